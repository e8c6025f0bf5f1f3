"""Hyper-parameter candidates chosen without the test split: grid search and Bayesian optimisation.

The papers chose (noise precision, prior precision) per split by Bayesian optimisation on the mean
5-fold cross-validated log-likelihood of the training part (SLANG: 5 random + 25 expected-improvement
steps with ``bayes_opt`` 0.6.0; Vadam: the same budget). ``GPBayesOpt`` re-implements that optimiser:
a GP with a Matern-5/2 kernel and noise ``alpha`` on the log-space box whose length-scales start at
the protocol's values and are re-fitted by maximum marginal likelihood at every step (sklearn's
L-BFGS-B with 25 random restarts, as ``bayes_opt`` 0.6.0 does), and expected improvement (xi = 0)
maximised by random search plus L-BFGS-B polishing (bayes_opt: 100000 random points and 250
L-BFGS-B starts; here 10000 and 5 unless ``hpo.acq_candidates`` / ``hpo.acq_polish`` say otherwise:
ample for a 2-D box). One optimiser runs
per split; all splits' candidates x folds train as one batched program, round by round. With
``batch > 1`` each round proposes several points by the kriging believer heuristic.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
from scipy.optimize import minimize
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
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import Matern
        if self.fit_length_scales:
            gp = GaussianProcessRegressor(kernel=Matern(length_scale=self.length_scales, nu=2.5), alpha=self.alpha,
                                          n_restarts_optimizer=self.gp_restarts,
                                          random_state=int(self.rng.integers(2**31)))
        else:
            gp = GaussianProcessRegressor(kernel=Matern(length_scale=self.length_scales, length_scale_bounds="fixed",
                                                        nu=2.5), alpha=self.alpha, optimizer=None)
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


def kfold_indices(n: int, n_folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``KFold(n_splits, shuffle=True, random_state=seed)`` positions (the SLANG/Vadam CV)."""
    from sklearn.model_selection import KFold
    return list(KFold(n_splits=n_folds, shuffle=True, random_state=seed).split(np.arange(n)))
