"""The published tables: where they are, how they are read, how they match our names.

Each CSV here holds the published cells of one paper's table, one row per cell
(README.md describes the columns); a cell is keyed by ``dataset, method,
setting, metric`` (:data:`KEYS`) as the paper spells them.  An experiment spec
maps its methods and metrics to those spellings (:func:`spec_methods`,
:func:`spec_metrics`), and our data set ids (``uci/boston``) are matched to
the reference's names (:func:`dataset_ref_name`).

Reference cells with a ``scale`` (SLANG Table 1 KL rows, printed as
"KL (x10^4)") are compared as true value = printed value x scale, which the
authors' own CSV (``reference/from_original_code/slang_table_1_7.csv``)
confirms; ``paper``/``paper_err`` hold the true (scaled) values and
``paper_printed``/``scale`` the printed ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import pandas as pd

__all__ = [
    "REFERENCE_DIR",
    "KEYS",
    "DEFAULT_HIGHER_IS_BETTER",
    "spec_methods",
    "spec_metrics",
    "reference_path",
    "read_reference",
    "dataset_ref_name",
]

REFERENCE_DIR = Path(__file__).resolve().parent

KEYS = ["dataset", "method", "setting", "metric"]

# Fallback directions for reference metrics, used only when the spec
# does not say.
DEFAULT_HIGHER_IS_BETTER = {
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


def spec_methods(spec: Mapping) -> dict[str, dict]:
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


def column_dataset(column: Mapping | None, ds: str) -> str:
    """The data set a table column's runs used for the row of ``ds``: its ``data_of`` entry, else ``ds`` (NNG Table
    1's naval row: the NNG authors' columns on ``uci/naval_turbine``, PBP's on ``uci/naval``)."""
    if not isinstance(column, Mapping):
        return ds
    return str((column.get("data_of") or {}).get(ds, ds))


def spec_metrics(spec: Mapping) -> dict[str, dict]:
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
            if pm not in DEFAULT_HIGHER_IS_BETTER:
                raise ValueError(f"metric {key!r}: higher_is_better not given")
            m["higher_is_better"] = DEFAULT_HIGHER_IS_BETTER[pm]
        m["higher_is_better"] = bool(m["higher_is_better"])
        if not m.get("kind"):
            m["kind"] = "binomial" if m.get("se_metric") else "kl" if "kl" in pm.split("_") else "default"
        out[str(key)] = m
    if not out:
        raise ValueError(f"spec {spec.get('name')!r} selects no metrics")
    return out


def reference_path(spec: Mapping, reference_dir) -> Path | list[Path]:
    """The spec's reference CSV, or its list of CSVs (one paper table printed as several, e.g. an LL and an RMSE
    table that share their runs)."""
    ref = spec.get("reference")
    if not ref:
        raise ValueError(f"spec {spec.get('name')!r} has no 'reference' CSV")
    base = Path(reference_dir) if reference_dir is not None else REFERENCE_DIR
    paths = [Path(r) if Path(r).is_absolute() else base / r for r in ([ref] if isinstance(ref, str) else ref)]
    return paths[0] if isinstance(ref, str) else paths


def read_reference(path: Path | list[Path]) -> pd.DataFrame:
    if isinstance(path, list):
        return pd.concat([read_reference(p) for p in path], ignore_index=True)
    ref = pd.read_csv(path, dtype=str, keep_default_na=False)
    for c in ["paper", "table", "dataset", "method", "setting", "metric",
              "value", "error", "error_kind", "scale"]:
        if c not in ref.columns:
            ref[c] = ""
        ref[c] = ref[c].fillna("").astype(str).str.strip()
    return ref


def dataset_ref_name(ds: str, overrides: Mapping, available: set) -> str:
    if ds in overrides:
        return str(overrides[ds])
    candidates = [ds.rsplit("/", 1)[-1], ds.replace("/", "_"), ds]
    for c in candidates:
        if c in available:
            return c
    return candidates[0]
