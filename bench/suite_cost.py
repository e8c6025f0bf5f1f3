"""Process-hours of the suite, from its run records: per table (experiment) and per phase (start-up, selection rounds,
final training, evaluation after training), and the projected cost of ``make reproduce-tables`` on this machine.

    python bench/suite_cost.py [--runs-root results/runs] [--experiments a,b] [--markdown] [--no-measure]

What a record measures (``bnnbench/run/execute.py``), and so what each phase is here:

* ``hpo_time_s``: from the start of the run (its run directory claimed) to the end of the hyper-parameter selection,
  rounds replayed from a checkpoint included. It holds the run's own start-up (reading and checking the data set,
  resolving the protocol, building the method), measured alone by the records without a search (``hpo=fixed`` or
  ``recorded``): there ``hpo_time_s`` *is* the start-up.
* ``train_time_s``: the final training of every split, with the evaluations during it (every ``eval_every`` epochs and
  the final one). The evaluations are not timed apart, so they are not separable from the records: "training" below
  includes them (``history.json`` says how many there were, not what they cost).
* ``wall_time_s - hpo_time_s - train_time_s``: what follows the training: the posterior metrics (the exact-VI KL of
  the logistic-regression tables), sampler diagnostics, the stored predictive and the record itself. This is the
  "evaluation after training" phase (0 where the difference is negative: the wall time of a run resumed before
  d175337 counts only its last process, and a re-recorded run's wall is its old selection plus its new training).
  An active-learning run (NNG Table 3) records only its last round's training: all of ``wall - hpo`` (every round's
  training and the acquisitions between them) counts as its training.

Estimated, not measured:

* the start-up inside a searched run (``hpo=bo`` / ``grid``): the median start-up of the unsearched records of the same
  data set (any experiment), else of all of them, capped at the run's ``hpo_time_s``; the rest is "selection";
* the start-up outside the run, which no record holds: the Python process with torch and bnnbench imported (once per
  experiment: ``make reproduce-tables`` runs one ``bnnbench reproduce`` per experiment) and the Hydra composition of
  each cell. Both are measured here once, now (``--no-measure``: left out), and added to the projection only;
* tables and figures rendered at the end of each experiment (seconds each): not counted.

Process-hours: a phase's seconds times the processes it ran in (``workers=W``: the selection and the training in W
processes; everything else in one). A record made on a GPU (``device=cuda``) is GPU time, not this CPU's: it is
listed apart and left out of the projection. A run that failed (``failed.json``) counts its wall time in its own
column; ``reproduce`` runs it again, so the projection counts it. The projection is the sum, one cell after another as
``make reproduce-tables`` (``JOBS=1``) runs them; at ``JOBS=N`` it is at best 1/N of that, on N idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
PHASES = ("startup", "selection", "training", "after", "failed")
PHASE_NAMES = {"startup": "start-up", "selection": "selection rounds", "training": "final training (+ its evals)",
               "after": "evaluation after training", "failed": "failed runs"}
SEARCHED = ("bo", "grid")


def outcome(d: Path) -> tuple[Path, str] | None:
    """A run directory's ``record.json`` (status ``ok``), else its ``failed.json`` (``failed``: a run that stopped,
    e.g. on divergence), else None."""
    return next(((d / n, s) for n, s in (("record.json", "ok"), ("failed.json", "failed")) if (d / n).is_file()), None)


def read_runs(runs_root: Path, experiments: list[str] | None = None) -> pd.DataFrame:
    """One row per run directory (``<experiment>/<label>/<data set>``) holding a ``record.json`` or a ``failed.json``:
    the times it records and what decides its phases."""
    rows = []
    for d in sorted(Path(runs_root).glob("*/*/*")):
        exp, label, data = d.relative_to(runs_root).parts
        if experiments and exp not in experiments:
            continue
        found = outcome(d)
        if found is None:
            continue
        rec, status = json.loads(found[0].read_text()), found[1]
        cfg = rec.get("config") or {}
        rows.append({
            "experiment": exp, "label": label, "dataset": rec.get("dataset") or data, "status": status,
            "device": str(rec.get("device") or "cpu").split(":")[0],
            "processes": int(cfg.get("workers") or 1),
            "searched": ((cfg.get("spec") or {}).get("hpo") or {}).get("kind") in SEARCHED,
            "wall": float(rec.get("wall_time_s") or 0.0), "hpo": float(rec.get("hpo_time_s") or 0.0),
            "train": float(rec.get("train_time_s") or 0.0), "active": "active_learning" in rec,
            "method": rec.get("method"), "protocol": rec.get("protocol"), "compiled": bool(cfg.get("compile")),
            "commit": rec.get("git_commit"),
        })
    return pd.DataFrame(rows, columns=["experiment", "label", "dataset", "status", "device", "processes", "searched",
                                       "wall", "hpo", "train", "active", "method", "protocol", "compiled", "commit"])


def phase_seconds(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with the process-seconds of each phase (``PHASES``) and their sum ``total``, per run."""
    df = runs.copy()
    ok = df["status"] == "ok"
    unsearched = df[ok & ~df["searched"]]
    by_data = unsearched.groupby("dataset")["hpo"].median().to_dict()
    overall = float(unsearched["hpo"].median()) if len(unsearched) else 0.0
    df["startup"] = [min(h, by_data.get(ds, overall)) if s else h
                     for ds, s, h in zip(df["dataset"], df["searched"], df["hpo"])]
    df["selection"] = (df["hpo"] - df["startup"]) * df["processes"]
    # an active-learning run records only its last round's training: its earlier rounds (and the acquisitions between
    # them) fill the rest of its wall time, which counts as training here
    train = df["train"].where(~df["active"], (df["wall"] - df["hpo"]).clip(lower=0.0))
    df["training"] = train * df["processes"]
    df["after"] = (df["wall"] - df["hpo"] - train).clip(lower=0.0)
    df["failed"] = 0.0
    for k in PHASES[:-1]:
        df.loc[~ok, k] = 0.0
    df.loc[~ok, "failed"] = df.loc[~ok, "wall"]
    df["total"] = df[list(PHASES)].sum(axis=1)
    return df


def by(df: pd.DataFrame, key: str) -> pd.DataFrame:
    """Process-seconds per phase summed over ``key`` (``label`` or ``experiment``), with the number of runs."""
    out = df.groupby(key)[[*PHASES, "total"]].sum()
    out.insert(0, "runs", df.groupby(key).size())
    return out


def makefile_experiments(makefile: Path = REPO / "Makefile") -> list[str]:
    """The experiments ``make reproduce-tables`` runs (the Makefile's ``EXPERIMENTS``)."""
    m = re.search(r"^EXPERIMENTS\s*\?=\s*(.*)$", makefile.read_text(), flags=re.M)
    return m.group(1).split("#")[0].split() if m else []


def missing_cells(experiment: str, runs_root: Path) -> int:
    """Cells of ``experiment`` without a record or failure in ``runs_root``: ``reproduce`` runs them, at a cost no
    record gives."""
    from bnnbench.run.config import cell_label, experiment_spec
    from bnnbench.run.results import run_dir
    spec = experiment_spec(experiment)
    return sum(not any((run_dir(runs_root, experiment, cell_label(c), c["data"]) / n).is_file()
                       for n in ("record.json", "failed.json")) for c in spec["runs"])


def measure_startup(experiment: str) -> tuple[float, float]:
    """Seconds, now: a fresh Python importing what ``bnnbench reproduce`` imports, and one cell's Hydra composition."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import bnnbench.cli, bnnbench.run.execute"], check=True, cwd=REPO)
    import_s = time.perf_counter() - t
    from bnnbench.run.config import cell_overrides, compose, experiment_spec
    cell = experiment_spec(experiment)["runs"][0]
    ov = cell_overrides(experiment, cell, "results/runs")
    compose(ov)   # the first composition of a process also loads Hydra's plugins and the config tree
    t = time.perf_counter()
    compose([*ov, "seed=1"])
    return import_s, time.perf_counter() - t


def hours(s: float) -> str:
    h = s / 3600
    return "0" if s == 0 else "<0.01" if h < 0.01 else f"{h:.2f}"


def table(frame: pd.DataFrame, key: str, markdown: bool) -> str:
    cols = [key, "runs", *(PHASE_NAMES[p] for p in PHASES), "total"]
    rows = [[str(i), str(int(r["runs"])), *(hours(r[p]) for p in PHASES), hours(r["total"])]
            for i, r in frame.iterrows()]
    if markdown:
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] + ["--:"] * (len(cols) - 1)) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(c), *(len(r[k]) for r in rows)) for k, c in enumerate(cols)]
    fmt = lambda r: "  ".join(v.ljust(w) if k == 0 else v.rjust(w) for k, (v, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(cols), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)])


def report(runs_root: Path, experiments: list[str] | None, markdown: bool, measure: bool) -> str:
    df = phase_seconds(read_runs(runs_root, experiments))
    out = []
    h = (lambda t: f"### {t}") if markdown else (lambda t: f"== {t}")
    unit = "process-hours (h) per phase, from the run records"
    gpu = df[df["device"] != "cpu"]
    cpu = df[df["device"] == "cpu"]
    for exp, sub in cpu.groupby("experiment"):
        out += [h(f"{exp}: {unit}"), table(by(sub, "label"), "label", markdown), ""]
    out += [h(f"All experiments on this CPU: {unit}"), table(pd.concat([by(cpu, "experiment"), _total(cpu)]),
                                                          "experiment", markdown), ""]
    if len(gpu):
        out += [h("Records made on a GPU (GPU hours, not this CPU's; left out above)"),
                table(pd.concat([by(gpu, "experiment"), _total(gpu)]), "experiment", markdown), ""]
    est = int((cpu["searched"] & (cpu["status"] == "ok")).sum())
    out.append(f"Start-up inside the runs (data set, protocol, method), all {len(cpu)} CPU runs: "
               f"{cpu['startup'].sum():.1f} s.")
    neg = int(((cpu["wall"] - cpu["hpo"] - cpu["train"]) < 0).sum())
    out.append(f"Measured by the records: selection + start-up together, final training with its evaluations, and what "
               f"follows it. Estimated: the start-up inside the {est} searched runs (the median of the unsearched "
               f"runs' start-up on the same data set). {neg} of {len(cpu)} records have a wall time below selection + "
               "training (old resumed or re-recorded runs): their evaluation after training counts 0.")
    out.append("")
    make = [e for e in makefile_experiments() if experiments is None or e in experiments]
    proj = cpu[cpu["experiment"].isin(make)]
    gpu_make = gpu[gpu["experiment"].isin(make)]
    recorded = float(proj["total"].sum())
    missing = {e: missing_cells(e, runs_root) for e in make}
    cells = len(proj) + sum(missing.values())
    lines = [h("Projected cost of `make reproduce-tables` on this machine (JOBS=1, every cell afresh)"),
             f"experiments: {' '.join(make)}",
             f"recorded runs: {len(proj)} ({hours(recorded)} process-hours)"]
    total = recorded
    if measure and make:
        import_s, compose_s = measure_startup(make[0])
        outside = len(make) * import_s + cells * compose_s
        total += outside
        lines.append(f"start-up outside the runs, measured now: {len(make)} processes x {import_s:.1f} s + {cells} "
                     f"cell compositions x {compose_s:.2f} s = {hours(outside)} h")
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    lines.append(f"projected: {hours(total)} h on one core" + (f" (at best {hours(total / n)} h with JOBS={n} on all "
                 f"{n} cores, idle)" if n > 1 else "") + "; tables and figures (seconds each) not counted; the records "
                 "hold what each run took when it ran, many beside other jobs: on idle cores less")
    if sum(missing.values()):
        lines.append("not projected (no record: their cost is unknown): "
                     + ", ".join(f"{e} {n} cell(s)" for e, n in missing.items() if n))
    if len(gpu_make):
        lines.append(f"not projected (recorded on a GPU): {len(gpu_make)} runs")
    out.append("\n\n".join(lines) if markdown else "\n".join(lines))
    return "\n".join(out)


def _total(df: pd.DataFrame) -> pd.DataFrame:
    t = df[[*PHASES, "total"]].sum().to_frame("total").T
    t.insert(0, "runs", len(df))
    t.index = ["total"]
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs-root", default=str(REPO / "results" / "runs"))
    ap.add_argument("--experiments", help="only these experiments (comma list); default: every one with records")
    ap.add_argument("--markdown", action="store_true", help="Markdown tables (for results/README.md)")
    ap.add_argument("--no-measure", action="store_true",
                    help="do not measure the start-up outside the runs (a fresh process, a composition) now")
    args = ap.parse_args(argv)
    exps = args.experiments.split(",") if args.experiments else None
    print(report(Path(args.runs_root), exps, args.markdown, not args.no_measure))
    return 0


if __name__ == "__main__":
    sys.exit(main())
