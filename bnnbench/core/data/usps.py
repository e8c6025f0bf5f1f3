"""USPS resampled (GPML ``usps_resampled.mat``), binary 3-vs-5 as in SLANG / Vadam.

The .mat holds ``train_patterns`` / ``test_patterns`` (256 x 4649, values in [-1, 1], one
column per image, row-major 16x16) and one-vs-rest ``±1`` label matrices (10 x 4649).
``usps/3vs5``: the 3s and 5s of train then test (original column order; 767 + 773 = 1540
rows), label 5 -> 1, 3 -> 0, X float64 [1540, 256] (no bias column), the 20 random 50/50 splits
of the authors' MATLAB code as for the LIBSVM sets (``libsvm.matlab_randperm_splits``, named "1".."20").
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import DataError


def read_usps_mat(path: Path):
    """``(X_train, d_train, X_test, d_test)``: float64 [n, 256] images and int64 digits."""
    from scipy.io import loadmat

    m = loadmat(str(path))
    out = []
    for part in ("train", "test"):
        P = np.asarray(m[f"{part}_patterns"], dtype=np.float64)
        L = np.asarray(m[f"{part}_labels"])
        if P.shape[0] != 256 or L.shape != (10, P.shape[1]):
            raise DataError(f"{path}: unexpected shapes {P.shape}, {L.shape}")
        if not np.all((L == 1).sum(axis=0) == 1):
            raise DataError(f"{path}: {part}_labels columns are not one-hot ±1")
        out += [np.ascontiguousarray(P.T), L.argmax(axis=0).astype(np.int64)]
    return tuple(out)


def build(name: str, spec: dict, files: dict[str, Path]):
    from . import Dataset
    from .libsvm import SPLIT_RULE, matlab_randperm_splits

    p = spec["params"]
    Xtr, dtr, Xte, dte = read_usps_mat(files[p["file"]])
    neg, pos = p["negative_digit"], p["positive_digit"]
    mtr, mte = np.isin(dtr, (neg, pos)), np.isin(dte, (neg, pos))
    X = np.vstack([Xtr[mtr], Xte[mte]])
    d = np.concatenate([dtr[mtr], dte[mte]])
    y = (d == pos).astype(np.int64)
    meta = {
        "source": p["file"],
        "digits": {"0": neg, "1": pos},
        "n_from_train": int(mtr.sum()),
        "n_from_test": int(mte.sum()),
        "train_columns": np.flatnonzero(mtr).tolist(),
        "test_columns": np.flatnonzero(mte).tolist(),
        "image_shape": [16, 16],
        "bias_column": False,
        "split_rule": SPLIT_RULE,
    }
    splits = matlab_randperm_splits(len(y), p["n_splits"], p["train_fraction"])
    return Dataset(name=name, task="binary", X=X, y=y, splits=splits, n_classes=2, meta=meta)
