"""Stochastic gradient descent with momentum and weight decay: the SGD column of noisy natural gradient's CIFAR-10
table (Zhang et al., 2018, Table 2), a point estimate.

Objective per data point, as MAP's (``methods/point/map.py``): ``-(1/M) sum_i log p(y_i | theta) + (1/(2N)) sum_p
lambda_p theta_p^2``, so the weight decay is lambda / N (the prior precision lambda of the problem). Heavy-ball momentum
as ``torch.optim.SGD``: ``v <- mu v + g``, ``theta <- theta - alpha v`` (Nesterov: ``theta - alpha (g + mu v)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from bnnbench.methods.point.map import MAP
from bnnbench.methods.settings import MethodConfig


@dataclass(frozen=True)
class SGDConfig(MethodConfig):
    name: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    nesterov: bool = False
    init_mean: str = "uniform_fan_in"   # uniform_fan_in | zero | xavier_uniform (a ConvNet's)


class SGD(MAP):
    name = "sgd"
    Config = SGDConfig

    def init(self, problem, generator):
        state = super().init(problem, generator)
        del state["v"]
        return state

    def step(self, state, batch, noise, lr_scale=1.0):
        obj, stats, g = self.gradient(state, batch, noise)
        mu = self.cfg.momentum
        m = mu * state["m"] + g
        d = g + mu * m if self.cfg.nesterov else m
        new_theta = state["theta"] - self.cfg.lr * lr_scale * d
        return {**state, "theta": new_theta, "m": m, "t": state["t"] + 1}, {"objective": obj, **stats}
