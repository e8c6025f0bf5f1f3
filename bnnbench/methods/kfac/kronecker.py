"""One layer's Kronecker-factored curvature (Martens & Grosse 2015; Grosse & Martens 2016 for convolutions), as the
K-FAC family keeps it: F_l ~ A_l (x) S_l for the layer's homogeneous weights ``[W; b]`` (``[d_in + 1, d_out]``), with

    A <- (1 - beta) A + beta E[a a^T],  S <- (1 - beta) S + beta E[ds ds^T]                  (moving averages)
    A^g = A + pi sqrt(g) I,  S^g = S + sqrt(g) / pi I,  pi^2 = (tr A / dim A) / (tr S / dim S)   (NNG eq. 13)

and what is derived from them at a damping g: the square roots C_A C_A^T = [A^g]^-1, C_S C_S^T = [S^g]^-1 (a draw
W = M + C_A E C_S^T has Cov vec(W) = [A^g]^-1 (x) [S^g]^-1) and the inverses [A^g]^-1, [S^g]^-1 of a preconditioner
[A^g]^-1 V [S^g]^-1.
"""

from __future__ import annotations

import dataclasses

import torch

from bnnbench.core.linalg import chol_root
from bnnbench.methods.state import Node, state_class


def inv_chol_t(X: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """``C = L^-T`` with ``X = L L^T``, so that ``C C^T = X^-1``, for damped factors ``X = F + floor I``, ``floor [R]``.

    Where ``X`` is not numerically positive definite (in float32, a factor F of large activations with a small
    damping), F's eigenvalues are clamped at 0 first, i.e. X's at ``floor``, in float64, as the authors' code does at
    every refresh (docs/protocols/noisy_kfac.md: eigendecompose the damped factors, clamp eigenvalues at the damping).
    A non-finite X, or one that even clamped is not positive definite in float64 (a diverging replica's), gives a
    non-finite C, and the engine stops the run as diverged (a selection round scores that candidate as failed).

    Compiled on a CPU, for n <= ``chol_root.MAX_N``: the SIMD kernel of ``core/linalg/chol_root`` in float64 (2.4-3x
    LAPACK's float32 calls at 20-100 factors of n = 14-128, ``bench/chol_root.py``), equal to this to float rounding;
    its failures (``info``, where float64 fails, so more rarely than float32's) take the same clamped fallback, for the
    failed replicas alone (``bnnbench::clamped_root_where_failed``)."""
    if X.shape[-1] == 1:  # a layer with one output: C = X^-1/2, clamped alike, without LAPACK
        nan = torch.full_like(X, float("nan"))
        return 1 / torch.sqrt(torch.where(X > 0, X, torch.where(torch.isfinite(X), floor[:, None, None], nan)))
    if torch.compiler.is_compiling() and X.device.type == "cpu" and X.shape[-1] <= chol_root.MAX_N:
        C, info = torch.ops.bnnbench.chol_root_simd(X)   # the SIMD kernel, in the graph (chol_root.py)
        return torch.ops.bnnbench.clamped_root_where_failed(X, floor, C, info)
    L, info = torch.linalg.cholesky_ex(X)
    bad = info != 0
    if torch.compiler.is_compiling():   # no branch on the outcome on the host: torch.cond keeps the step one graph
        L = torch.cond(bad.any(), _clamped_chol, lambda X, floor, L, bad: L.clone(), (X, floor, L, bad))
    elif bad.any():
        Xb = X[bad].double()
        ok = torch.isfinite(Xb).all(-1).all(-1)
        Lb = torch.full_like(Xb, float("nan"))
        if ok.any():
            e, V = torch.linalg.eigh(Xb[ok])
            e = torch.maximum(e, floor[bad][ok].double()[:, None])
            Lc, still = torch.linalg.cholesky_ex((V * e.unsqueeze(-2)) @ V.transpose(-1, -2))
            Lc[still != 0] = float("nan")   # a factor of a diverging replica (values ~1e30): NaN, the run stops it
            Lb[ok] = Lc
        L = L.clone()
        L[bad] = Lb.to(X.dtype)
    return chol_root.root_of_factor(L)


def _clamped_factor(X: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """The Cholesky factor of every X with its eigenvalues clamped at ``floor`` in float64 (the same LAPACK calls per
    matrix as ``inv_chol_t``'s eager fallback), NaN where X is not finite or even clamped not positive definite."""
    Xd = X.double()
    ok = torch.isfinite(Xd).all(-1).all(-1)
    eye = torch.eye(X.shape[-1], dtype=Xd.dtype, device=X.device).expand_as(Xd)
    e, V = torch.linalg.eigh(torch.where(ok[:, None, None], Xd, eye))
    e = torch.maximum(e, floor.double()[:, None])
    Lc, still = torch.linalg.cholesky_ex((V * e.unsqueeze(-2)) @ V.transpose(-1, -2))
    return torch.where((ok & (still == 0))[:, None, None], Lc, torch.full_like(Lc, float("nan"))).to(X.dtype)


def _clamped_chol(X: torch.Tensor, floor: torch.Tensor, L: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """``inv_chol_t``'s compiled fallback after LAPACK's factorisation, for every replica at once: where ``bad``,
    ``_clamped_factor``'s L; elsewhere ``L``."""
    return torch.where(bad[:, None, None], _clamped_factor(X, floor), L)


@torch.library.custom_op("bnnbench::clamped_root_where_failed", mutates_args=(), device_types="cpu")
def _clamped_root_where_failed(X: torch.Tensor, floor: torch.Tensor, C: torch.Tensor,
                               info: torch.Tensor) -> torch.Tensor:
    """``inv_chol_t``'s compiled fallback after the SIMD kernel: ``C`` with each replica whose factorisation failed
    (``info != 0``) replaced by C = L^-T of its ``_clamped_factor``, computed for those replicas alone, and NaN
    without an eigendecomposition where X is not finite (a diverged candidate, which a selection round steps to its
    end). An operator, so the compiled step stays one graph and runs it as it is: a ``torch.cond`` branch had the
    batch's shape and eigendecomposed every replica's factors in float64 whenever one failed, as a selection round's
    diverging candidate does at every step (the UCI board's noisy K-FAC step: 2.5-3x slower compiled than eager,
    bench/step_ab.py)."""
    bad = (info != 0).nonzero()[:, 0]
    out = C.clone()
    if len(bad):
        Xb = X[bad]
        fin = torch.isfinite(Xb).all(-1).all(-1)
        Cb = torch.full_like(Xb, float("nan"))   # a non-finite factor (a diverged replica's): NaN, as _clamped_factor
        if fin.any():
            Cb[fin] = chol_root.root_of_factor(_clamped_factor(Xb[fin], floor[bad][fin]))
        out[bad] = Cb
    return out


@_clamped_root_where_failed.register_fake
def _(X, floor, C, info):
    return torch.empty_like(C)


def kron_times(cA: torch.Tensor, E: torch.Tensor, cS: torch.Tensor) -> torch.Tensor:
    """``cA E_s cS^T`` for ``E [R, S, a, b]``, ``cA [R, a', a]``, ``cS [R, b', b]``: the samples folded into the matrix
    dimensions, two GEMMs per replica (broadcasting the factors over samples copies them S times)."""
    R, S, a, b = E.shape
    a2, b2 = cA.shape[-2], cS.shape[-2]
    if b == 1 and b2 == 1:  # cS is a scalar per replica; contiguous, as the output layer's passes prefer
        if torch.compiler.is_compiling():   # [R, S, a2] from the product itself: inductor drops a copy's layout
            return ((E[..., 0] * cS[:, :, :1]) @ cA.transpose(-1, -2)).unsqueeze(-1)
        return (cA @ (E[..., 0] * cS[:, :, :1]).transpose(1, 2)).transpose(1, 2).contiguous().unsqueeze(-1)
    X = (E.reshape(R, S * a, b) @ cS.transpose(-1, -2)).reshape(R, S, a, b2)            # E cS^T
    X = cA @ X.transpose(1, 2).reshape(R, a, S * b2)                                    # cA [E cS^T]
    return X.reshape(R, a2, S, b2).transpose(1, 2)


def ema_gram(X: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta, n) -> torch.Tensor:
    """The moving average (1 - beta) X + (beta / n) a^T b of a factor, ``a [R, B, p]``, ``b [R, B, q]``: one fused
    GEMM (``baddbmm``) for a float ``beta``; for a 0-d tensor, as the compiled step gets its lr-scaled step sizes
    (bnnbench.run.compiled), the same sum in tensor arithmetic, since ``baddbmm`` takes its scalars as numbers only."""
    if torch.is_tensor(beta):
        return (1 - beta) * X + (beta / n) * torch.bmm(a.transpose(1, 2), b)
    return torch.baddbmm(X, a.transpose(1, 2), b, beta=1 - beta, alpha=beta / n)


def homogeneous_rows(a: torch.Tensor):
    """A layer's inputs ``a [R, S, B, d_in]`` with the homogeneous 1 appended, one row per (sample, row): ``(a1 [R, S B,
    d_in + 1], R, B, shared)``; where the samples share the inputs (the first layer: stride 0 over S), one sample's
    rows only (``shared``), so that sums over the samples go first."""
    R, _, B = a.shape[:3]
    shared = a.stride(1) == 0
    a = a[:, :1] if shared else a
    return torch.cat([a, torch.ones_like(a[..., :1])], -1).reshape(R, a.shape[1] * B, -1), R, B, shared


@state_class
class Kronecker(Node):
    """A layer's factors ``A [R, d_in + 1, d_in + 1]``, ``S [R, d_out, d_out]`` and, where a method keeps them, the
    square roots ``cA``, ``cS`` of its posterior covariance (C C^T = X^-1, times sqrt(lambda / N) in ``cA``) and the
    damped inverses ``iA``, ``iS`` of its mean update."""
    A: torch.Tensor
    S: torch.Tensor
    cA: torch.Tensor | None = None
    cS: torch.Tensor | None = None
    iA: torch.Tensor | None = None
    iS: torch.Tensor | None = None

    @classmethod
    def identity(cls, R: int, d_in: int, d_out: int, scale: float, dtype, device) -> Kronecker:
        """A = scale I, S = scale I, replicated ``R`` times (the factors' initialisation, ``factor_init``)."""
        eye_a = torch.eye(d_in + 1, dtype=dtype, device=device).expand(R, -1, -1)
        eye_s = torch.eye(d_out, dtype=dtype, device=device).expand(R, -1, -1)
        return cls(A=eye_a * scale, S=eye_s * scale)

    def damped(self, gamma: torch.Tensor):
        """A^gamma, S^gamma of eq. 13 with pi^2 = (tr A / dim A) / (tr S / dim S), and their dampings
        pi sqrt(gamma), sqrt(gamma) / pi ``[R]`` (``gamma [R]``)."""
        A, S = self.A, self.S
        pi = torch.sqrt(A.diagonal(dim1=-2, dim2=-1).mean(-1) / S.diagonal(dim1=-2, dim2=-1).mean(-1)).clamp(1e-8, 1e8)
        g = gamma.sqrt()
        floor_A, floor_S = pi * g, g / pi
        return (A + torch.diag_embed(floor_A[:, None].expand(-1, A.shape[-1])),
                S + torch.diag_embed(floor_S[:, None].expand(-1, S.shape[-1])), floor_A, floor_S)

    def averaged(self, homog, d_s: torch.Tensor, n_samples: int, n_ex: int, beta):
        """The moving averages (1 - beta) X + beta E[x x^T] of the factors, one fused GEMM each: A = E_{b,t}[a a^T] over
        examples and positions, S = E_b[sum_t ds_t ds_t^T] (KFC's Omega / |T| and |T| Gamma: F ~ A (x) S for a
        convolution too; a convolution's B rows are its examples x positions, Grosse & Martens 2016), from the
        homogeneous input rows ``homog`` (``homogeneous_rows``) and the sampled targets' back-propagated gradients
        ``d_s``. Returns the new factors, what was derived from the old ones kept until ``with_root`` and
        ``with_inverse`` refresh it (every T_stats and T_inv steps), and the rows ``(a1, shared, d)``."""
        a1, R, B, shared = homog
        d = d_s.reshape(R, n_samples * B, -1)
        A = ema_gram(self.A, a1, a1, beta, B if shared else n_samples * B)
        S = ema_gram(self.S, d, d, beta, n_samples * n_ex)
        return dataclasses.replace(self, A=A, S=S), (a1, shared, d)

    def roots(self, gamma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """C_A, C_S with C C^T = X^-1 for X = A^gamma, S^gamma: C = chol(X)^-T (unique; ``inv_chol_t``)."""
        A, S, floor_A, floor_S = self.damped(gamma)
        return inv_chol_t(A, floor_A), inv_chol_t(S, floor_S)

    def with_root(self, gamma: torch.Tensor, scale: torch.Tensor) -> Kronecker:
        """The square roots of ``scale^2`` [A^gamma]^-1 and [S^gamma]^-1 (``roots``), ``scale [R, 1, 1]`` multiplying
        C_A."""
        cA, cS = self.roots(gamma)
        return dataclasses.replace(self, cA=cA * scale, cS=cS)

    def with_inverse(self, gamma: torch.Tensor) -> Kronecker:
        """The damped inverses [A^gamma]^-1, [S^gamma]^-1."""
        A, S, _, _ = self.damped(gamma)
        return dataclasses.replace(self, iA=torch.linalg.inv(A), iS=torch.linalg.inv(S))

    def sample(self, M: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """W_s = M + C_A E_s C_S^T ``[R, S, d_in + 1, d_out]`` for ``M [R, d_in + 1, d_out]``, ``eps [R, S, d_in + 1,
        d_out]``: Cov vec(W) = C_A C_A^T (x) C_S C_S^T."""
        return M.unsqueeze(1) + kron_times(self.cA, eps, self.cS)

    def precondition(self, V: torch.Tensor) -> torch.Tensor:
        """[A^g]^-1 V [S^g]^-1 by the damped inverses."""
        return self.iA @ V @ self.iS

    def precondition_by_root(self, V: torch.Tensor, n_over_kl: torch.Tensor) -> torch.Tensor:
        """C_A C_A^T V C_S C_S^T N / lambda (``n_over_kl [R, 1, 1]``): the damped inverses' preconditioner where they
        are the covariance's, C_A C_A^T = (lambda / N) [A^g]^-1 and C_S C_S^T = [S^g]^-1 (never formed)."""
        cA, cS = self.cA, self.cS
        if cS.shape[-1] == 1:
            return cA @ (cA.transpose(-1, -2) @ V) * (cS * cS * n_over_kl)
        return cA @ ((cA.transpose(-1, -2) @ V) @ cS) @ cS.transpose(-1, -2) * n_over_kl
