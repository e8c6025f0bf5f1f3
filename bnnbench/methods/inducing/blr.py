"""Bayesian linear regression on pseudo-data: the weight posterior of a local or global inducing layer.

Ober & Aitchison (2020), Eq. 8-10: with the layer's inducing inputs U (P x D, the bias as a column of ones), learned
pseudo-outputs V (P x out) and pseudo-precisions Lambda = diag(lam) (P), and the prior W ~ N(0, alpha^-1 I), each
output column w_j of W (D x out) has

    q(w_j) = N(Sigma U^T Lambda v_j, Sigma),   Sigma = (U^T Lambda U + alpha I)^-1,

the posterior of w_j given the pseudo-data (U, v_j) with noise precisions Lambda. A draw is w = mean + L^-T z with
prec = L L^T and z ~ N(0, I); its single-sample ELBO term log p(w) - log q(w) is what ``bayesfunc`` (the authors'
library) uses: at the exact posterior it equals log evidence - log likelihood for every draw. The prior precision may
also be a convolution's ``KroneckerPrec`` (alpha I replaced by A); a convolution's U^T Lambda U and U^T Lambda V come
from ``autocorrelation`` (``sample_weights_from_stats``); with fewer inducing points than rows the draw is made in
P x P algebra (``sample_weights_dual``).

A compiled step on a CPU draws from the precision's inverse Cholesky root C = L^-T (``prec_root``: the SIMD kernel of
``core/linalg/chol_root``, an operator in the graph) as W = C (C^T U^T Lambda V + z), so that the triangular solves of
the draw and of its backward pass become products (``bench/step_ab.py``, App. G's families); the eager step, and so
every record, keeps LAPACK's factor and solves.
"""

from __future__ import annotations

import torch

from bnnbench.core.linalg import chol_root


def posterior_prec(U: torch.Tensor, lam: torch.Tensor, alpha) -> torch.Tensor:
    """U^T diag(lam) U + alpha I for ``U [..., P, D]``, ``lam [..., P]`` and ``alpha`` broadcasting to ``[...]`` (or
    + A for a ``KroneckerPrec``)."""
    return add_prior((U * lam.unsqueeze(-1)).mT @ U, alpha)


def sample_weights(U: torch.Tensor, lam: torch.Tensor, V: torch.Tensor, alpha: torch.Tensor,
                   z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A draw W ``[..., D, out]`` of q(W) and log p(W) - log q(W) ``[...]``.

    ``U [..., P, D]`` (inducing inputs with the bias column), ``lam [..., P]``, ``V [..., P, out]``, ``alpha [...]``
    the prior precision (or a ``KroneckerPrec``), ``z [..., D, out]`` standard normal draws; the leading axes
    broadcast (replica, sample).
    """
    prec = posterior_prec(U, lam, alpha)
    if _root_in_graph(prec):
        return _draw_from_root(prec_root(prec), (U * lam.unsqueeze(-1)).mT @ V, alpha, z)
    return _draw(torch.linalg.cholesky(prec), (U * lam.unsqueeze(-1)).mT @ V, alpha, z)


def _root_in_graph(prec: torch.Tensor) -> bool:
    """Whether this draw is being compiled on a CPU for a precision the SIMD kernel takes (``chol_root.MAX_N``)."""
    return (torch.compiler.is_compiling() and prec.device.type == "cpu" and prec.shape[-1] <= chol_root.MAX_N
            and prec.dtype in (torch.float32, torch.float64))


def prec_root(A: torch.Tensor) -> torch.Tensor:
    """``C = L^-T`` with ``A = L L^T`` by the SIMD kernel (``core/linalg/chol_root``), NaN where A is not numerically
    positive definite; differentiable in ``A`` (the operator's gradient, ``chol_root._chol_root_backward``)."""
    C, info = torch.ops.bnnbench.chol_root_simd(A)
    return torch.where((info == 0)[..., None, None], C, torch.full_like(C, float("nan")))


def chol_solve(B: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """``(L L^T)^-1 B`` for lower-triangular ``L`` by two triangular solves, ``L^-T (L^-1 B)``, as LAPACK's ``?potrs``
    does (bit for bit ``torch.cholesky_solve`` on the CPU): on a GPU ``cholesky_solve`` reads its status on the host,
    which a CUDA graph cannot capture (the H200 lease of 2026-12-04: ``compile=true``'s dual sampler failed there);
    the triangular solves (cuBLAS' ``trsm``) have no status to read."""
    return torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, B, upper=False), upper=True)


def sample_weights_dual(U: torch.Tensor, lam: torch.Tensor, V: torch.Tensor, alpha: torch.Tensor,
                        z: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_weights`` in P x P algebra, for fewer inducing points than weight rows (P < D): with
    K = U U^T / alpha + Lambda^-1, a prior draw w_0 = alpha^(-1/2) z conditioned on the pseudo-data with its own
    pseudo-noise Lambda^(-1/2) eps (``eps [..., P, out]``; Matheron's rule, exact in distribution),

        W = w_0 + U^T K^-1 (V - U w_0 - Lambda^(-1/2) eps) / alpha,     mean = U^T K^-1 V / alpha,

    and log q(W) = -1/2 (alpha |W - mean|^2 + |Lambda^(1/2) U (W - mean)|^2) + out/2 log det(alpha I + U^T Lambda U)
    with log det(alpha I + U^T Lambda U) = D log alpha + sum log lambda + log det K: O(P^2 D) instead of the
    O(D^3) Cholesky factor of the D x D precision (the MNIST CNN's 3137-row output layer under 500 points)."""
    D, P, out = U.shape[-1], U.shape[-2], V.shape[-1]
    a = alpha[..., None, None]
    K = U @ U.mT / a + torch.diag_embed(1 / lam).expand(*U.shape[:-2], P, P)
    L = torch.linalg.cholesky(K)
    w0 = z * a.rsqrt()
    Uw0 = U @ w0
    dW = w0 - U.mT @ chol_solve(Uw0 + eps * lam.rsqrt().unsqueeze(-1), L) / a
    W = dW + U.mT @ chol_solve(V, L) / a
    quad = alpha * (dW * dW).sum((-1, -2)) + ((U @ dW) ** 2 * lam.unsqueeze(-1)).sum((-1, -2))
    logdet = D * torch.log(alpha) + lam.log().sum(-1) + 2 * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    log_q = -0.5 * quad + 0.5 * out * logdet
    log_p = -0.5 * alpha * (W * W).sum((-1, -2)) + 0.5 * D * out * torch.log(alpha)
    return W, log_p - log_q


def sample_weights_from_stats(ULU: torch.Tensor, ULV: torch.Tensor, prior, z: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_weights`` from the regression's sufficient statistics U^T Lambda U ``[..., D, D]`` and
    U^T Lambda V ``[..., D, out]`` (a convolution's come from ``autocorrelation``)."""
    return _draw(torch.linalg.cholesky(add_prior(ULU, prior)), ULV, prior, z)


def add_prior(ULU: torch.Tensor, prior) -> torch.Tensor:
    """U^T Lambda U + A for the prior precision A = alpha I (``prior`` a tensor ``[...]``) or a ``KroneckerPrec``."""
    if isinstance(prior, torch.Tensor):
        eye = torch.eye(ULU.shape[-1], device=ULU.device, dtype=ULU.dtype)
        return ULU + prior[..., None, None] * eye
    return ULU + prior.dense()


def _draw(L: torch.Tensor, ULV: torch.Tensor, prior, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W = mean + L^-T z with the posterior precision L L^T, and

        log p(W) = -1/2 sum_j w_j^T A w_j + out/2 log det A,   log q(W) = -1/2 |z|^2 + out sum log diag L.

    The normalising constants (2 pi)^(-D out / 2) of p and q cancel and are left out of both."""
    # mean + L^-T z = L^-T (L^-1 ULV + z): two triangular solves for the mean and the draw together
    W = torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, ULV, upper=False) + z, upper=True)
    log_q = -0.5 * (z * z).sum((-1, -2)) + W.shape[-1] * L.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return W, _log_prior(W, prior) - log_q


def _draw_from_root(C: torch.Tensor, ULV: torch.Tensor, prior, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``_draw`` from the root C = L^-T: W = C (C^T ULV + z), log det L = -sum log diag C."""
    W = C @ (C.mT @ ULV + z)
    log_q = -0.5 * (z * z).sum((-1, -2)) - W.shape[-1] * C.diagonal(dim1=-2, dim2=-1).log().sum(-1)
    return W, _log_prior(W, prior) - log_q


def _log_prior(W: torch.Tensor, prior) -> torch.Tensor:
    """log p(W) ``[...]`` without its (2 pi) constant, for W ``[..., D, out]``."""
    D, out = W.shape[-2], W.shape[-1]
    if isinstance(prior, torch.Tensor):
        return -0.5 * prior * (W * W).sum((-1, -2)) + 0.5 * D * out * torch.log(prior)
    return -0.5 * prior.quad(W) + 0.5 * out * prior.logdet()


def posterior(U: torch.Tensor, lam: torch.Tensor, V: torch.Tensor,
              alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean ``[..., D, out]`` and the covariance ``[..., D, D]`` (shared by the output columns) of q(W)."""
    prec = posterior_prec(U, lam, alpha)
    cov = torch.cholesky_inverse(torch.linalg.cholesky(prec))
    return cov @ ((U * lam.unsqueeze(-1)).mT @ V), cov

