"""IVON, the improved variational online Newton method (Shen et al., 2024, "Variational learning is effective for
large deep networks", Alg. 1), as a bnnbench method on the replica axis.

q(theta) = N(m, diag(1 / (lambda (h + delta)))) with lambda the effective sample size (ess, here the training-set
size N) and delta the weight decay (here lambda_prior / N: the prior N(0, 1 / lambda_prior) of the protocol). A step
draws S samples theta_s = m + eps_s, eps_s ~ N(0, 1 / (lambda (h + delta))), takes the gradients g_s of the mean
negative log-likelihood per data point of the minibatch, and with g = mean_s g_s and the reparameterisation
("Price") curvature estimate h_hat = mean_s (eps_s * g_s) (h + delta):

    g_m  <- beta1 g_m + (1 - beta1) g
    h    <- beta2 h + (1 - beta2) lambda h_hat + (1/2) (1 - beta2)^2 (h - lambda h_hat)^2 / (h + delta)
    m    <- m - alpha_t (g_m / (1 - beta1^t) + delta m) / (h + delta),   alpha_t = alpha (h_0 + delta)

(the step clipped elementwise at clip_radius; alpha rescaled by h_0 + delta as the authors' ``rescale_lr``). This is
the update of the authors' ``ivon-opt`` package, tested step for step against it in ``tests/test_ivon.py``.

The method's state is ``IVONState``: a subclass of ``bnnbench.methods.State`` made a frozen dataclass by
``@state_class``, one typed field per tensor the method keeps (m, h, g_m, t), each with the replica axis first, beside
the replicas' hyper-parameters that ``State`` holds (N, lambda_prior, tau). ``init`` builds it from
``hyper_state(problem)`` and its own tensors, ``step`` returns ``state.replace(...)`` (a new state; the one given is
never modified), and the harness slices a replica out as ``state[r]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnbench.methods import Method, State, state_class
from bnnbench.methods.base import hyper_state, likelihood_of, standard_normal
from bnnbench.methods.settings import MethodConfig


@dataclass(frozen=True)
class IVONConfig(MethodConfig):
    name: str = "ivon"
    lr: float = 0.03                    # alpha, before the rescaling by h_0 + delta (0.1 diverges in the first epoch of
                                        # `bnnbench run method=ivon data=uci/boston`, minibatch 10; 0.03 does not)
    hess_init: float = 1.0              # h_0
    beta1: float = 0.9
    beta2: float = 0.99999
    train_samples: int = 1              # S
    clip_radius: float = float("inf")
    init_mean: str = "uniform_fan_in"


@state_class
class IVONState(State):
    """The mean m, the curvature estimate h and the gradient momentum g_m (each ``[R, P]``) after t steps (``[R]``);
    beside them, from ``State``, N and lambda_prior (and tau, y_scale for a Gaussian likelihood)."""
    mean: torch.Tensor
    hess: torch.Tensor
    g_m: torch.Tensor
    t: torch.Tensor


class IVON(Method):
    name = "ivon"
    label = "IVON"   # its name in bnnbench's tables and figures
    Config = IVONConfig

    def _ess(self, state):
        return state.n_data.to(state.mean.dtype)[:, None]                                # lambda = N  [R, 1]

    def _delta(self, state):
        return state.prior_prec / self._ess(state)                                       # delta  [R, P]

    def init(self, problem, generator) -> IVONState:
        mean = self.init_params(problem, generator)
        return IVONState(**hyper_state(problem), mean=mean, hess=torch.full_like(mean, float(self.cfg.hess_init)),
                         g_m=torch.zeros_like(mean), t=torch.zeros(mean.shape[0], dtype=torch.long, device=mean.device))

    def std(self, state):
        return (self._ess(state) * (state.hess + self._delta(state))).rsqrt()

    def noise(self, state, batch, generator):
        return standard_normal(state.mean, int(self.cfg.train_samples), generator) * self.std(state).unsqueeze(1)

    def step(self, state, batch, noise, lr_scale=1.0):
        eps = noise                                                                      # [R, S, P]
        theta = (state.mean.unsqueeze(1) + eps).detach().requires_grad_(True)
        with torch.enable_grad():
            f = self.model.forward(theta, batch.x)                                      # [R, S, B, 1]
            nll_s = -likelihood_of(state, self.likelihood).log_prob(f, batch.y).mean(2)   # [R, S]
            (g_s,) = torch.autograd.grad(nll_s.sum(), [theta])
        g, nxg = g_s.mean(1), (eps * g_s).mean(1)
        ess, delta, h = self._ess(state), self._delta(state), state.hess
        b1, b2 = float(self.cfg.beta1), float(self.cfg.beta2)
        t = state.t + 1
        g_m = b1 * state.g_m + (1 - b1) * g
        f_hat = nxg * (h + delta) * ess
        h_new = b2 * h + (1 - b2) * f_hat + 0.5 * (1 - b2) ** 2 * (h - f_hat) ** 2 / (h + delta)
        debias = 1 - b1 ** t.to(g.dtype)[:, None]
        lr = float(self.cfg.lr) * lr_scale * (float(self.cfg.hess_init) + delta)
        r = float(self.cfg.clip_radius)
        mean = state.mean - lr * ((g_m / debias + delta * state.mean) / (h_new + delta)).clamp(-r, r)
        nll = nll_s.detach().mean(1)
        return state.replace(mean=mean, hess=h_new, g_m=g_m, t=t), {"objective": nll, "nll": nll}

    def predict(self, state, x, n_samples, generator):
        eps = standard_normal(state.mean, n_samples, generator) * self.std(state).unsqueeze(1)
        return self._predictive(state, self.model.forward(state.mean.unsqueeze(1) + eps, x))
