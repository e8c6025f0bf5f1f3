"""Bayesian linear regression on pseudo-data: the weight posterior of a local or global inducing layer.

Ober & Aitchison (2020), Eq. 8-10: with the layer's inducing inputs U (P x D, the bias as a column of ones), learned
pseudo-outputs V (P x out) and pseudo-precisions Lambda = diag(lam) (P), and the prior W ~ N(0, alpha^-1 I), each
output column w_j of W (D x out) has

    q(w_j) = N(Sigma U^T Lambda v_j, Sigma),   Sigma = (U^T Lambda U + alpha I)^-1,

the posterior of w_j given the pseudo-data (U, v_j) with noise precisions Lambda. A draw is w = mean + L^-T z with
prec = L L^T and z ~ N(0, I); its single-sample ELBO term log p(w) - log q(w) is what ``bayesfunc`` (the authors'
library) uses: at the exact posterior it equals log evidence - log likelihood for every draw.
"""

from __future__ import annotations

import torch


def posterior_prec(U: torch.Tensor, lam: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """U^T diag(lam) U + alpha I for ``U [..., P, D]``, ``lam [..., P]`` and ``alpha`` broadcasting to ``[...]``."""
    D = U.shape[-1]
    prec = (U * lam.unsqueeze(-1)).mT @ U
    eye = torch.eye(D, device=U.device, dtype=U.dtype)
    return prec + alpha[..., None, None] * eye


def sample_weights(U: torch.Tensor, lam: torch.Tensor, V: torch.Tensor, alpha: torch.Tensor,
                   z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A draw W ``[..., D, out]`` of q(W) and log p(W) - log q(W) ``[...]``.

    ``U [..., P, D]`` (inducing inputs with the bias column), ``lam [..., P]``, ``V [..., P, out]``, ``alpha [...]``
    the prior precision, ``z [..., D, out]`` standard normal draws; the leading axes broadcast (replica, sample).
    The normalising constants (2 pi)^(-D out / 2) of p and q cancel and are left out of both.
    """
    prec = posterior_prec(U, lam, alpha)
    L = torch.linalg.cholesky(prec)
    rhs = (U * lam.unsqueeze(-1)).mT @ V
    # mean + L^-T z = L^-T (L^-1 rhs + z): two triangular solves for the mean and the draw together
    W = torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, rhs, upper=False) + z, upper=True)
    D, out = W.shape[-2], W.shape[-1]
    log_q = -0.5 * (z * z).sum((-1, -2)) + out * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    log_p = -0.5 * alpha * (W * W).sum((-1, -2)) + 0.5 * D * out * torch.log(alpha)
    return W, log_p - log_q


def posterior(U: torch.Tensor, lam: torch.Tensor, V: torch.Tensor,
              alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean ``[..., D, out]`` and the covariance ``[..., D, D]`` (shared by the output columns) of q(W)."""
    prec = posterior_prec(U, lam, alpha)
    cov = torch.cholesky_inverse(torch.linalg.cholesky(prec))
    return cov @ ((U * lam.unsqueeze(-1)).mT @ V), cov

