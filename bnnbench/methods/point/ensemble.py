"""Deep ensembles (Lakshminarayanan, Pritzel & Blundell, 2017): M networks trained independently from independent
initialisations, each by MAP's Adam on

    L_m(theta_m) = -(1/M_b) sum_i log p(y_i | theta_m) + (1/(2N)) sum_p lambda_p theta_{m,p}^2,

predicting with the uniform mixture p(y | x) = (1/M) sum_m p(y | x, theta_m).

The members sit on an axis of the state (``theta [R, M, P]``), the sample axis of the network's forward pass, so an
ensemble of every replica is one batched step. Members as replicas of their own would batch too, but a replica would
then no longer be one split's predictive, which selection, evaluation and the records assume. Each member sees the
same minibatches (the original trains each on its own shuffle; with independent initialisations the mixture is the
same kind of object). The paper's proper-scoring-rule variance head and adversarial training are left out: the
suite's Gaussian likelihood has the protocol's noise precision, as for every other method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bnnbench.methods.adam import adam
from bnnbench.methods.base import Problem, likelihood_of
from bnnbench.methods.point.map import MAP, MAPConfig, MAPState
from bnnbench.methods.state import state_class


@dataclass(frozen=True)
class DeepEnsembleConfig(MAPConfig):
    name: str = "deep_ensemble"
    members: int = 5                # M, the paper's ensemble size


@state_class
class DeepEnsembleState(MAPState):
    """theta and Adam's moments ``[R, M, P]`` of the M members, the step count ``[R]``."""


class DeepEnsemble(MAP):
    name = "deep_ensemble"
    Config = DeepEnsembleConfig
    State = DeepEnsembleState
    conv = False

    @classmethod
    def check_settings(cls, cfg):
        if cfg.members < 1:
            raise ValueError(f"deep_ensemble: members must be at least 1, got {cfg.members}")

    def init_params(self, problem: Problem, generator: torch.Generator) -> torch.Tensor:
        """theta_0 ``[R, M, P]``: R M independent draws, replica r's members draws r, R + r, ..."""
        R, M = problem.n_replicas, self.cfg.members
        lam = problem.prior_prec
        theta = self.model.init(R * M, generator, self.cfg.init_mean, device=lam.device, dtype=lam.dtype)
        return theta.reshape(M, R, -1).transpose(0, 1).contiguous()

    def objective(self, state, theta, batch, noise):
        """The members' summed objectives ``[R]`` (each member's gradient is its own objective's)."""
        f = self.model.forward(theta, batch.x)                                     # [R, M, B, 1]
        nll = -likelihood_of(state, self.likelihood).log_prob(f, batch.y).mean(-1).sum(1)   # [R]
        reg = 0.5 * (state.prior_prec[:, None] * theta * theta).sum((1, 2)) / state.n_data.to(theta.dtype)
        return nll + reg, {"nll": nll / theta.shape[1]}

    def step(self, state, batch, noise, lr_scale=1.0):
        obj, stats, g = self.gradient(state, batch, noise)
        t = state.t + 1
        new_theta, m, v = adam(state.theta, g, state.m, state.v, t, self.cfg.lr * lr_scale,
                               tuple(self.cfg.betas), self.cfg.eps)
        return state.replace(theta=new_theta, m=m, v=v, t=t), {"objective": obj / state.theta.shape[1], **stats}

    def predict(self, state, x, n_samples, generator):
        """S = ``n_samples`` outputs, sample s from member s mod M: the log-mean-exp over them is the mixture's log
        density exactly when M divides S."""
        M = state.theta.shape[1]
        f = self.model.forward(state.theta, x)                                     # [R, M, T, d]
        idx = torch.arange(n_samples, device=f.device) % M
        return self._predictive(state, f.index_select(1, idx))
