"""SWAG (Maddox, Izmailov, Garipov, Vetrov & Wilson, 2019): a Gaussian fitted to the iterates of the optimiser.

Training is MAP's (Adam on the MAP objective, ``point/map.py``). From epoch ``start_epoch`` on, the iterate theta_i
after each epoch is collected into running moments and a deviation matrix,

    theta_SWA = (1/n) sum_i theta_i,   s = (1/n) sum_i theta_i^2,   Sigma_diag = diag(s - theta_SWA^2),
    D = [theta_i - theta_SWA(i)] over the last K collected iterates (theta_SWA(i): the mean just after collecting i),

and the posterior is N(theta_SWA, (1/2) (Sigma_diag + D D^T / (K - 1))), sampled as

    theta = theta_SWA + sqrt(scale) (Sigma_diag^{1/2} z_1 + D z_2 / sqrt(K - 1)),  z_1 ~ N(0, I_P), z_2 ~ N(0, I_K),

scale = 1/2 (the paper's Sec. 3; ``SWAG.sample(scale=0.5, cov=True)`` of ``wjmaddox/swa_gaussian``). K is the
number of columns filled so far (at most ``rank``; the authors' code divides by ``max_num_models - 1`` also while
fewer are filled). The authors run SGD with a constant learning rate in the collection phase; here the optimiser is
the protocol's Adam for every MAP-based method, so SWAG differs from MAP (Adam) only in its predictive.

A small module of the suite's own, not a library's: ``posteriors`` (0.1.3, the library the leaderboard's issue names)
has no SWAG, and the authors' ``SWAG`` wraps one ``nn.Module``, with no replica axis.

An epoch ends, for replica r, at each step where floor(t B / N_r) grows (t steps of B rows: one training set's
worth of rows seen), so the moments need no branch and compile with the step; the deviation matrix is written only at
the steps where some replica collects (``SWAG.deviations``, eager).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bnnbench.core import prng
from bnnbench.methods.adam import adam
from bnnbench.methods.point.map import MAP, MAPConfig, MAPState
from bnnbench.methods.state import state_class


@dataclass(frozen=True)
class SWAGConfig(MAPConfig):
    name: str = "swag"
    rank: int = 20             # K, the columns of D (the authors' max_num_models)
    start_epoch: int = 50      # the first epoch whose end is collected (of the leaderboard's 100)
    scale: float = 0.5         # the covariance's factor at sampling


@state_class
class SWAGState(MAPState):
    """MAP's state, the moments of the collected iterates ``swa_mean, swa_sq [R, P]``, the deviations
    ``dev [R, K, P]`` (a ring: column ``i mod K`` holds collected iterate i) and the count collected ``n_swa [R]``."""
    swa_mean: torch.Tensor
    swa_sq: torch.Tensor
    dev: torch.Tensor
    n_swa: torch.Tensor


class SWAG(MAP):
    name = "swag"
    Config = SWAGConfig
    State = SWAGState
    conv = False

    @classmethod
    def check_settings(cls, cfg):
        if cfg.rank < 2:
            raise ValueError(f"swag: rank must be at least 2 (D D^T / (K - 1)), got {cfg.rank}")
        if cfg.start_epoch < 1 or cfg.scale <= 0:
            raise ValueError(f"swag: start_epoch must be at least 1 and scale positive, got {cfg.start_epoch}, "
                             f"{cfg.scale}")

    def extra_state(self, theta, problem):
        R, P = theta.shape
        z = torch.zeros_like(theta)
        return dict(swa_mean=z, swa_sq=z.clone(), dev=z.new_zeros(R, self.cfg.rank, P),
                    n_swa=torch.zeros(R, dtype=torch.long, device=theta.device))

    def step(self, state, batch, noise, lr_scale=1.0, iterate=None):
        """``iterate`` (the compiled one: ``compiled_step``), then the deviations' update."""
        new, stats, collect = (iterate or self.iterate)(state, batch, noise, lr_scale)
        return new.replace(dev=self.deviations(state, new, collect)), stats

    def iterate(self, state, batch, noise, lr_scale=1.0):
        """MAP's Adam step and the collected moments: the new state (its ``dev`` still the old one), the step's
        statistics and which replicas collected their iterate ``collect [R]``."""
        obj, stats, g = self.gradient(state, batch, noise)
        t = state.t + 1
        theta, m, v = adam(state.theta, g, state.m, state.v, t, self.cfg.lr * lr_scale, tuple(self.cfg.betas),
                           self.cfg.eps)
        B, N = batch.x.shape[1], state.n_data
        epochs = t * B // N
        collect = (epochs > (t - 1) * B // N) & (epochs >= self.cfg.start_epoch)
        n = state.n_swa + collect.long()
        w = (collect.to(theta.dtype) / n.clamp_min(1).to(theta.dtype))[:, None]
        mean = state.swa_mean + w * (theta - state.swa_mean)
        sq = state.swa_sq + w * (theta * theta - state.swa_sq)
        return (state.replace(theta=theta, m=m, v=v, t=t, swa_mean=mean, swa_sq=sq, n_swa=n),
                {"objective": obj, **stats}, collect)

    @staticmethod
    def deviations(state, new, collect) -> torch.Tensor:
        """D with column ``n_swa mod K`` of each collecting replica set to theta - theta_SWA (``new``'s), the others
        as in ``state``. At most steps no replica collects (once an epoch), and ``state.dev`` itself is returned: a
        ``where`` over the ``[R, K, P]`` ring at every step cost more than the rest of the step (USPS's board:
        R = 100, K = 20, P = 12 952, bench/step_ab.py), and more still compiled, inside the graph."""
        if not bool(collect.any()):
            return state.dev
        K = state.dev.shape[1]
        slot = torch.arange(K, device=collect.device)[None, :] == (state.n_swa % K)[:, None]
        return torch.where((collect[:, None] & slot)[..., None], (new.theta - new.swa_mean)[:, None, :], state.dev)

    def compiled_step(self, compile):
        """``step`` with ``iterate`` compiled and the deviations' update (once an epoch, a host check) eager."""
        iterate = compile(self.iterate)

        def step(state, batch, noise, lr_scale=1.0):
            return self.step(state, batch, noise, lr_scale, iterate=iterate)
        return step

    def sample_params(self, state, n_samples: int, generator: torch.Generator) -> torch.Tensor:
        """theta_s ``[R, S, P]`` from the SWAG Gaussian; a replica that has collected nothing yet gives its iterate."""
        mean = state.swa_mean
        R, P = mean.shape
        K = state.dev.shape[1]
        var = (state.swa_sq - mean * mean).clamp_min(1e-30)
        z1 = prng.randn(R, n_samples, P, generator=generator, device=mean.device, dtype=mean.dtype)
        z2 = prng.randn(R, n_samples, K, generator=generator, device=mean.device, dtype=mean.dtype)
        k_minus_1 = (state.n_swa.clamp(max=K) - 1).clamp_min(1).to(mean.dtype)
        delta = var.sqrt()[:, None] * z1 + torch.matmul(z2, state.dev) / k_minus_1.sqrt()[:, None, None]
        theta = mean[:, None] + math.sqrt(self.cfg.scale) * delta
        return torch.where((state.n_swa > 0)[:, None, None], theta, state.theta[:, None])

    def covariance(self, state) -> torch.Tensor:
        """The SWAG covariance ``[R, P, P]`` that ``sample_params`` draws from (dense: for tests and small nets)."""
        mean = state.swa_mean
        var = (state.swa_sq - mean * mean).clamp_min(1e-30)
        k_minus_1 = (state.n_swa.clamp(max=state.dev.shape[1]) - 1).clamp_min(1).to(mean.dtype)
        low_rank = state.dev.transpose(1, 2) @ state.dev / k_minus_1[:, None, None]
        return self.cfg.scale * (torch.diag_embed(var) + low_rank)

    def predict(self, state, x, n_samples, generator):
        return self._predictive(state, self.model.forward(self.sample_params(state, n_samples, generator), x))
