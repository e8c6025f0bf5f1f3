"""Binary classification sets in LIBSVM format, and the SLANG/Vadam fixed presplits.

* ``random_splits`` (australian, breast_cancer): the full LIBSVM file; labels mapped to {0, 1}
  (australian: +1 -> 1, -1 -> 0; breast cancer: 4 (malignant) -> 1, 2 -> 0); the 20 random 50/50
  splits of SLANG's and Vadam's MATLAB code (``matlab_randperm_splits``), named by their seed "1".."20".
* ``presplit``: the fixed train/test CSVs of the SLANG/Vadam PyTorch code (space-separated,
  no bias column); X = [X_tr; X_te], one split named "presplit".
* ``train_test`` (a1a): a1a (train) stacked on a1a.t (test), ``n_features=123``, one split
  named "official".

X is dense float64 without a bias column (SLANG prepends a column of ones in its models).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import DataError

SPLIT_RULE = ("MATLAB setSeed(s); randperm(N) for s = 1..20 (MT19937 init_genrand(s), argsort of 53-bit "
              "uniforms); first floor(N/2) rows train")


def matlab_randperm(n: int, seed: int) -> np.ndarray:
    """MATLAB's ``setSeed(seed); p = randperm(n)`` as 0-based indices.

    Khan's ``setSeed.m`` calls ``rand('twister', seed)``, which seeds MT19937 with ``init_genrand(seed)``
    (as ``numpy.random.RandomState(seed)`` does), and ``randperm(n)`` is ``[~, p] = sort(rand(1, n))``,
    MATLAB's doubles being the same 53-bit ``genrand_res53`` draws as ``RandomState.random_sample``.
    Checked against the authors' numbers: Full-Gaussian Exact on these splits gives SLANG Table 1's
    means (tests/methods/test_logreg.py)."""
    u = np.random.RandomState(int(seed)).random_sample(n)
    return np.argsort(u, kind="stable")


def matlab_randperm_splits(n: int, n_splits: int = 20, train_fraction: float = 0.5):
    """The 50/50 splits of SLANG's ``get_data_log_reg.m`` (restart s uses split seed s = 1..n_splits):
    ``p = randperm(N)`` after ``setSeed(s)``, the first ``floor(N * train_fraction)`` rows train."""
    from . import Split

    n_train = int(np.floor(n * train_fraction))
    out = []
    for s in range(1, n_splits + 1):
        perm = matlab_randperm(n, s)
        out.append(Split(str(s), perm[:n_train], perm[n_train:]))
    return tuple(out)


def map_labels(y: np.ndarray, positive, negative, what: str) -> np.ndarray:
    y = np.asarray(y)
    bad = set(np.unique(y).tolist()) - {positive, negative}
    if bad:
        raise DataError(f"{what}: unexpected labels {sorted(bad)} (expected {negative}/{positive})")
    return (y == positive).astype(np.int64)


def _read_svmlight(path: Path, n_features: int):
    from sklearn.datasets import load_svmlight_file

    X, y = load_svmlight_file(str(path), n_features=n_features, dtype=np.float64)
    return np.asarray(X.toarray(), dtype=np.float64), y


def build(name: str, spec: dict, files: dict[str, Path]):
    from .dataset import Dataset, Split

    p = spec["params"]
    kind = p["kind"]
    meta = {"source_kind": kind, "bias_column": False, "label_map": None}
    if kind == "random_splits":
        X, yraw = _read_svmlight(files[p["file"]], p["n_features"])
        y = map_labels(yraw, p["positive_label"], p["negative_label"], p["file"])
        splits = matlab_randperm_splits(len(y), p["n_splits"], p["train_fraction"])
        meta.update(source=p["file"], split_rule=SPLIT_RULE)
    elif kind == "presplit":
        Xtr = np.loadtxt(files[p["X_tr"]], dtype=np.float64, ndmin=2)
        Xte = np.loadtxt(files[p["X_te"]], dtype=np.float64, ndmin=2)
        ytr = np.loadtxt(files[p["y_tr"]], dtype=np.float64, ndmin=1)
        yte = np.loadtxt(files[p["y_te"]], dtype=np.float64, ndmin=1)
        if len(Xtr) != len(ytr) or len(Xte) != len(yte) or Xtr.shape[1] != Xte.shape[1]:
            raise DataError(f"{name}: presplit files have inconsistent shapes")
        X = np.vstack([Xtr, Xte])
        y = map_labels(np.concatenate([ytr, yte]), 1.0, 0.0, name)
        n = len(ytr)
        splits = (Split("presplit", np.arange(n), np.arange(n, len(y))),)
        meta.update(source=p["X_tr"].rsplit("/", 1)[0], split_rule="fixed SLANG/Vadam presplit")
    elif kind == "train_test":
        Xtr, ytr = _read_svmlight(files[p["train"]], p["n_features"])
        Xte, yte = _read_svmlight(files[p["test"]], p["n_features"])
        X = np.vstack([Xtr, Xte])
        y = map_labels(np.concatenate([ytr, yte]), p["positive_label"], p["negative_label"], name)
        n = len(ytr)
        splits = (Split("official", np.arange(n), np.arange(n, len(y))),)
        meta.update(source=f"{p['train']} + {p['test']}", split_rule="official LIBSVM train/test files")
    else:
        raise DataError(f"{name}: unknown libsvm kind {kind!r}")
    if kind != "presplit":
        meta["label_map"] = {str(p["positive_label"]): 1, str(p["negative_label"]): 0}
    return Dataset(name=name, task="binary", X=np.ascontiguousarray(X), y=y, splits=splits,
                   n_classes=2, meta=meta)
