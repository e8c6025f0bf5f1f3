"""Whole cells re-run by an old commit's code and by this code with ``compile=true``, in one window (issue 31,
section 5: the suite's cost before and after, measured rather than projected).

    PYTHONPATH=. python bench/cells_ab.py --cells "uci_leaderboard uci/yacht bbb,vogn" "nng_table1 uci/yacht noisy_adam"
        [--base 5c21305] [--base-compiled] [--fresh-inductor] [--out /tmp/bnnbench_cells_ab] [--cores 0,1]
        [--compare-only]

Each ``--cells`` item is ``<experiment> <data set> <labels>``, run as ``bnnbench reproduce <experiment> --data <data
set> --label <labels> threads=1`` into a runs root of each side's own (``<out>/old``, ``<out>/new``). The two sides
run at once, the old code (checked out into a worktree as ``bench/step_ab.py`` does; without this environment's
plugin methods, which are built for this tree) on the first core and this code compiled on the second, each side's
cells one after another in the same order, so both see the same load. Then every cell both sides recorded is
compared: wall time old / new (the records' ``wall_time_s``: selection, training, evaluation and the compilations)
and the difference of each side's RMSE and test log-likelihood in standard errors of the new one. A cell whose
protocol changed since the old commit (its configuration differs beyond ``compile``) is listed apart and not summed:
its old and new runs are not the same experiment. Prints the table and writes ``<out>/summary.json``.
``--base-compiled`` runs the old code with ``compile=true`` too (an A/B of two compiled codes, for a base that has the
setting); ``--fresh-inductor`` gives each side an empty inductor cache of its own (``<out>/<side>/inductor``), so that
both pay their compilations as a first run does.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from step_ab import REPO, worktree   # bench/ is the script's folder, so it heads sys.path

OLD_CLI = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
           "from step_ab import isolate_tree; isolate_tree(); import runpy; sys.argv[0] = 'bnnbench'; "
           "runpy.run_module('bnnbench', run_name='__main__')")


def side_command(tree: Path, old: bool, cell: list[str], root: Path, compiled: bool | None = None) -> list[str]:
    exp, data, labels = cell
    head = [sys.executable, "-c", OLD_CLI] if old else [sys.executable, "-m", "bnnbench"]
    return [*head, "reproduce", exp, "--data", data, "--label", labels, "--runs-root", str(root),
            "--out", str(root / "tables"), "--figures", str(root / "figures"), "progress=false", "threads=1",
            *(["compile=true"] if (not old if compiled is None else compiled) else [])]


def run_side(tree: Path, old: bool, cells: list[list[str]], root: Path, core: str | None,
             compiled: bool | None = None, fresh_inductor: bool = False) -> subprocess.Popen:
    """One side's cells, one after another, in a child shell (each cell's log beside its runs root)."""
    root.mkdir(parents=True, exist_ok=True)
    pin = ["taskset", "-c", core] if core is not None and shutil.which("taskset") else []
    lines = []
    for i, cell in enumerate(cells):
        cmd = shlex.join(pin + side_command(tree, old, cell, root, compiled))
        log = shlex.quote(f"{root}/cell{i}.log")
        # the exit status covers the tables reproduce renders at the end too: the records decide what is compared
        lines.append(f"{cmd} > {log} 2>&1 || echo 'cell {i}: reproduce exited non-zero, see cell{i}.log' "
                     f">> {shlex.quote(str(root / 'failed.txt'))}")
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if fresh_inductor:
        shutil.rmtree(root / "inductor", ignore_errors=True)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    return subprocess.Popen(["bash", "-c", "\n".join(lines)], cwd=str(tree), env=env)


def _metric(summary: dict, key: str):
    v = summary.get(key)
    return (v.get("mean"), v.get("stderr")) if isinstance(v, dict) else (v, None)


def protocol_changes(old: dict, new: dict) -> list[str]:
    """The settings of the old record's configuration that the new one sets otherwise or not at all, and the search
    axes and fixed values the new one adds (``compile``, ``rng`` and
    the schema's version apart; settings the schema gained since the old commit, absent from the old record, are not
    changes of the experiment, nor are the search's settings of a cell that searches nothing: ``hpo`` fixed or
    recorded on both sides)."""
    from bnnbench.run.results import flat_config
    fo, fn = flat_config(old["config"]), flat_config(new["config"])
    kinds = {fo.get("spec.hpo.kind"), fn.get("spec.hpo.kind")}
    unsearched = kinds <= {"fixed", "recorded", None}
    changed = {k for k, v in fo.items() if k not in ("compile", "rng", "config_schema")
               and not (unsearched and k.startswith("spec.hpo."))
               and json.dumps(v, default=str) != json.dumps(fn.get(k), default=str)}
    # a search axis or a fixed value the new configuration adds is a change of the experiment; a method setting it adds
    # is not (a new setting's default keeps the old behaviour: the committed records verify it)
    added = {k for k in fn.keys() - fo.keys() if k.startswith(("spec.space.", "spec.fixed."))}
    return sorted(changed | added)


def compare(out: Path) -> dict:
    rows = []
    for f in sorted((out / "new").glob("*/*/*/record.json")):
        rel = f.relative_to(out / "new")
        g = out / "old" / rel
        if not g.is_file():
            continue
        a, b = json.loads(g.read_text()), json.loads(f.read_text())
        row = {"experiment": rel.parts[0], "label": rel.parts[1], "data": rel.parts[2], "old_s": a["wall_time_s"],
               "new_s": b["wall_time_s"], "changed": protocol_changes(a, b)}
        for key in ("rmse", "loglik_pointwise", "loglik_joint", "pearson_corr_predvar_vs_hmc"):
            (ma, _), (mb, eb) = _metric(a["summary"], key), _metric(b["summary"], key)
            if ma is not None and mb is not None:
                row.setdefault("metrics", {})[key] = [ma, mb, (mb - ma) / eb if eb else None]
        rows.append(row)
    same = [r for r in rows if not r["changed"]]
    total = {"old_s": sum(r["old_s"] for r in same), "new_s": sum(r["new_s"] for r in same), "cells": len(same)}
    return {"cells": rows, "total": total}


def show(summary: dict) -> str:
    lines = [f"{'experiment':<16s} {'label':<18s} {'data':<11s} {'old s':>8s} {'new s':>8s} {'old/new':>8s}  metrics "
             "old -> new (new - old in new's standard errors)"]
    for r in summary["cells"]:
        ms = "  ".join(f"{k} {v[0]:.4f} -> {v[1]:.4f} ({'-' if v[2] is None else f'{v[2]:+.2f}'})"
                       for k, v in r.get("metrics", {}).items())
        flag = f"  [changed since the base: {', '.join(r['changed'][:4])}; not summed]" if r["changed"] else ""
        lines.append(f"{r['experiment']:<16s} {r['label']:<18s} {r['data'][5:]:<11s} {r['old_s']:8.1f} "
                     f"{r['new_s']:8.1f} {r['old_s'] / r['new_s']:7.2f}x  {ms}{flag}")
    t = summary["total"]
    if t["cells"]:
        lines.append(f"total over {t['cells']} cells of the same protocol: {t['old_s']:.0f} s -> {t['new_s']:.0f} s "
                     f"({t['old_s'] / t['new_s']:.2f}x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", default=[], help='"<experiment> <data set> <labels>" items')
    ap.add_argument("--base", default="5c21305")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bnnbench_cells_ab"))
    ap.add_argument("--cores", default="0,1", help="the old side's core and the new side's")
    ap.add_argument("--base-compiled", action="store_true", help="the old code with compile=true too")
    ap.add_argument("--fresh-inductor", action="store_true", help="each side an empty inductor cache of its own")
    ap.add_argument("--compare-only", action="store_true", help="compare what --out holds, run nothing")
    args = ap.parse_args(argv)
    if not args.compare_only:
        cells = [c.split() for c in args.cells]
        if not cells or any(len(c) != 3 for c in cells):
            ap.error('each --cells item is "<experiment> <data set> <labels>"')
        cores = args.cores.split(",")
        t = time.perf_counter()
        sides = [run_side(worktree(args.base), True, cells, args.out / "old", cores[0],
                          compiled=args.base_compiled, fresh_inductor=args.fresh_inductor),
                 run_side(REPO, False, cells, args.out / "new", cores[-1], fresh_inductor=args.fresh_inductor)]
        for p in sides:
            p.wait()
        print(f"both sides done in {time.perf_counter() - t:.0f} s")
    summary = compare(args.out)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(show(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
