"""MKL's kernels chosen by the CPU's instruction sets alone, not by its vendor (opt-in: ``BNNBENCH_MKL_ANY_VENDOR=1``).

torch's x86-64 wheels do their BLAS and LAPACK in Intel's MKL, which takes generic code paths on a CPU that is not
Intel's, whatever its instruction sets. On this project's AMD EPYC (AVX-512, 2026-12-03, one thread,
``PYTHONPATH=. python bench/mkl_vendor.py``) that leaves the UCI steps' batched float32 GEMMs 2.1-2.8x slower (4.5x
for the Nystrom eigensolver's [100, 901, 3] x [100, 3, 3]) than MKL's AVX-512 kernels run them on the same CPU, a
[256, 3137] x [3137, 500] product 2.2x, batched Choleskys of [20, 257, 257] 1.5-1.6x and ``eigh`` 1.5x.
``mkl_vendor.c`` defines the function through which MKL asks, once, whether the CPU is Intel's; loaded globally
before torch, it answers yes (the override that MKL's users on AMD machines apply).

It must be loaded before torch: ``bnnbench/__init__.py`` calls :func:`enable` where the environment sets
``BNNBENCH_MKL_ANY_VENDOR`` (a worker process inherits it). Imported after torch, MKL keeps its vendor dispatch and
:func:`enable` warns. The kernels that MKL runs set the rounding of a seeded CPU run, so the mode is part of the
machine's numerics class (``bnnbench.run.numerics``): a record made with it is checked exactly only against re-runs
made with it, and CI, which runs without it, compares such a record across classes. No record committed before
2026-12-03 was made with it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import warnings
from pathlib import Path

from bnnbench.core.linalg import c_kernels

ENV = "BNNBENCH_MKL_ANY_VENDOR"
SOURCE = Path(__file__).with_name("mkl_vendor.c")

_lib: ctypes.CDLL | None = None


def requested() -> bool:
    """Whether the environment asks for the mode (``BNNBENCH_MKL_ANY_VENDOR`` set, and not to ``0``)."""
    return os.environ.get(ENV, "") not in ("", "0")


def enable() -> bool:
    """Load the override globally, before torch; False (with a warning) where torch is loaded already or the C file
    cannot be built (MKL then keeps its vendor dispatch)."""
    global _lib
    if _lib is not None:
        return True
    if "torch" in sys.modules:
        warnings.warn(f"{ENV} is set, but torch was imported before bnnbench: MKL keeps its vendor dispatch (import "
                      "bnnbench first)", RuntimeWarning, stacklevel=2)
        return False
    _lib = c_kernels.build(SOURCE, "MKL vendor", {"bnnbench_mkl_asked": ([], ctypes.c_long)},
                           instead="MKL's vendor dispatch", mode=ctypes.RTLD_GLOBAL)
    return _lib is not None


def active() -> bool:
    """Whether MKL dispatches through the override: it is loaded and MKL asked it (MKL asks at its first GEMM, which
    this makes where none ran yet). False where torch's BLAS is not MKL."""
    if _lib is None:
        return False
    if _lib.bnnbench_mkl_asked() == 0:
        import torch
        torch.ones(64, 64) @ torch.ones(64, 64)
    return _lib.bnnbench_mkl_asked() > 0
