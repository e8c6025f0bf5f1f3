"""Likelihoods p(y | f) evaluated for outputs ``f [R, S, B, d_out]`` and targets ``y [R, B]``.

Each returns per-(replica, sample, example) log densities ``[R, S, B]`` (``log_prob``) and their gradients in f,
``[R, S, B, d_out]`` (``grad_f``, closed forms: no autograd graph in a training step); parameters that vary by
replica (the Gaussian noise precision) carry a leading ``[R]`` axis. Targets are ``[R, B]`` (shared by
the samples) or ``[R, S, B]`` (one per sample, e.g. targets drawn from the model for a Fisher).

For the curvature of natural-gradient methods each also draws targets from the model (``sample`` from the standard
draws of ``sample_noise``), gives the score at such a target (``sampled_score``, whose outer product estimates the
Fisher) and a per-example scalar whose gradient r in f is a square root of the output curvature
Lambda = -d^2 log p / df^2 (``ggn_sqrt_output``): back-propagated, it gives the factors J^T r of the Gauss-Newton
matrix J^T Lambda J.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bnnbench.core import prng

LOG_2PI = math.log(2.0 * math.pi)


def _per_sample(y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Targets broadcast against ``f[..., 0]`` of shape ``[R, S, B]``."""
    return y if y.dim() == f.dim() - 1 else y.unsqueeze(1)


class Likelihood:
    """p(y | f); subclasses define ``log_prob``, ``grad_f``, ``sample_noise``, ``sample`` and ``ggn_sqrt_output``."""

    def sampled_score(self, f: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """d log p(y~ | f) / df at the target y~ = ``sample(f, noise)`` drawn from the model, ``[R, S, B, d_out]``:
        E_{y~ ~ p(y | f)}[score score^T] is the Fisher (the "true Fisher" of Zhang et al. 2018, eq. 8)."""
        return self.grad_f(f, self.sample(f, noise))


class Gaussian(Likelihood):
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

    def sample_noise(self, f_shape, generator, dtype, device) -> torch.Tensor:
        """eps ~ N(0, 1) per example, ``[R, S, B]`` for outputs of shape ``f_shape``."""
        return prng.randn(f_shape[:-1], generator=generator, dtype=dtype, device=device)

    def sample(self, f: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """y~ = f + eps / sqrt(tau) ~ N(f, 1/tau), ``[R, S, B]``."""
        return f[..., 0] + eps * self._prec(3).rsqrt()

    def sampled_score(self, f: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """tau (y~ - f) = sqrt(tau) eps at y~ = f + eps / sqrt(tau), without forming y~ - f."""
        return (self._prec(3).sqrt() * eps).unsqueeze(-1)

    def ggn_sqrt_output(self, f: torch.Tensor, generator=None) -> torch.Tensor:
        """sqrt(tau) f, ``[R, S, B]``: its gradient r = sqrt(tau) has r^2 = Lambda = -d^2 log p / df^2 = tau."""
        return (f * self._prec(4).sqrt())[..., 0]


class Bernoulli(Likelihood):
    """log p(y | f) = y log sigmoid(f) + (1 - y) log sigmoid(-f), labels y in {0, 1}."""

    task = "binary"

    def log_prob(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return -F.binary_cross_entropy_with_logits(
            f[..., 0], _per_sample(y, f).to(f.dtype).expand_as(f[..., 0]), reduction="none")

    def grad_f(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """d log p / d f = y - sigmoid(f), ``[R, S, B, 1]``."""
        return _per_sample(y, f).to(f.dtype).unsqueeze(-1) - torch.sigmoid(f)

    def sample_noise(self, f_shape, generator, dtype, device) -> torch.Tensor:
        """u ~ U(0, 1) per example, ``[R, S, B]``."""
        return prng.rand(f_shape[:-1], generator=generator, dtype=dtype, device=device)

    def sample(self, f: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """y~ = 1[u < sigmoid(f)] ~ Bernoulli(sigmoid(f)), ``[R, S, B]``."""
        return (u < torch.sigmoid(f[..., 0])).to(f.dtype)

    def ggn_sqrt_output(self, f: torch.Tensor, generator=None) -> torch.Tensor:
        """sqrt(p (1 - p)) f with p = sigmoid(f) held fixed, ``[R, S, B]``: its gradient r = sqrt(p (1 - p)) has
        r^2 = Lambda = -d^2 log p(y | f) / df^2 = p (1 - p)."""
        p = torch.sigmoid(f.detach())
        return (f * (p * (1 - p)).sqrt())[..., 0]


class Categorical(Likelihood):
    """log p(y | f) = log softmax(f)_y, labels y in {0, ..., K-1}."""

    task = "multiclass"

    def log_prob(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(f, dim=-1).gather(-1, _label_index(y, f))[..., 0]

    def grad_f(self, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """d log p / d f = onehot(y) - softmax(f), ``[R, S, B, K]``."""
        return (-torch.softmax(f, dim=-1)).scatter_add_(-1, _label_index(y, f), torch.ones_like(f[..., :1]))

    def sample_noise(self, f_shape, generator, dtype, device) -> torch.Tensor:
        """u ~ U(0, 1) per example and class, ``[R, S, B, K]``, kept above 1e-12 (``sample`` takes log(-log u))."""
        return prng.rand(f_shape, generator=generator, dtype=dtype, device=device).clamp_min(1e-12)

    def sample(self, f: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """y~ = argmax_k (log softmax(f)_k - log(-log u_k)) ~ Categorical(softmax(f)) (the Gumbel-max trick),
        ``[R, S, B]``."""
        return torch.argmax(torch.log_softmax(f, -1) - torch.log(-torch.log(u)), -1)

    def ggn_sqrt_output(self, f: torch.Tensor, generator=None) -> torch.Tensor:
        """-log p(y~ | f) with a label y~ ~ Categorical(p), p = softmax(f), drawn from ``generator``, ``[R, S, B]``: its
        gradient r = p - e_y~ is a one-sample Monte Carlo square root of
        Lambda = -d^2 log p(y | f) / df^2 = diag(p) - p p^T = E_y~[r r^T] (the Fisher with labels drawn from the
        model)."""
        probs = torch.softmax(f.detach(), -1)
        y = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
        return -self.log_prob(f, y.reshape(probs.shape[:-1]))


def _label_index(y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Labels as a ``[R, S, B, 1]`` index into the last axis of ``f``."""
    return _per_sample(y.long(), f).expand(f.shape[:-1]).unsqueeze(-1)
