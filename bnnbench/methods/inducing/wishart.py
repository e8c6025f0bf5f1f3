"""Inverse-Wishart draws with real-valued degrees of freedom by the Bartlett decomposition (Ober & Aitchison,
2020, App. B; the library's ``wishart_dist.py``) and the learned Inverse-Wishart posterior of the spatial prior
(the library's ``VI_InverseWishart``).

Bartlett (1933): with A lower triangular, A_ij ~ N(0, 1) below the diagonal and A_ii^2 ~ chi^2(nu - i) =
Gamma((nu - i) / 2, rate 1/2) (i = 0..p-1; the Gamma allows real nu > p - 1), A A^T ~ Wishart(I, nu). With
Psi = L L^T,

    Sigma = L (A A^T)^-1 L^T ~ InverseWishart(Psi, nu)   (Sigma^-1 = L^-T A A^T L^-1 ~ Wishart(Psi^-1, nu)),

    log IW(Sigma; Psi, nu) = nu/2 log|Psi| - nu p/2 log 2 - log Gamma_p(nu/2) - (nu + p + 1)/2 log|Sigma|
                             - 1/2 tr(Psi Sigma^-1),

with tr(Psi Sigma^-1) = |A|_F^2 and log|Sigma| = log|Psi| - 2 sum log A_ii at a Bartlett draw (scipy's
``invwishart(df=nu, scale=Psi)``). The library writes IW(K, nu) for InverseWishart(nu K, nu); here Psi is always
the standard scale matrix.

The chi-square variables are Gamma draws from a ``torch.Generator`` (``gamma.standard_gamma``: ``noise`` draws,
``step`` replays) made differentiable in nu by implicit reparameterisation, as the library's ``Gamma.rsample``.
"""

from __future__ import annotations

import math

import torch

from bnnbench.core import prng
from bnnbench.methods.inducing.blr import chol_solve
from bnnbench.methods.inducing.gamma import reparam_standard_gamma, standard_gamma


def chi2_shapes(nu: torch.Tensor, p: int) -> torch.Tensor:
    """The Gamma shapes (nu - i) / 2 ``[..., p]`` of A_ii^2 / 2."""
    return (nu.unsqueeze(-1) - torch.arange(p, device=nu.device, dtype=nu.dtype)) / 2


def bartlett_noise(nu: torch.Tensor, p: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The draws of a Bartlett factor for ``nu [...]``: standard normals ``[..., p, p]`` (strict lower triangle used)
    and x0 ~ Gamma((nu - i) / 2, 1) ``[..., p]``."""
    normals = prng.randn(*nu.shape, p, p, generator=generator, device=nu.device, dtype=nu.dtype)
    return normals, standard_gamma(chi2_shapes(nu.detach(), p), generator)


def bartlett_factor(nu: torch.Tensor, normals: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    """A ``[..., p, p]`` with A A^T ~ Wishart(I, nu): strict lower triangle ``normals``, A_ii = (2 x0_i)^(1/2) with
    x0_i reparameterised as a function of nu."""
    p = normals.shape[-1]
    chi2 = 2 * reparam_standard_gamma(chi2_shapes(nu, p), x0)
    return torch.tril(normals, -1) + torch.diag_embed(chi2.sqrt())


def inverse_wishart_log_prob(Sigma: torch.Tensor, Psi: torch.Tensor, nu: torch.Tensor) -> torch.Tensor:
    """log IW(Sigma; Psi, nu) ``[...]`` for ``Sigma, Psi [..., p, p]``, ``nu [...]``."""
    p = Sigma.shape[-1]
    L_sigma = torch.linalg.cholesky(Sigma)
    logdet_sigma = 2 * L_sigma.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    tr = chol_solve(Psi, L_sigma).diagonal(dim1=-2, dim2=-1).sum(-1)   # capturable in a CUDA graph (blr)
    return (0.5 * nu * torch.logdet(Psi) - 0.5 * nu * p * math.log(2) - torch.mvlgamma(0.5 * nu, p)
            - 0.5 * (nu + p + 1) * logdet_sigma - 0.5 * tr)


def inverse_wishart_draw(Psi: torch.Tensor, nu: torch.Tensor, A: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Sigma = L (A A^T)^-1 L^T ``[..., p, p]`` for the Bartlett factor ``A`` of ``nu``, and its log IW(Psi, nu)
    computed from A (no inverse of Sigma)."""
    p = Psi.shape[-1]
    L = torch.linalg.cholesky(Psi)
    M = torch.linalg.solve_triangular(A.mT, L, upper=True, left=False)   # L A^-T
    Sigma = M @ M.mT
    logdet_psi = 2 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    logdet_sigma = logdet_psi - 2 * A.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    log_q = (0.5 * nu * logdet_psi - 0.5 * nu * p * math.log(2) - torch.mvlgamma(0.5 * nu, p)
             - 0.5 * (nu + p + 1) * logdet_sigma - 0.5 * (A * A).sum((-1, -2)))
    return Sigma, log_q
