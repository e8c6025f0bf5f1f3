"""Noisy K-FAC's factor roots alone (issue 31): ``C = L^-T`` of R damped Kronecker factors of n x n, as its step
refreshes them (R = 100 in a selection round, 20 in a final run; n = 14, 51 and 50 on Boston), by LAPACK
(``cholesky_ex``, then a triangular solve against the identity: the eager step's ``inv_chol_t``) and by the SIMD kernel
of ``linalg.chol_root`` (the compiled step's), timed in turns in one process on one thread, float32 in as in the step.
The largest difference between the two, relative to the largest entry of C, is printed beside (float32 rounding: the
kernel computes in float64). Over sizes (``--n 14,51,101,128,161,201 --replicas 1,8,20,100``) it gives the grid
behind ``chol_root.MAX_N``: the kernel runs 8 matrices at once, unblocked, so it loses where they are large.

    PYTHONPATH=. taskset -c 0 python bench/chol_root.py [--replicas 100,20] [--n 14,51,50] [--rounds 41]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bnnbench.core.linalg import chol_root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="100,20", help="comma list of batch sizes R")
    ap.add_argument("--n", default="14,51,50", help="comma list of matrix sizes")
    ap.add_argument("--rounds", type=int, default=41)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not chol_root.available():
        raise SystemExit("the kernel could not be built (no C compiler?)")
    g = torch.Generator().manual_seed(0)
    print(f"float32 in, 1 thread, medians of up to {args.rounds} interleaved rounds")
    print(f"{'n':>5} {'R':>5} {'LAPACK ms':>10} {'kernel ms':>10} {'ratio':>7} {'max diff / max |C|':>19}")
    for n in (int(v) for v in args.n.split(",")):
        for R in (int(r) for r in args.replicas.split(",")):
            A = torch.randn(R, n, 4 * n, generator=g)
            X = A @ A.transpose(1, 2) / (4 * n) + 1e-2 * torch.eye(n)   # a damped second-moment matrix
            cases = {"lapack": lambda: chol_root._lapack_chol_root(X), "simd": lambda: chol_root.chol_root(X)}
            times = {k: [] for k in cases}
            out = {k: f()[0] for k, f in cases.items()}
            for _ in range(max(3, min(args.rounds, int(args.rounds * (51 / n) ** 2)))):
                for k, f in cases.items():
                    t = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t)
            ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
            diff = ((out["simd"] - out["lapack"]).abs().max() / out["lapack"].abs().max()).item()
            print(f"{n:>5} {R:>5} {ms['lapack']:>10.3f} {ms['simd']:>10.3f} {ms['lapack'] / ms['simd']:>6.2f}x "
                  f"{diff:>19.1e}")


if __name__ == "__main__":
    main()
