"""Wall time of the whole SLANG Table 1 at the paper protocol (issue 4: under 30 minutes on this machine),
estimated in one run from short trainings of every stochastic cell through the real training path.

Each of the 32 stochastic cells (4 data sets x 8 columns: MF EF / Hessian, SLANG L = 1, 2, 5, 10, Full EF / Hessian)
trains all its splits on the replica axis for E epochs (``fit``: data, minibatches, steps, one final evaluation);
t(E) / E times the protocol's epochs, plus that evaluation once per ``eval_every`` epochs of the protocol (counted
at t(E) again: an upper bound), is the cell's estimate.
The exact columns (L-BFGS) are run in full. Printed: per cell, per data set, the total for one process and for
``--jobs`` cells run at a time (longest-first onto the workers), and the floor set by the Full-Gaussian columns on
USPS (one P x P Cholesky factor per step and split: measured alone at the same shape).

    python bench/logreg_table1.py [--epochs 30] [--jobs 2] [--data usps/3vs5,...]
"""

from __future__ import annotations

import argparse
import heapq
import time

import torch

from bnnbench.core.data import load_dataset
from bnnbench.run.protocol import resolve
from bnnbench.run.fit import FitOptions, fit
from bnnbench.methods import method_class
from bnnbench.run.splits import select_splits, with_restarts


def cell_spec(cell):
    from bnnbench.run.config import CommandLine, cell_own_overrides, compose
    ov = ["experiment=slang_table1", f"method={cell['method']}", f"data={cell['data']}",
          *cell_own_overrides(cell, "results/runs")]
    cfg = compose(ov)
    ds = load_dataset(cfg.data.name)
    return resolve(cfg, CommandLine.parse(ov), meta=ds.meta), ds


def time_fit(spec, ds, epochs):
    splits = with_restarts(select_splits(ds, spec.splits, spec.split_scheme), spec.restarts)
    pairs = [(s.train, s.test) for s in splits]
    t = time.perf_counter()
    fit(spec, ds, pairs, list(range(len(pairs))), [dict(spec.fixed)] * len(pairs), torch.Generator().manual_seed(0),
        FitOptions(device=torch.device("cpu"), dtype=torch.float32, epochs=epochs))
    return time.perf_counter() - t


def time_exact(cell):
    from bnnbench.run.config import compose
    from bnnbench.run.execute import execute
    import tempfile
    ov = ["experiment=slang_table1", f"method={cell['method']}", f"data={cell['data']}", "progress=false"]
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        execute(compose(ov), ov, d, log=lambda m: None)
        return time.perf_counter() - t


def cholesky_floor(R: int, P: int, steps: int) -> float:
    A = torch.randn(R, P, P)
    A = A @ A.transpose(1, 2) + P * torch.eye(P)
    torch.linalg.cholesky(A)
    t = time.perf_counter()
    for _ in range(5):
        torch.linalg.cholesky(A)
    return (time.perf_counter() - t) / 5 * steps


def makespan(times, jobs):
    workers = [0.0] * jobs
    for t in sorted(times, reverse=True):
        heapq.heappush(workers, heapq.heappop(workers) + t)
    return max(workers)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data", default=None, help="comma list of data sets (default: all four)")
    args = ap.parse_args()
    from bnnbench.run.config import experiment_spec
    cells = experiment_spec("slang_table1")["runs"]
    if args.data:
        cells = [c for c in cells if c["data"] in args.data.split(",")]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    est = {}
    for cell in cells:
        label = cell.get("label") or cell["method"]
        if method_class(cell["method"]).solved:
            est[label, cell["data"]] = time_exact(cell)
            print(f"{cell['data']:>22s} {label:>13s}: {est[label, cell['data']]:7.1f} s (run in full)", flush=True)
            continue
        spec, ds = cell_spec(cell)
        t = time_fit(spec, ds, args.epochs)   # fit evaluates once, at the end
        n_eval = max(1, spec.epochs // (spec.eval_every or spec.epochs))
        est[label, cell["data"]] = t / args.epochs * spec.epochs + n_eval * t
        print(f"{cell['data']:>22s} {label:>13s}: {est[label, cell['data']]:7.1f} s "
              f"({t / args.epochs * 1e3:.1f} ms/epoch x {spec.epochs}, {n_eval} evaluations)", flush=True)
    for data in dict.fromkeys(d for _, d in est):
        print(f"{data:>22s}: {sum(t for (_, d), t in est.items() if d == data) / 60:6.1f} min")
    total = sum(est.values())
    print(f"whole table: {total / 60:.1f} min in one process; {makespan(list(est.values()), args.jobs) / 60:.1f} min "
          f"with {args.jobs} cells at a time (target: 30 min)")
    if any(d == "usps/3vs5" for _, d in est):
        spec, ds = cell_spec({"method": "full_gaussian", "data": "usps/3vs5"})
        n_train = max(len(s.train) for s in select_splits(ds, spec.splits, spec.split_scheme))
        steps = spec.epochs * -(-n_train // spec.batch_size)
        floor = cholesky_floor(20, ds.X.shape[1] + 1, steps)
        print(f"floor: one Full-Gaussian column on USPS needs {steps} steps x a batched Cholesky of [20, "
              f"{ds.X.shape[1] + 1}, {ds.X.shape[1] + 1}] = {floor / 60:.1f} min alone")


if __name__ == "__main__":
    main()
