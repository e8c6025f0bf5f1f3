"""Vadam as the MATLAB logistic-regression code of Khan et al. (ICML 2018, section 6.1, Figure 2;
``matlab/lib/methods/my_methods.m``, docs/protocols/vadam.md 2) runs it. It differs from the PyTorch
``vadam`` (``bnnbench/methods/gaussian/vadam.py``) in its scaling, its initial state and where the prior enters.

q = N(mu, diag(1 / prec)), starting from prec_0 = S_0 = ``prec_init`` (the code: Sigma = I, S = inv(Sigma)). With the
minibatch gradient of the *summed* negative log-likelihood scaled to the data set,
g = (N / M) mean_s sum_i grad l_i(theta_s), theta_s = mu + eps_s / sqrt(prec):

    m <- rho m + (1 - rho)(g + lambda mu),                 m_hat = m / (1 - rho^t),
    S <- (1 - beta_t) S + beta_t g^2 / N,                  S_hat = S / (1 - (1 - beta_t)^t),
    prec <- S_hat + lambda,
    mu <- mu - alpha_t m_hat / (sqrt(S_hat) + lambda),

with alpha_t = alpha_0 / (1 + t^kappa), beta_t = beta_0 / (1 + t^kappa) and rho = 0.9 (the code's
momentum weight 0.1 on the new value). The curvature g^2 / N is the squared *minibatch* gradient
("gradient magnitude"), not a sum of per-example squares: Vadam's approximation that Figure 2 studies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnbench.methods.gaussian.natural import leaf_layers, sample_gradients
from bnnbench.methods.gaussian.slang import decayed
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.gaussian.vogn import VOGN, VOGNState
from bnnbench.methods.state import state_class


@dataclass(frozen=True)
class VadamMatlabConfig(MethodConfig):
    name: str = "vadam_matlab"
    lr: float = 0.01                    # alpha_0
    beta: float = 0.01                  # beta_0
    decay: float = 0.55                 # kappa: alpha_t = alpha_0 / (1 + t^kappa), beta_t likewise (0: constant)
    momentum: float = 0.9               # rho: the code's weight 0.1 on the new gradient, with bias correction
    train_samples: int = 1
    prec_init: float = 1.0              # Sigma_0 = I
    init_mean: str = "zero"


@state_class
class VadamMatlabState(VOGNState):
    """VOGN's mu, prec = S_hat + lambda and t, with the code's second moment S and gradient momentum m."""
    S: torch.Tensor
    m: torch.Tensor


class VadamMatlab(VOGN):
    """VOGN's mean-field state (``mean``, ``prec``) and initialisation, with ``S`` and ``m`` added."""
    name = "vadam_matlab"
    Config = VadamMatlabConfig

    def init(self, problem, generator) -> VadamMatlabState:
        state = super().init(problem, generator)
        return VadamMatlabState(**vars(state), S=state.prec.clone(), m=torch.zeros_like(state.mean))

    def step(self, state, batch, noise, lr_scale=1.0):
        mean, lam = state.mean, state.prior_prec
        g, nll = sample_gradients(self, state, leaf_layers(self.model, mean, self.std(state), noise), batch)
        N = state.n_data.to(mean.dtype)[:, None]
        g = N * g.mean(1)                                     # (N / M) sum_i grad l_i, averaged over samples
        t = state.t + 1
        tt = t.to(mean.dtype)[:, None]
        kappa = self.cfg.decay
        alpha = lr_scale * decayed(self.cfg.lr, kappa, t).to(mean.dtype)[:, None]
        beta = decayed(self.cfg.beta, kappa, t).to(mean.dtype)[:, None]
        rho = self.cfg.momentum
        m = rho * state.m + (1 - rho) * (g + lam * mean)
        m_hat = m / (1 - rho ** tt)
        S = (1 - beta) * state.S + beta * g * g / N
        S_hat = S / (1 - (1 - beta) ** tt)
        new_mean = mean - alpha * m_hat / (S_hat.sqrt() + lam)
        return (state.replace(mean=new_mean, prec=S_hat + lam, S=S, m=m, t=t),
                {"objective": nll, "nll": nll})
