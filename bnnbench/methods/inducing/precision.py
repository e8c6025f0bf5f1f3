"""The Kronecker-structured weight prior precision of a convolution under the spatial Inverse-Wishart prior.

A convolution's weights W ``[..., D, out]`` have D = C k^2 rows in the order (input channel, kernel row, kernel
column); with the spatial Inverse-Wishart prior (Ober & Aitchison, 2020, Eq. 21, App. B; the library's
``SpatialIWPrior``) each output column has the precision

    A = (c I_C) kron Q,    c = C (the library's channel precision ``Scale(C, C)``),  Q ``[..., p, p]``, p = k^2,

with Q an Inverse-Wishart draw over the kernel's pixels (``wishart``). Every other prior's precision is a scalar
alpha ``[...]`` times I, passed around as a plain tensor; this class gives A's products and determinant without
forming it, and ``dense`` for the regression's precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class KroneckerPrec:
    c: float              # channel precision
    n_channels: int       # C
    spatial: torch.Tensor  # Q [..., p, p]

    @property
    def p(self) -> int:
        return self.spatial.shape[-1]

    def dense(self) -> torch.Tensor:
        """A ``[..., C p, C p]``."""
        C, p, Q = self.n_channels, self.p, self.spatial
        eye = torch.eye(C, device=Q.device, dtype=Q.dtype)
        A = self.c * eye[:, None, :, None] * Q[..., None, :, None, :]
        return A.reshape(*Q.shape[:-2], C * p, C * p)

    def diagonal(self) -> torch.Tensor:
        """diag(A) ``[..., C p]``."""
        d = self.c * self.spatial.diagonal(dim1=-2, dim2=-1)
        return d.unsqueeze(-2).expand(*d.shape[:-1], self.n_channels, self.p).reshape(*d.shape[:-1], -1)

    def quad(self, W: torch.Tensor) -> torch.Tensor:
        """sum_j w_j^T A w_j over the columns of ``W [..., C p, out]``: c sum_{channel, j} w_{cj}^T Q w_{cj}."""
        Wc = W.reshape(*W.shape[:-2], self.n_channels, self.p, W.shape[-1])
        return self.c * (Wc * (self.spatial.unsqueeze(-3) @ Wc)).sum((-1, -2, -3))

    def logdet(self) -> torch.Tensor:
        """log det A = C p log c + C log det Q."""
        C, p = self.n_channels, self.p
        return C * p * math.log(self.c) + C * torch.logdet(self.spatial)

    def whiten(self, z: torch.Tensor) -> torch.Tensor:
        """A^{-1/2} z in the Cholesky sense, L_A^{-T} z with A = L_A L_A^T, for ``z [..., C p, out]``: a N(0, A^-1)
        draw per column (per channel c^{-1/2} L_Q^{-T} z_c)."""
        L = torch.linalg.cholesky(self.spatial)
        zc = z.reshape(*z.shape[:-2], self.n_channels, self.p, z.shape[-1])
        w = torch.linalg.solve_triangular(L.mT.unsqueeze(-3), zc, upper=True) / math.sqrt(self.c)
        return w.reshape(z.shape)
