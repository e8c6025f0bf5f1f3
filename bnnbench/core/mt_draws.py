"""torch's own CPU draws, the same bits, faster: ``torch.randn`` / ``torch.rand`` of float32 from a
``torch.Generator`` (its Mersenne twister, MT19937) by the C kernel ``mt_draws.c``.

ATen draws a float32 uniform as ``(w & 0xFFFFFF) * 2^-24`` from one tempered MT19937 word, one word per call through
the generator, and a normal fill of n >= 16 numbers as n uniforms turned into normals 16 at a time by Box-Muller
(``normal_fill`` with ``normal_fill_16_AVX2``: the Cephes polynomials of ``avx_mathfun.h``, the wheel's fused
multiply-adds), the last 16 redrawn where 16 does not divide n. The kernel computes the same numbers from the
generator's state (``Generator.get_state``, written back with ``set_state``, so torch's later draws continue the
stream): the words twisted and tempered in vector loops, Box-Muller on 8 lanes. ``rng=torch``'s draws go through it
(``prng.randn`` / ``prng.rand``), so every committed record's numbers stand.

That is how torch 2.13's CPU wheel draws on an x86-64 CPU; another torch, build or processor may draw otherwise (an
MKL path, ``NormalFill16``'s scalar form with libm). So the kernel is checked against torch at first use
(``available``: several sizes, the tail rule, the state after the draw) and used only where it agrees bit for bit,
else torch draws (with a warning). Below ``MIN_N`` numbers torch's own call is as cheap as the state's round trip
(1.6 us).

Measured (``PYTHONPATH=. taskset -c 1 python bench/prng.py``, one thread): see results/README.md, Speed.
"""

from __future__ import annotations

import ctypes
import functools
import math
import warnings
from pathlib import Path

import torch

from bnnbench.core.linalg import c_kernels

SOURCE = Path(__file__).with_name("mt_draws.c")
MIN_N = 256
STATE_BYTES = 5056   # sizeof(CPUGeneratorImplState): the layout the kernel reads (mt_draws.c)


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    sig = ([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long], None)
    return c_kernels.build(SOURCE, "Mersenne-twister draws", {"mt_normal": sig, "mt_uniform": sig},
                           instead="torch's own draws")


def _fill(lib, generator: torch.Generator, out: torch.Tensor, normal: bool) -> torch.Tensor:
    state = generator.get_state()
    (lib.mt_normal if normal else lib.mt_uniform)(state.data_ptr(), out.data_ptr(), out.numel())
    generator.set_state(state)
    return out


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether the kernel is built and draws torch's bits here: from one seed, torch and the kernel in turn draw
    normals and uniforms of several sizes (multiples of 16 and not, across the twister's 624-word blocks), and then
    torch again from each state."""
    lib = _library()
    if lib is None:
        return False
    ours, theirs = torch.Generator().manual_seed(20261204), torch.Generator().manual_seed(20261204)
    if ours.get_state().numel() != STATE_BYTES:
        warnings.warn("torch's generator state has another layout than mt_draws.c reads; torch's own draws used",
                      RuntimeWarning, stacklevel=3)
        return False
    same = True
    for n, normal in [(16, True), (17, True), (1000, False), (4099, True), (623, False), (100_003, True), (31, True)]:
        a = (torch.randn if normal else torch.rand)(n, generator=theirs)
        b = _fill(lib, ours, torch.empty(n, dtype=torch.float32), normal)
        same = same and torch.equal(a.view(torch.int32), b.view(torch.int32))
    same = same and torch.equal(torch.rand(700, generator=theirs), torch.rand(700, generator=ours))
    if not same:
        warnings.warn(f"mt_draws.c does not reproduce torch {torch.__version__}'s CPU draws on this machine; "
                      "torch's own draws used", RuntimeWarning, stacklevel=3)
    return same


def applies(size, generator, device, dtype) -> bool:
    """Whether a draw of ``size`` with these arguments is one the kernel makes: float32, on the CPU, from a CPU
    generator (or the default one), at least ``MIN_N`` numbers, not while dynamo traces (a compiled caller draws
    through torch)."""
    return ((dtype or torch.get_default_dtype()) == torch.float32 and not torch.compiler.is_compiling()
            and (device is None or torch.device(device).type == "cpu")
            and (generator is None or generator.device.type == "cpu")
            and math.prod(size) >= MIN_N and available())


def randn(size, generator: torch.Generator | None = None) -> torch.Tensor:
    """``torch.randn(*size, generator=generator)`` (float32, CPU), bit for bit; ``applies`` must hold."""
    return _fill(_library(), generator or torch.default_generator, torch.empty(size, dtype=torch.float32), True)


def rand(size, generator: torch.Generator | None = None) -> torch.Tensor:
    """``torch.rand(*size, generator=generator)`` (float32, CPU), bit for bit; ``applies`` must hold."""
    return _fill(_library(), generator or torch.default_generator, torch.empty(size, dtype=torch.float32), False)
