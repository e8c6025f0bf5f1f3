"""Markdown and LaTeX renderings of a table (the frame of :func:`bnnbench.judge.tables.build_table`).

Markdown: title, conventions (error bars, verdict rule, metrics), the table,
the count line (reproduced, and beside it better, worse, ...) and the
counts per method, notes and the wall time of the runs;
LaTeX: a booktabs tabular of the same cells.  Ours is printed with one more
decimal than the paper prints.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from bnnbench.judge.counts import FAR_Z, count_line, method_line
from bnnbench.judge.reference import DEFAULT_HIGHER_IS_BETTER, KEYS
from bnnbench.core.files import atomic_write_text
from bnnbench.judge.verdicts import VERDICT_RULE, as_decimal, decimal_places, is_missing, norm_keys

__all__ = ["render_markdown", "render_latex", "total_wall_time"]

# Fallback labels for reference metrics, used only when the spec does not say.
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
# the verdicts' own words, as the site and the count lines say them (worse in bold, to be found at a glance)
_VERDICT_WORDS_MD = {
    "reproduced": "reproduced",
    "better": "better",
    "worse": "**worse**",
    "inconclusive": "inconclusive (our se > 3x the paper's)",
    "not_run": "not run",
    "unattributed": "no verdict (cell unattributed)",
}
_VERDICT_WORDS_TEX = {
    "reproduced": "reproduced",
    "better": "better",
    "worse": "\\textbf{worse}",
    "inconclusive": "inconcl.",
    "not_run": "--",
    "unattributed": "n/a",
}


def _method_label(method: str, setting: str) -> str:
    setting = "" if is_missing(setting) else str(setting)
    return f"{method} ({setting})" if setting else str(method)


def _metric_label(metric: str, spec: Mapping) -> str:
    for key, m in (spec.get("metrics") or {}).items():
        if isinstance(m, Mapping) and m.get("paper_metric", key) == metric and m.get("label"):
            return str(m["label"])
    return _METRIC_LABELS.get(metric, metric)


def _printed_decimals(row) -> int:
    printed = row.get("paper_printed")
    try:
        d = decimal_places(as_decimal(printed)) if not is_missing(printed) else 3
    except ValueError:
        d = 3
    scale = row.get("scale")
    if not is_missing(scale) and float(scale) > 0:
        d -= int(round(math.log10(float(scale))))
    return max(0, d)


def _fmt(x: float, decimals: int) -> str:
    if is_missing(x):
        return ""
    return f"{float(x):.{decimals}f}"


def _fmt_pm(x, err, decimals, pm="\u00b1") -> str:
    s = _fmt(x, decimals)
    if s and not is_missing(err):
        s += f" {pm} {_fmt(err, decimals)}"
    return s


def _cell_strings(row, pm="\u00b1") -> tuple[str, str]:
    """(ours, paper) strings; ours gets one more decimal than the paper prints."""
    d = _printed_decimals(row)
    scale = row.get("scale")
    scaled = not is_missing(scale) and float(scale) != 1.0
    paper = row.get("paper_printed") if not scaled and not is_missing(
        row.get("paper_printed")) else _fmt(row["paper"], d)
    if not is_missing(row.get("paper_err")):
        perr = row.get("paper_err_printed") if not scaled and not is_missing(
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
    if "run_status" in df.columns and ((df["verdict"] == "inconclusive")
                                       & df["run_status"].fillna("").astype(str).str.startswith("reference ")).any():
        lines.append("A cell scored against a reference run (HMC) whose diagnostics flag it (an R-hat above the "
                     "threshold) is **inconclusive** whatever its number: it is not counted as reproduced.")
    if "kind" in df.columns and (df["kind"] == "binomial").any():
        lines.append("Single-run error rates (no ± printed): se_ours is the binomial standard error "
                     "√(err (1 − err) / n_test) of our run, and the z rule above applies with it.")
    mparts = []
    for key, m in (spec.get("metrics") or {}).items():
        if not isinstance(m, Mapping):
            continue
        pm = m.get("paper_metric", key)
        hib = m.get("higher_is_better", DEFAULT_HIGHER_IS_BETTER.get(pm))
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


def _counts(df: pd.DataFrame) -> tuple[str, str]:
    """The count line (``reproduced N of M; better B (|z| > 4: K); worse W; ...``) and the per-method line."""
    return count_line(df), method_line(df)


COUNT_NOTE = (f"Better is not counted as reproduced: a cell better than the paper by |z| > {FAR_Z:g} is a discrepancy, "
              "explained with the misses in results/README.md. Judged: every published cell but the unattributed.")


def render_markdown(df: pd.DataFrame, spec: Mapping, wall_time_s: float | None = None) -> str:
    """People-facing Markdown: title, conventions, table, counts, notes, wall time.

    The table has one row per dataset and, per (metric, method), three columns:
    ``<METRIC> <Method> ours`` (mean ± se), ``... paper`` (as printed, ± error)
    and ``...`` verdict (reproduced / better / **worse** / not run); with ``layout: long`` in the
    spec, one row per published cell instead.
    """
    df = norm_keys(df)
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
    line, per_method = _counts(df)
    out.append("**" + line + "**  ")
    if per_method:
        out.append(per_method + "  ")
    out.append(COUNT_NOTE)
    out.append("")
    notes = spec.get("notes")
    if notes:
        out.append("Notes: " + str(notes).strip())
        out.append("")
    if wall_time_s is None:
        wall_time_s = total_wall_time(df)
    if wall_time_s is not None and not is_missing(wall_time_s):
        out.append(f"Total wall time of the runs behind this table: "
                   f"{_fmt_duration(float(wall_time_s))}.")
        out.append("")
    return "\n".join(out)


def _verdict_md(r) -> str:
    v = _VERDICT_WORDS_MD.get(r["verdict"], r["verdict"])
    if r["verdict"] == "not_run" and r.get("run_status") not in (None, "", "missing"):
        v = f"not run ({r['run_status']})"
    elif r["verdict"] == "inconclusive" and str(r.get("run_status") or "").startswith("reference "):
        v = f"inconclusive ({r['run_status']})"   # a paired cell whose reference sampler has not converged
    elif str(r.get("run_status") or "").startswith("flagged"):
        v = f"{v} ({r['run_status']})"   # a sampler that has not converged: its number stands, marked
    return v


def _long_rows(df: pd.DataFrame, spec: Mapping) -> list[str]:
    """``layout: long``: one row per published cell (dataset, metric, method), for tables with many columns."""
    proto = bool(spec.get("show_protocol"))
    judged = bool(spec.get("printed_reference"))   # which precision each cell was judged at
    out = ["| Dataset | Metric | Method | ours | paper | verdict |" + (" protocol of ours |" if proto else "")
           + (" judged at | reference's value |" if judged else ""),
           "|---|---|---|--:|--:|:-:|" + ("---|" if proto else "") + ("---|--:|" if judged else "")]
    for r in df.to_dict("records"):
        ours, paper = _cell_strings(r)
        cells = [r["dataset"], _metric_label(r["metric"], spec), _method_label(r["method"], r["setting"]),
                 ours, paper, _verdict_md(r)] + ([r.get("protocol") or ""] if proto else [])
        if judged:
            ref = r.get("reference_value")
            cells += [r.get("judged_at") or "", "" if is_missing(ref) else f"{float(ref):.6g}"]
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
    df = norm_keys(df)
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
    line, per_method = _counts(df)
    lines.append(f"% {_tex(line)}")
    if per_method:
        lines.append(f"% {_tex(per_method)}")
    return "\n".join(lines) + "\n"


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
