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

A cell that ``bench/retime.py`` re-ran with this code (``--retimed``, default ``results/speed/retime.jsonl``; its
configuration the record's) counts with its re-run's wall time and phases instead of its record's: as measured where
it ran compiled, else divided by the step speed-ups like a record.

What this is and is not: for the other cells, an estimate from the records' wall times, which carry the load each
record was made under and the code of its day (results/README.md, Cost of the suite: right in sum for two jobs on
the two cores, off cell by cell), scaled by step ratios measured in one window on one core. The steps are not the
whole of a cell (the evaluations during training, the data preparation of each round are not compiled), so the
speed-up of a whole cell is below its step's; that makes this a lower bound on the compiled suite's cost given the
records. A ratio moves with the window it was measured in: over the cases with three or more rows, the old code's
step differs by a median factor of 1.6 between its fastest and its slowest window (2026-12-04); SLANG's on kin8nm
took 42.0 ms on 2026-12-03 and 26.2 ms on 2026-12-04, the new code's 16.3 and 13.4 ms (1.1x of which its own
speed-up), so a case's latest row can lower its ratio where the code got faster. Only re-running the tables measures
the cost; the re-runs and the sample estimate are the measured part of this.
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


def _modes(df: pd.DataFrame, mkl_any_vendor: bool, rng: str) -> pd.DataFrame:
    """The rows measured in the modes asked for or in fewer (``BNNBENCH_MKL_ANY_VENDOR``, ``rng=philox``), with
    ``mode``: how many of them each row ran in (sorted on, so that a case's row in the most of them comes last)."""
    mkl = df["mkl_any_vendor"].fillna(False).astype(bool) if "mkl_any_vendor" in df else pd.Series(False, df.index)
    philox = df["rng"].fillna("torch").eq("philox") if "rng" in df else pd.Series(False, df.index)
    df = df.assign(mode=mkl.astype(int) + philox.astype(int))
    return df[(~mkl | mkl_any_vendor) & (~philox | (rng == "philox"))]


def read_ratios(path: Path, mkl_any_vendor: bool = False, rng: str = "torch") -> pd.DataFrame:
    """``step_ab``'s rows of the compiled new code against the eager old, in time order (``pick`` takes the latest).
    By default those measured without ``BNNBENCH_MKL_ANY_VENDOR`` and with torch's draws in the new code; with
    ``mkl_any_vendor`` (``rng="philox"``), those measured with it, ordered after the others, so that a case measured
    only without it keeps its row (where the mode speeds the case up, a lower bound on its gain)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    plain = df["overrides"].isna() if "overrides" in df else pd.Series(True, df.index)   # step_ab --set: not a cell's
    df = _modes(df[df["compiled"] & ~df["base_compiled"] & plain], mkl_any_vendor, rng).copy()
    df["ratio"] = df["old_ms"] / df["new_ms"]
    return df.sort_values(["mode", "when"])


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


def read_retimed(path: Path, mkl_any_vendor: bool = False, rng: str = "torch") -> pd.DataFrame:
    """``bench/retime.py``'s rows: the latest re-run of each cell whose configuration is its record's. As
    ``read_ratios``: by default the re-runs without ``BNNBENCH_MKL_ANY_VENDOR`` and with torch's draws; with
    ``mkl_any_vendor`` (``rng="philox"``), a cell's re-runs with it after those without (rows of before 2026-12-03 say
    nothing of the mode, nor rows of before 2026-12-04 of the draws: they ran without them). A cell drawn into a
    random sample (``--sample``) keeps its ``sample`` tag when a later re-run, not drawn, replaces its row: it stays in
    the sample, ``sample_estimate`` taking its latest re-run's cost. A row names the record it re-ran by the record's
    commit (``recorded_commit``): the latest row per cell and recorded commit is kept, and ``with_retimed`` pairs a
    record only with a re-run of itself, not of a record its cell had before."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    df = pd.DataFrame(rows, columns=["experiment", "label", "dataset", "wall_s", "hpo_s", "train_s", "compile",
                                     "changed", "when"] if not rows else None)
    if df.empty:
        return df
    for col in ("sample", "recorded_commit"):
        if col not in df:
            df[col] = None
    df = _modes(df, mkl_any_vendor, rng)
    df = df[df["changed"].map(len) == 0].sort_values(["mode", "when"])
    key = ["experiment", "label", "dataset"]
    drawn = df[df["sample"].notna()].drop_duplicates(key, keep="last").set_index(key)["sample"]
    df = df.drop_duplicates(key + ["recorded_commit"], keep="last").set_index(key)
    df["sample"] = drawn.reindex(df.index)
    return df.reset_index()


def with_retimed(runs: pd.DataFrame, retimed: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (``read_runs``) with each re-timed cell's wall time and phases those of its re-run, and the columns
    ``retimed`` and ``retimed_compiled``. A failed run's re-run (failed too: ``bench/retime.compare``) replaces its wall
    time, which counts whole as the phase ``failed``. A re-run counts only for the record it re-ran (its
    ``recorded_commit`` the record's ``commit``; a failed run records none)."""
    out = runs.copy()
    out["retimed"] = out["retimed_compiled"] = False
    if retimed.empty:
        return out
    key = ["experiment", "label", "dataset"]
    m = out[key + ["commit"]].merge(retimed, left_on=key + ["commit"], right_on=key + ["recorded_commit"], how="left")
    status = m["status"].fillna("ok").to_numpy() if "status" in m else "ok"   # rows of before 2026-12-04: records
    hit = m["wall_s"].notna().to_numpy() & (out["status"].to_numpy() == status)
    for col, src in (("wall", "wall_s"), ("hpo", "hpo_s"), ("train", "train_s")):
        out.loc[hit, col] = m.loc[hit, src].astype(float).to_numpy()
    out.loc[hit, "retimed"] = True
    out.loc[hit, "retimed_compiled"] = m.loc[hit, "compile"].astype(bool).to_numpy()
    return out


def sample_estimate(base: pd.DataFrame, proj: pd.DataFrame, retimed: pd.DataFrame) -> dict | None:
    """The suite's cost with the frame's cells that were not re-run estimated from ``bench/retime.py``'s random sample
    (its ``sample`` rows; one draw): the ratio estimator r = sum(y) / sum(x) over the n sampled cells, x a cell's
    projection from its record (``base``), y from its re-run (``proj``), applied to the X seconds the frame's other
    cells project to; its standard error X se(r), se(r)^2 = (1 - n / N) sum (y - r x)^2 / ((n - 1) n mean(x)^2)
    (Cochran, Sampling Techniques, 1977, Sec. 6.3). The frame: the cells projected at most ``frame_hours`` from their
    records, N of them when drawn. A sampled cell whose record has gone since (its column moved to another data set)
    leaves the sample and the frame (``dropped``). Every other cell counts as ``proj`` has it (re-run, recorded
    compiled or projected)."""
    if retimed.empty or retimed["sample"].isna().all():
        return None
    key = ["experiment", "label", "dataset"]
    tags = retimed["sample"].dropna()
    tag = tags.iloc[-1]
    drawn = retimed[retimed["sample"].map(lambda t: t == tag)][key]
    x = base.set_index(key)["proj_total"]
    y = proj.set_index(key)["proj_total"].reindex(x.index)
    idx = pd.MultiIndex.from_frame(drawn)
    idx = idx[idx.isin(x.index)]
    dropped = len(drawn) - len(idx)
    xs, ys = x.reindex(idx).to_numpy(), y.reindex(idx).to_numpy()
    n, N = len(xs), int(tag["frame_cells"]) - dropped
    r = ys.sum() / xs.sum()
    se_r = (((1 - n / N) * ((ys - r * xs) ** 2).sum() / ((n - 1) * n)) ** 0.5 / xs.mean()) if n > 1 else float("nan")
    paired = proj.set_index(key)["retimed"].reindex(x.index).fillna(False).astype(bool).to_numpy()
    ok = (base["status"] == "ok").to_numpy()   # the frame holds no failed run: it counts as recorded
    measured = base["compiled"].astype(bool).to_numpy()   # a record made compiled is measured: not estimated
    rest = ~paired & (x <= tag["frame_hours"] * 3600).to_numpy() & ok & ~measured
    X, other = float(x[rest].sum()), float(y[~rest].sum())
    return {"n": n, "N": N, "dropped": dropped, "frame_hours": tag["frame_hours"], "seed": tag["seed"],
            "ratio": float(r),
            "ratio_se": float(se_r), "rest_cells": int(rest.sum()), "rest_projected_s": X,
            "total_s": other + r * X, "total_se_s": X * se_r}


def from_records(runs_root: Path, ratios: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The records of ``make reproduce-tables``' experiments (``read_runs``) and their CPU cells projected from the
    records alone (no re-run counted): the frame ``bench/retime.py`` draws from and ``sample_estimate``'s x."""
    records = read_runs(runs_root, makefile_experiments())
    base = phase_seconds(records)
    return records, project(base[base["device"] == "cpu"], ratios)


def project(runs: pd.DataFrame, ratios: pd.DataFrame) -> pd.DataFrame:
    """``runs`` (``phase_seconds``) with the projected seconds per phase, the speed-ups used and their sources. A cell
    re-run compiled (``retimed_compiled``) keeps its re-run's phases, and a record made compiled (``compiled``) that
    was not re-run its own: they are measured, compilations included."""
    out = runs.copy()
    sel_src, fin_src, sel_r, fin_r, compile_s = [], [], [], [], []
    for _, r in out.iterrows():
        measured = ("re-run compiled" if r.get("retimed_compiled", False) else
                    "recorded compiled" if r.get("compiled", False) and not r.get("retimed", False) else None)
        if measured:
            sel_r.append(1.0), fin_r.append(1.0), compile_s.append(0.0)
            sel_src.append(measured), fin_src.append(measured)
            continue
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
    ap.add_argument("--retimed", type=Path, default=REPO / "results" / "speed" / "retime.jsonl",
                    help="bench/retime.py's re-runs, used in place of their cells' records")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--sources", action="store_true", help="also list the speed-up each method and protocol used")
    ap.add_argument("--measured", action="store_true", help="only list the measured rows (the latest of each)")
    ap.add_argument("--mkl-any-vendor", action="store_true",
                    help="the step ratios and re-runs measured with BNNBENCH_MKL_ANY_VENDOR=1 (core/linalg/mkl_vendor) "
                         "where there are any, else those without")
    ap.add_argument("--rng", default="torch", choices=["torch", "philox"],
                    help="philox: the step ratios and re-runs measured with rng=philox (core/prng.py) where there are "
                         "any, else those with torch's draws")
    args = ap.parse_args(argv)
    if args.measured:
        df = read_ratios(args.ratios, args.mkl_any_vendor, args.rng)
        df = df.drop_duplicates(["method", "protocol", "data", "R"], keep="last")
        df = df.sort_values(["method", "protocol", "data", "R"], ascending=[True, True, True, False])
        cols = ["method", "protocol", "data", "R", "old_ms", "new_ms", "ratio", "draws_ms", "compile_s", "when"]
        out = df[cols].round(2)
        print(markdown(out, index=False) if args.markdown else out.to_string(index=False))
        return 0
    experiments = makefile_experiments()
    ratios = read_ratios(args.ratios, args.mkl_any_vendor, args.rng)
    retimed = read_retimed(args.retimed, args.mkl_any_vendor, args.rng)
    records, base = from_records(args.runs_root, ratios)
    runs = phase_seconds(with_retimed(records, retimed))
    runs["recorded"] = phase_seconds(records)["total"]
    proj = project(runs[runs["device"] == "cpu"], ratios)
    cols = {"recorded h": "recorded", "re-run cells": "retimed", "selection h": "selection", "-> h": "proj_selection",
            "training h": "training", "--> h": "proj_training", "compiling h": "compile", "failed runs h": "failed",
            "projected h": "proj_total"}
    table = proj.groupby("experiment")[list(cols.values())].sum() / 3600
    table["retimed"] = proj.groupby("experiment")["retimed"].sum()
    table.loc["total"] = table.sum()
    table["retimed"] = table["retimed"].astype(int)
    table.columns = list(cols)
    print(markdown(table.round(2)) if args.markdown else table.round(2).to_string())
    rec, new = table.loc["total", "recorded h"], table.loc["total", "projected h"]
    unmeasured = proj[proj["training_source"].str.startswith("unmeasured")]
    kept = unmeasured["proj_total"].sum() / 3600
    print(f"\n{len(proj)} CPU records of make reproduce-tables' {len(experiments)} experiments: {rec:.1f} "
          f"process-hours recorded, {new:.1f} projected compiled; {kept:.1f} h of it in {len(unmeasured)} records of "
          "methods with no measured step (kept as recorded or re-run).")
    re = proj[proj["retimed"]]
    if len(re):
        print(f"{len(re)} cells re-run by this code (bench/retime.py; {int(re['retimed_compiled'].sum())} compiled): "
              f"{re['recorded'].sum() / 3600:.2f} h recorded, {re['total'].sum() / 3600:.2f} h re-run, "
              f"{re['proj_total'].sum() / 3600:.2f} h projected.")
    est = sample_estimate(base, proj, retimed)
    if est:
        left = f" ({est['dropped']} sampled cells without a record now left out)" if est["dropped"] else ""
        print(f"Estimated from a random sample (seed {est['seed']}) of {est['n']} of the {est['N']} cells projected "
              f"at most {est['frame_hours']} h from their records{left}: re-run / projected {est['ratio']:.3f} +- "
              f"{est['ratio_se']:.3f}, applied to the {est['rest_cells']} such cells not re-run "
              f"({est['rest_projected_s'] / 3600:.1f} h projected): the suite {est['total_s'] / 3600:.1f} +- "
              f"{est['total_se_s'] / 3600:.1f} process-hours compiled.")
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
