"""Synthetic regression data generated from a seed (no raw files; rebuilt on every load, never cached).

- ``synthetic/gap_cubic``: the toy of Hernandez-Lobato & Adams (2015) with a gap, as Ober & Aitchison (2020) Fig. 1:
  20 inputs from U(-4, -2) and 20 from U(2, 4), y = x^3 + eps, eps ~ N(0, 3^2); the test rows are a grid over
  [-6, 6] (with noisy targets), so a run's stored predictive is the figure's curve. One split ("0").
- ``synthetic/deep_linear``: Ober & Aitchison (2020) Fig. 2: d inputs x ~ N(0, I), y = x^T w + eps with
  w ~ N(0, weight_var I) and eps ~ N(0, noise_var); ``n_draws`` independent draws of (w, X, y), one split each, of
  ``n_train`` training and ``n_test`` test rows. The exact log evidence of the generating model
  (``log_evidence``) is the figure's reference.
"""

from __future__ import annotations

import math

import numpy as np


def _gap_cubic(name, p):
    from .dataset import Dataset, Split
    rng = np.random.default_rng(int(p["seed"]))
    n = int(p["n_per_side"])
    x_train = np.concatenate([rng.uniform(-4, -2, n), rng.uniform(2, 4, n)])
    lo, hi = p["grid"]
    x_test = np.linspace(float(lo), float(hi), int(p["n_grid"]))
    x = np.concatenate([x_train, x_test])
    y = x ** 3 + float(p["noise_std"]) * rng.standard_normal(len(x))
    split = Split("0", np.arange(2 * n), np.arange(2 * n, len(x)))
    return Dataset(name=name, task="regression", X=x[:, None], y=y, splits=[split], n_classes=None,
                   meta={"noise_std": float(p["noise_std"]), "generator": "gap_cubic", **p})


def _deep_linear(name, p):
    from .dataset import Dataset, Split
    rng = np.random.default_rng(int(p["seed"]))
    d, n_tr, n_te = int(p["d_in"]), int(p["n_train"]), int(p["n_test"])
    X, y, splits = [], [], []
    for k in range(int(p["n_draws"])):
        w = math.sqrt(float(p["weight_var"])) * rng.standard_normal(d)
        xk = rng.standard_normal((n_tr + n_te, d))
        X.append(xk)
        y.append(xk @ w + math.sqrt(float(p["noise_var"])) * rng.standard_normal(n_tr + n_te))
        base = k * (n_tr + n_te)
        splits.append(Split(str(k), base + np.arange(n_tr), base + n_tr + np.arange(n_te)))
    return Dataset(name=name, task="regression", X=np.vstack(X), y=np.concatenate(y), splits=splits, n_classes=None,
                   meta={"generator": "deep_linear", **p})


def log_evidence(X: np.ndarray, y: np.ndarray, weight_var: float, noise_var: float) -> float:
    """log N(y; 0, weight_var X X^T + noise_var I): the evidence of y = X w + eps, w ~ N(0, weight_var I)."""
    n, d = X.shape
    # by the matrix determinant lemma and Woodbury in the d x d space
    A = np.eye(d) / weight_var + X.T @ X / noise_var
    L = np.linalg.cholesky(A)
    b = np.linalg.solve(L, X.T @ y / noise_var)
    logdet = n * math.log(noise_var) + d * math.log(weight_var) + 2 * np.log(np.diag(L)).sum()
    quad = y @ y / noise_var - b @ b
    return float(-0.5 * (n * math.log(2 * math.pi) + logdet + quad))


GENERATORS = {"gap_cubic": _gap_cubic, "deep_linear": _deep_linear}


def build(name: str, spec: dict, files=None):
    p = dict(spec["params"])
    return GENERATORS[p.pop("generator")](name, p)
