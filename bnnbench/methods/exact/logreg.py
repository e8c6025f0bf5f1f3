"""Bayesian logistic regression with Gaussian posteriors: the metrics of SLANG Table 1 and the exact
columns (Mishkin et al., 2018, section 4.1; docs/protocols/slang.md sections 3 and 4.1).

The model is the MLP with no hidden layer, ``f(x) = w^T x + b``, with a Bernoulli likelihood. Its flat
parameter vector is ``[w (D), b]``; the design-matrix form of ``bnnbench.methods.exact.exact_vi`` puts the bias first,
``X~ = [1, X]``, ``theta~ = [b, w]`` (as SLANG's MATLAB code, whose KL quirk concerns coordinate 0).

For every method whose q is Gaussian (``Method.gaussian``), the exact solutions included
(``bnnbench.methods.exact.exact_gaussian``), per split:

* ``neg_elbo``: -ELBO(q) / N_train, exact (1-D quadrature, correct KL);
* ``neg_elbo_paper``: the MATLAB convention of the published numbers: E[log(1 + e^z)] by the piecewise
  bound of Marlin et al. (2011) and the KL without the bias coordinate's log prior precision
  (``exact_vi.neg_elbo_per_point(method="marlin", matlab_kl=True)``);
* ``test_nll``: mean of -log p(y|x) over the test split in nats, p(y=1|x) = E_{z~N(x^T m, x^T S x)}[sigmoid z];
* ``sym_kl``: 0.5 [KL(q || q*) + KL(q* || q)] to the Full-Gaussian Exact solution q* of the same split;
* ``sym_kl_mf``: the same to the Mean-Field Exact solution (the reference of Vadam Figure 2).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from bnnbench.core.files import save_npz
from bnnbench.methods.exact import exact_vi


def design(X: np.ndarray) -> np.ndarray:
    """``[1, x]`` rows: the bias coordinate first."""
    X = np.asarray(X, dtype=np.float64).reshape(len(X), -1)
    return np.hstack([np.ones((len(X), 1)), X])


def to_design_order(theta_vec: np.ndarray) -> np.ndarray:
    """MLP order ``[w, b]`` -> design order ``[b, w]`` along the last axis (one output, no hidden layer)."""
    return np.concatenate([theta_vec[..., -1:], theta_vec[..., :-1]], axis=-1)


def cov_to_design_order(cov: np.ndarray) -> np.ndarray:
    perm = np.r_[cov.shape[-1] - 1, np.arange(cov.shape[-1] - 1)]
    return cov[..., perm[:, None], perm[None, :]]


def to_mlp_order(theta_vec: np.ndarray) -> np.ndarray:
    """Design order ``[b, w]`` -> MLP order ``[w, b]`` along the last axis (inverse of ``to_design_order``)."""
    return np.concatenate([theta_vec[..., 1:], theta_vec[..., :1]], axis=-1)


def cov_to_mlp_order(cov: np.ndarray) -> np.ndarray:
    perm = np.r_[np.arange(1, cov.shape[-1]), 0]
    return cov[..., perm[:, None], perm[None, :]]


def prior_vector(n_features: int, prior_prec: float, bias_prior_prec: float | None) -> np.ndarray:
    """Prior precisions in design order: the bias coordinate, then the weights."""
    lam = np.full(n_features + 1, float(prior_prec))
    if bias_prior_prec is not None:
        lam[0] = float(bias_prior_prec)
    return lam


def _cache_dir() -> Path:
    from bnnbench.core.data.store import cache_dir
    return cache_dir() / "exact_vi"


def exact_solution(X: np.ndarray, y: np.ndarray, lam: np.ndarray, family: str, *, gtol: float,
                   max_iter: int = 20000, cache: bool = True) -> exact_vi.ExactResult:
    """``exact_vi.fit_exact`` on design matrix ``X`` (bias column included), cached on disk by the
    sha256 of its inputs (the Full-Gaussian Exact solution is the reference of every column's KL)."""
    h = hashlib.sha256()
    for a in (np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(y, dtype=np.float64),
              np.ascontiguousarray(lam, dtype=np.float64)):
        h.update(a.tobytes())
    h.update(json.dumps([family, gtol, max_iter]).encode())
    path = _cache_dir() / f"{family}-{h.hexdigest()[:24]}.npz"
    if cache and path.exists():
        z = np.load(path)
        return exact_vi.ExactResult(mean=z["mean"], cov=z["cov"], neg_elbo_per_point=float(z["f"]),
                                    converged=True, n_iter=int(z["n_iter"]), grad_norm=float(z["grad_norm"]),
                                    family=family, message="cached")
    res = exact_vi.fit_exact(X, y, lam, family, gtol=gtol, max_iter=max_iter)
    if cache:
        save_npz(path, mean=res.mean, cov=res.cov, f=res.neg_elbo_per_point, n_iter=res.n_iter,
                         grad_norm=res.grad_norm)
    return res


def posterior_metrics(mean, cov, X_train, y_train, X_test, y_test, lam, reference,
                      reference_mf=None) -> dict[str, float]:
    """The Table-1 metrics of ``N(mean, cov)`` (design order) for one split; ``reference`` is the
    Full-Gaussian Exact ``(mean, cov)`` of that split, ``reference_mf`` the Mean-Field Exact one."""
    mean = np.asarray(mean, dtype=np.float64)
    cov = np.asarray(cov, dtype=np.float64)
    cov = 0.5 * (cov + cov.T)
    return {
        "neg_elbo": exact_vi.neg_elbo_per_point(mean, cov, X_train, y_train, lam),
        "neg_elbo_paper": exact_vi.neg_elbo_per_point(mean, cov, X_train, y_train, lam, method="marlin",
                                                      matlab_kl=True),
        "test_nll": exact_vi.test_nll(mean, cov, X_test, y_test),
        "sym_kl": exact_vi.sym_kl(mean, cov, reference[0], reference[1]),
        **({"sym_kl_mf": exact_vi.sym_kl(mean, cov, *reference_mf)} if reference_mf is not None else {}),
    }


def split_arrays(ds, split):
    return (design(ds.X[split.train]), np.asarray(ds.y[split.train]).ravel(),
            design(ds.X[split.test]), np.asarray(ds.y[split.test]).ravel())


def reference_solutions(ds, splits, lams, gtol: float, family: str = "full") -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for s, lam in zip(splits, lams):
        Xtr, ytr, _, _ = split_arrays(ds, s)
        r = exact_solution(Xtr, ytr, lam, family, gtol=gtol)
        out.append((r.mean, r.cov))
    return out


def gaussian_q(method, state) -> tuple[np.ndarray, np.ndarray]:
    """A fitted (trained or solved) method's Gaussian q per replica, ``(mean [R, D+1], cov [R, D+1, D+1])`` in float64
    and the design order."""
    mean, cov = method.gaussian(state)
    return (to_design_order(mean.detach().double().cpu().numpy()),
            cov_to_design_order(cov.detach().double().cpu().numpy()))


def method_metrics(mean, cov, ds, splits, lams, gtol: float) -> list[dict]:
    """Table-1 metrics of the Gaussian q ``(mean, cov)`` (``gaussian_q``), replica r = split r."""
    refs = reference_solutions(ds, splits, lams, gtol)
    refs_mf = reference_solutions(ds, splits, lams, gtol, family="mf")
    rows = []
    for r, (s, lam, ref, ref_mf) in enumerate(zip(splits, lams, refs, refs_mf)):
        Xtr, ytr, Xte, yte = split_arrays(ds, s)
        rows.append(posterior_metrics(mean[r], cov[r], Xtr, ytr, Xte, yte, lam, ref, ref_mf))
    return rows
