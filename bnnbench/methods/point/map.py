"""Maximum a posteriori point estimate with Adam.

Objective per data point: ``-(1/M) sum_i log p(y_i | theta) + (1/(2N)) sum_p lambda_p theta_p^2``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch

from bnnbench.methods.adam import adam
from bnnbench.methods.base import Method, Problem, hyper_state
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.state import State, state_class


@dataclass(frozen=True)
class MAPConfig(MethodConfig):
    name: str = "map"
    lr: float = 1e-3
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    init_mean: str = "uniform_fan_in"   # uniform_fan_in (nn.Linear's default) | zero

@state_class
class MAPState(State):
    """theta and Adam's moments (m, v) after t steps."""
    theta: torch.Tensor
    m: torch.Tensor
    v: torch.Tensor
    t: torch.Tensor


class MAP(Method):
    name = "map"
    compilable = True  # bench/compile_step.py: MC dropout's step 1.5-1.6x faster compiled at UCI scale
    Config = MAPConfig
    State = MAPState   # subclasses with more per-replica tensors (MC dropout's rates) name theirs
    conv = True

    def init(self, problem: Problem, generator: torch.Generator) -> MAPState:
        theta = self.init_params(problem, generator)
        z = torch.zeros_like(theta)
        return self.State(**hyper_state(problem), theta=theta, m=z, v=z.clone(),
                          t=torch.zeros(problem.n_replicas, dtype=torch.long, device=theta.device),
                          **self.extra_state(theta, problem))

    def extra_state(self, theta: torch.Tensor, problem: Problem) -> dict:
        """The initial values of the fields a subclass's ``State`` adds to MAP's (SWAG's moments, Laplace's root)."""
        return {}

    def noise(self, state, batch, generator):
        return None

    def objective(self, state, theta, batch, noise):
        """The objective per replica ``[R]`` at ``theta [R, P]`` and the statistics to report beside it."""
        f = self.model.forward(theta.unsqueeze(1), batch.x)
        nll = self.nll(state, f, batch.y)
        reg = 0.5 * (state.prior_prec * theta * theta).sum(-1) / state.n_data.to(theta.dtype)
        return nll + reg, {"nll": nll}

    def gradient(self, state, batch, noise):
        """The objective ``[R]``, its statistics and its gradient ``[R, P]`` at ``state.theta``."""
        theta = state.theta.detach().requires_grad_(True)
        with torch.enable_grad():
            obj, stats = self.objective(state, theta, batch, noise)
            (g,) = torch.autograd.grad(obj.sum(), [theta])
        return obj.detach(), {k: v.detach() for k, v in stats.items()}, g

    def step(self, state, batch, noise, lr_scale=1.0):
        obj, stats, g = self.gradient(state, batch, noise)
        t = state.t + 1
        new_theta, m, v = adam(state.theta, g, state.m, state.v, t, self.cfg.lr * lr_scale,
                               tuple(self.cfg.betas), self.cfg.eps)
        return state.replace(theta=new_theta, m=m, v=v, t=t), {"objective": obj, **stats}

    def predict(self, state, x, n_samples, generator):
        return self._predictive(state, self.model.forward(state.theta.unsqueeze(1), x))
