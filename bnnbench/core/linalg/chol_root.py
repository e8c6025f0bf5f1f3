"""Inverse Cholesky square roots of many small positive definite matrices on the CPU: ``C = L^-T`` with ``X = L L^T``,
so that ``C C^T = X^-1``, by ``chol_root.c``, eight matrices at a time in the SIMD lanes of one core, in float64
(LAPACK's ?potf2 and ?trti2 recurrences; the C file says which).

Noisy K-FAC (Zhang et al., 2018, Alg. 2) refreshes ``C`` for each layer's two damped Kronecker factors at every step
(``methods/kfac/kronecker.inv_chol_t``): 14 x 14, 51 x 51 and 50 x 50 per replica at Boston scale. LAPACK takes one
matrix per call (``cholesky_ex``, then a triangular solve against the identity and the copies between them); at 100
replicas about 3.3 of the compiled step's 14.3 ms (profiled), about 2.5x what this kernel takes (``bench/chol_root.py``:
2.4-3x at 20-100 matrices of n = 14-128; 0.5-0.8x for a single matrix, which fills one of the eight lanes; LAPACK's
blocked factorisation wins above n = 128). The compiled step asks for this kernel (the operator
``bnnbench::chol_root_simd``, which dynamo traces through) for matrices up to ``MAX_N``; the eager step, and so every
record, keeps LAPACK. Built at first use (``c_kernels``); where it cannot be, one warning, then LAPACK.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bnnbench.core.linalg import c_kernels

SOURCE = Path(__file__).with_name("chol_root.c")
MAX_N = 128   # up to which the kernel beats LAPACK (the module's docstring)


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The built kernel (``c_kernels.build``), or None (with a warning) where no C compiler builds it."""
    entry = ([ctypes.c_void_p, ctypes.c_long, ctypes.c_long] + [ctypes.c_void_p] * 3, None)
    return c_kernels.build(SOURCE, "Cholesky", {"chol_root_work": ([ctypes.c_long], ctypes.c_long),
                                                "chol_root_f32_all": entry, "chol_root_f64_all": entry})


def available() -> bool:
    """Whether the kernel is built (building it if need be)."""
    return _library() is not None


def chol_root(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(C, info)`` for symmetric ``X [..., n, n]`` (float32 or float64, its lower triangle read): ``C = L^-T``, upper
    triangular, in ``X``'s dtype, computed in float64; ``info [...]`` (int32) 0, or k > 0 where the k-th pivot of the
    Cholesky factorisation is not positive or not finite (``C`` is then undefined there), as ``cholesky_ex``'s.
    Raises ``RuntimeError`` where the kernel cannot be built (``available``)."""
    lib = _library()
    if lib is None:
        raise RuntimeError(f"the Cholesky kernel {SOURCE.name} is not available")
    if X.dtype not in (torch.float32, torch.float64) or X.device.type != "cpu":
        raise TypeError(f"chol_root takes float32 or float64 CPU tensors, not {X.dtype} on {X.device}")
    n = X.shape[-1]
    flat = X.detach().reshape(-1, n, n).contiguous()
    R = flat.shape[0]
    C = torch.empty_like(flat)
    info = torch.empty(R, dtype=torch.int32)
    work = torch.empty(lib.chol_root_work(n), dtype=torch.float64)
    fn = lib.chol_root_f32_all if X.dtype == torch.float32 else lib.chol_root_f64_all
    fn(flat.data_ptr(), R, n, C.data_ptr(), info.data_ptr(), work.data_ptr())
    return C.reshape(X.shape), info.reshape(X.shape[:-2])


def root_of_factor(L: torch.Tensor) -> torch.Tensor:
    """``C = L^-T`` of lower-triangular Cholesky factors ``L [..., n, n]`` by LAPACK, from ``C L^T = I`` (a solve from
    the right: 2x faster on a CPU than ``L C^T = I`` and a transpose)."""
    eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L)
    return torch.linalg.solve_triangular(L.transpose(-1, -2), eye, upper=True, left=False)


def _lapack_chol_root(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``chol_root`` by LAPACK: ``cholesky_ex``, then ``root_of_factor``."""
    L, info = torch.linalg.cholesky_ex(X)
    return root_of_factor(L), info


@torch.library.custom_op("bnnbench::chol_root_simd", mutates_args=(), device_types="cpu")
def chol_root_simd(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``chol_root`` by the kernel, or by LAPACK where it does not build (``chol_root`` warns then): an operator with a
    shape rule, so that a compiled step's graph holds it, and a gradient in X (``_chol_root_backward``), so that a
    compiled step differentiates through it without a ``torch.autograd.Function``, whose graphs AOTAutograd's cache
    cannot store (``autograd_function_apply``: every run of App. G's inducing families traced its step again, 4-10 s
    a cell, where the other methods load theirs from the cache)."""
    return chol_root(X) if available() else _lapack_chol_root(X)


@chol_root_simd.register_fake
def _(X):
    return torch.empty_like(X), X.new_empty(X.shape[:-2], dtype=torch.int32)


def _chol_root_setup(ctx, inputs, output):
    ctx.save_for_backward(*output)


def _chol_root_backward(ctx, grad_C, grad_info):
    """The gradient in X of ``C = L^-T``, X = L L^T (its lower triangle read). With dL = L Phi(L^-1 dX L^-T) (Phi: the
    lower triangle, its diagonal halved) and L^T C = I,

        dC = -C dL^T C = -C Phi(C^T dX C)^T,   so   grad_X = -C Phi(grad_C^T C) C^T,

    symmetrised as torch's Cholesky backward is: products only, no triangular solves. NaN where the factorisation
    failed (``info``: C is undefined there)."""
    C, info = ctx.saved_tensors
    C = torch.where((info == 0)[..., None, None], C, torch.full_like(C, float("nan")))
    M = grad_C.mT @ C
    phi = M.tril() - 0.5 * torch.diag_embed(M.diagonal(dim1=-2, dim2=-1))
    K = C @ phi @ C.mT
    return -0.5 * (K + K.mT)


chol_root_simd.register_autograd(_chol_root_backward, setup_context=_chol_root_setup)
