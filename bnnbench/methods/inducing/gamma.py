"""Gamma variates for the Scale prior: exact draws from a ``torch.Generator`` and their implicit reparameterisation.

A draw x ~ Gamma(a, b) is x0 / b with x0 ~ Gamma(a, 1). ``standard_gamma`` draws x0 by Marsaglia & Tsang (2000) from
the generator (so a method's ``noise`` can make it and ``step`` replay it), and ``reparam_standard_gamma`` passes it
through autograd with the implicit gradient dx0/da = -(dF(x0; a)/da) / p(x0; a) (Figurnov et al., 2018), the gradient
``torch.distributions.Gamma.rsample`` uses.
"""

from __future__ import annotations

import torch

from bnnbench.core import prng


def standard_gamma(shape: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """x0 ~ Gamma(shape, 1), elementwise, shape >= 1: Marsaglia & Tsang's squeeze-rejection method,
    d = a - 1/3, c = 1 / sqrt(9 d), x0 = d (1 + c z)^3 accepted when log u < z^2 / 2 + d - d v + d log v."""
    a = shape.detach()
    if (a < 1).any():
        raise ValueError("standard_gamma needs shape >= 1")
    d = a - 1.0 / 3.0
    c = (9.0 * d).rsqrt()
    out = torch.empty_like(a)
    todo = torch.ones_like(a, dtype=torch.bool)
    while todo.any():
        z = prng.randn(a.shape, generator=generator, device=a.device, dtype=a.dtype)
        u = prng.rand(a.shape, generator=generator, device=a.device, dtype=a.dtype)
        v = (1 + c * z) ** 3
        ok = (v > 0) & (u.log() < 0.5 * z * z + d - d * v + d * v.clamp_min(1e-30).log())
        take = ok & todo
        out = torch.where(take, d * v, out)
        todo = todo & ~ok
    return out


class _ReparamStandardGamma(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shape, x0):
        ctx.save_for_backward(shape, x0)
        return x0.clone()

    @staticmethod
    def backward(ctx, grad):
        shape, x0 = ctx.saved_tensors
        return grad * torch._standard_gamma_grad(shape, x0), None


def reparam_standard_gamma(shape: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """The draw ``x0 ~ Gamma(shape, 1)`` as a differentiable function of ``shape`` (implicit reparameterisation)."""
    return _ReparamStandardGamma.apply(shape, x0)


def kl_gamma(a_q, b_q, a_p, b_p):
    """KL(Gamma(a_q, b_q) || Gamma(a_p, b_p)) (shape, rate):
    (a_q - a_p) psi(a_q) - lgamma(a_q) + lgamma(a_p) + a_p (log b_q - log b_p) + a_q (b_p - b_q) / b_q."""
    return ((a_q - a_p) * torch.digamma(a_q) - torch.lgamma(a_q) + torch.lgamma(a_p)
            + a_p * (torch.log(b_q) - torch.log(b_p)) + a_q * (b_p - b_q) / b_q)
