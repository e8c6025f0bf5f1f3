"""The hidden layer's memory layout under ``torch.compile``: examples or hidden units innermost (issue 31, a lead).

BBB's compiled step at Vadam Table 1's selection on kin8nm (R = 100 replicas, S = 10 samples, minibatch B = 128,
8 inputs, 50 ReLU units, one output; float32, one thread) spends most of its time in one fused kernel over the
``[R, S, B, 50]`` pre-activations (``torch.profiler``: 8.2 of about 20 ms a step). With the hidden units innermost,
as ``MLP.forward`` lays them out, inductor vectorises the output layer's sum over the 50 units along them: three
vectors of 16 and a masked tail of 2, then a horizontal reduction, for each of the R S B = 128 000 rows, and again in
the backward pass. This script times the forward and backward pass of the squared-error loss, compiled, in that layout
(``z = x W + b``, ``[R, S, B, H]``) and transposed (``z^T = W^T x^T + b``, ``[R, S, H, B]``: the sum over units is
a sum of rows, vectorised along the 128 examples), and the largest relative difference of the loss and gradients.

    PYTHONPATH=. taskset -c 0 python bench/hidden_layout.py [--replicas 100] [--samples 10] [--batch 128] [--repeats 15]

(medians of interleaved rounds).

2026-12-02 (fortieth session, the other core idle), two runs: 18.6 -> 16.4 ms (1.13x) and 19.0 -> 16.3 ms (1.17x),
the loss and gradients equal to 3e-7 relative (best-of timings, not interleaved, had given 0.92-1.24x).
Built since for BBB's compiled step alone (``MLP.forward_layers(examples_inner=True)`` on minibatches of 64 rows or
more, ``bbb.EXAMPLES_INNER_MIN_BATCH``); the eager steps, whose order of operations the committed records hold, and the
other methods keep the units innermost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--inputs", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    R, S, B, d, H = args.replicas, args.samples, args.batch, args.inputs, args.hidden
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(R, B, d, generator=g), torch.randn(R, B, generator=g)
    xT = x.transpose(1, 2).contiguous()
    params = (0.3 * torch.randn(R, S, d, H, generator=g), 0.1 * torch.randn(R, S, H, generator=g),
              0.3 * torch.randn(R, S, H, generator=g), torch.randn(R, S, generator=g))

    def units_inner(W1, b1, w2, b2):
        z = torch.matmul(x.unsqueeze(1), W1) + b1.unsqueeze(-2)                    # [R, S, B, H]
        f = (torch.relu(z) * w2.unsqueeze(-2)).sum(-1) + b2.unsqueeze(-1)
        return ((f - y.unsqueeze(1)) ** 2).sum()

    def examples_inner(W1, b1, w2, b2):
        zT = torch.matmul(W1.transpose(-1, -2), xT.unsqueeze(1)) + b1.unsqueeze(-1)  # [R, S, H, B]
        f = (torch.relu(zT) * w2.unsqueeze(-1)).sum(-2) + b2.unsqueeze(-1)
        return ((f - y.unsqueeze(1)) ** 2).sum()

    def compiled(loss):
        def value_and_grads(*ps):
            ps = [p.detach().requires_grad_() for p in ps]
            with torch.enable_grad():
                value = loss(*ps)
                return value.detach(), torch.autograd.grad(value, ps)
        return torch.compile(value_and_grads)

    a, b = compiled(units_inner), compiled(examples_inner)
    (va, ga), (vb, gb) = a(*params), b(*params)
    diff = max([float((va - vb).abs() / va.abs())] + [float((p - q).abs().max() / p.abs().max())
                                                       for p, q in zip(ga, gb)])

    def ms(fn, n=10):
        t = time.perf_counter()
        for _ in range(n):
            fn(*params)
        return (time.perf_counter() - t) / n * 1e3

    for fn in (a, b):
        ms(fn, 3)
    rounds = [(ms(a), ms(b)) for _ in range(args.repeats)]   # interleaved: a change of load hits both
    ta, tb = (statistics.median(r[i] for r in rounds) for i in (0, 1))
    print(f"R={R} S={S} B={B} {d}-{H}-1, float32, 1 thread, compiled forward + backward: units innermost "
          f"{ta:.2f} ms, examples innermost {tb:.2f} ms ({ta / tb:.2f}x); largest relative difference {diff:.1e}")


if __name__ == "__main__":
    main()
