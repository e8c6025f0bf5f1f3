"""Stochastic gradient descent with momentum and weight decay: the SGD column of noisy natural gradient's CIFAR-10
table (Zhang et al., 2018, Table 2), a point estimate.

Objective per data point, as MAP's (``methods/point/map.py``): ``-(1/M) sum_i log p(y_i | theta) + (1/(2N)) sum_p
lambda_p theta_p^2``, so the weight decay is lambda / N (the prior precision lambda of the problem). Heavy-ball momentum
as ``torch.optim.SGD``: ``v <- mu v + g``, ``theta <- theta - alpha v`` (Nesterov: ``theta - alpha (g + mu v)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnbench.methods.base import hyper_state
from bnnbench.methods.point.map import MAP
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.state import State, state_class


@dataclass(frozen=True)
class SGDConfig(MethodConfig):
    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    nesterov: bool = False
    init_mean: str = "uniform_fan_in"   # uniform_fan_in | zero | xavier_uniform (a ConvNet's)


@state_class
class SGDState(State):
    """theta and the momentum buffer m (torch.optim.SGD's v) after t steps."""
    theta: torch.Tensor
    m: torch.Tensor
    t: torch.Tensor


class SGD(MAP):
    name = "sgd"
    Config = SGDConfig
    State = SGDState

    def init(self, problem, generator) -> SGDState:
        theta = self.init_params(problem, generator)
        return self.State(**hyper_state(problem), theta=theta, m=torch.zeros_like(theta),
                          t=torch.zeros(problem.n_replicas, dtype=torch.long, device=theta.device))

    def step(self, state, batch, noise, lr_scale=1.0):
        obj, stats, g = self.gradient(state, batch, noise)
        mu = self.cfg.momentum
        m = mu * state.m + g
        d = g + mu * m if self.cfg.nesterov else m
        new_theta = state.theta - self.cfg.lr * lr_scale * d
        return state.replace(theta=new_theta, m=m, t=state.t + 1), {"objective": obj, **stats}
