"""Verdicts: one cell of ours against the published number, and two tables against each other.

Verdict rule (see :func:`verdict`): *reproduced* when our mean rounds to the
printed value, or when |z| <= 2 with z = (ours - paper) / sqrt(se^2 + e^2),
e = max(published error, half a unit of the printed last digit); without a
published error, when within 5 % relative (KL cells: within a factor 1.25);
otherwise *better* / *worse* by the metric's direction.  A cell that would be
*reproduced* while our standard error exceeds 3 e is *inconclusive*: its error
bar, not its agreement, makes |z| small; so is a paired cell (a metric against a
reference run, e.g. NNG Table 4's correlation with HMC) whose reference run is
flagged by its diagnostics (``tables.build_table``).  No record: *not_run*.

:func:`compare_verdicts` lists the cells a new table lost against an old one
(the regression check, ``bnnbench.judge.regression_check``).
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Any

import numpy as np
import pandas as pd

from bnnbench.judge.reference import KEYS

__all__ = [
    "VERDICTS",
    "GOOD",
    "Z_THRESHOLD",
    "REL_TOL",
    "KL_FACTOR",
    "INCONCLUSIVE_FACTOR",
    "VERDICT_RULE",
    "verdict",
    "is_missing",
    "as_decimal",
    "decimal_places",
    "norm_keys",
    "compare_verdicts",
]

VERDICTS = ("reproduced", "better", "worse", "inconclusive", "not_run", "unattributed")  # unattributed: the
# published cell could not be read from the paper with confidence (its candidates are shown, no verdict is claimed);
# inconclusive: within the error bars only because ours is several times the paper's, or scored against a flagged
# (unconverged) reference run (not counted as reproduced)
# GOOD: the verdicts compare_verdicts keeps (two tables against each other). Not a count: the headline of every count
# line is *reproduced* alone, better is beside it (``bnnbench.judge.counts``); CI's regression check compares numbers
# and any change of verdict (``bnnbench.judge.regression_check``).
GOOD = ("reproduced", "better")

Z_THRESHOLD = 2.0
REL_TOL = 0.05
KL_FACTOR = 1.25
INCONCLUSIVE_FACTOR = 3.0

_NA_STRINGS = {"", "na", "n/a", "nan", "none", "-", "--", "\u2013", "\u2014"}

VERDICT_RULE = (
    "Verdict per cell: **reproduced** if our mean rounds to the printed value, or if "
    "|z| \u2264 2 with z = (ours \u2212 paper) / \u221a(se_ours\u00b2 + e\u00b2), "
    "e = max(paper's \u00b1, half a unit of its last printed digit); where the paper "
    "prints no \u00b1, if within 5% relative (KL cells: within a factor 1.25); otherwise "
    "**better** / **worse** by the metric's direction. A cell that would be reproduced while "
    "se_ours > 3e (our standard error over three times the paper's error) is **inconclusive** and "
    "not counted as reproduced; **not run** if we have no record."
)


def is_missing(x: Any) -> bool:
    if x is None:
        return True
    if isinstance(x, str):
        return x.strip().lower() in _NA_STRINGS
    try:
        return bool(np.isnan(float(x)))
    except (TypeError, ValueError):
        return True


def as_decimal(s: Any) -> Decimal | None:
    """Parse a printed number (string; trailing zeros are significant)."""
    if is_missing(s):
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


def decimal_places(d: Decimal) -> int:
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
      else ``better``/``worse`` by ``higher_is_better``.
    * With a published error, a cell that the two rules above call ``reproduced`` is ``inconclusive`` when
      ``ours_se > 3 e``: our error bar, several times the paper's, is what makes the two agree.  A zero denominator
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
    if is_missing(ours):
        return "not_run", nan
    ours = float(ours)
    if math.isnan(ours):
        return "not_run", nan
    p = as_decimal(paper_str)
    if p is None:
        raise ValueError("verdict() needs a published value")
    paper = float(p)
    d = decimal_places(p)
    h = 0.5 * 10.0 ** (-d)
    se = 0.0 if is_missing(ours_se) else abs(float(ours_se))
    diff = ours - paper

    z = nan
    e_dec = as_decimal(paper_err_str)
    if e_dec is not None:
        e = max(abs(float(e_dec)), h)
        denom = math.sqrt(se * se + e * e)
        if denom > 0 and math.isfinite(denom):
            z = diff / denom
    elif kind == "binomial" and se > 0:
        z = diff / math.sqrt(se * se + h * h)

    # a published error bar that ours dwarfs: agreement within the bars confirms nothing
    wide = e_dec is not None and se > INCONCLUSIVE_FACTOR * max(abs(float(e_dec)), h)
    agreed = "inconclusive" if wide else "reproduced"

    # 1. rounding: the printed precision cannot tell them apart
    if math.isfinite(ours):
        quantum = Decimal(1).scaleb(-d)
        rounded = Decimal(repr(ours)).quantize(quantum, rounding=ROUND_HALF_EVEN)
        if rounded == p:
            return agreed, z

    # 2. published error -> z-score
    if not math.isnan(z):
        if abs(z) <= Z_THRESHOLD:
            return agreed, z
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


def norm_keys(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for c in KEYS:
        df[c] = df[c].fillna("").astype(str)
    if "verdict" in df.columns:
        df["verdict"] = df["verdict"].fillna("not_run").astype(str)
    return df


def compare_verdicts(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """Cells that were reproduced/better in ``old`` and are not in ``new``.

    Joined on ``dataset, method, setting, metric``.  A cell absent from ``new``
    counts as a regression with ``verdict_new = "missing"``.  Columns:
    keys, ``paper``, ``ours_old, ours_se_old, verdict_old, ours_new,
    ours_se_new, verdict_new``.
    """
    o = norm_keys(old)
    n = norm_keys(new)
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
