"""The per-example outer-product kernel alone (``core/linalg/outer_times``) against torch's batched products.

On one thread:

    PYTHONPATH=. taskset -c 0 python bench/outer_times.py [--inputs 16,8,4] [--hidden 50] [--replicas 100]
        [--samples 2] [--rows 100] [--k 3] [--rounds 7] [--base <commit>]

For each input width (naval 16, kin8nm 8, power 4: SLANG Table 2's large sets) a one-hidden-layer ReLU MLP's
activations and gradients at R replicas x S samples x M rows, then ``c2 G G^T Y`` for Y ``[R, P, k]`` (k = L + 2: the
Nystrom eigensolver's probes) three ways: ``per_example.gradient_t_times`` then ``gradient_times`` (torch's GEMMs, what
the eager step runs), ``outer_times.times`` on a packed input (five of these a step), and ``outer_times.pack`` (once
a step). Medians of interleaved rounds of 20 calls each (a change of load hits all alike); the operands stay in the
cache between calls, so a step, whose operands come from memory, runs each slower (results/README.md, Speed).

Then the Nystrom eigensolver's whole subspace iteration (``low_rank.nystrom_range``: n_iter + 1 = 5 products with
``a2 U U^T + c2 G G^T`` and four QR factorisations, U of rank k - 2) two ways: ``pack`` once, ``times`` for each product
and LAPACK's QR (``range ms``: what the compiled step ran until 2026-12-03), and ``outer_times.nystrom_range``, one
replica at a time (``nystrom ms``), with the largest difference of their Q.

``--base <commit>`` then times ``nystrom_range`` with that commit's kernel (its ``outer_times.c`` and headers, built
from its worktree as bench/step_ab.py checks it out) against this tree's, in interleaved rounds in this one process,
with the largest relative difference of their outputs (Q, E, nu; each over its largest entry).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from bnnbench.core.linalg import outer_times
from bnnbench.core.linalg.per_example import forward_cache, gradient_t_times, gradient_times, layer_factors
from bnnbench.core.models.mlp import MLP


def mlp_factors(D: int, hidden: int, R: int, S: int, M: int, g: torch.Generator):
    """A one-hidden-layer ReLU MLP's layers' inputs and gradients at R replicas x S samples x M rows."""
    model = MLP([D, hidden, 1])
    theta = 0.3 * torch.randn(R, S, model.n_params, generator=g)
    layers = [(W.requires_grad_(True), b.requires_grad_(True)) for W, b in model.layers(theta)]
    f, acts, zs = forward_cache(model, layers, torch.randn(R, M, D, generator=g))
    gs = torch.autograd.grad((f ** 2).sum(), zs)
    return model, [a.detach() for a in acts], gs


def case(D: int, hidden: int, R: int, S: int, M: int, k: int):
    g = torch.Generator().manual_seed(0)
    model, acts, gs = mlp_factors(D, hidden, R, S, M, g)
    factors = layer_factors(acts, gs)
    Y, c = torch.randn(R, model.n_params, k, generator=g), torch.rand(R, 1, 1, generator=g)
    packed, layout, S_, M_ = outer_times.pack(acts, gs)
    c2 = (c * c).view(R)
    ways = {"torch": lambda: gradient_times(model, factors, c * (c * gradient_t_times(model, factors, Y))),
            "kernel": lambda: outer_times.times(packed, layout, S_, M_, Y, c2),
            "pack": lambda: outer_times.pack(acts, gs)}
    ref, out = ways["torch"](), ways["kernel"]()
    err = float((out - ref).abs().max() / ref.abs().max())
    return ways, err


def subspace_case(D: int, hidden: int, R: int, S: int, M: int, k: int, n_iter: int = 4):
    from bnnbench.core.linalg.low_rank import nystrom_range
    g = torch.Generator().manual_seed(0)
    model, acts, gs = mlp_factors(D, hidden, R, S, M, g)
    U = 0.1 * torch.randn(R, model.n_params, k - 2, generator=g)
    a2, c2 = torch.rand(R, generator=g), torch.rand(R, generator=g)
    probes = 2 * torch.rand(R, model.n_params, k, generator=g) - 1

    def by_products():
        packed, layout, S_, M_ = outer_times.pack(acts, gs)
        return nystrom_range(lambda Y: a2[:, None, None] * (U @ (U.transpose(1, 2) @ Y))
                             + outer_times.times(packed, layout, S_, M_, Y, c2), probes, n_iter)

    ways = {"range": by_products, "nystrom": lambda: outer_times.nystrom_range(acts, gs, U, a2, c2, probes, n_iter)}
    err = float((ways["range"]()[0] - ways["nystrom"]()[0]).abs().max())
    return ways, err


def median_ms(fn, rounds_ms: list[float], calls: int = 20) -> None:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    rounds_ms.append((time.perf_counter() - t0) / calls * 1e3)


def medians(ways: dict, rounds: int, calls: int) -> dict:
    """ms per call of each way: the median of ``rounds`` interleaved rounds of ``calls`` calls, after one call each."""
    times = {name: [] for name in ways}
    for fn in ways.values():
        fn()
    for _ in range(rounds):
        for name, fn in ways.items():
            median_ms(fn, times[name], calls)
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", default="16,8,4")
    ap.add_argument("--hidden", type=int, default=50)
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--base", help="also time nystrom_range with this commit's kernel against this tree's")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not outer_times.available():
        print("the kernel does not build here (no C compiler)")
        return 1
    print(f"R = {args.replicas}, S = {args.samples}, M = {args.rows}, hidden {args.hidden}, k = {args.k}, 1 thread; "
          f"medians of {args.rounds} interleaved rounds of 20 calls")
    print(f"{'inputs':>6} {'torch ms':>9} {'kernel ms':>10} {'pack ms':>8} {'torch/kernel':>13} {'max rel err':>12}")
    for D in (int(d) for d in args.inputs.split(",")):
        ways, err = case(D, args.hidden, args.replicas, args.samples, args.rows, args.k)
        t = medians(ways, args.rounds, 20)
        print(f"{D:>6} {t['torch']:>9.2f} {t['kernel']:>10.2f} {t['pack']:>8.2f} {t['torch'] / t['kernel']:>12.2f}x "
              f"{err:>12.1e}")
    print(f"\n{'inputs':>6} {'range ms':>9} {'nystrom ms':>11} {'range/nystrom':>14} {'max Q diff':>11}")
    for D in (int(d) for d in args.inputs.split(",")):
        ways, err = subspace_case(D, args.hidden, args.replicas, args.samples, args.rows, args.k)
        t = medians(ways, args.rounds, 5)
        print(f"{D:>6} {t['range']:>9.2f} {t['nystrom']:>11.2f} {t['range'] / t['nystrom']:>13.2f}x {err:>11.1e}")
    if args.base:
        base_ab(args)
    return 0


def base_library(commit: str):
    """``commit``'s kernel: its ``outer_times.c`` and the headers beside it, built (``c_kernels.build``) from the
    commit's worktree (``step_ab.worktree``) with this tree's declarations of its functions."""
    from bnnbench.core.linalg import c_kernels
    from step_ab import REPO, worktree   # bench/ is the script's folder, so it heads sys.path
    src = Path(outer_times.SOURCE)
    old = worktree(commit) / src.relative_to(REPO)
    real = c_kernels.build
    c_kernels.build = lambda source, what, sigs, **kw: real(old, what, sigs, **kw)
    try:
        return outer_times._library.__wrapped__()
    finally:
        c_kernels.build = real


def base_ab(args) -> None:
    libs = {"old": base_library(args.base), "new": outer_times._library()}
    real_library = outer_times._library
    print(f"\nnystrom_range with the kernel of {args.base} (old) and this tree's (new), interleaved rounds of 5 calls")
    print(f"{'inputs':>6} {'old ms':>8} {'new ms':>8} {'old/new':>8} {'max rel diff':>13}")
    for D in (int(d) for d in args.inputs.split(",")):
        ways, _ = subspace_case(D, args.hidden, args.replicas, args.samples, args.rows, args.k)

        def with_lib(name):
            def call():
                outer_times._library = lambda: libs[name]
                try:
                    return ways["nystrom"]()
                finally:
                    outer_times._library = real_library
            return call
        fns = {name: with_lib(name) for name in libs}
        diff = max(float((a - b).abs().max() / a.abs().max()) for a, b in zip(fns["old"](), fns["new"]()))
        t = medians(fns, args.rounds, 5)
        print(f"{D:>6} {t['old']:>8.2f} {t['new']:>8.2f} {t['old'] / t['new']:>7.2f}x {diff:>13.1e}")


if __name__ == "__main__":
    raise SystemExit(main())
