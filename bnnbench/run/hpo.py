"""Hyper-parameter candidates chosen without the test split: grid search and Bayesian optimisation.

The papers chose (noise precision, prior precision) per split by Bayesian optimisation on the mean
5-fold cross-validated log-likelihood of the training part (SLANG: 5 random + 25 expected-improvement
steps with ``bayes_opt`` 0.6.0; Vadam: the same budget). ``GPBayesOpt`` re-implements that optimiser:
a GP with a Matern-5/2 kernel and noise ``alpha`` on the log-space box whose length-scales start at
the protocol's values and are re-fitted by maximum marginal likelihood at every step (sklearn's
L-BFGS-B with 25 random restarts, as ``bayes_opt`` 0.6.0 does), and expected improvement (xi = 0)
maximised by random search plus L-BFGS-B polishing (bayes_opt: 100000 random points and 250
L-BFGS-B starts; here 10000 and 5 unless ``hpo.acq_candidates`` / ``hpo.acq_polish`` say otherwise:
ample for a 2-D box). The length-scale fit evaluates ``matern52_lml``: sklearn's numbers, bit for bit, in about half
of its time. One optimiser runs
per split; all splits' candidates x folds train as one batched program, round by round. With
``batch > 1`` each round proposes several points by the kriging believer heuristic.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import numpy as np
from scipy.linalg import lapack
from scipy.optimize import minimize
from scipy.spatial import distance
from scipy.stats import norm


def grid_points(axes: list) -> np.ndarray:
    """All combinations ``[n_1 * ... * n_d, d]`` of the values on each axis (first axis slowest)."""
    return np.array(list(itertools.product(*axes)), dtype=float)


def expected_improvement(mu: np.ndarray, sd: np.ndarray, best: float, xi: float = 0.0) -> np.ndarray:
    """EI(x) = (mu - best - xi) Phi(z) + sd phi(z), z = (mu - best - xi) / sd, for maximisation."""
    sd = np.maximum(sd, 1e-12)
    z = (mu - best - xi) / sd
    return (mu - best - xi) * norm.cdf(z) + sd * norm.pdf(z)


class GPBayesOpt:
    """One Bayesian optimisation (maximisation) over a box, driven by ``ask``/``tell``."""

    def __init__(self, bounds, length_scales, n_random: int = 5, alpha: float = 1e-2, xi: float = 0.0,
                 seed: int = 0, n_candidates: int = 10000, n_polish: int = 5, fit_length_scales: bool = True,
                 gp_restarts: int = 25):
        self.bounds = np.asarray(bounds, dtype=float)
        self.length_scales = np.asarray(length_scales, dtype=float)
        self.n_random, self.alpha, self.xi = n_random, alpha, xi
        self.rng = np.random.default_rng(seed)
        self.n_candidates, self.n_polish = n_candidates, n_polish
        self.fit_length_scales, self.gp_restarts, self.seed = fit_length_scales, gp_restarts, seed
        self.X: list[np.ndarray] = []
        self.y: list[float] = []

    def _uniform(self, n):
        lo, hi = self.bounds[:, 0], self.bounds[:, 1]
        return lo + (hi - lo) * self.rng.random((n, len(lo)))

    def _gp(self, X, y):
        from sklearn.gaussian_process.kernels import Matern
        GPR = _matern_gpr()
        if self.fit_length_scales:
            gp = GPR(kernel=Matern(length_scale=self.length_scales, nu=2.5), alpha=self.alpha,
                     n_restarts_optimizer=self.gp_restarts, random_state=int(self.rng.integers(2**31)))
        else:
            gp = GPR(kernel=Matern(length_scale=self.length_scales, length_scale_bounds="fixed", nu=2.5),
                     alpha=self.alpha, optimizer=None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gp.fit(np.asarray(X), np.asarray(y))
        return gp

    def _argmax_ei(self, gp, best):
        cand = self._uniform(self.n_candidates)
        mu, sd = gp.predict(cand, return_std=True)
        ei = expected_improvement(mu, sd, best, self.xi)
        top = cand[np.argsort(-ei)[: self.n_polish]]
        x_best, ei_best = top[0], ei.max()

        def neg_ei(x):
            m, s = gp.predict(x[None], return_std=True)
            return -expected_improvement(m, s, best, self.xi)[0]

        for x0 in top:
            res = minimize(neg_ei, x0, bounds=self.bounds, method="L-BFGS-B")
            if res.success and -res.fun > ei_best:
                x_best, ei_best = np.clip(res.x, self.bounds[:, 0], self.bounds[:, 1]), -res.fun
        return x_best

    def ask(self, n: int = 1) -> np.ndarray:
        """``n`` points to evaluate next: random while fewer than ``n_random`` are known, then EI."""
        n_known = len(self.y)
        if n_known < self.n_random:
            return self._uniform(min(n, self.n_random - n_known))
        X, y = list(self.X), list(self.y)
        out = []
        for _ in range(n):
            gp = self._gp(X, y)
            x = self._argmax_ei(gp, max(y))
            out.append(x)
            X.append(x)
            y.append(float(gp.predict(x[None])[0]))  # kriging believer
        return np.array(out)

    def tell(self, X: np.ndarray, y: np.ndarray):
        for x, v in zip(np.atleast_2d(X), np.atleast_1d(y)):
            self.X.append(np.asarray(x, dtype=float))
            self.y.append(float(v))

    @property
    def best(self) -> tuple[np.ndarray, float]:
        i = int(np.argmax(self.y))
        return self.X[i], self.y[i]


def matern52_lml(theta: np.ndarray, X: np.ndarray, y: np.ndarray, alpha: float,
                 sq_diff: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """The log marginal likelihood of a zero-mean GP with the anisotropic Matern-5/2 kernel of length-scales
    ``exp(theta)`` and noise variance ``alpha``, and its gradient in ``theta`` (Rasmussen & Williams, 2006, Alg. 2.1
    and eq. 5.9):

        log p(y | X) = -y^T K^-1 y / 2 - sum_i log L_ii - n log(2 pi) / 2,   K = k(X, X) + alpha I = L L^T,
        d/dtheta_d = tr((a a^T - K^-1) dK/dtheta_d) / 2,                     a = K^-1 y,

    with k(r) = (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r), r the scaled distance. Computed by the same numpy, scipy
    and LAPACK calls, in the same order, as scikit-learn's ``GaussianProcessRegressor.log_marginal_likelihood`` with
    ``Matern(nu=2.5)`` (read in 1.9; tests/run/test_hpo.py compares the bits with the installed version's), so the
    same bits; what it leaves out is the kernel object's parameter machinery and scipy's argument checks, most of
    sklearn's time for the BO's GPs of at most 30 points. ``(-inf, 0)`` where K is not positive definite, as sklearn.
    ``sq_diff``: ``(X_i - X_j)^2 [n, n, d]``, the same for every theta of a fit (``sq_diffs``)."""
    length_scale = np.exp(theta)
    K = _pdist_euclidean(X / length_scale) * math.sqrt(5)
    K = (1.0 + K + K**2 / 3.0) * np.exp(-K)
    K = distance.squareform(K, checks=False)
    n = K.shape[0]
    K.flat[:: n + 1] = 1
    D = (sq_diffs(X) if sq_diff is None else sq_diff) / (length_scale**2)
    tmp = np.sqrt(5 * D.sum(-1))[..., np.newaxis]
    K_gradient = 5.0 / 3.0 * D * (tmp + 1) * np.exp(-tmp)
    K.flat[:: n + 1] += alpha
    L, info = lapack.dpotrf(K, lower=True, overwrite_a=False, clean=True)
    if info != 0:
        return -np.inf, np.zeros_like(theta)
    y = y[:, np.newaxis]
    a = lapack.dpotrs(L, y, lower=True, overwrite_b=False)[0]
    lml = -0.5 * np.einsum("ik,ik->k", y, a)
    lml -= np.log(np.diag(L)).sum()
    lml -= n / 2 * np.log(2 * np.pi)
    inner = np.einsum("ik,jk->ijk", a, a)
    K_inv = lapack.dpotrs(L, np.eye(n), lower=True, overwrite_b=False)[0]
    inner -= K_inv[..., np.newaxis]
    grad = 0.5 * np.einsum("ijl,jik->kl", inner, K_gradient)
    return lml.sum(axis=-1), grad.sum(axis=-1)


def sq_diffs(X: np.ndarray) -> np.ndarray:
    """``(X_i - X_j)^2 [n, n, d]``, as sklearn's Matern forms it before scaling by the length-scales."""
    return (X[:, np.newaxis, :] - X[np.newaxis, :, :]) ** 2


def _pdist_euclidean(X: np.ndarray) -> np.ndarray:
    """``scipy.spatial.distance.pdist(X)``: the kernel it calls for "euclidean" without its argument handling."""
    kernel = getattr(getattr(distance, "_METRIC_ALIAS", {}).get("euclidean"), "pdist_func", None)
    return kernel(X) if callable(kernel) else distance.pdist(X)


@functools.cache
def _matern_gpr():
    """sklearn's ``GaussianProcessRegressor`` whose length-scale fit evaluates ``matern52_lml`` (the same bits, so the
    same L-BFGS-B path, fitted GP and proposals; tests/run/test_hpo.py) where it applies: a Matern-5/2 kernel with
    two or more fitted length-scales, a scalar noise, one output. Anything else is sklearn's own."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import Matern

    class MaternGPR(GaussianProcessRegressor):
        def log_marginal_likelihood(self, theta=None, eval_gradient=False, clone_kernel=True):
            if eval_gradient and not clone_kernel and theta is not None and np.ndim(self.alpha) == 0:
                sq_diff = self._sq_diff()
                if sq_diff is not None:
                    return matern52_lml(np.asarray(theta, dtype=float), self.X_train_, self.y_train_, self.alpha,
                                        sq_diff)
            return super().log_marginal_likelihood(theta, eval_gradient, clone_kernel)

        def _sq_diff(self):
            """``sq_diffs`` of this fit's inputs where ``matern52_lml`` applies to the fit, else None: decided and
            computed once per fit, not at each of its L-BFGS-B evaluations."""
            if getattr(self, "_sq_diff_of", None) is not self.X_train_:
                k = getattr(self, "kernel_", None)
                applies = (type(k) is Matern and k.nu == 2.5 and k.anisotropic
                           and not k.hyperparameter_length_scale.fixed and not self.normalize_y
                           and self.y_train_.ndim == 1 and self.X_train_.dtype == np.float64)
                self._sq_diff_of, self._sq_diff_value = self.X_train_, sq_diffs(self.X_train_) if applies else None
            return self._sq_diff_value

    return MaternGPR


def kfold_indices(n: int, n_folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``KFold(n_splits, shuffle=True, random_state=seed)`` positions (the SLANG/Vadam CV)."""
    from sklearn.model_selection import KFold
    return list(KFold(n_splits=n_folds, shuffle=True, random_state=seed).split(np.arange(n)))
