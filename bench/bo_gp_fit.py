"""The Bayesian optimisation's proposals alone (issue 31, section 2: "the Gaussian-process fits of the Bayesian
optimisation"): one BO of SLANG Table 2 / Vadam Table 1's budget per split (5 random points, then 25 proposals, each
re-fitting the Matern-5/2 length-scales with 25 L-BFGS-B restarts and maximising expected improvement), for
``--splits`` splits, with the GP regressor of ``bnnbench.run.hpo`` (``_matern_gpr``: sklearn's, its log marginal
likelihood computed by ``matern52_lml``) and with sklearn's plain one, timed in turns in one process on one thread.
The objective is a smooth 2-D stand-in for a CV score (the GP's cost depends on the number of points, not on what
they score). Both must propose the same points, bit for bit: the script checks it.

A whole cell spends this once per split, beside its training: py-spy on SLANG Table 2's BBB on yacht
(``bnnbench reproduce slang_table2 --label bbb --data uci/yacht compile=true threads=1``, 2026-12-02) put 47.5 s of
its 294 s in the GP fits and 8.1 s in the EI maximisation.

    PYTHONPATH=. taskset -c 0 python bench/bo_gp_fit.py [--splits 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import numpy as np

from bnnbench.run import hpo


def one_bo(splits: int) -> np.ndarray:
    """Every split's BO to its 30th evaluation; the proposals ``[splits, 30, 2]``."""
    out = []
    for i in range(splits):
        f = lambda x: -((x[:, 0] - 4.9 - 0.01 * i) ** 2) - 0.3 * (x[:, 1] + 1.0) ** 2 + 0.1 * np.sin(7 * x[:, 1])  # noqa: E731
        opt = hpo.GPBayesOpt([[4.8, 5.3], [-2, 2]], [0.1, 1.25], n_random=5, alpha=1e-2, seed=1000 + i)
        x = opt.ask(5)
        opt.tell(x, f(x))
        for _ in range(25):
            x = opt.ask(1)
            opt.tell(x, f(x))
        out.append(np.array(opt.X))
    return np.stack(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from sklearn.gaussian_process import GaussianProcessRegressor
    times = {"sklearn": [], "bnnbench": []}
    for _ in range(args.rounds):
        t = time.perf_counter()
        with mock.patch.object(hpo, "_matern_gpr", lambda: GaussianProcessRegressor):
            plain = one_bo(args.splits)
        times["sklearn"].append(time.perf_counter() - t)
        t = time.perf_counter()
        ours = one_bo(args.splits)
        times["bnnbench"].append(time.perf_counter() - t)
        if not np.array_equal(ours, plain):
            raise SystemExit("the proposals differ from sklearn's")
    a, b = statistics.median(times["sklearn"]), statistics.median(times["bnnbench"])
    print(f"{args.splits} splits x 30 evaluations, medians of {args.rounds} interleaved rounds, 1 thread: "
          f"sklearn's GP {a:.2f} s, bnnbench's {b:.2f} s ({a / b:.2f}x); the same proposals bit for bit")


if __name__ == "__main__":
    main()
