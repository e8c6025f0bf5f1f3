"""Committed cells re-run by this code to measure what they cost now (issue 31, section 5: the suite's cost measured,
not projected from the records' wall times, which carry the load and the code of the day each was made).

    PYTHONPATH=. python bench/retime.py --cells "slang_table1 usps/3vs5 full_ef,full_hessian" [--compile] [--rng philox]
        [--out /tmp/bnnbench_retime] [--core 1] [--log results/speed/retime.jsonl]
    PYTHONPATH=. python bench/retime.py --compare-only --out /tmp/bnnbench_retime [--log ...]

Each ``--cells`` item is ``<experiment> <data set> <labels>`` (labels: a comma list, or ``all``), run one after
another as ``bnnbench reproduce <experiment> --data <data set> [--label <labels>] --runs-root <out> threads=1
[compile=true]`` on one core (``taskset``; a cell whose record ran with ``workers=W`` on W cores, ``--core 0,1``).
Then every record under ``<out>`` (or ``failed.json``: a run stopped on divergence, whose cost counts as well) is
paired with the committed record (or failure) of the same cell (``results/runs/<experiment>/<label>/<data set>``)
and one row per cell is appended to ``--log``: the recorded and the re-run's wall time and phases, whether the
re-run was compiled, the commit, and the cell's metrics side by side (their difference in the re-run's standard
errors; ``identical``: every summary metric the same to the last digit, as an eager re-run of a record's own
configuration gives). A cell whose configuration differs from its record's beyond ``compile``
(``bench/cells_ab.protocol_changes``), or whose run failed where the record did not or the other way round, is logged
with ``changed`` and not used by ``bench/projection.py``, which otherwise takes a re-run's times in place of its
record's.

    PYTHONPATH=. python bench/retime.py --sample 40 --seed 1 --frame-hours 0.5 --draw /tmp/draw.json --shard 0/2
        --core 0 --out /tmp/rs0 --compile     (and --shard 1/2 --core 1 --out /tmp/rs1, the same --draw)

draws a simple random sample (``--seed``) of 40 cells from the frame: the cells of ``make reproduce-tables`` with a
CPU record, no re-run logged yet (in results/speed/retime.jsonl or ``--log``) and a projected cost
(``bench/projection.py``, from the record) of at most ``--frame-hours``; runs its ``--shard`` i/k (the draw split into
k parts of about equal projected cost; one draw, written to ``--draw`` by the first shard and read by the others, in k
processes on k cores, each into its own ``--out``) and logs each row with the draw (``sample``: seed, frame, frame
size). From those rows ``bench/projection.py`` estimates what the frame's cells that were not re-run cost: their
projected hours times the ratio estimator sum(re-run) / sum(projected) of the sample, with its standard error.
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

import numpy as np

from cells_ab import _metric, protocol_changes   # bench/ is the script's folder, so it heads sys.path
from step_ab import REPO
from suite_cost import outcome

from bnnbench.run.numerics import record_class
from bnnbench.run.results import load_record, run_dir

RUNS = REPO / "results" / "runs"
LOG = REPO / "results" / "speed" / "retime.jsonl"


def cell_command(cell: list[str], root: Path, compile_: bool, rng: str = "torch") -> list[str]:
    exp, data, labels = cell
    return [sys.executable, "-m", "bnnbench", "reproduce", exp, "--data", data,
            *([] if labels == "all" else ["--label", labels]), "--runs-root", str(root),
            "--out", str(root / "tables"), "--figures", str(root / "figures"), "progress=false", "threads=1",
            *(["compile=true"] if compile_ else []), *([f"rng={rng}"] if rng != "torch" else [])]


def cores_in(spec: str) -> int:
    """How many cores a ``taskset -c`` list names (``"1"``, ``"0,1"``, ``"0-3,6"``)."""
    n = 0
    for part in spec.split(","):
        a, _, b = part.partition("-")
        n += int(b) - int(a) + 1 if b else 1
    return n


def recorded_workers(cell: list[str], runs: Path = RUNS) -> int:
    """The most worker processes (``workers``) any committed record of ``cell`` ran its replicas in (1 without)."""
    exp, data, labels = cell
    names = [p.name for p in (runs / exp).iterdir() if p.is_dir()] if labels == "all" else labels.split(",")
    recs = [load_record(run_dir(runs, exp, name, data)) for name in names]
    return max([int((r.get("config") or {}).get("workers") or 1) for r in recs if r is not None], default=1)


def run_cells(cells: list[list[str]], root: Path, compile_: bool, core: str | None, rng: str = "torch",
              runs: Path = RUNS) -> int:
    """The cells one after another on ``core``; the number that exited non-zero (each cell's log beside ``root``).
    A cell whose record ran in W worker processes needs W cores: pinned to fewer, its processes would share them and
    its wall time (counted W times in process-hours) would double; such a cell is refused before anything runs."""
    root.mkdir(parents=True, exist_ok=True)
    pin = ["taskset", "-c", core] if core is not None and shutil.which("taskset") else []
    if pin:
        short = [(" ".join(c), w) for c in cells if (w := recorded_workers(c, runs)) > cores_in(core)]
        if short:
            raise SystemExit(f"--core {core} pins {cores_in(core)} core(s), but these cells' records ran in more "
                             f"worker processes: {short}; pin as many cores (--core 0,1) or none (--core none)")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    failed = 0
    for i, cell in enumerate(cells):
        with open(root / f"cell{i}.log", "w") as log:
            print(f"{time.strftime('%H:%M:%S')} {shlex.join(cell)}", flush=True)
            failed += subprocess.run(pin + cell_command(cell, root, compile_, rng), cwd=REPO, env=env, stdout=log,
                                     stderr=subprocess.STDOUT).returncode != 0
    return failed


def draw(n: int, seed: int, frame_hours: float, log: Path | None) -> dict:
    """A simple random sample of ``n`` cells of the frame (module docstring), with the frame's size."""
    import projection as pj
    import pandas as pd
    _, x = pj.from_records(RUNS, pj.read_ratios(pj.REPO / "results" / "speed" / "step_ab.jsonl"))
    x = x[x["status"] == "ok"]
    key = ["experiment", "label", "dataset"]
    # the committed log's re-runs always, and ``log``'s: a scratch --log had let the frame of 2026-12-04 hold them
    done = [d[key] for d in (pj.read_retimed(p) for p in dict.fromkeys([LOG, *([log] if log else [])])) if not d.empty]
    if done:
        x = x.merge(pd.concat(done).drop_duplicates().assign(_done=True), on=key, how="left")
        x = x[x["_done"].isna()]
    frame = x[x["proj_total"] <= frame_hours * 3600].sort_values(key).reset_index(drop=True)
    if n > len(frame):
        raise SystemExit(f"the frame holds {len(frame)} cells, fewer than --sample {n}")
    pick = np.random.default_rng(seed).choice(len(frame), size=n, replace=False)
    cells = [{k: frame.loc[i, k] for k in key} | {"proj_s": float(frame.loc[i, "proj_total"])} for i in pick]
    return {"seed": seed, "frame_hours": frame_hours, "frame_cells": len(frame),
            "frame_proj_s": float(frame["proj_total"].sum()), "cells": cells}


def cost_s(wall: float, hpo: float, train: float) -> float:
    """A record's process-seconds as ``bench/suite_cost.py`` counts them: a resumed run's ``wall_time_s`` holds only
    its last process, its selection and training times all of them."""
    return max(wall, hpo + train)


def shard(cells: list[dict], i: int, k: int, cost=lambda c: c["proj_s"]) -> list[dict]:
    """Shard ``i`` of ``k`` of the drawn cells, balanced by their ``cost`` (default: the projected one): each cell,
    the costliest first, goes to the shard with the least so far (the same split in every shard's process)."""
    load, parts = [0.0] * k, [[] for _ in range(k)]
    for c in sorted(cells, key=lambda c: -cost(c)):
        j = load.index(min(load))
        parts[j].append(c)
        load[j] += cost(c)
    return parts[i]


def compare(root: Path, runs: Path = RUNS) -> list[dict]:
    """One row per run under ``root`` (a record, or a failure) that has a committed counterpart in ``runs``. A failed
    run is paired with a committed failure (its cost is what re-running that cell costs); a run whose outcome differs
    from its record's (one failed, the other not) is logged with the change and not used."""
    rows = []
    for d in sorted({f.parent for n in ("record.json", "failed.json") for f in root.glob(f"*/*/*/{n}")}):
        rel = d.relative_to(root)
        (f, status), recorded = outcome(d), outcome(runs / rel)
        if recorded is None:
            continue
        g, recorded_status = recorded
        a, b = json.loads(g.read_text()), json.loads(f.read_text())
        changed = protocol_changes(a, b) + ([f"outcome {recorded_status} -> {status}"]
                                            if status != recorded_status else [])
        numerics = record_class(b)   # the class the re-run ran in (its host's instruction sets; the mode ends it)
        row = {"experiment": rel.parts[0], "label": rel.parts[1], "dataset": b.get("dataset") or rel.parts[2],
               "status": status, **({"reason": b.get("reason")} if status == "failed" else {}),
               "recorded_s": a["wall_time_s"], "recorded_hpo_s": a.get("hpo_time_s") or 0.0,
               "recorded_train_s": a.get("train_time_s") or 0.0, "wall_s": b["wall_time_s"],
               "hpo_s": b.get("hpo_time_s") or 0.0, "train_s": b.get("train_time_s") or 0.0,
               "compile": bool((b.get("config") or {}).get("compile")), "changed": changed,
               "recorded_commit": a.get("git_commit"), "commit": b.get("git_commit"),
               "numerics": numerics, "mkl_any_vendor": "mkl any vendor" in numerics,   # BNNBENCH_MKL_ANY_VENDOR=1
               "rng": (b.get("config") or {}).get("rng") or "torch",
               "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime(f.stat().st_mtime))}
        metrics, identical, rel = {}, True, 0.0
        for key in sorted(set(a.get("summary") or {}) & set(b.get("summary") or {})):
            (ma, _), (mb, eb) = _metric(a["summary"], key), _metric(b["summary"], key)
            if not all(isinstance(v, (int, float)) for v in (ma, mb)):
                continue
            identical &= ma == mb
            rel = max(rel, abs(mb - ma) / max(abs(ma), 1e-300)) if ma != mb else rel
            metrics[key] = [ma, mb, (mb - ma) / eb if eb else None]
        row["metrics"], row["identical"], row["max_rel_diff"] = metrics, identical and bool(metrics), rel
        rows.append(row)
    manifest = root / "sample.json"
    if manifest.is_file():
        s = json.loads(manifest.read_text())
        drawn = {(c["experiment"], c["label"], c["dataset"]) for c in s["cells"]}
        tag = {k: s[k] for k in ("seed", "frame_hours", "frame_cells")}
        for row in rows:
            if (row["experiment"], row["label"], row["dataset"]) in drawn:
                row["sample"] = tag
    return rows


def _costs(r: dict) -> tuple[float, float]:
    return (cost_s(r["recorded_s"], r["recorded_hpo_s"], r["recorded_train_s"]),
            cost_s(r["wall_s"], r["hpo_s"], r["train_s"]))


def show(rows: list[dict]) -> str:
    lines = [f"{'experiment':<16s} {'label':<18s} {'data set':<22s} {'recorded s':>10s} {'re-run s':>9s} "
             f"{'ratio':>6s}  compiled  metrics"]
    for r in rows:
        worst = max((abs(v[2]) for v in r["metrics"].values() if v[2] is not None), default=0.0)
        how = ("identical" if r["identical"] else "no metrics" if not r["metrics"]
               else f"max |diff| {worst:.2f} SE, {r['max_rel_diff']:.1e} relative")
        flag = f"  [changed: {', '.join(r['changed'][:4])}]" if r["changed"] else ""
        flag += f"  [drawn, seed {r['sample']['seed']}]" if r.get("sample") else ""
        flag += f"  [failed: {r['reason']}]" if r.get("status") == "failed" else ""
        rec, new = _costs(r)
        lines.append(f"{r['experiment']:<16s} {r['label']:<18s} {r['dataset']:<22s} {rec:10.1f} "
                     f"{new:9.1f} {rec / new:5.2f}x  {'yes' if r['compile'] else 'no':>8s}"
                     f"  {how}{flag}")
    same = [r for r in rows if not r["changed"]]
    if same:
        rec, new = (sum(c) for c in zip(*map(_costs, same)))
        lines.append(f"{len(same)} cells of their records' configuration: {rec:.0f} s recorded, {new:.0f} s re-run "
                     f"({rec / new:.2f}x); {sum(r['identical'] for r in same)} with identical metrics")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", action="extend", default=[],
                    help='"<experiment> <data set> <labels|all>" items (the flag may be repeated)')
    ap.add_argument("--compile", action="store_true", help="re-run with compile=true (default: as the records ran)")
    ap.add_argument("--rng", default="torch", choices=["torch", "philox"],
                    help="re-run with this rng (core/prng.py; default: torch's, as the records ran)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bnnbench_retime"), help="the re-runs' runs root")
    ap.add_argument("--core", default="1",
                    help="the cores the cells run on (a taskset list: 1, 0,1; none: not pinned); a cell whose record "
                         "ran with workers=W needs W of them")
    ap.add_argument("--log", default=str(LOG), help="append one row per compared cell here ('': nowhere)")
    ap.add_argument("--compare-only", action="store_true", help="compare what --out holds, run nothing")
    ap.add_argument("--sample", type=int, help="draw this many cells of the frame at random instead of --cells")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--frame-hours", type=float, default=0.5)
    ap.add_argument("--shard", default="0/1", help="i/k: run the i-th of k parts of the draw")
    ap.add_argument("--draw", type=Path, help="the draw's file: written by the first shard, read by the others")
    ap.add_argument("--show-log", action="store_true", help="print the latest row of each cell in --log, run nothing")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.show_log:
        latest = {}
        for r in map(json.loads, Path(args.log).read_text().splitlines()):
            latest[(r["experiment"], r["label"], r["dataset"])] = r
        print(show(sorted(latest.values(), key=lambda r: (r["experiment"], r["label"], r["dataset"]))))
        return 0
    failed = 0
    if args.sample and not args.compare_only:
        if args.draw and args.draw.is_file():   # the other shards': one draw for all of them
            s = json.loads(args.draw.read_text())
        else:
            s = draw(args.sample, args.seed, args.frame_hours, Path(args.log) if args.log else None)
            if args.draw:
                args.draw.write_text(json.dumps(s, indent=1))
        i, k = map(int, args.shard.split("/"))
        s["cells"] = shard(s["cells"], i, k)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sample.json").write_text(json.dumps(s, indent=1))
        args.cells = [f"{c['experiment']} {c['dataset']} {c['label']}" for c in s["cells"]]
    if not args.compare_only:
        cells = [c.split() for c in args.cells]
        if not cells or any(len(c) != 3 for c in cells):
            ap.error('each --cells item is "<experiment> <data set> <labels|all>"')
        failed = run_cells(cells, args.out, args.compile, None if args.core == "none" else args.core, args.rng)
    rows = compare(args.out)
    print(show(rows))
    if rows and args.log:
        log = Path(args.log)
        log.parent.mkdir(parents=True, exist_ok=True)
        seen = {(r["experiment"], r["label"], r["dataset"], r["wall_s"])
                for r in map(json.loads, log.read_text().splitlines() if log.is_file() else [])}
        with open(log, "a") as f:
            for r in rows:
                if (r["experiment"], r["label"], r["dataset"], r["wall_s"]) not in seen:   # logged before
                    f.write(json.dumps(r) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
