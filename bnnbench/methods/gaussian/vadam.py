"""Vadam and Vprop (Khan et al., ICML 2018, section 4; ``vadam/optimizers.py`` of the authors' code).

Weight perturbation with the Adam/RMSprop second moment as the precision. With lambda the prior
precision, lambda~ = lambda / N, and theta_s = mu + eps_s / sqrt(N s + lambda) (s without bias
correction), g_s the gradient of the minibatch-mean negative log-likelihood at theta_s:

Vadam:  m <- g1 m + (1 - g1)(mean_s g_s + lambda~ mu),   s <- g2 s + (1 - g2) mean_s g_s^2,
        mu <- mu - alpha m_hat / (sqrt(s_hat) + lambda~),  m_hat = m / (1 - g1^t), s_hat = s / (1 - g2^t);
Vprop:  s <- b s + (1 - b) mean_s g_s^2,   mu <- mu - alpha (mean_s g_s + lambda~ mu) / (sqrt(s) + lambda~).

s starts at (prec_init - lambda) / N (the UCI code sets prec_init = lambda, so s_0 = 0). The
posterior precision used for prediction is N s + lambda.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch

from bnnbench.core.linalg import mlp_relu
from bnnbench.methods.base import Problem, hyper_state
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.gaussian.mean_field import DiagonalPrecision, MeanFieldState
from bnnbench.methods.gaussian.natural import leaf_layers, sample_gradients
from bnnbench.methods.state import state_class


@dataclass(frozen=True)
class VadamConfig(MethodConfig):
    name: str = "vadam"
    lr: float = 0.01
    betas: List[float] = field(default_factory=lambda: [0.9, 0.99])
    train_samples: int = 1
    prec_init: Optional[float] = None   # None: the prior precision (s_0 = 0), as the UCI code
    init_mean: str = "uniform_fan_in"


@dataclass(frozen=True)
class VpropConfig(MethodConfig):
    name: str = "vprop"
    lr: float = 0.01
    beta: float = 0.99
    train_samples: int = 1
    prec_init: Optional[float] = None
    init_mean: str = "uniform_fan_in"


@state_class
class VpropState(MeanFieldState):
    """mu and the second moment s ``[R, P]`` (posterior precision N s + lambda) after t steps."""
    s: torch.Tensor
    t: torch.Tensor


@state_class
class VadamState(VpropState):
    """Vprop's mu, s and t, with Adam's first moment m."""
    m: torch.Tensor


class Vadam(DiagonalPrecision):
    name = "vadam"
    compilable = True  # bench/compile_step.py: 1.3-2x faster compiled at UCI scale
    Config = VadamConfig
    momentum = True

    def init(self, problem: Problem, generator: torch.Generator) -> VpropState:
        mean = self.init_params(problem, generator)
        N = problem.n_data.to(mean.dtype)[:, None]
        prec_init = problem.prior_prec if self.cfg.prec_init is None else self.cfg.prec_init
        s = ((prec_init - problem.prior_prec) / N).clamp_min(0) * torch.ones_like(mean)
        t = torch.zeros(problem.n_replicas, dtype=torch.long, device=mean.device)
        if self.momentum:
            return VadamState(**hyper_state(problem), mean=mean, s=s, t=t, m=torch.zeros_like(mean))
        return VpropState(**hyper_state(problem), mean=mean, s=s, t=t)

    def prec(self, state):
        """The posterior precision N s + lambda."""
        return state.n_data.to(state.s.dtype)[:, None] * state.s + state.prior_prec

    def compiled_step(self, compile):
        """``step`` compiled; a ReLU MLP's samples' gradients in float32 on a CPU by the fused kernel
        (``core/linalg/mlp_relu``) on minibatches of at least ``mlp_relu.MIN_ROWS`` rows."""
        kernel = mlp_relu.available()

        def step(state, batch, noise, lr_scale=1.0):
            fused = (kernel and batch.x.shape[1] >= mlp_relu.MIN_ROWS
                     and mlp_relu.applies(self.model, batch.x, state.mean.dtype))
            return self.step(state, batch, noise, lr_scale, fused=fused)
        return compile(step)

    def step(self, state, batch, noise, lr_scale=1.0, fused=False):
        mean, s = state.mean, state.s
        if fused:
            theta = (mean.unsqueeze(1) + self.std(state).unsqueeze(1) * noise).detach().requires_grad_(True)
            g, nll = sample_gradients(self, state, theta, batch)
        else:
            g, nll = sample_gradients(self, state, leaf_layers(self.model, mean, self.std(state), noise), batch)
        g_bar, g2_bar = g.mean(1), (g * g).mean(1)
        lam_t = state.prior_prec / state.n_data.to(mean.dtype)[:, None]
        t = state.t + 1
        alpha = self.cfg.lr * lr_scale
        if self.momentum:
            g1, g2 = (float(b) for b in self.cfg.betas)
            m = g1 * state.m + (1 - g1) * (g_bar + lam_t * mean)
            s = g2 * s + (1 - g2) * g2_bar
            tt = t.to(mean.dtype)[:, None]
            m_hat, s_hat = m / (1 - g1 ** tt), s / (1 - g2 ** tt)
            new = state.replace(t=t, m=m, s=s, mean=mean - alpha * m_hat / (s_hat.sqrt() + lam_t))
        else:
            beta = self.cfg.beta
            s = beta * s + (1 - beta) * g2_bar
            new = state.replace(t=t, s=s, mean=mean - alpha * (g_bar + lam_t * mean) / (s.sqrt() + lam_t))
        return new, {"objective": nll, "nll": nll}


class Vprop(Vadam):
    name = "vprop"
    Config = VpropConfig
    momentum = False
