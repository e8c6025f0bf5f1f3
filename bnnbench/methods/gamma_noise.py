"""A learned Gamma posterior on the Gaussian noise precision (the noisy natural gradient UCI protocol, Zhang
et al. 2018, App. C.1), shared by noisy Adam, noisy K-FAC and BBB when ``learn_noise`` is set.

q(tau) = Gamma(a, b), prior Gamma(a0, b0) (shape, rate); the likelihood of a step uses E_q[tau] = a / b, and
(log a, log b) follow Adam at rate ``noise_lr`` on the per-point objective

    -E_q[log N(y | f, 1/tau)] + KL(q(tau) || p(tau)) / N,
    E_q[log N(y | f, 1/tau)] = (psi(a) - log b - (a/b) (y - f)^2 - log 2 pi) / 2          (NNG eq. 23).

Predictions draw tau_s ~ q(tau) per posterior sample, as the authors' evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from bnnbench.core.errors import ConfigError
from bnnbench.methods.adam import adam
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.state import Node, state_class

LOG_2PI = math.log(2 * math.pi)


NOISE_KEYS = ("noise_prior_shape", "noise_prior_rate", "noise_lr")


@dataclass(frozen=True)
class NoiseConfig(MethodConfig):
    """The settings of a learned noise precision, shared by the methods that offer one."""
    learn_noise: bool = False           # a Gaussian likelihood's q(tau) = Gamma(a, b) learned with the weights
    noise_prior_shape: Optional[float] = None  # Gamma(a0, b0) prior on tau (normalised units)
    noise_prior_rate: Optional[float] = None
    noise_lr: Optional[float] = None    # Adam's step size on (log a, log b)
    noise_lr_drop: bool = True          # the protocol's lr_drop scales the noise's step size too


def learns_noise(cfg, likelihood: str) -> bool:
    on = likelihood == "gaussian" and cfg.learn_noise
    if on and (missing := [k for k in NOISE_KEYS if getattr(cfg, k) is None]):
        keys = ", ".join("method." + k for k in missing)
        raise ConfigError(f"learn_noise needs the Gamma prior and its step size: set {keys} "
                          "(protocol=nng_uci sets them)")
    return on


@state_class
class NoiseQ(Node):
    """q(tau) = Gamma(a, b) per replica as ``log_ab = (log a, log b) [R, 2]``, with its Adam moments."""
    log_ab: torch.Tensor
    m_ab: torch.Tensor
    v_ab: torch.Tensor


def init_state(cfg, R: int, device, dtype) -> dict:
    """The state fields of a learned noise: q(tau) = the prior at the start (Adam moments at zero), and the
    likelihood's precision E_q[tau] = a / b."""
    z = torch.full((R, 2), math.log(cfg.noise_prior_shape), device=device, dtype=dtype)
    z[:, 1] = math.log(cfg.noise_prior_rate)
    return {"noise_q": NoiseQ(log_ab=z, m_ab=torch.zeros_like(z), v_ab=torch.zeros_like(z)),
            "noise_prec": torch.exp(z[:, 0] - z[:, 1])}


def objective_grad(a, b, r2, a0, b0, n):
    """Gradient in (log a, log b), ``[R, 2]``, of the per-point objective of the module docstring for the mean
    squared residual ``r2`` and N = ``n`` data, in closed form (psi' the trigamma function):

        d/d log a = a [-(psi'(a) - r2 / b) / 2 + ((a - a0) psi'(a) + b0 / b - 1) / N],
        d/d log b = 1/2 - a r2 / (2 b) + (a0 - a b0 / b) / N."""
    tri = torch.polygamma(1, a)
    r2_b, b0_b = r2 / b, b0 / b
    g_a = a * (tri * ((a - a0) / n - 0.5) + 0.5 * r2_b + (b0_b - 1) / n)
    g_b = 0.5 - 0.5 * a * r2_b + (a0 - a * b0_b) / n
    return torch.stack([g_a, g_b], -1)


def step(cfg, state, f, y, lr_scale: float) -> dict:
    """One Adam step on (log a, log b) from the outputs ``f [R, S, B, 1]`` of this step's samples; returns the
    updated state fields (``state.replace(**...)``); ``state.t`` is the step count before this step. The NNG code
    (regression/model.py) learns them at a constant rate: its x0.1 drop of alpha, beta at half time
    (regression/train.py) leaves the noise alone (``noise_lr_drop: false``)."""
    q = state.noise_q
    ab = q.log_ab.exp()
    a, b = ab[:, 0], ab[:, 1]
    r2 = (y.unsqueeze(1) - f.detach()[..., 0]).square().mean(dim=(1, 2))
    gz = objective_grad(a, b, r2, cfg.noise_prior_shape, cfg.noise_prior_rate, state.n_data.to(a.dtype))
    t = state.t + 1
    scale = lr_scale if cfg.noise_lr_drop else 1.0
    z_new, m, v = adam(q.log_ab, gz, q.m_ab, q.v_ab, t, cfg.noise_lr * scale)
    return {"noise_q": NoiseQ(log_ab=z_new, m_ab=m, v_ab=v), "noise_prec": torch.exp(z_new[:, 0] - z_new[:, 1])}


def sample_prec(q: NoiseQ, n_samples: int) -> torch.Tensor:
    """tau_s ~ q(tau), ``[R, n_samples]``, from torch's global generator (seeded by ``execute`` and in each
    worker process)."""
    a, b = q.log_ab[:, 0].exp(), q.log_ab[:, 1].exp()
    return torch.distributions.Gamma(a[:, None].expand(-1, n_samples), b[:, None].expand(-1, n_samples)).sample()
