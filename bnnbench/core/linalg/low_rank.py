"""Low-rank-plus-diagonal Gaussians: precision ``U U^T + diag(d)``, ``U [R, P, L]``, ``d [R, P]``.

``fast_inverse`` (SLANG Algorithm 2) solves with the precision by the Woodbury identity,
``fast_sample`` (SLANG Algorithm 3) draws from ``N(0, (U U^T + diag d)^-1)`` in O(P L^2 + L^3),
``fast_eig`` (Rayleigh-Ritz) and ``nystrom_eig`` (the SLANG code's variant) are randomised top-L
eigendecompositions, SLANG's ``fast_eig``, of an operator given by its matrix products, and ``top_eigh``
is the exact top-L eigendecomposition of a small dense matrix (LAPACK; for L = 1 also ``top_eigpair``'s C kernel).
All functions are batched over the leading replica axis.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from bnnbench.core.linalg import top_eigpair


def fast_inverse(U: torch.Tensor, d: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``(U U^T + diag d)^-1 v`` by Woodbury:
    ``D^-1 v - D^-1 U (I + U^T D^-1 U)^-1 U^T D^-1 v``; ``v [R, P]`` or ``[R, P, k]``."""
    vec = v.dim() == 2
    if vec:
        v = v.unsqueeze(-1)
    d = d.unsqueeze(-1)
    Dinv_v = v / d
    Us = U * d.rsqrt()                                          # D^-1/2 U: U^T D^-1 U = Us^T Us
    L = U.shape[-1]
    cap = torch.eye(L, dtype=U.dtype, device=U.device) + Us.transpose(-1, -2) @ Us
    rhs = U.transpose(-1, -2) @ Dinv_v
    if L == 1 and torch.compiler.is_compiling():   # a division, not a LAPACK call in the graph; equal to the solve to
        y = rhs / cap                                 # float rounding, not bitwise, so the eager step keeps the solve
    else:   # solve_ex: solve without its host-side check (a CUDA graph cannot capture it); cap >= I is never singular
        y = torch.linalg.solve_ex(cap, rhs)[0]
    x = Dinv_v - (U @ y) / d
    return x[..., 0] if vec else x


@functools.lru_cache(maxsize=1)
def _scipy_lapack():
    from scipy.linalg import lapack
    from threadpoolctl import ThreadpoolController
    return lapack, ThreadpoolController()   # after scipy's BLAS is loaded, so that it controls it


SIMD_MAX_N = 64          # up to which top_eigh's kernel="simd" beats ?syevr for any number of matrices (its docstring)
SIMD_MAX_N_LANES = 144   # up to which it beats ?syevr where the matrices fill its 8 lanes (8 or more of them)


def top_eigh(A: torch.Tensor, k: int, kernel: str = "lapack") -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest eigenpairs of symmetric ``A [..., n, n]`` (its lower triangle is read), descending:
    ``(values [..., k], vectors [..., n, k])``. On the CPU, LAPACK's ``?syevr`` computes only these (MRRR on the
    tridiagonal form; for SLANG's Gram matrices, k = 1 of n = 41, 4x faster than the full ``torch.linalg.eigh``),
    eagerly between a compiled caller's parts; elsewhere, or for k = n, the full decomposition sliced.
    ``kernel="simd"``: for k = 1 on the CPU, the C kernel of ``top_eigpair`` as the operator
    ``bnnbench::top_eigh_simd``, which a compiled caller traces through; the same eigenpairs to the input's rounding.
    It runs eight matrices at a time in float64, so it wins where the matrices are small (``?syevr`` time / kernel
    time, one thread, ``python bench/top_eigpair.py --n 11,21,41,64,81,161 --replicas 1,3,8,20,100``: for 1, 8 and
    100 matrices n = 41: 0.69x, 3.3x, 3.0x; n = 64: 0.68x, 3.0x, 1.9x; n = 81: 0.34x, 1.7x, 2.2x; n = 161: 0.16x,
    0.86x, 0.87x): it is used for n <= ``SIMD_MAX_N``, LAPACK above (SLANG's MNIST step: one 801 x 801 matrix). For
    fewer than 8 matrices of n <= 64 it loses at most about 0.1 ms, less than the graph break that LAPACK's loop costs
    a compiled step. Where 8 or more matrices fill its lanes it is used up to ``SIMD_MAX_N_LANES``: the boards' and
    a1a's 129 x 129 Gram matrices (1 + 32 x 4 and 1 + 128 rows), on the AMD EPYC of 2026-12-02 (same command, n = 129,
    161, 193, 257 for 100 / 8 / 4 matrices: 2.37x / 1.44x / 0.77x, 1.22x / 1.26x / 0.66x, 1.18x / 1.50x / 0.76x,
    1.10x / 1.56x / 0.66x; the host of the earlier grid had 0.86x at n = 161)."""
    n = A.shape[-1]
    if A.device.type != "cpu" or k >= n or A.dtype not in (torch.float32, torch.float64):
        e, V = eigh(A)
        return e.flip(-1)[..., :k], V.flip(-1)[..., :k]
    if kernel not in ("lapack", "simd"):
        raise ValueError(f"unknown kernel {kernel!r}; valid: lapack, simd")
    if kernel == "simd" and k == 1 and (n <= SIMD_MAX_N or (n <= SIMD_MAX_N_LANES and math.prod(A.shape[:-2]) >= 8)):
        return torch.ops.bnnbench.top_eigh_simd(A)
    return _lapack_top_eigh(A, k)


@torch.compiler.disable   # LAPACK through scipy: a compiled caller runs it eagerly between its compiled parts
def _lapack_top_eigh(A: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``top_eigh`` on the CPU by ``?syevr``, one matrix per call."""
    n = A.shape[-1]
    lapack, pools = _scipy_lapack()
    evr = lapack.dsyevr if A.dtype == torch.float64 else lapack.ssyevr
    flat = A.detach().reshape(-1, n, n).numpy()
    e = np.empty((len(flat), k), dtype=flat.dtype)
    V = np.empty((len(flat), n, k), dtype=flat.dtype)
    # one thread: scipy's OpenBLAS pool is not torch's, and its threads spin beside torch's after each call (measured:
    # 5 s instead of 30 ms for n = 801 beside two single-threaded jobs on 2 cores; SLANG's MNIST step 1.8x slower)
    with pools.limit(limits=1, user_api="blas"):
        for r, a in enumerate(flat):
            w, z, m, _, info = evr(a, compute_v=1, range="I", lower=1, il=n - k + 1, iu=n)
            if info != 0 or m != k:
                raise torch.linalg.LinAlgError(f"?syevr failed (info = {info}, {m} of {k} eigenpairs)")
            e[r], V[r] = w[:k][::-1], z[:, :k][:, ::-1]
    return (torch.from_numpy(e).reshape(*A.shape[:-2], k),
            torch.from_numpy(V).reshape(*A.shape[:-2], n, k))


@torch.library.custom_op("bnnbench::top_eigh_simd", mutates_args=(), device_types="cpu")
def _top_eigh_simd(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``top_eigh(A, 1)`` by ``top_eigpair``'s kernel, or by LAPACK where the kernel does not build (``top_eigpair``
    warns then): an operator with a shape rule, so that dynamo puts it in a compiled step's graph, not between two."""
    return top_eigpair.top_eigpair(A) if top_eigpair.available() else _lapack_top_eigh(A, 1)


@_top_eigh_simd.register_fake
def _(A):
    return A.new_empty(*A.shape[:-2], 1), A.new_empty(*A.shape[:-1], 1)


def eigh(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eigh``; on a GPU run eagerly between a compiled step's graphs: cuSOLVER's eigh reads its
    convergence flag on the host, which a CUDA graph cannot capture (``cudaErrorStreamCaptureUnsupported``, the H200
    lease of 2026-11-27). The same kernels either way, so the same numbers."""
    return _eager_eigh(A) if A.is_cuda else torch.linalg.eigh(A)


@torch.compiler.disable
def _eager_eigh(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.linalg.eigh(A)


def fast_sample(U: torch.Tensor, d: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """``z ~ N(0, (U U^T + diag d)^-1)`` from standard normal ``eps [R, S, P]``.

    With ``V = D^-1/2 U`` and ``V^T V = Q diag(e) Q^T``,
    ``(I + V V^T)^-1/2 = I + V Q diag(k) Q^T V^T`` with ``k = ((1+e)^-1/2 - 1)/e = -1/(sqrt(1+e)(1+sqrt(1+e)))``
    (finite at ``e = 0``), and ``z = D^-1/2 (I + V V^T)^-1/2 eps``.
    """
    sd = d.rsqrt()
    V = U * sd.unsqueeze(-1)                                   # [R, P, L]
    VtV = V.transpose(-1, -2) @ V
    if U.shape[-1] == 1:   # the 1 x 1 eigh returns its entry and 1 exactly (LAPACK's), without a call
        e, Q = VtV[..., 0], torch.ones_like(VtV)
    else:
        e, Q = eigh(VtV)                                       # [R, L], [R, L, L]
    e = e.clamp_min(0)
    r = torch.sqrt(1 + e)
    k = -1.0 / (r * (1 + r))
    coef = ((eps @ V) @ Q) * k.unsqueeze(1)                    # [R, S, L]
    return (eps + (coef @ Q.transpose(-1, -2)) @ V.transpose(-1, -2)) * sd.unsqueeze(1)


def fast_eig(matmul, probes: torch.Tensor, rank: int, n_iter: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``rank`` eigenpairs of a symmetric PSD operator ``A`` given by ``matmul(Y) = A Y``:
    randomised subspace iteration from the Gaussian ``probes [R, P, k]`` (k >= rank; SLANG's
    ``fast_eig`` uses k = rank + 2 and 4 power iterations), then Rayleigh-Ritz (Halko, Martinsson &
    Tropp, 2011). Returns ``(values [R, rank] descending, vectors [R, P, rank])``."""
    Y = matmul(probes)
    for _ in range(n_iter):
        Q, _ = torch.linalg.qr(Y)
        Y = matmul(Q)
    Q, _ = torch.linalg.qr(Y)
    T = Q.transpose(-1, -2) @ matmul(Q)
    w, S = eigh(0.5 * (T + T.transpose(-1, -2)))
    return w.flip(-1)[..., :rank], Q @ S.flip(-1)[..., :rank]


def _rsqrt_or_zero(x: torch.Tensor) -> torch.Tensor:
    """``x^-1/2`` where ``x > 0``, else 0 (a pseudo-inverse square root of eigenvalues)."""
    return torch.where(x > 0, x.clamp_min(torch.finfo(x.dtype).tiny).rsqrt(), torch.zeros_like(x))


def _thin_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for batches of products with a side of k (a few probes); in a compiled graph on the CPU as a sum of
    broadcast products, which inductor fuses into one loop (MKL's batched GEMM takes about 9 us per [901, 3] x [3, 3]
    product, 0.9 ms for a Bayesian-optimisation round's 100). Equal to the product to float rounding, not bitwise, so
    the eager step keeps the GEMM."""
    if a.device.type == "cpu" and torch.compiler.is_compiling():
        return (a.unsqueeze(-1) * b.unsqueeze(-3)).sum(-2)
    return a @ b


def nystrom_eig(matmul, probes: torch.Tensor, rank: int, n_iter: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``rank`` eigenpairs of a symmetric PSD operator by the randomised eigensolver of SLANG's Python code
    (``fastpca.eigsh_func``, after fbpca; Halko, Martinsson & Tropp, 2011, Algorithm 5.5): ``n_iter - 1``
    orthonormalised power steps from ``probes [R, P, k]``, one more step ``Y = A Q`` giving the shift
    ``nu = 1e-7 sqrt(P) max_j |Y_j| / |Q_j|``, then on ``Q = orth(Y)`` the Nystrom approximation

        A + nu I ~ E (Q^T E)^-1 E^T,   E = (A + nu I) Q,

    whose eigenvalues, less ``nu``, and eigenvectors are returned (top ``rank`` by absolute value, as the code
    does). ``n_iter + 1`` products with ``A`` (five for the code's ``n_iter = 4``): ``nystrom_range``, then
    ``nystrom_top``."""
    return nystrom_top(*nystrom_range(matmul, probes, n_iter), rank)


def nystrom_range(matmul, probes: torch.Tensor, n_iter: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``nystrom_eig``'s subspace: ``(Q, E = (A + nu I) Q [R, P, k], nu [R, 1, 1])`` (the products with ``A``)."""
    Q = probes
    for _ in range(max(0, n_iter - 1)):
        Q, _ = torch.linalg.qr(matmul(Q))
    Y = matmul(Q)
    P = Q.shape[-2]
    anorm = (torch.linalg.vector_norm(Y, dim=-2) / torch.linalg.vector_norm(Q, dim=-2)).amax(-1)
    nu = (1e-7 * math.sqrt(P) * anorm)[:, None, None]
    Q, _ = torch.linalg.qr(Y)
    return Q, matmul(Q) + nu * Q, nu


def nystrom_top(Q: torch.Tensor, E: torch.Tensor, nu: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``nystrom_eig``'s eigenpairs from its subspace (``nystrom_range``). ``(Q^T E)^-1`` goes through the
    eigendecomposition of the k x k matrix ``Q^T E`` (the code: its Cholesky factor; the same product). The signs of
    ``Q``'s columns change no eigenvalue, and an eigenvector at most in its sign."""
    C = _thin_mm(Q.transpose(-1, -2), E)
    lam, W = eigh(0.5 * (C + C.transpose(-1, -2)))
    F = _thin_mm((W * _rsqrt_or_zero(lam).unsqueeze(-2)).transpose(-1, -2), E.transpose(-1, -2))  # F^T F = E C^-1 E^T
    s2, V = eigh(_thin_mm(F, F.transpose(-1, -2)))
    vecs = _thin_mm(F.transpose(-1, -2), V * _rsqrt_or_zero(s2).unsqueeze(-2))
    e = s2 - nu[..., 0]
    order = e.abs().argsort(-1, descending=True)[..., :rank]
    return e.abs().gather(-1, order), vecs.gather(-1, order.unsqueeze(-2).expand(*vecs.shape[:-1], rank))


def precision_diag_of_cov(U: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``diag((U U^T + diag d)^-1)`` in O(P L^2)."""
    Dinv_U = U / d.unsqueeze(-1)
    cap = torch.eye(U.shape[-1], dtype=U.dtype, device=U.device) + U.transpose(-1, -2) @ Dinv_U
    return 1.0 / d - (Dinv_U @ torch.linalg.inv(cap) * Dinv_U).sum(-1)


def logdet_precision(U: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``log det(U U^T + diag d) = sum log d + log det(I + U^T D^-1 U)``."""
    cap = torch.eye(U.shape[-1], dtype=U.dtype, device=U.device) + U.transpose(-1, -2) @ (U / d.unsqueeze(-1))
    return torch.log(d).sum(-1) + torch.logdet(cap)


def kl_low_rank_to_diag(mean, U, d, prior_prec) -> torch.Tensor:
    """KL(N(mean, (U U^T + diag d)^-1) || N(0, diag(prior_prec)^-1)) per replica."""
    return 0.5 * ((prior_prec * precision_diag_of_cov(U, d)).sum(-1) + (prior_prec * mean * mean).sum(-1)
                  - mean.shape[-1] + logdet_precision(U, d) - torch.log(prior_prec).sum(-1))
