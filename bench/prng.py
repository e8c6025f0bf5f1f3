"""The draws of ``rng=torch`` by ``core/mt_draws`` (torch's Mersenne-twister numbers, bit for bit, from a C kernel) and
of ``rng=philox`` (``core/prng.py``: Philox4x32-10 and Box-Muller in a C kernel) against torch's own CPU draws, one
thread, per number drawn.

    PYTHONPATH=. taskset -c 0 python bench/prng.py [--sizes 10000,100000,1000000] [--rounds 7]

For each size: torch's ``randn`` and ``rand`` with a generator, ``prng.randn`` / ``prng.rand`` under ``rng=torch``
(``mt``: the same numbers by ``mt_draws``' kernel, the generator's state read and written back included), the Philox
kernel's normals and uniforms, and the same Philox
draws by torch's operations (what a GPU and a machine without a C compiler run), in interleaved rounds; medians in ns
per number and torch / kernel. ``rng=philox`` draws one key from the run's generator per draw as well (``prng.key``,
about 1.5 us), included in the ``randn``/``rand`` rows under the mode.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bnnbench.core import mt_draws, prng


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not prng._library() or not mt_draws.available():
        raise SystemExit("the kernels philox.c and mt_draws.c could not be built or checked here (no C compiler?)")
    g = torch.Generator().manual_seed(0)

    def under_philox(fn):
        def run():
            with prng.mode("philox"):
                fn()
        return run

    print(f"ns per number, 1 thread, medians of {args.rounds} interleaved rounds")
    print(f"{'size':>9s} {'draw':<8s} {'torch':>7s} {'mt':>7s} {'philox':>7s} {'ops':>7s} {'torch/mt':>9s} "
          f"{'torch/philox':>13s}")
    for n in map(int, args.sizes.split(",")):
        ways = {("normal", "torch"): lambda: torch.randn(n, generator=g),
                ("normal", "mt"): lambda: prng.randn(n, generator=g),
                ("normal", "philox"): under_philox(lambda: prng.randn(n, generator=g)),
                ("normal", "ops"): lambda: prng._normal_torch(7, n, "cpu"),
                ("uniform", "torch"): lambda: torch.rand(n, generator=g),
                ("uniform", "mt"): lambda: prng.rand(n, generator=g),
                ("uniform", "philox"): under_philox(lambda: prng.rand(n, generator=g)),
                ("uniform", "ops"): lambda: prng._uniform_torch(7, n, "cpu")}
        calls = max(2, int(2e6 / n))
        times = {k: [] for k in ways}
        for _ in range(args.rounds):
            for k, fn in ways.items():
                fn()
                t = time.perf_counter()
                for _ in range(calls if k[1] != "ops" else max(1, calls // 20)):
                    fn()
                times[k].append((time.perf_counter() - t) / (calls if k[1] != "ops" else max(1, calls // 20)) / n)
        med = {k: statistics.median(v) * 1e9 for k, v in times.items()}
        for draw in ("normal", "uniform"):
            t, m, p, o = (med[(draw, w)] for w in ("torch", "mt", "philox", "ops"))
            print(f"{n:9d} {draw:<8s} {t:7.2f} {m:7.2f} {p:7.2f} {o:7.2f} {t / m:8.2f}x {t / p:12.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
