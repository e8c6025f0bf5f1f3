"""Exact Gaussian VI for Bayesian logistic regression, solved rather than stepped: the "Full-Gaussian Exact" and
"Mean-Field Exact" columns of SLANG Table 1 (Mishkin et al., 2018) and the MF-Exact reference of Vadam Figure 2
(Khan et al., 2018).

For the linear model f(x) = w^T x + b, labels y_i in {0, 1} (s_i = 2 y_i - 1) and the prior N(0, diag(lambda)^-1),

    q* = argmax_{q = N(m, S)}  sum_i E_q[log sigmoid(s_i f(x_i))] - KL(q || p),

over full covariances S (``exact_full``) or diagonal ones (``exact_mf``): L-BFGS on the exact ELBO (1-D quadrature,
``bnnbench.methods.exact.exact_vi.fit_exact``) to a max-abs gradient ``gtol``, each replica on its own training rows.
Solutions are cached on disk by their inputs (``logreg.exact_solution``), as every Gaussian method's symmetric KL is
measured to them. The state (``ExactGaussianState``) holds q* in the MLP's parameter order [w, b]: ``mean [R, P]``
and ``cov [R, P, P]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bnnbench.core import prng
from bnnbench.methods.exact import logreg
from bnnbench.core.errors import ConfigError
from bnnbench.methods.base import Method, Problem, hyper_state
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.state import State, state_class


@state_class
class ExactGaussianState(State):
    """q* = N(mean, cov) per replica in the MLP's parameter order [w, b]: ``mean [R, P]``, ``cov [R, P, P]``."""
    mean: torch.Tensor
    cov: torch.Tensor


class ExactGaussian(Method):
    """q* of the module docstring over the Gaussians of ``family`` (``exact_vi.FAMILIES``)."""
    solved = True
    family: str

    def __init__(self, cfg, model, likelihood: str):
        super().__init__(cfg, model, likelihood)
        if likelihood != "bernoulli" or not model.is_linear:
            raise ConfigError(f"{self.name} is exact VI for Bayesian logistic regression: valid with a binary task "
                              "(protocol=slang_logreg or vadam_logreg) and a linear model (protocol hidden: []); this "
                              f"run has a {likelihood} likelihood and layer sizes {model.sizes}")

    def solve(self, problem: Problem, data, *, gtol: float) -> tuple[ExactGaussianState, dict]:
        """Replica r's q* on its training rows in design order ``[1, x]`` (``logreg.design``), with the prior
        precisions of ``problem``; the report counts the L-BFGS iterations and the solutions read from the cache
        (whose fitting time is then not in this run's)."""
        lam = logreg.to_design_order(problem.prior_prec.detach().double().cpu().numpy())
        info = {"family": self.family, "gtol": gtol, "lbfgs_iterations": 0, "cached_solutions": 0}
        means, covs = [], []
        for r, u in enumerate(data.data_index.tolist()):
            n = int(data.n_train[u])
            X = logreg.design(data.x_train[u, :n].double().cpu().numpy())
            q = logreg.exact_solution(X, data.y_train[u, :n].double().cpu().numpy(), lam[r], self.family, gtol=gtol)
            info["lbfgs_iterations"] += q.n_iter
            info["cached_solutions"] += q.message == "cached"
            means.append(logreg.to_mlp_order(q.mean))
            covs.append(logreg.cov_to_mlp_order(q.cov))
        dev = problem.prior_prec.device
        state = ExactGaussianState(**hyper_state(problem),
                                   mean=torch.as_tensor(np.stack(means), dtype=torch.float64, device=dev),
                                   cov=torch.as_tensor(np.stack(covs), dtype=torch.float64, device=dev))
        return state, info

    def gaussian(self, state):
        return state.mean, state.cov

    def predict(self, state, x, n_samples, generator):
        """theta = m + L eps with S = L L^T, eps ~ N(0, I)."""
        mean = state.mean
        R, P = mean.shape
        eps = prng.randn(R, n_samples, P, generator=generator, dtype=mean.dtype, device=mean.device)
        theta = mean.unsqueeze(1) + eps @ torch.linalg.cholesky(state.cov).transpose(-1, -2)
        return self._predictive(state, self.model.forward(theta, x))


@dataclass(frozen=True)
class ExactFullConfig(MethodConfig):
    name: str = "exact_full"


@dataclass(frozen=True)
class ExactMFConfig(MethodConfig):
    name: str = "exact_mf"


class ExactFullGaussian(ExactGaussian):
    name = "exact_full"
    Config = ExactFullConfig
    family = "full"


class ExactMeanField(ExactGaussian):
    name = "exact_mf"
    Config = ExactMFConfig
    family = "mf"
