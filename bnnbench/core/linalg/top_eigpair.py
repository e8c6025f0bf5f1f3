"""The largest eigenpair of many small symmetric matrices on the CPU: ``top_eigpair.c``, eight matrices at a time in
the SIMD lanes of one core, in float64 (LAPACK's steps for one eigenpair: Householder tridiagonalisation, bisection,
inverse iteration; the C file says which).

SLANG's step (L = 1) needs the top eigenpair of one (1 + S M) x (1 + S M) Gram matrix per replica, 41 x 41 at UCI
scale. LAPACK's ``?syevr`` (``low_rank.top_eigh``) takes one matrix per call, about 50 us for 41 x 41 on this CPU: at
100 replicas, half of SLANG's compiled step. This kernel runs the same 100 matrices 3-4x faster and in float64
throughout (``?syevr`` runs in the input's float32). The compiled SLANG step uses it (``top_eigh(..., kernel="simd")``,
an operator that dynamo traces through) where it wins: matrices up to 64 x 64, and up to 144 x 144 where 8 or more
fill its lanes (``low_rank.top_eigh``); the eager step, and so every record, keeps LAPACK.

The kernel is built at first use with the system's C compiler (``c_kernels``). Where it cannot be built, ``top_eigh``
says so once (a warning) and uses LAPACK.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np
import torch

from bnnbench.core.linalg import c_kernels

SOURCE = Path(__file__).with_name("top_eigpair.c")


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The built kernel (``c_kernels.build``), or None (with a warning) where no C compiler builds it."""
    return c_kernels.build(SOURCE, "eigensolver", {
        "top_eigpair_work": ([ctypes.c_long], ctypes.c_long),
        "top_eigpair": ([ctypes.c_void_p, ctypes.c_long, ctypes.c_long] + [ctypes.c_void_p] * 3, None)})


def available() -> bool:
    """Whether the kernel is built (building it if need be)."""
    return _library() is not None


def top_eigpair(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The largest eigenvalue and a unit eigenvector of each symmetric ``A [..., n, n]`` on the CPU (its lower
    triangle is read): ``(values [..., 1], vectors [..., n, 1])`` in ``A``'s dtype, computed in float64. The sign of a
    vector is the kernel's (as LAPACK's, arbitrary). Raises ``RuntimeError`` where the kernel cannot be built
    (``available``)."""
    lib = _library()
    if lib is None:
        raise RuntimeError(f"the eigensolver kernel {SOURCE.name} is not available")
    n = A.shape[-1]
    flat = np.ascontiguousarray(A.detach().reshape(-1, n, n).numpy(), dtype=np.float64)
    R = len(flat)
    e, V = np.empty(R), np.empty((R, n))
    work = np.empty(lib.top_eigpair_work(n))
    lib.top_eigpair(flat.ctypes.data, R, n, e.ctypes.data, V.ctypes.data, work.ctypes.data)
    return (torch.from_numpy(e).to(A.dtype).reshape(*A.shape[:-2], 1),
            torch.from_numpy(V).to(A.dtype).reshape(*A.shape[:-2], n, 1))
