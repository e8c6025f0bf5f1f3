"""Tables and verdicts: our run records against the published numbers.

A table is built from an *experiment spec* (a plain dict, e.g.
``OmegaConf.to_container(cfg.experiment)``) and a runs root holding
``<runs_root>/<experiment>/<method>/<dataset_slug>/record.json`` files.  The
result is a long :class:`pandas.DataFrame` with one row per published cell of
the selected methods x datasets x metrics (the keys ``dataset, method, setting,
metric`` are spelled as in the reference CSV, so rows join back to it), our
number, the paper's number and a verdict.

Verdict rule (see :func:`verdict`): *reproduced* when our mean rounds to the
printed value, or when |z| <= 2 with z = (ours - paper) / sqrt(se^2 + e^2),
e = max(published error, half a unit of the printed last digit); without a
published error, when within 5 % relative (KL cells: within a factor 1.25);
otherwise *better* / *worse* by the metric's direction.  No record: *not_run*.

Reference cells with a ``scale`` (SLANG Table 1 KL rows, printed as
"KL (x10^4)") are compared as true value = printed value x scale, which the
authors' own CSV (``reference/from_original_code/slang_table_1_7.csv``)
confirms; ``paper``/``paper_err`` hold the true (scaled) values and
``paper_printed``/``scale`` the printed ones.
"""

from __future__ import annotations

import json
import math
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from bnnbench.results import FAILED, RECORD, atomic_write_text, load_record, run_dir

__all__ = [
    "COLUMNS",
    "KEYS",
    "VERDICTS",
    "verdict",
    "build_table",
    "render_markdown",
    "render_latex",
    "write_tables",
    "compare_verdicts",
    "load_table",
    "total_wall_time",
    "REFERENCE_DIR",
]

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"

KEYS = ["dataset", "method", "setting", "metric"]
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
]
VERDICTS = ("reproduced", "better", "worse", "not_run")
GOOD = ("reproduced", "better")

Z_THRESHOLD = 2.0
REL_TOL = 0.05
KL_FACTOR = 1.25

_NA_STRINGS = {"", "na", "n/a", "nan", "none", "-", "--", "\u2013", "\u2014"}

# Fallback directions / labels for reference metrics, used only when the spec
# does not say.
_DEFAULT_HIGHER_IS_BETTER = {
    "test_rmse": False,
    "test_loglik": True,
    "neg_elbo": False,
    "test_nll": False,
    "sym_kl": False,
    "test_error_pct": False,
    "test_accuracy_pct": True,
    "accuracy_pct": True,
    "elbo_per_datapoint": True,
    "pearson_corr_predvar_vs_hmc": True,
    "time_per_epoch_s": False,
}
_METRIC_LABELS = {
    "test_rmse": "RMSE",
    "test_loglik": "LL",
    "neg_elbo": "-ELBO",
    "test_nll": "NLL",
    "sym_kl": "KL",
    "test_error_pct": "Err %",
    "test_accuracy_pct": "Acc %",
    "accuracy_pct": "Acc %",
    "elbo_per_datapoint": "ELBO/pt",
    "pearson_corr_predvar_vs_hmc": "corr(HMC)",
    "time_per_epoch_s": "s/epoch",
}
_VERDICT_WORDS_MD = {
    "reproduced": "ok",
    "better": "better",
    "worse": "**WORSE**",
    "not_run": "not run",
}
_VERDICT_WORDS_TEX = {
    "reproduced": "ok",
    "better": "better",
    "worse": "\\textbf{worse}",
    "not_run": "--",
}


# --------------------------------------------------------------------------
# verdict
# --------------------------------------------------------------------------
def _is_missing(x: Any) -> bool:
    if x is None:
        return True
    if isinstance(x, str):
        return x.strip().lower() in _NA_STRINGS
    try:
        return bool(np.isnan(float(x)))
    except (TypeError, ValueError):
        return True


def _as_decimal(s: Any) -> Decimal | None:
    """Parse a printed number (string; trailing zeros are significant)."""
    if _is_missing(s):
        return None
    if not isinstance(s, str):
        # a float: its repr has no trailing zeros, so precision is a guess
        s = repr(float(s))
    s = s.strip().replace("\u2212", "-").replace(",", "")
    try:
        d = Decimal(s)
    except InvalidOperation as exc:
        raise ValueError(f"cannot parse published number {s!r}") from exc
    if not d.is_finite():
        raise ValueError(f"non-finite published number {s!r}")
    return d


def _decimals(d: Decimal) -> int:
    exp = d.as_tuple().exponent
    return max(0, -int(exp))


def _direction(diff: float, higher_is_better: bool) -> str:
    return "better" if (diff > 0) == bool(higher_is_better) else "worse"


def verdict(
    ours: Any,
    ours_se: Any,
    paper_str: Any,
    paper_err_str: Any,
    higher_is_better: bool,
    kind: str = "default",
) -> tuple[str, float]:
    """Verdict of one cell: ``(verdict, z)``.

    * ``ours`` NaN/None -> ``("not_run", nan)``.
    * ``paper_str`` is the value as printed; its number of decimals d gives the
      half-unit h = 0.5 * 10**-d.  If ``ours`` rounds (half-even) to the printed
      value at d decimals -> ``reproduced``.
    * Else with a published error e_p: e = max(e_p, h),
      z = (ours - paper) / sqrt(ours_se**2 + e**2); |z| <= 2 -> ``reproduced``,
      else ``better``/``worse`` by ``higher_is_better``.  A zero denominator
      falls through to the no-error rule.
    * Else with ``kind="binomial"`` (a single run's error rate, ``ours_se`` its binomial standard error):
      z = (ours - paper) / sqrt(ours_se**2 + h**2), |z| <= 2 -> ``reproduced`` (SLANG Table 3: about
      0.3 percentage points on 10k test images).
    * Else: |ours - paper| / |paper| <= 0.05 -> ``reproduced``
      (``kind="kl"``: 1/1.25 <= ours/paper <= 1.25), else better/worse.

    ``z`` is returned whenever it can be computed (a published error exists),
    also for cells reproduced by rounding; otherwise NaN.
    """
    nan = float("nan")
    if _is_missing(ours):
        return "not_run", nan
    ours = float(ours)
    if math.isnan(ours):
        return "not_run", nan
    p = _as_decimal(paper_str)
    if p is None:
        raise ValueError("verdict() needs a published value")
    paper = float(p)
    d = _decimals(p)
    h = 0.5 * 10.0 ** (-d)
    se = 0.0 if _is_missing(ours_se) else abs(float(ours_se))
    diff = ours - paper

    z = nan
    e_dec = _as_decimal(paper_err_str)
    if e_dec is not None:
        e = max(abs(float(e_dec)), h)
        denom = math.sqrt(se * se + e * e)
        if denom > 0 and math.isfinite(denom):
            z = diff / denom
    elif kind == "binomial" and se > 0:
        z = diff / math.sqrt(se * se + h * h)

    # 1. rounding: the printed precision cannot tell them apart
    if math.isfinite(ours):
        quantum = Decimal(1).scaleb(-d)
        rounded = Decimal(repr(ours)).quantize(quantum, rounding=ROUND_HALF_EVEN)
        if rounded == p:
            return "reproduced", z

    # 2. published error -> z-score
    if not math.isnan(z):
        if abs(z) <= Z_THRESHOLD:
            return "reproduced", z
        return _direction(diff, higher_is_better), z

    # 3. no published error -> relative rule
    if kind == "kl":
        if paper > 0 and ours > 0:
            ratio = ours / paper
            if 1.0 / KL_FACTOR <= ratio <= KL_FACTOR:
                return "reproduced", z
    elif paper != 0:
        if abs(diff) / abs(paper) <= REL_TOL:
            return "reproduced", z
    if diff == 0:  # only reachable for degenerate inputs
        return "reproduced", z
    return _direction(diff, higher_is_better), z


# --------------------------------------------------------------------------
# spec / reference / records
# --------------------------------------------------------------------------
def _spec_methods(spec: Mapping) -> dict[str, dict]:
    methods = spec.get("methods") or {}
    out = {}
    for mid, m in methods.items():
        if isinstance(m, str):
            m = {"paper_method": m}
        m = dict(m or {})
        m.setdefault("paper_method", mid)
        s = m.get("setting")
        m["setting"] = "" if s is None else str(s)
        out[str(mid)] = m
    if not out:
        raise ValueError(f"spec {spec.get('name')!r} selects no methods")
    return out


def _spec_metrics(spec: Mapping) -> dict[str, dict]:
    metrics = spec.get("metrics") or {}
    out = {}
    seen: dict[str, str] = {}
    for key, m in metrics.items():
        if isinstance(m, str):
            m = {"paper_metric": m}
        m = dict(m or {})
        m.setdefault("paper_metric", key)
        pm = str(m["paper_metric"])
        if pm in seen:
            raise ValueError(
                f"metrics {seen[pm]!r} and {key!r} both map to paper metric {pm!r}; "
                "a published cell can be compared with one of our metrics only"
            )
        seen[pm] = key
        if m.get("higher_is_better") is None:
            if pm not in _DEFAULT_HIGHER_IS_BETTER:
                raise ValueError(f"metric {key!r}: higher_is_better not given")
            m["higher_is_better"] = _DEFAULT_HIGHER_IS_BETTER[pm]
        m["higher_is_better"] = bool(m["higher_is_better"])
        if not m.get("kind"):
            m["kind"] = "binomial" if m.get("se_metric") else "kl" if "kl" in pm.split("_") else "default"
        out[str(key)] = m
    if not out:
        raise ValueError(f"spec {spec.get('name')!r} selects no metrics")
    return out


def _reference_path(spec: Mapping, reference_dir) -> Path:
    ref = spec.get("reference")
    if not ref:
        raise ValueError(f"spec {spec.get('name')!r} has no 'reference' CSV")
    base = Path(reference_dir) if reference_dir is not None else REFERENCE_DIR
    p = Path(ref)
    return p if p.is_absolute() else base / p


def _read_reference(path: Path) -> pd.DataFrame:
    ref = pd.read_csv(path, dtype=str, keep_default_na=False)
    for c in ["paper", "table", "dataset", "method", "setting", "metric",
              "value", "error", "error_kind", "scale"]:
        if c not in ref.columns:
            ref[c] = ""
        ref[c] = ref[c].fillna("").astype(str).str.strip()
    return ref


def _dataset_ref_name(ds: str, overrides: Mapping, available: set) -> str:
    if ds in overrides:
        return str(overrides[ds])
    candidates = [ds.rsplit("/", 1)[-1], ds.replace("/", "_"), ds]
    for c in candidates:
        if c in available:
            return c
    return candidates[0]


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
    if isinstance(summ, Mapping) and not _is_missing(summ.get("mean")):
        se = summ.get("stderr")
        n = summ.get("n")
        return (float(summ["mean"]),
                nan if _is_missing(se) else float(se),
                nan if _is_missing(n) else float(n))
    # fall back to the per-split metrics, with the std(ddof=0)/sqrt(n) convention
    vals = []
    for row in rec.get("metrics") or []:
        v = row.get(key) if isinstance(row, Mapping) else None
        if not _is_missing(v):
            vals.append(float(v))
    if not vals:
        return nan, nan, nan
    a = np.asarray(vals, dtype=float)
    return float(a.mean()), float(a.std(ddof=0) / math.sqrt(len(a))), float(len(a))


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
    (it is almost always a typo in the spec).
    """
    spec = dict(spec)
    name = str(spec.get("name") or "")
    methods = _spec_methods(spec)
    metrics = _spec_metrics(spec)
    datasets = [str(d) for d in (spec.get("datasets") or [])]
    if not datasets:
        raise ValueError(f"spec {name!r} selects no datasets")
    ref = _read_reference(_reference_path(spec, reference_dir))
    if spec.get("table"):
        ref = ref[ref["table"] == str(spec["table"])]
    if spec.get("paper") and (ref["paper"] == str(spec["paper"])).any():
        ref = ref[ref["paper"] == str(spec["paper"])]
    if ref.empty:
        raise ValueError(f"spec {name!r}: reference selection is empty")

    overrides = {str(k): v for k, v in (spec.get("dataset_names") or {}).items()}
    available = set(ref["dataset"])
    ds_ref = {ds: _dataset_ref_name(ds, overrides, available) for ds in datasets}

    cell_index: dict[tuple, pd.Series] = {}
    for _, r in ref.iterrows():
        cell_index.setdefault((r["dataset"], r["method"], r["setting"], r["metric"]), r)

    runs_root = Path(runs_root)
    used_m, used_d, used_k = set(), set(), set()
    rows = []
    nan = float("nan")
    for ds in datasets:
        for mid, m in methods.items():
            rec_dir = run_dir(runs_root, name, mid, ds)
            rec = load_record(rec_dir)
            if rec is None:
                run_status = "failed" if (rec_dir / FAILED).exists() else (
                    "unreadable" if (rec_dir / RECORD).exists() else "missing")
            else:
                st = rec.get("status", "ok")
                run_status = "ok" if st == "ok" else f"status:{st}"
                if run_status != "ok":
                    rec = None
            for key, mm in metrics.items():
                cell = cell_index.get((ds_ref[ds], m["paper_method"], m["setting"],
                                       mm["paper_metric"]))
                if cell is None or _is_missing(cell["value"]):
                    continue
                used_m.add(mid), used_d.add(ds), used_k.add(key)
                p_dec = _as_decimal(cell["value"])
                e_dec = _as_decimal(cell["error"])
                scale = float(cell["scale"]) if not _is_missing(cell["scale"]) else float(mm.get("scale", 1.0))
                if rec is not None:
                    ours, se, n = _summary_of(rec, key)
                    if mm.get("se_metric") and n == 1:  # one run: the metric's own standard error (binomial)
                        se = _summary_of(rec, mm["se_metric"])[0]
                    wall = rec.get("wall_time_s")
                    wall = nan if _is_missing(wall) else float(wall)
                    conv = str(rec.get("stderr_convention") or "")
                    status = run_status if not math.isnan(ours) else "metric_missing"
                else:
                    ours = se = n = wall = nan
                    conv = ""
                    status = run_status
                proto = _protocol_of(rec)
                v, z = verdict(
                    None if math.isnan(ours) else ours / scale,
                    se / scale if not math.isnan(se) else se,
                    cell["value"], cell["error"], mm["higher_is_better"], mm["kind"],
                )
                paper = float(p_dec) * scale
                rows.append({
                    "dataset": cell["dataset"],
                    "method": cell["method"],
                    "setting": cell["setting"],
                    "metric": cell["metric"],
                    "ours": ours,
                    "ours_se": se,
                    "paper": paper,
                    "paper_err": float(e_dec) * scale if e_dec is not None else nan,
                    "verdict": v,
                    "z": z,
                    "rel_diff": (ours - paper) / abs(paper) if paper != 0 else nan,
                    "n": n,
                    "wall_time_s": wall,
                    "our_method": mid,
                    "our_dataset": ds,
                    "our_metric": key,
                    "higher_is_better": mm["higher_is_better"],
                    "kind": mm["kind"],
                    "paper_printed": cell["value"],
                    "paper_err_printed": cell["error"],
                    "scale": scale,
                    "error_kind": cell["error_kind"],
                    "stderr_convention": conv,
                    "run_status": status,
                    "protocol": proto,
                })

    unmatched = []
    for what, sel, used in (("methods", list(methods), used_m),
                            ("datasets", datasets, used_d),
                            ("metrics", list(metrics), used_k)):
        miss = [x for x in sel if x not in used]
        if miss:
            unmatched.append(f"{what} {miss}")
    if unmatched:
        raise ValueError(f"spec {name!r}: no published cell in "
                         f"{_reference_path(spec, reference_dir).name} for "
                         + "; ".join(unmatched))
    df = pd.DataFrame(rows, columns=COLUMNS + EXTRA_COLUMNS)
    for c in ["ours", "ours_se", "paper", "paper_err", "z", "rel_diff", "n",
              "wall_time_s", "scale"]:
        df[c] = df[c].astype(float)
    return df


# --------------------------------------------------------------------------
# rendering helpers
# --------------------------------------------------------------------------
def _method_label(method: str, setting: str) -> str:
    setting = "" if _is_missing(setting) else str(setting)
    return f"{method} ({setting})" if setting else str(method)


def _metric_label(metric: str, spec: Mapping) -> str:
    for key, m in (spec.get("metrics") or {}).items():
        if isinstance(m, Mapping) and m.get("paper_metric", key) == metric and m.get("label"):
            return str(m["label"])
    return _METRIC_LABELS.get(metric, metric)


def _printed_decimals(row) -> int:
    printed = row.get("paper_printed")
    try:
        d = _decimals(_as_decimal(printed)) if not _is_missing(printed) else 3
    except ValueError:
        d = 3
    scale = row.get("scale")
    if not _is_missing(scale) and float(scale) > 0:
        d -= int(round(math.log10(float(scale))))
    return max(0, d)


def _fmt(x: float, decimals: int) -> str:
    if _is_missing(x):
        return ""
    return f"{float(x):.{decimals}f}"


def _fmt_pm(x, err, decimals, pm="\u00b1") -> str:
    s = _fmt(x, decimals)
    if s and not _is_missing(err):
        s += f" {pm} {_fmt(err, decimals)}"
    return s


def _cell_strings(row, pm="\u00b1") -> tuple[str, str]:
    """(ours, paper) strings; ours gets one more decimal than the paper prints."""
    d = _printed_decimals(row)
    scale = row.get("scale")
    scaled = not _is_missing(scale) and float(scale) != 1.0
    paper = row.get("paper_printed") if not scaled and not _is_missing(
        row.get("paper_printed")) else _fmt(row["paper"], d)
    if not _is_missing(row.get("paper_err")):
        perr = row.get("paper_err_printed") if not scaled and not _is_missing(
            row.get("paper_err_printed")) else _fmt(row["paper_err"], d)
        paper = f"{paper} {pm} {perr}"
    ours = _fmt_pm(row["ours"], row["ours_se"], d + 1, pm)
    return ours, str(paper)


def _groups(df: pd.DataFrame, spec: Mapping) -> list[tuple[str, str, str]]:
    """(metric, method, setting) column groups, in spec order."""
    out = []
    for metric in _ordered_unique(df["metric"]):
        for method, setting in _ordered_unique(zip(df["method"], df["setting"])):
            if ((df["metric"] == metric) & (df["method"] == method)
                    & (df["setting"] == setting)).any():
                out.append((metric, method, setting))
    return out


def _ordered_unique(it) -> list:
    seen, out = set(), []
    for x in it:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def _norm_keys(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for c in KEYS:
        df[c] = df[c].fillna("").astype(str)
    if "verdict" in df.columns:
        df["verdict"] = df["verdict"].fillna("not_run").astype(str)
    return df


def total_wall_time(df: pd.DataFrame) -> float:
    """Sum of ``wall_time_s`` over the distinct runs (method, dataset) behind ``df``."""
    if "wall_time_s" not in df.columns or df["wall_time_s"].isna().all():
        return float("nan")
    mcol = "our_method" if "our_method" in df.columns else "method"
    dcol = "our_dataset" if "our_dataset" in df.columns else "dataset"
    runs = df.dropna(subset=["wall_time_s"]).drop_duplicates(subset=[mcol, dcol])
    return float(runs["wall_time_s"].sum())


def _fmt_duration(s: float) -> str:
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s:.0f} s ({s / 60:.1f} min)"
    return f"{s:.0f} s ({s / 3600:.2f} h)"


VERDICT_RULE = (
    "Verdict per cell: **reproduced** if our mean rounds to the printed value, or if "
    "|z| \u2264 2 with z = (ours \u2212 paper) / \u221a(se_ours\u00b2 + e\u00b2), "
    "e = max(paper's \u00b1, half a unit of its last printed digit); where the paper "
    "prints no \u00b1, if within 5% relative (KL cells: within a factor 1.25); otherwise "
    "**better** / **worse** by the metric's direction; **not run** if we have no record."
)


def _conventions(df: pd.DataFrame, spec: Mapping) -> list[str]:
    lines = []
    convs = sorted({c for c in df.get("stderr_convention", pd.Series(dtype=str)).dropna()
                    if str(c)})
    conv = ", ".join(f"`{c}`" for c in convs) if convs else "n/a (no runs)"
    kinds = sorted({str(k) for k in df.get("error_kind", pd.Series(dtype=str)).dropna()
                    if str(k)})
    kind_txt = ", ".join(kinds) if kinds else "none printed"
    lines.append(
        f"Error bars: ours = mean \u00b1 standard error over splits ({conv}); "
        f"paper = value \u00b1 as printed (kind of error: {kind_txt}).")
    lines.append(VERDICT_RULE)
    if "kind" in df.columns and (df["kind"] == "binomial").any():
        lines.append("Single-run error rates (no ± printed): se_ours is the binomial standard error "
                     "√(err (1 − err) / n_test) of our run, and the z rule above applies with it.")
    mparts = []
    for key, m in (spec.get("metrics") or {}).items():
        if not isinstance(m, Mapping):
            continue
        pm = m.get("paper_metric", key)
        hib = m.get("higher_is_better", _DEFAULT_HIGHER_IS_BETTER.get(pm))
        arrow = "higher is better" if hib else "lower is better"
        mparts.append(f"{_metric_label(pm, spec)} = paper `{pm}` vs our `{key}` ({arrow})")
    if mparts:
        lines.append("Metrics: " + "; ".join(mparts) + ".")
    ll = spec.get("ll_convention") or spec.get("loglik_convention")
    if ll:
        lines.append(f"Log-likelihood convention: {ll}")
    if "scale" in df.columns and (df["scale"].fillna(1.0) != 1.0).any():
        lines.append("Cells printed with a scale (KL \u00d710^4, error in %) are shown and "
                     "compared as printed value \u00d7 scale (KL on its true scale, error as a fraction).")
    return lines


def _counts(df: pd.DataFrame) -> tuple[str, list[str]]:
    parts = []
    for method, setting in _ordered_unique(zip(df["method"], df["setting"])):
        sub = df[(df["method"] == method) & (df["setting"] == setting)]
        k = int(sub["verdict"].isin(GOOD).sum())
        parts.append(f"{_method_label(method, setting)} {k} / {len(sub)}")
    k_all = int(df["verdict"].isin(GOOD).sum())
    vc = df["verdict"].value_counts()
    breakdown = ", ".join(f"{v} {int(vc.get(v, 0))}" for v in VERDICTS)
    line = ("reproduced or better: k / n cells per method: " + "; ".join(parts)
            + f" (all: {k_all} / {len(df)}; {breakdown})")
    return line, parts


def render_markdown(df: pd.DataFrame, spec: Mapping, wall_time_s: float | None = None) -> str:
    """People-facing Markdown: title, conventions, table, counts, notes, wall time.

    The table has one row per dataset and, per (metric, method), three columns:
    ``<METRIC> <Method> ours`` (mean ± se), ``... paper`` (as printed, ± error)
    and ``...`` verdict (ok / better / **WORSE** / not run); with ``layout: long`` in the
    spec, one row per published cell instead.
    """
    df = _norm_keys(df)
    title = str(spec.get("title") or spec.get("name") or "Results")
    out = [f"# {title}", ""]
    for line in _conventions(df, spec):
        out.append(line + "  ")
    out.append("")

    if spec.get("layout") == "long":
        out += _long_rows(df, spec)
    else:
        out += _wide_rows(df, spec)
    out.append("")
    line, _ = _counts(df)
    out.append("**" + line + "**")
    out.append("")
    notes = spec.get("notes")
    if notes:
        out.append("Notes: " + str(notes).strip())
        out.append("")
    if wall_time_s is None:
        wall_time_s = total_wall_time(df)
    if wall_time_s is not None and not _is_missing(wall_time_s):
        out.append(f"Total wall time of the runs behind this table: "
                   f"{_fmt_duration(float(wall_time_s))}.")
        out.append("")
    return "\n".join(out)


def _verdict_md(r) -> str:
    v = _VERDICT_WORDS_MD.get(r["verdict"], r["verdict"])
    if r["verdict"] == "not_run" and r.get("run_status") not in (None, "", "missing"):
        v = f"not run ({r['run_status']})"
    return v


def _long_rows(df: pd.DataFrame, spec: Mapping) -> list[str]:
    """``layout: long``: one row per published cell (dataset, metric, method), for tables with many columns."""
    proto = bool(spec.get("show_protocol"))
    out = ["| Dataset | Metric | Method | ours | paper | verdict |" + (" protocol of ours |" if proto else ""),
           "|---|---|---|--:|--:|:-:|" + ("---|" if proto else "")]
    for r in df.to_dict("records"):
        ours, paper = _cell_strings(r)
        cells = [r["dataset"], _metric_label(r["metric"], spec), _method_label(r["method"], r["setting"]),
                 ours, paper, _verdict_md(r)] + ([r.get("protocol") or ""] if proto else [])
        out.append("| " + " | ".join(_md_escape(str(c)) for c in cells) + " |")
    return out


def _wide_rows(df: pd.DataFrame, spec: Mapping) -> list[str]:
    """One row per dataset; per (metric, method) the columns ours, paper, verdict."""
    out = []
    groups = _groups(df, spec)
    header = ["Dataset"]
    for metric, method, setting in groups:
        lab = f"{_metric_label(metric, spec)} {_method_label(method, setting)}"
        header += [f"{lab} ours", f"{lab} paper", f"{lab}"]
    out.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
    out.append("|" + "|".join(["---"] + ["--:", "--:", ":-:"] * len(groups)) + "|")
    idx = {tuple(r[k] for k in KEYS): r for r in df.to_dict("records")}
    for ds in _ordered_unique(df["dataset"]):
        cells = [ds]
        for metric, method, setting in groups:
            r = idx.get((ds, method, setting, metric))
            if r is None:
                cells += ["", "", "\u2013"]  # not published for this dataset
                continue
            ours, paper = _cell_strings(r)
            cells += [ours, paper, _verdict_md(r)]
        out.append("| " + " | ".join(_md_escape(str(c)) for c in cells) + " |")
    return out


def _md_escape(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


_TEX_ESC = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
            "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
            "^": r"\textasciicircum{}"}


def _tex(s: Any) -> str:
    s = "" if s is None else str(s)
    s = s.replace("\u00b1", "\x00PM\x00").replace("\u2212", "-")
    s = "".join(_TEX_ESC.get(ch, ch) for ch in s)
    return s.replace("\x00PM\x00", "$\\pm$")


def render_latex(df: pd.DataFrame, spec: Mapping) -> str:
    """booktabs tabular: per (metric, method) columns ours / paper / verdict."""
    df = _norm_keys(df)
    groups = _groups(df, spec)
    metrics = _ordered_unique(g[0] for g in groups)
    lines = [
        f"% {_tex(spec.get('title') or spec.get('name') or '')}",
        "% generated by bnnbench.tables; needs \\usepackage{booktabs}",
        "% " + VERDICT_RULE.replace("**", ""),
        "\\begin{tabular}{l" + "rrc" * len(groups) + "}",
        "\\toprule",
    ]
    # metric header with cmidrules
    row, rules, col = ["Dataset"], [], 2
    for metric in metrics:
        k = sum(1 for g in groups if g[0] == metric) * 3
        row.append(f"\\multicolumn{{{k}}}{{c}}{{{_tex(_metric_label(metric, spec))}}}")
        rules.append(f"\\cmidrule(lr){{{col}-{col + k - 1}}}")
        col += k
    lines.append(" & ".join(row) + " \\\\")
    lines.append(" ".join(rules))
    row, rules, col = [""], [], 2
    for metric, method, setting in groups:
        row.append(f"\\multicolumn{{3}}{{c}}{{{_tex(_method_label(method, setting))}}}")
        rules.append(f"\\cmidrule(lr){{{col}-{col + 2}}}")
        col += 3
    lines.append(" & ".join(row) + " \\\\")
    lines.append(" ".join(rules))
    lines.append(" & ".join([""] + ["ours", "paper", ""] * len(groups)) + " \\\\")
    lines.append("\\midrule")
    idx = {tuple(r[k] for k in KEYS): r for r in df.to_dict("records")}
    for ds in _ordered_unique(df["dataset"]):
        cells = [_tex(ds)]
        for metric, method, setting in groups:
            r = idx.get((ds, method, setting, metric))
            if r is None:
                cells += ["", "", ""]
                continue
            ours, paper = _cell_strings(r)
            cells += [_tex(ours), _tex(paper),
                      _VERDICT_WORDS_TEX.get(r["verdict"], _tex(r["verdict"]))]
        lines.append(" & ".join(cells) + " \\\\")
    lines.append("\\bottomrule")
    lines.append("\\end{tabular}")
    line, _ = _counts(df)
    lines.append(f"% {_tex(line)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# files / regression check
# --------------------------------------------------------------------------
def write_tables(df: pd.DataFrame, spec: Mapping, out_dir, wall_time_s: float | None = None
                 ) -> dict[str, Path]:
    """Write ``<name>.md``, ``<name>.csv`` (long table, full float precision) and
    ``<name>.tex`` atomically; returns ``{"md": path, "csv": path, "tex": path}``."""
    out_dir = Path(out_dir)
    name = str(spec.get("name") or "table")
    paths = {"md": out_dir / f"{name}.md", "csv": out_dir / f"{name}.csv",
             "tex": out_dir / f"{name}.tex"}
    atomic_write_text(paths["csv"], df.to_csv(index=False))
    atomic_write_text(paths["md"], render_markdown(df, spec, wall_time_s=wall_time_s))
    atomic_write_text(paths["tex"], render_latex(df, spec))
    return paths


def load_table(path) -> pd.DataFrame:
    """Read a table CSV written by :func:`write_tables` (keys as strings, empty setting kept)."""
    df = pd.read_csv(path, dtype={k: str for k in KEYS + ["verdict", "paper_printed",
                                                          "paper_err_printed"]},
                     keep_default_na=False, na_values=[""])
    return _norm_keys(df)


def compare_verdicts(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Cells that were reproduced/better in ``old`` and are not in ``new``.

    Joined on ``dataset, method, setting, metric``.  A cell absent from ``new``
    counts as a regression with ``verdict_new = "missing"``.  Columns:
    keys, ``paper``, ``ours_old, ours_se_old, verdict_old, ours_new,
    ours_se_new, verdict_new``.
    """
    o = _norm_keys(old)
    n = _norm_keys(new)
    o = o[KEYS + [c for c in ("paper", "ours", "ours_se", "verdict") if c in o.columns]]
    n = n[KEYS + [c for c in ("ours", "ours_se", "verdict") if c in n.columns]]
    n = n.drop_duplicates(subset=KEYS)
    m = o.merge(n, on=KEYS, how="left", suffixes=("_old", "_new"), indicator=True)
    m.loc[m["_merge"] == "left_only", "verdict_new"] = "missing"
    bad = m[m["verdict_old"].isin(GOOD) & ~m["verdict_new"].isin(GOOD)]
    cols = KEYS + (["paper"] if "paper" in bad.columns else []) + [
        c for c in ("ours_old", "ours_se_old", "verdict_old", "ours_new", "ours_se_new",
                    "verdict_new") if c in bad.columns]
    return bad[cols].reset_index(drop=True)
