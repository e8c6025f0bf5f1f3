"""torch's MKL operations with MKL's vendor dispatch and with its kernels chosen by instruction set alone
(``BNNBENCH_MKL_ANY_VENDOR=1``, core/linalg/mkl_vendor), on one thread: two child processes, one per mode (the mode is
fixed when MKL first runs), timed in turns, medians of interleaved rounds.

    PYTHONPATH=. taskset -c 0 python bench/mkl_vendor.py [--rounds 9]

The shapes are the UCI steps' (R = 100 replicas: the boards' SLANG Gram products, an MLP layer's forward pass over
replicas x samples, the Nystrom eigensolver's small products), App. G's (an MNIST batch through a 3137-input layer),
SLANG Table 1's full-Gaussian logistic regression (batched Choleskys of [20, 257, 257]) and an exact eigensolver.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

OPS = {  # name: (shapes, what)
    "bmm [100,128,51]x[100,51,128]": ("bmm", (100, 128, 51), (100, 51, 128)),
    "bmm [200,100,16]x[200,16,50]": ("bmm", (200, 100, 16), (200, 16, 50)),
    "bmm [400,16,32]x[400,32,50]": ("bmm", (400, 16, 32), (400, 32, 50)),
    "bmm [100,901,3]x[100,3,3]": ("bmm", (100, 901, 3), (100, 3, 3)),
    "mm [256,3137]x[3137,500]": ("bmm", (1, 256, 3137), (1, 3137, 500)),
    "cholesky [20,257,257] f64": ("cholesky", (20, 257, 257), None),
    "cholesky [20,257,257] f32": ("cholesky32", (20, 257, 257), None),
    "eigh [20,129,129] f64": ("eigh", (20, 129, 129), None),
}


def child() -> None:
    import bnnbench  # noqa: F401  (before torch: the mode acts there)
    import torch

    from bnnbench.core.linalg import mkl_vendor
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    calls = []
    for kind, a, b in OPS.values():
        if kind == "bmm":
            x, y = torch.randn(*a, generator=g), torch.randn(*b, generator=g)
            calls.append(lambda x=x, y=y: torch.bmm(x, y))
        else:
            m = torch.randn(a[0], a[1] + 100, a[2], generator=g, dtype=torch.float64)
            spd = m.transpose(1, 2) @ m + torch.eye(a[2], dtype=torch.float64)
            spd = spd.float() if kind == "cholesky32" else spd
            calls.append((lambda s=spd: torch.linalg.eigh(s)) if kind == "eigh"
                         else (lambda s=spd: torch.linalg.cholesky(s)))
    for f in calls:
        f()
    print(json.dumps({"any_vendor": mkl_vendor.active()}), flush=True)
    for line in sys.stdin:
        i, n = map(int, line.split())
        t = time.perf_counter()
        for _ in range(n):
            calls[i]()
        print(json.dumps({"ms": (time.perf_counter() - t) / n * 1e3}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child()
    procs = {}
    for mode, value in (("vendor", "0"), ("any vendor", "1")):
        env = dict(os.environ, BNNBENCH_MKL_ANY_VENDOR=value, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        p = subprocess.Popen([sys.executable, __file__, "--child"], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        procs[mode] = (p, json.loads(p.stdout.readline())["any_vendor"])
    times = {mode: [[] for _ in OPS] for mode in procs}
    for _ in range(args.rounds):
        for i in range(len(OPS)):
            for mode, (p, _) in procs.items():
                p.stdin.write(f"{i} 10\n")
                p.stdin.flush()
                times[mode][i].append(json.loads(p.stdout.readline())["ms"])
    for p, _ in procs.values():
        p.stdin.close()
        p.wait()
    print(f"1 thread, medians of {args.rounds} interleaved rounds of 10 calls; MKL by instruction set alone in the "
          f"second process: {procs['any vendor'][1]} (first: {procs['vendor'][1]})")
    print(f"{'operation':<34s} {'vendor ms':>10s} {'any ms':>8s} {'ratio':>7s}")
    for i, name in enumerate(OPS):
        v, a = (statistics.median(times[m][i]) for m in procs)
        print(f"{name:<34s} {v:10.3f} {a:8.3f} {v / a:6.2f}x")


if __name__ == "__main__":
    main()
