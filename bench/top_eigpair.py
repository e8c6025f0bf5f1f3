"""SLANG's eigensolver alone (issue 31): the top eigenpair of R Gram matrices of n x n, as the L = 1 step at UCI scale
hands them over (R = 100 in a Bayesian-optimisation round, 20 in a final run; n = 1 + S M = 41 on Boston), by
LAPACK's ``?syevr`` one matrix per call (``low_rank.top_eigh``, the eager step's) and by the SIMD kernel of
``linalg.top_eigpair`` (the compiled step's), timed in turns in one process on one thread, float32 in as in the step.
The largest eigenvalue's relative difference between the two is printed beside (float32 rounding: the kernel computes
in float64). With several sizes (``--n 11,21,41,64,81,161 --replicas 1,3,8,20,100``) it gives the grid behind
``top_eigh``'s choice (``low_rank.SIMD_MAX_N``): the kernel runs 8 matrices at once, so it loses where they are large
(and, by less, where they are few).

    PYTHONPATH=. taskset -c 0 python bench/top_eigpair.py [--replicas 100,20] [--n 41] [--rounds 41]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bnnbench.core.linalg import top_eigpair
from bnnbench.core.linalg.low_rank import top_eigh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="100,20", help="comma list of batch sizes R")
    ap.add_argument("--n", default="41", help="comma list of matrix sizes")
    ap.add_argument("--rows", type=int, default=751, help="rows of B in B^T B (Boston's P)")
    ap.add_argument("--rounds", type=int, default=41)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not top_eigpair.available():
        raise SystemExit("the kernel could not be built (no C compiler?)")
    g = torch.Generator().manual_seed(0)
    print(f"float32 in, 1 thread, medians of up to {args.rounds} interleaved rounds")
    print(f"{'n':>5} {'R':>5} {'?syevr ms':>10} {'kernel ms':>10} {'ratio':>7} {'max rel diff e':>15}")
    for n in (int(v) for v in args.n.split(",")):
        for R in (int(r) for r in args.replicas.split(",")):
            B = torch.randn(R, max(args.rows, n), n, generator=g)
            A = B.transpose(1, 2) @ B
            # the kernel itself, at any n (top_eigh would hand n > SIMD_MAX_N to LAPACK)
            cases = {"lapack": lambda: top_eigh(A, 1), "simd": lambda: top_eigpair.top_eigpair(A)}
            times = {k: [] for k in cases}
            out = {k: f() for k, f in cases.items()}
            for _ in range(max(3, min(args.rounds, int(args.rounds * (41 / n) ** 2)))):
                for k, f in cases.items():
                    t = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t)
            ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            diff = ((out["simd"][0] - out["lapack"][0]).abs() / out["lapack"][0].abs()).max().item()
            print(f"{n:>5} {R:>5} {ms['lapack']:>10.3f} {ms['simd']:>10.3f} {ms['lapack'] / ms['simd']:>6.2f}x "
                  f"{diff:>15.1e}")


if __name__ == "__main__":
    main()
