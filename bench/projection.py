"""Projected cost of ``make reproduce-tables`` with ``compile=true`` (issue 31, section 5), cell by cell: each record's
process-hours per phase (``bench/suite_cost.py``) divided by the step speed-up that ``bench/step_ab.py`` measured for
the cell's own method, protocol and data set (``--json``, default ``results/speed/step_ab.jsonl``).

    python bench/projection.py [--ratios results/speed/step_ab.jsonl] [--runs-root results/runs] [--markdown]

For a record of method m under protocol p on data set d, the speed-up is old / new of ``step_ab``'s medians (old: the
code of issue 31's base 5c21305; new: this code compiled), from the row measured at (m, p, d), else, for a UCI data
set, at (m, p, Boston); the latest such row. Another protocol's row is not used (its minibatch, samples and data
differ: BBB's R = 100 step is 2.1x faster on kin8nm under vadam_uci and 1.6x under nng_uci). Its selection rounds
are divided by the speed-up at R = 100 replicas (a Bayesian-optimisation round: 20 splits x 5 folds), its final
training by the one at R = 20 (the splits), each at the measured R nearest to these. Start-up, the evaluation after
training and failed runs are kept as recorded, and so is every phase of a method with no row (unmeasured or not
compilable: PBP, HMC, the logistic-regression methods, the MNIST and convolutional cells). Each compiled run also
pays its compilations: the row's cold-cache compile time once for the selection's shape and once for the final
run's (inductor's cache makes later processes cheaper; counted in full here).

What this is and is not: an estimate from the records' wall times, which carry the load each record was made under
and the code of its day (results/README.md, Cost of the suite: right in sum for two jobs on the two cores, off cell
by cell), scaled by step ratios measured in one window on one core. The steps are not the whole of a cell (the
evaluations during training, the data preparation of each round are not compiled), so the speed-up of a whole cell
is below its step's; that makes this a lower bound on the compiled suite's cost given the records. Only re-running the
tables measures it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from suite_cost import REPO, makefile_experiments, phase_seconds, read_runs  # bench/ heads sys.path

BOSTON = "uci/boston"
SELECTION_R, FINAL_R = 100, 20


def markdown(df: pd.DataFrame, index: bool = True) -> str:
    """A frame as a Markdown table (numbers right-aligned), without pandas' optional ``tabulate``."""
    frame = df.reset_index() if index else df
    cols = [str(c) for c in frame.columns]
    num = [pd.api.types.is_numeric_dtype(frame[c]) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("--:" if n else "---" for n in num) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def read_ratios(path: Path) -> pd.DataFrame:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df = df[df["compiled"] & ~df["base_compiled"]].copy()
    df["ratio"] = df["old_ms"] / df["new_ms"]
    return df.sort_values("when")


def pick(ratios: pd.DataFrame, method: str, protocol: str, data: str, R: int):
    """``(ratio, compile_s, source)`` of the most specific measured row for a cell, at the R nearest to ``R``;
    ``None`` where the method has none."""
    m = ratios[(ratios["method"] == method) & (ratios["protocol"] == protocol)]
    for rows, source in ((m[m["data"] == data], "own"),
                         (m[m["data"] == BOSTON] if data.startswith("uci/") else m[:0], "protocol on Boston")):
        if len(rows):
            near = rows[(rows["R"] - R).abs() == (rows["R"] - R).abs().min()]
            row = near.iloc[-1]
            return float(row["ratio"]), float(row["compile_s"]), f"{source} (R = {int(row['R'])})"
    return None


def project(runs: pd.DataFrame, ratios: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (``phase_seconds``) with the projected seconds per phase, the speed-ups used and their sources."""
    out = runs.copy()
    sel_src, fin_src, sel_r, fin_r, compile_s = [], [], [], [], []
    for _, r in out.iterrows():
        method, protocol = r["method"], r["protocol"]
        s = pick(ratios, method, protocol, r["dataset"], SELECTION_R) if method else None
        f = pick(ratios, method, protocol, r["dataset"], FINAL_R) if method else None
        sel_r.append(s[0] if s and r["selection"] > 0 else 1.0)
        fin_r.append(f[0] if f else 1.0)
        sel_src.append(s[2] if s and r["selection"] > 0 else "-")
        fin_src.append(f[2] if f else "unmeasured: as recorded")
        compile_s.append(((s[1] if s and r["selection"] > 0 else 0.0) + (f[1] if f else 0.0)) * r["processes"])
    out["selection_ratio"], out["training_ratio"] = sel_r, fin_r
    out["selection_source"], out["training_source"] = sel_src, fin_src
    out["proj_selection"] = out["selection"] / out["selection_ratio"]
    out["proj_training"] = out["training"] / out["training_ratio"]
    out["compile"] = compile_s
    out["proj_total"] = (out["startup"] + out["proj_selection"] + out["proj_training"] + out["after"] + out["failed"]
                         + out["compile"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ratios", type=Path, default=REPO / "results" / "speed" / "step_ab.jsonl")
    ap.add_argument("--runs-root", type=Path, default=REPO / "results" / "runs")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--sources", action="store_true", help="also list the speed-up each method and protocol used")
    ap.add_argument("--measured", action="store_true", help="only list the measured rows (the latest of each)")
    args = ap.parse_args(argv)
    if args.measured:
        df = read_ratios(args.ratios).drop_duplicates(["method", "protocol", "data", "R"], keep="last")
        df = df.sort_values(["method", "protocol", "data", "R"], ascending=[True, True, True, False])
        cols = ["method", "protocol", "data", "R", "old_ms", "new_ms", "ratio", "draws_ms", "compile_s", "when"]
        out = df[cols].round(2)
        print(markdown(out, index=False) if args.markdown else out.to_string(index=False))
        return 0
    experiments = makefile_experiments()
    runs = phase_seconds(read_runs(args.runs_root, experiments))
    runs = runs[runs["device"] == "cpu"]
    proj = project(runs, read_ratios(args.ratios))
    cols = {"recorded h": "total", "selection h": "selection", "-> h": "proj_selection", "training h": "training",
            "--> h": "proj_training", "compiling h": "compile", "projected h": "proj_total"}
    table = proj.groupby("experiment")[list(cols.values())].sum() / 3600
    table.loc["total"] = table.sum()
    table.columns = list(cols)
    print(markdown(table.round(2)) if args.markdown else table.round(2).to_string())
    rec, new = table.loc["total", "recorded h"], table.loc["total", "projected h"]
    unmeasured = proj[proj["training_source"].str.startswith("unmeasured")]
    print(f"\n{len(proj)} CPU records of make reproduce-tables' {len(experiments)} experiments: {rec:.1f} "
          f"process-hours recorded, {new:.1f} projected compiled; {unmeasured['total'].sum() / 3600:.1f} h of it in "
          f"{len(unmeasured)} records of methods with no measured step (kept as recorded).")
    if args.sources:
        src = (proj.groupby(["experiment", "method", "selection_source", "training_source"])
               .agg(runs=("total", "size"), hours=("total", "sum"), sel_ratio=("selection_ratio", "median"),
                    train_ratio=("training_ratio", "median")))
        src["hours"] /= 3600
        print()
        print(markdown(src.round(2)) if args.markdown else src.round(2).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
