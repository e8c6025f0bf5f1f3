"""Variational Online Gauss-Newton (VOGN; Khan et al., ICML 2018, section 3 and the ``vadam``
PyTorch code): mean-field q = N(mu, diag(1/P)), with per-example curvature.

Each step, with theta_s = mu + eps_s / sqrt(P), s = 1..S, and a minibatch of M examples:

    g_hat = N mean_s (1/M) sum_i grad loss_i(theta_s),   H_hat = N mean_s (1/M) sum_i c_i(theta_s),
    P  <- beta P + (1 - beta) (H_hat + lambda),
    mu <- mu - alpha (g_hat + lambda mu) / P,

with c_i the squared per-example gradient (empirical Fisher, the code's choice) or the per-example
Gauss-Newton diagonal (``curvature: ggn``). Minibatch size 1 is VOGN-1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from bnnbench.methods.base import Problem, hyper_state
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.gaussian.mean_field import DiagonalPrecision, MeanFieldState
from bnnbench.methods.gaussian.natural import leaf_layers, per_example_stats
from bnnbench.methods.state import state_class


@dataclass(frozen=True)
class VOGNConfig(MethodConfig):
    name: str = "vogn"
    lr: float = 1e-3
    beta: float = 0.999                 # P <- beta P + (1 - beta)(H_hat + lambda)
    train_samples: int = 1
    curvature: str = "ef"               # ef (empirical Fisher, the authors' code) | ggn (Gauss-Newton)
    prec_init: Optional[float] = None   # initial precision P; None: the prior precision
    init_mean: str = "uniform_fan_in"


@state_class
class VOGNState(MeanFieldState):
    """mu and the precision P ``[R, P]`` of q = N(mu, diag(1/P)) after t steps."""
    prec: torch.Tensor
    t: torch.Tensor


class VOGN(DiagonalPrecision):
    name = "vogn"
    compilable = True  # bench/compile_step.py: 1.3-2x faster compiled at UCI scale
    Config = VOGNConfig

    def init(self, problem: Problem, generator: torch.Generator) -> VOGNState:
        mean = self.init_params(problem, generator)
        prec = torch.full_like(mean, self.cfg.prec_init) if self.cfg.prec_init is not None \
            else problem.prior_prec.clone()
        return VOGNState(**hyper_state(problem), mean=mean, prec=prec,
                         t=torch.zeros(problem.n_replicas, dtype=torch.long, device=mean.device))

    def step(self, state, batch, noise, lr_scale=1.0):
        mean, prec, lam = state.mean, state.prec, state.prior_prec
        layers = leaf_layers(self.model, mean, self.std(state), noise)
        # compiled, the sums over samples and examples are taken together (fewer passes over the activations: 1.2-1.6x,
        # bench/step_ab.py); eagerly per sample, the order the committed records were made in
        over = torch.compiler.is_compiling()
        g_sum, c_sum, nll = per_example_stats(self, state, layers, batch, self.cfg.curvature, over_samples=over)
        g_sum, c_sum = g_sum.detach(), c_sum.detach()   # the new state holds values, not the step's graph
        if over:
            g_sum, c_sum = g_sum / noise.shape[1], c_sum / noise.shape[1]
        else:
            g_sum, c_sum = g_sum.mean(1), c_sum.mean(1)
        N = state.n_data.to(mean.dtype)[:, None]
        M = batch.x.shape[1]
        g_hat = N * g_sum / M
        h_hat = N * c_sum / M
        beta, alpha = self.cfg.beta, self.cfg.lr * lr_scale
        prec = beta * prec + (1 - beta) * (h_hat + lam)
        new_mean = mean - alpha * (g_hat + lam * mean) / prec
        return state.replace(mean=new_mean, prec=prec, t=state.t + 1), {"objective": nll, "nll": nll}
