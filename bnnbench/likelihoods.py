"""Likelihoods p(y | f) evaluated for outputs ``f [R, S, B, d_out]`` and targets ``y [R, B]``.

Each returns per-(replica, sample, example) log densities ``[R, S, B]`` (``log_prob``) and their gradients in f,
``[R, S, B, d_out]`` (``grad_f``, closed forms: no autograd graph in a training step); parameters that vary by
replica (the Gaussian noise precision) carry a leading ``[R]`` axis. Targets are ``[R, B]`` (shared by
the samples) or ``[R, S, B]`` (one per sample, e.g. targets drawn from the model for a Fisher).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LOG_2PI = math.log(2.0 * math.pi)


def _per_sample(y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Targets broadcast against ``f[..., 0]`` of shape ``[R, S, B]``."""
    return y if y.dim() == f.dim() - 1 else y.unsqueeze(1)


class Gaussian:
    """log N(y | f, 1/tau) = 0.5 log tau - 0.5 log 2pi - 0.5 tau (y - f)^2, tau ``[R]`` (or ``[R, S]``)."""

    task = "regression"

    def __init__(self, noise_prec: torch.Tensor):
        self.noise_prec = noise_prec

    def _prec(self, ndim: int) -> torch.Tensor:
        """tau with trailing unit axes, broadcasting against a tensor of ``ndim`` dimensions."""
        tau = self.noise_prec
        return tau.reshape(*tau.shape, *([1] * (ndim - tau.dim())))

    def log_prob(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        tau = self._prec(3)
        r = _per_sample(y, f) - f[..., 0]
        return 0.5 * torch.log(tau) - 0.5 * LOG_2PI - 0.5 * tau * r * r

    def grad_f(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """d log p / d f = tau (y - f), ``[R, S, B, 1]``."""
        return self._prec(4) * (_per_sample(y, f).unsqueeze(-1) - f)


class Bernoulli:
    """log p(y | f) = y log sigmoid(f) + (1 - y) log sigmoid(-f), labels y in {0, 1}."""

    task = "binary"

    def log_prob(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -F.binary_cross_entropy_with_logits(
            f[..., 0], _per_sample(y, f).to(f.dtype).expand_as(f[..., 0]), reduction="none")

    def grad_f(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """d log p / d f = y - sigmoid(f), ``[R, S, B, 1]``."""
        return _per_sample(y, f).to(f.dtype).unsqueeze(-1) - torch.sigmoid(f)


class Categorical:
    """log p(y | f) = log softmax(f)_y, labels y in {0, ..., K-1}."""

    task = "multiclass"

    def log_prob(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(f, dim=-1).gather(-1, _label_index(y, f))[..., 0]

    def grad_f(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """d log p / d f = onehot(y) - softmax(f), ``[R, S, B, K]``."""
        return (-torch.softmax(f, dim=-1)).scatter_add_(-1, _label_index(y, f), torch.ones_like(f[..., :1]))


def _label_index(y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Labels as a ``[R, S, B, 1]`` index into the last axis of ``f``."""
    return _per_sample(y.long(), f).expand(f.shape[:-1]).unsqueeze(-1)
