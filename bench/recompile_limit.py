"""Compiled runs in one process past dynamo's limit of versions per code object (issue 31; results/README.md, Speed).

Dynamo keeps a function's compiled versions per code object, one per set of guards, and past ``recompile_limit`` (64,
``bnnbench.run.compiled._CACHE_SIZE_LIMIT``) runs it eagerly. This runs ``--runs`` one-epoch BBB runs on yacht with
``compile=true`` in one process, each with another step size (a constant of the step's graph: a new version), as
``bnnbench reproduce`` runs an experiment's cells, and prints how many frames each run compiled, counted by a counting
backend instead of inductor (seconds, not minutes). ``--old`` skips ``compiled.new_run`` (the reset at a compiled
run's start), as the code before it did: the runs past the 64th then compile nothing.

    BNNBENCH_MIRROR=... PYTHONPATH=. taskset -c 0 python bench/recompile_limit.py [--runs 70] [--old]
"""

from __future__ import annotations

import argparse
import collections
import tempfile

import torch
from torch._dynamo.testing import CompileCounter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=70)
    ap.add_argument("--old", action="store_true", help="no reset at a run's start (the code before new_run)")
    args = ap.parse_args()
    import bnnbench.run.execute as execute
    from bnnbench.cli import main as cli
    if args.old:
        execute.new_run = lambda: None
    counter, real = CompileCounter(), torch.compile
    torch.compile = lambda fn, dynamic=None, mode=None, options=None: real(fn, backend=counter, dynamic=dynamic)
    root, seen, counts = tempfile.mkdtemp(), 0, []
    for i in range(args.runs):
        cli(["run", "method=bbb", "data=uci/yacht", "protocol.epochs=1", "protocol.splits=[0]", "progress=false",
             "hpo=fixed", "compile=true", f"method.lr={0.001 * (i + 1):.4f}", f"runs_root={root}/{i}"])
        counts.append(counter.frame_count - seen)
        seen = counter.frame_count
    by = collections.defaultdict(list)
    for i, n in enumerate(counts, 1):
        by[n].append(i)
    for n, runs in sorted(by.items()):
        span = f"{runs[0]}-{runs[-1]}" if runs == list(range(runs[0], runs[-1] + 1)) else str(runs)
        print(f"{len(runs)} runs compiled {n} frame(s): runs {span}")


if __name__ == "__main__":
    main()
