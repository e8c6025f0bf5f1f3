"""Tables: our run records against the published numbers.

A table is built from an *experiment spec* (a plain dict, e.g.
``OmegaConf.to_container(cfg.experiment)``) and a runs root holding
``<runs_root>/<experiment>/<method>/<dataset_slug>/record.json`` files.  The
result is a long :class:`pandas.DataFrame` with one row per published cell of
the selected methods x datasets x metrics (the keys ``dataset, method, setting,
metric`` are spelled as in the reference CSV, so rows join back to it), our
number, the paper's number and a verdict.

The published tables and their reading are in :mod:`bnnbench.judge.reference`, the
verdict rule in :mod:`bnnbench.judge.verdicts`, the Markdown and LaTeX renderings
(both fed from the one frame) in :mod:`bnnbench.present.render`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from bnnbench.judge.paired import PAIRED_METRICS
from bnnbench.judge.reference import (KEYS, column_dataset, dataset_ref_name, read_reference, reference_path,
                                      spec_methods, spec_metrics)
from bnnbench.run.results import FAILED, RECORD, load_record, run_dir
from bnnbench.judge.verdicts import as_decimal, decimal_places, is_missing, norm_keys, verdict

__all__ = [
    "COLUMNS",
    "build_table",
    "load_table",
]

COLUMNS = KEYS + ["ours", "ours_se", "paper", "paper_err", "verdict"]
EXTRA_COLUMNS = [
    "z",
    "rel_diff",
    "n",
    "wall_time_s",
    "our_method",
    "our_dataset",
    "our_metric",
    "higher_is_better",
    "kind",
    "paper_printed",
    "paper_err_printed",
    "scale",
    "error_kind",
    "stderr_convention",
    "run_status",
    "protocol",
    "selected",
    "judged_at",        # the precision the verdict used: the paper's printed decimals or the reference's
    "reference_value",  # the reference's own value (scaled) where the verdict used the printed one
]


def _protocol_of(rec: Mapping | None) -> str:
    """The protocol a record ran under, with its training stages (SLANG Table 3 on CPU runs shortened ones)."""
    if rec is None:
        return ""
    out = str(rec.get("protocol") or "")
    stages = rec.get("stages") or []
    spec = (rec.get("config") or {}).get("spec") or {}
    if stages:
        out += " (" + " + ".join(f"{s['epochs']} ep. on {s['n_train']}" for s in stages) + ")"
    elif spec.get("epochs") and isinstance(spec.get("splits"), list):
        out += f" ({spec['epochs']} ep. on split {', '.join(map(str, spec['splits']))})"
    return out


def _summary_of(rec: Mapping, key: str) -> tuple[float, float, float]:
    """(mean, stderr, n) of our metric ``key`` in a record."""
    nan = float("nan")
    summ = (rec.get("summary") or {}).get(key)
    if isinstance(summ, Mapping) and not is_missing(summ.get("mean")):
        se = summ.get("stderr")
        n = summ.get("n")
        return (float(summ["mean"]),
                nan if is_missing(se) else float(se),
                nan if is_missing(n) else float(n))
    # fall back to the per-split metrics, with the std(ddof=0)/sqrt(n) convention
    vals = []
    for row in rec.get("metrics") or []:
        v = row.get(key) if isinstance(row, Mapping) else None
        if not is_missing(v):
            vals.append(float(v))
    return _mean_se(vals)


def _mean_se(vals) -> tuple[float, float, float]:
    """(mean, std(ddof=0)/sqrt(n), n) of per-split values; NaNs when there are none."""
    if not len(vals):
        return float("nan"), float("nan"), float("nan")
    a = np.asarray(vals, dtype=float)
    return float(a.mean()), float(a.std(ddof=0) / math.sqrt(len(a))), float(len(a))


def _paired_summary(runs_root: Path, name: str, mid: str, ds: str, mm: Mapping
                    ) -> tuple[tuple, str | None, str | None]:
    """(mean, stderr, n) of a metric between this column's run and the run ``mm["against"]`` on the same splits
    (``bnnbench.judge.paired``, e.g. Table 4's correlation of predictive variances with HMC's); the reason when there is
    none: the reference run unfinished, or no stored predictive; and why the reference is flagged (its sampler's
    ``diagnostics``: an R-hat above the threshold), else None: such a cell is inconclusive (``build_table``)."""
    nan = float("nan")
    kind = str(mm.get("paired") or "predvar_corr")
    if kind not in PAIRED_METRICS:
        raise ValueError(f"unknown paired metric {kind!r}; valid: {sorted(PAIRED_METRICS)}")
    against = str(mm["against"])
    ref, status = _load(run_dir(runs_root, name, against, ds))
    if ref is None:
        return (nan, nan, nan), f"reference run {against}: {status}", None
    vals = PAIRED_METRICS[kind](run_dir(runs_root, name, mid, ds), run_dir(runs_root, name, against, ds))
    if vals is None:
        return (nan, nan, nan), "no predictive.npz (protocol.save_predictive)", None
    flag = _flag_of(ref)
    return _mean_se(vals), None, (f"reference {against} {flag}" if flag else None)   # "reference hmc flagged: ..."


def _flag_of(rec: Mapping | None) -> str | None:
    """Why a finished run is flagged (its sampler's ``diagnostics``: an R-hat above the threshold), else None."""
    diag = (rec or {}).get("diagnostics") or {}
    if not diag.get("flagged"):
        return None
    rhat = [v for k in ("rhat_mean_max", "rhat_var_max") for v in (diag.get(k) or [])]
    if rhat:
        return f"flagged: R-hat {max(rhat):.2f} > {diag.get('rhat_threshold', 1.1)}"
    return "flagged: " + str(diag.get("summary") or "diagnostics")


def _load(rec_dir: Path) -> tuple[dict | None, str]:
    """A run directory's finished record (None otherwise) and its status: ok | failed | unreadable | missing."""
    rec = load_record(rec_dir)
    if rec is None:
        return None, "failed" if (rec_dir / FAILED).exists() else (
            "unreadable" if (rec_dir / RECORD).exists() else "missing")
    st = rec.get("status", "ok")
    return (rec, "ok") if st == "ok" else (None, f"status:{st}")


def _column_record(runs_root: Path, name: str, mid: str, m: Mapping, ds: str) -> tuple[dict | None, str, str]:
    """The record behind a table column on a data set, its status and the run label it came from.

    A column with ``candidates`` (run labels: a paper's grid search) takes the candidate whose summary metric
    ``select_by`` (default ``elbo``, larger is better) is best, as papers that select settings by the training
    objective do; it is ``missing`` until every candidate has a finished record (no choice among part of a grid).
    A column with ``runs_of: <experiment>`` reads that experiment's runs (two papers that print the same baseline)."""
    name = m.get("runs_of", name)
    cands = m.get("candidates")
    if not cands:
        rec, status = _load(run_dir(runs_root, name, mid, ds))
        return rec, status, mid
    key = str(m.get("select_by") or "elbo")
    loaded = [(c, *_load(run_dir(runs_root, name, str(c), ds))) for c in cands]
    done = [(c, r) for c, r, st in loaded if r is not None]
    if len(done) < len(loaded):
        bad = [f"{c}: {st}" for c, r, st in loaded if r is None]
        return None, f"grid incomplete ({len(done)} of {len(loaded)}; " + ", ".join(bad) + ")", ""
    score = {c: _summary_of(r, key)[0] for c, r in done}
    if any(math.isnan(v) for v in score.values()):
        return None, f"metric_missing ({key})", ""
    best = max(done, key=lambda cr: score[cr[0]])
    return best[1], "ok", str(best[0])


def _names(path) -> str:
    return ", ".join(p.name for p in path) if isinstance(path, list) else path.name


def _candidates_note(cell) -> str:
    """The printed values an unattributed reference cell may hold (its notes), '' when it has none."""
    notes = "" if is_missing(cell.get("notes")) else str(cell["notes"])
    if not notes.startswith("AMBIGUOUS"):
        return ""
    head = "candidate printed value(s): "
    if head in notes:
        return "? " + notes.split(head, 1)[1].split(";", 1)[0]
    return "?"


def _printed_index(spec: Mapping, reference_dir) -> dict[tuple, pd.Series]:
    """``printed_reference: {file, table}``: the paper's table as printed, for a spec whose ``reference`` carries more
    digits (the authors' CSV): cells are judged at the precision the paper printed."""
    pr = spec.get("printed_reference")
    if not pr:
        return {}
    ref = read_reference(reference_path({"name": spec.get("name"), "reference": pr["file"]}, reference_dir))
    if pr.get("table"):
        ref = ref[ref["table"] == str(pr["table"])]
    return {(r["dataset"], r["method"], r["setting"], r["metric"]): r for _, r in ref.iterrows()
            if not is_missing(r["value"])}


def _judged_against(cell, p_dec, e_dec, scale: float, printed_index: Mapping) -> dict:
    """The value, error and scale a verdict compares with: the reference's own, or, where the paper printed the cell
    with fewer digits than the reference carries, the printed value (its decimals set the rounding rule and the
    half-unit floor of e) with the reference's error brought to the printed scale."""
    own = {"value": cell["value"], "error": cell["error"], "error_printed": cell["error"], "scale": scale,
           "printed": False,
           "judged_at": f"{decimal_places(p_dec)} decimals (reference)" if p_dec is not None else ""}
    printed = printed_index.get((cell["dataset"], cell["method"], cell["setting"], cell["metric"]))
    if printed is None or p_dec is None:
        return own
    pv = as_decimal(printed["value"])
    p_scale = float(printed["scale"]) if not is_missing(printed["scale"]) else 1.0
    if decimal_places(pv) - math.log10(p_scale) >= decimal_places(p_dec) - math.log10(scale):
        return own   # the reference is no more precise than the print
    err = None if e_dec is None else float(e_dec) * scale / p_scale
    return {"value": printed["value"], "error": "" if err is None else repr(err),
            "error_printed": "" if err is None else f"{err:.{decimal_places(pv)}f}", "scale": p_scale,
            "printed": True, "judged_at": f"{decimal_places(pv)} decimals (as printed)"}


def _reference_cells(spec: dict, reference_dir) -> pd.DataFrame:
    """The published cells of the spec's paper and table (``ValueError`` when none)."""
    ref = read_reference(reference_path(spec, reference_dir))
    if spec.get("table"):
        ref = ref[ref["table"] == str(spec["table"])]
    if spec.get("paper") and (ref["paper"] == str(spec["paper"])).any():
        ref = ref[ref["paper"] == str(spec["paper"])]
    if ref.empty:
        raise ValueError(f"spec {spec.get('name')!r}: reference selection is empty")
    return ref


def _ours(rec: Mapping | None, run_status: str, runs_root: Path, name: str, column: str, m: Mapping, key: str,
          mm: Mapping, ds: str) -> dict:
    """Our side of one cell from its column's record: ``ours, ours_se, n, wall_time_s, stderr_convention,
    run_status`` and the flag of a paired metric's reference run (``ref_flag``, or None)."""
    nan = float("nan")
    if rec is None:
        return {"ours": nan, "ours_se": nan, "n": nan, "wall_time_s": nan, "stderr_convention": "",
                "run_status": run_status, "ref_flag": None}
    paired_status = ref_flag = None
    if mm.get("against"):
        (ours, se, n), paired_status, ref_flag = _paired_summary(runs_root, name, column, ds, mm)
    else:   # a column may read another metric of its records (Dropout: per-point LL)
        ours, se, n = _summary_of(rec, (m.get("metric_keys") or {}).get(key, key))
    if mm.get("se_metric") and n == 1:  # one run: the metric's own standard error (binomial)
        se = _summary_of(rec, mm["se_metric"])[0]
    wall = rec.get("wall_time_s")
    status = run_status if not math.isnan(ours) else (paired_status or "metric_missing")
    status = (_flag_of(rec) if not math.isnan(ours) else None) or status
    if ref_flag and not math.isnan(ours):   # the reference's flag first: it sets the verdict
        status = ref_flag + ("; " + status if status.startswith("flagged") else "")
    return {"ours": ours, "ours_se": se, "n": n, "wall_time_s": nan if is_missing(wall) else float(wall),
            "stderr_convention": str(rec.get("stderr_convention") or ""), "run_status": status, "ref_flag": ref_flag}


def _judged_row(cell, scale: float, ours: dict, mm: Mapping, judge: dict, unattributed: bool) -> dict:
    """The paper's side of one cell and the verdict: ``paper, paper_err, verdict, z, rel_diff, scale,
    paper_printed, paper_err_printed, judged_at, reference_value``."""
    nan = float("nan")
    p_dec, e_dec = as_decimal(cell["value"]), as_decimal(cell["error"])
    mean, se = ours["ours"], ours["ours_se"]
    if unattributed:
        v, z = "unattributed", nan
    else:
        v, z = verdict(None if math.isnan(mean) else mean / judge["scale"],
                       se / judge["scale"] if not math.isnan(se) else se,
                       judge["value"], judge["error"], mm["higher_is_better"], mm["kind"])
        if ours["ref_flag"] and v != "not_run":   # against an unconverged reference the number confirms nothing
            v = "inconclusive"
    reference_value = nan
    if judge["printed"]:   # the paper column shows what the paper printed, the reference's value beside
        reference_value = float(p_dec) * scale
        p_dec, scale = as_decimal(judge["value"]), judge["scale"]
        e_dec = as_decimal(judge["error"])
    paper = float(p_dec) * scale if p_dec is not None else nan
    return {"paper": paper, "paper_err": float(e_dec) * scale if e_dec is not None else nan, "verdict": v, "z": z,
            "rel_diff": (mean - paper) / abs(paper) if paper != 0 else nan, "scale": scale,
            "paper_printed": _candidates_note(cell) if unattributed else judge["value"],
            "paper_err_printed": judge["error_printed"], "judged_at": judge["judged_at"],
            "reference_value": reference_value}


def build_table(spec: Mapping, runs_root, reference_dir=None) -> pd.DataFrame:
    """One row per published cell of the spec's methods x datasets x metrics.

    Columns: ``dataset, method, setting, metric, ours, ours_se, paper,
    paper_err, verdict`` followed by extras (``z, rel_diff, n, wall_time_s,
    our_method, our_dataset, our_metric, higher_is_better, kind,
    paper_printed, paper_err_printed, scale, error_kind, stderr_convention,
    run_status``).  ``paper``/``paper_err`` are floats on the true scale
    (printed x ``scale``).  Reference cells printed empty (N/A, not
    recoverable) are not published cells and give no row.  A method, dataset
    or metric of the spec that matches no reference cell raises ValueError
    (it is almost always a typo in the spec).  A column's ``data_of`` maps a
    row's data set to the one its runs used (NNG Table 1's naval: the NNG
    authors' columns on ``uci/naval_turbine``, PBP's on ``uci/naval``);
    ``our_dataset`` names it.
    """
    spec = dict(spec)
    name = str(spec.get("name") or "")
    methods = spec_methods(spec)
    metrics = spec_metrics(spec)
    datasets = [str(d) for d in (spec.get("datasets") or [])]
    if not datasets:
        raise ValueError(f"spec {name!r} selects no datasets")
    ref = _reference_cells(spec, reference_dir)
    overrides = {str(k): v for k, v in (spec.get("dataset_names") or {}).items()}
    available = set(ref["dataset"])
    ds_ref = {ds: dataset_ref_name(ds, overrides, available) for ds in datasets}
    cell_index: dict[tuple, pd.Series] = {}
    for _, r in ref.iterrows():
        cell_index.setdefault((r["dataset"], r["method"], r["setting"], r["metric"]), r)
    printed_index = _printed_index(spec, reference_dir)

    runs_root = Path(runs_root)
    used_m, used_d, used_k = set(), set(), set()
    rows = []
    for ds in datasets:
        for mid, m in methods.items():
            rds = column_dataset(m, ds)
            rec, run_status, selected = _column_record(runs_root, name, mid, m, rds)
            for key, mm in metrics.items():
                cell = cell_index.get((ds_ref[ds], m["paper_method"], m["setting"], mm["paper_metric"]))
                if cell is None:
                    continue
                unattributed = is_missing(cell["value"])
                if unattributed and not (spec.get("show_unattributed") and _candidates_note(cell)):
                    continue
                used_m.add(mid), used_d.add(ds), used_k.add(key)
                scale = float(cell["scale"]) if not is_missing(cell["scale"]) else float(mm.get("scale", 1.0))
                ours = _ours(rec, run_status, runs_root, name, selected or mid, m, key, mm, rds)
                judge = _judged_against(cell, as_decimal(cell["value"]), as_decimal(cell["error"]), scale,
                                        printed_index)
                row = {"dataset": cell["dataset"], "method": cell["method"], "setting": cell["setting"],
                       "metric": cell["metric"], "our_method": mid, "our_dataset": rds, "our_metric": key,
                       "higher_is_better": mm["higher_is_better"], "kind": mm["kind"],
                       "error_kind": cell["error_kind"], "protocol": _protocol_of(rec), "selected": selected,
                       **ours, **_judged_row(cell, scale, ours, mm, judge, unattributed)}
                del row["ref_flag"]
                rows.append(row)

    unmatched = []
    for what, sel, used in (("methods", list(methods), used_m),
                            ("datasets", datasets, used_d),
                            ("metrics", list(metrics), used_k)):
        miss = [x for x in sel if x not in used]
        if miss:
            unmatched.append(f"{what} {miss}")
    if unmatched:
        raise ValueError(f"spec {name!r}: no published cell in "
                         f"{_names(reference_path(spec, reference_dir))} for "
                         + "; ".join(unmatched))
    df = pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)
    for c in ["ours", "ours_se", "paper", "paper_err", "z", "rel_diff", "n",
              "wall_time_s", "scale", "reference_value"]:
        df[c] = df[c].astype(float)
    return df


def load_table(path) -> pd.DataFrame:
    """Read a table CSV written by :func:`bnnbench.present.render.write_tables` (keys as strings, empty setting
    kept)."""
    df = pd.read_csv(path, dtype={k: str for k in KEYS + ["verdict", "paper_printed",
                                                          "paper_err_printed"]},
                     keep_default_na=False, na_values=[""])
    return norm_keys(df)
