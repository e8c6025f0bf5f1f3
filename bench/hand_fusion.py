"""Hand-fusion against torch.compile on the costliest part of a UCI step: VOGN's per-example statistics (issue 31).

VOGN under vadam_uci on Boston (13-50-1, B = 32, S = 10), float32, one thread. From the same sampled weights and
minibatch, each variant computes the per-sample sums of the per-example gradients and of their squares (``g_sum,
c_sum [R, S, P]``, the empirical Fisher) and the mean NLL:

* ``autograd``: the step's own ``natural.per_example_stats`` (autograd back to each layer's pre-activation);
* ``closed form``: the same quantities without autograd, in inference mode: the Gaussian likelihood's closed-form
  output cotangent and ``per_example.backprop`` (as noisy Adam's and noisy K-FAC's steps do already);
* ``folded``: the closed form with the samples folded into the matrix dimensions of the first layer, whose input the
  samples share: its forward pass one ``[B, 13] x [13, S 50]`` product per replica instead of S ``[B, 13] x [13, 50]``
  ones, and its gradient sums ``a^T g`` and ``(a^2)^T g^2`` one ``[13, B] x [B, S 50]`` product each;
* ``chunks of 20``: ``closed form`` over the replica axis in chunks of 20 (every intermediate of a chunk fits the
  1-2 MiB L2 cache of this CPU; R = 100's [R, S, B, 50] tensors are 6.4 MB each and go to L3 / memory);
* ``compiled``: ``autograd`` through ``torch.compile``.

The largest relative difference from ``autograd`` is printed beside each: 0 where the variant is bitwise equal (it
could replace the eager code without moving a committed record's digits), float rounding where it is not.

    PYTHONPATH=. taskset -c 0 python bench/hand_fusion.py [--replicas 100,20] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bnnbench.core.data import load_dataset
from bnnbench.core.linalg.per_example import backprop, forward_cache, sum_grads, sum_sq_grads
from bnnbench.methods.base import likelihood_of
from bnnbench.methods.gaussian.natural import leaf_layers, per_example_stats
from bnnbench.core.models.mlp import affine

from step_profile import CASES, Case  # bench/ is the script's folder, so it heads sys.path


def closed_form(method, state, layers, batch):
    """``(g_sum, c_sum, nll)`` of ``per_example_stats(..., "ef")`` by the closed-form backward pass."""
    model = method.model
    layers = [(W.detach(), b.detach()) for W, b in layers]
    with torch.inference_mode():
        f, acts, zs = forward_cache(model, layers, batch.x)
        lik = likelihood_of(state, method.likelihood)
        gs = backprop(model, layers, acts, zs, -lik.grad_f(f, batch.y))   # d nll_i / d f = -d log p / d f
        return sum_grads(model, acts, gs), sum_sq_grads(model, acts, gs), -lik.log_prob(f, batch.y).mean(dim=(1, 2))


def folded(method, state, layers, batch):
    """``closed_form`` with the S samples folded into the first layer's products (its input is shared)."""
    layers = [(W.detach(), b.detach()) for W, b in layers]
    with torch.inference_mode():
        x = batch.x                                                        # [R, B, D]
        (W1, b1), (W2, b2) = layers
        R, S, D, H = W1.shape
        B = x.shape[1]
        z1 = torch.baddbmm(b1.reshape(R, 1, S * H), x, W1.permute(0, 2, 1, 3).reshape(R, D, S * H))  # [R, B, S H]
        h1 = torch.relu(z1)
        h1s = h1.view(R, B, S, H).transpose(1, 2)                          # [R, S, B, H] (a view)
        f = affine(h1s, W2, b2)                                            # [R, S, B, 1]
        lik = likelihood_of(state, method.likelihood)
        g2 = -lik.grad_f(f, batch.y)                                       # [R, S, B, 1]
        g1 = (g2 * W2.transpose(-1, -2)) * torch.sign(h1s)                 # [R, S, B, H]
        g1f = g1.transpose(1, 2).reshape(R, B, S * H)
        gW1 = (x.transpose(1, 2) @ g1f).view(R, D, S, H).transpose(1, 2)   # sum_i a_i^T g_i
        cW1 = ((x * x).transpose(1, 2) @ (g1f * g1f)).view(R, D, S, H).transpose(1, 2)
        g_sum = torch.cat([gW1.flatten(2), g1.sum(2), (h1s.transpose(-1, -2) @ g2).flatten(2), g2.sum(2)], -1)
        c_sum = torch.cat([cW1.flatten(2), (g1 * g1).sum(2), ((h1s * h1s).transpose(-1, -2) @ (g2 * g2)).flatten(2),
                           (g2 * g2).sum(2)], -1)
        return g_sum, c_sum, -lik.log_prob(f, batch.y).mean(dim=(1, 2))


def chunked(fn, size):
    def run(method, state, layers, batch):
        R = batch.x.shape[0]
        parts = []
        for lo in range(0, R, size):
            sl = slice(lo, min(R, lo + size))
            sub = state[sl]
            b = type(batch)(batch.x[sl], batch.y[sl], batch.n_data[sl])
            parts.append(fn(method, sub, [(W[sl], bb[sl]) for W, bb in layers], b))
        return tuple(torch.cat(p) for p in zip(*parts))
    return run


def autograd(method, state, layers, batch):
    g, c, nll = per_example_stats(method, state, layers, batch, "ef")
    return g.detach(), c.detach(), nll


def rel(a, b):
    return max(float((x - y).abs().max() / x.abs().max()) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", default="100,20")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inner", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.trace_autograd_ops = True
    ds = load_dataset("uci/boston")
    label, name, proto = next(c for c in CASES if c[1] == "vogn")
    compiled = torch.compile(autograd, dynamic=False)
    variants = [("autograd", autograd), ("closed form", closed_form), ("folded", folded),
                ("chunks of 20", chunked(closed_form, 20)), ("compiled", compiled)]
    rows = []
    for R in [int(r) for r in args.replicas.split(",")]:
        c = Case(label, name, proto, R, ds)
        m, state, batch = c.method, c.state, c.batches[0]
        layers = leaf_layers(m.model, state.mean, m.std(state), m.noise(state, batch, c.g))
        ref = autograd(m, state, layers, batch)
        for vname, fn in variants:
            out = fn(m, state, layers, batch)   # compiles here
            rows.append(dict(R=R, name=vname, fn=fn, args=(m, state, layers, batch), diff=rel(ref, out), ms=[]))
    for _ in range(args.repeats):   # interleaved
        for r in rows:
            t = time.perf_counter()
            for _ in range(args.inner):
                r["fn"](*r["args"])
            r["ms"].append((time.perf_counter() - t) / args.inner * 1e3)
    print(f"VOGN per-example statistics (vadam_uci, Boston, B = 32, S = 10), float32, 1 thread; medians of "
          f"{args.repeats} interleaved repeats")
    print(f"{'R':>4s} {'variant':<14s} {'ms':>8s} {'vs autograd':>11s} {'max rel diff':>12s}")
    base = {}
    for r in rows:
        ms = statistics.median(r["ms"])
        base.setdefault(r["R"], r["ms"])
        ratio = statistics.median(a / b for a, b in zip(base[r["R"]], r["ms"]))
        print(f"{r['R']:4d} {r['name']:<14s} {ms:8.2f} {ratio:10.2f}x {r['diff']:12.1e}")


if __name__ == "__main__":
    main()
