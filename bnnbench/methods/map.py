"""Maximum a posteriori point estimate with Adam.

Objective per data point: ``-(1/M) sum_i log p(y_i | theta) + (1/(2N)) sum_p lambda_p theta_p^2``.
"""

from __future__ import annotations

import torch

from bnnbench.methods.base import Method, Problem, State, adam, hyper_state


class MAP(Method):
    name = "map"

    def init(self, problem: Problem, generator: torch.Generator) -> State:
        R = problem.n_replicas
        dev, dt = problem.prior_prec.device, problem.prior_prec.dtype
        theta = self.model.init(R, generator, self.cfg.init_mean, device=dev, dtype=dt)
        z = torch.zeros_like(theta)
        return {**hyper_state(problem), "theta": theta, "m": z, "v": z.clone(),
                "t": torch.zeros(R, dtype=torch.long, device=dev)}

    def noise(self, state, batch, generator):
        return None

    def step(self, state, batch, noise, lr_scale=1.0):
        theta = state["theta"].detach().requires_grad_(True)
        with torch.enable_grad():
            f = self.model.forward(theta.unsqueeze(1), batch.x)
            nll = self.nll(state, f, batch.y)
            reg = 0.5 * (state["prior_prec"] * theta * theta).sum(-1) / state["n_data"].to(theta.dtype)
            obj = nll + reg
            (g,) = torch.autograd.grad(obj.sum(), [theta])
        t = state["t"] + 1
        new_theta, m, v = adam(state["theta"], g, state["m"], state["v"], t, float(self.cfg.lr) * lr_scale,
                               tuple(self.cfg.betas), float(self.cfg.eps))
        return {**state, "theta": new_theta, "m": m, "v": v, "t": t}, {"objective": obj.detach(), "nll": nll.detach()}

    def predict(self, state, x, n_samples, generator):
        return self._predictive(state, self.model.forward(state["theta"].unsqueeze(1), x))
