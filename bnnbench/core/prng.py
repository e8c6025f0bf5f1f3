"""The Monte Carlo draws of a run: torch's generator, or counter-based Philox draws (the ``rng`` setting).

Every draw a method makes goes through ``randn`` and ``rand``, which take torch's arguments. Under ``rng=torch`` (the
default, what every committed record ran with) they are ``torch.randn`` and ``torch.rand``: bit for bit, by
``mt_draws``' kernel where it applies (float32 on the CPU, at least 256 numbers, checked against torch at first use).
Under ``rng=philox`` (``mode``), a float32 draw takes one 63-bit key from the run's generator (``key``: so the draws
follow the seed, and a checkpoint's generator state resumes them) and fills the tensor from that key by Philox4x32-10
(Salmon et al., SC 2011: the counter-based generator of cuRAND, JAX and torch's CUDA draws) with Box-Muller for
normals (``philox.c`` gives the layout and the formulas). On a CPU a vectorised C kernel does it, one thread
(``bench/prng.py``, 2026-12-04): 2.4-2.5x torch's Mersenne-twister normals and 4.5-5.0x its uniforms for 10^5-10^6
numbers, 1.3x and 1.75x for 10^4 (a call's key and dispatch, about 5 us against torch's 1.2 us); the draws were 15-45%
of the compiled steps of BBB, Vadam, VOGN, noisy Adam, MC dropout and App. G's factorised family
(``bench/step_ab.py``'s draws column). ``philox4x32``, ``_normal_torch`` and ``_uniform_torch`` compute the same
numbers with torch's integer and float32 operations, bit for bit: on a GPU (dozens of small kernels a draw: there
torch's own generator, already Philox, is the fast one) and where no C compiler builds the kernel. Other dtypes draw
from torch under either setting.

The two settings draw different numbers from one seed: ``rng`` is part of a run's configuration (recorded, hashed when
not ``torch``), like ``compile``.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import math
from pathlib import Path

import torch

from bnnbench.core import mt_draws
from bnnbench.core.linalg import c_kernels

MODES = ("torch", "philox")
SOURCE = Path(__file__).with_name("philox.c")
_MODE = contextvars.ContextVar("bnnbench_rng", default="torch")

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
LANES = 16   # counters per block: block b's four words fill out[64 b + 16 w + lane]


@contextlib.contextmanager
def mode(name: str):
    """Draw with ``name`` (``MODES``) inside the block."""
    if name not in MODES:
        raise ValueError(f"rng={name!r}; valid: {', '.join(MODES)}")
    token = _MODE.set(name)
    try:
        yield
    finally:
        _MODE.reset(token)


def current() -> str:
    return _MODE.get()


def _philox(dtype) -> bool:
    return _MODE.get() == "philox" and (dtype or torch.get_default_dtype()) == torch.float32


def _size(size) -> tuple[int, ...]:
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)


def key(generator: torch.Generator | None, device=None) -> int:
    """One 63-bit key from ``generator`` (torch's default generator of ``device`` when None)."""
    dev = generator.device if generator is not None else device
    return int(torch.randint(0, 2 ** 63 - 1, (), generator=generator, device=dev))


def randn(*size, generator=None, device=None, dtype=None) -> torch.Tensor:
    """``torch.randn(*size, generator=, device=, dtype=)``; under ``rng=philox`` a float32 tensor of Philox normals."""
    size = _size(size)
    if not _philox(dtype):
        if mt_draws.applies(size, generator, device, dtype):
            return mt_draws.randn(size, generator)
        return torch.randn(size, generator=generator, device=device, dtype=dtype)
    return _draw(key(generator, device), size, device, normal=True)


def rand(*size, generator=None, device=None, dtype=None) -> torch.Tensor:
    """``torch.rand(*size, generator=, device=, dtype=)``; under ``rng=philox`` a float32 tensor of Philox uniforms
    in [0, 1)."""
    size = _size(size)
    if not _philox(dtype):
        if mt_draws.applies(size, generator, device, dtype):
            return mt_draws.rand(size, generator)
        return torch.rand(size, generator=generator, device=device, dtype=dtype)
    return _draw(key(generator, device), size, device, normal=False)


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The built kernel (``c_kernels.build``), or None (with a warning) where no C compiler builds it."""
    sig = ([ctypes.c_uint64, ctypes.c_void_p, ctypes.c_long], None)
    return c_kernels.build(SOURCE, "Philox draws", {"philox_normal": sig, "philox_uniform": sig},
                           instead="the same draws by torch's operations")


def normal(k: int, size, device=None) -> torch.Tensor:
    """Standard normal float32 draws of key ``k`` (``philox.c``'s layout), shaped ``size``."""
    return _draw(k, size, device, normal=True)


def uniform(k: int, size, device=None) -> torch.Tensor:
    """Uniform float32 draws in [0, 1) of key ``k``, shaped ``size``."""
    return _draw(k, size, device, normal=False)


def _draw(k: int, size, device, normal: bool) -> torch.Tensor:
    on_cpu = device is None or torch.device(device).type == "cpu"
    lib = _library() if on_cpu else None
    if lib is not None:
        out = torch.empty(size, dtype=torch.float32)
        (lib.philox_normal if normal else lib.philox_uniform)(k, out.data_ptr(), out.numel())
        return out
    return (_normal_torch if normal else _uniform_torch)(k, math.prod(size), device or "cpu").reshape(size)


# The same numbers by torch's operations: words held in int64, float32 steps one IEEE operation each (no fused
# multiply-adds), in philox.c's order.

MASK32 = 0xFFFFFFFF


def _mulhilo(m: int, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) words of m a for words a: through 16-bit halves of a (int64 products stay below 2^49)."""
    p_lo, p_hi = m * (a & 0xFFFF), m * (a >> 16)
    t = p_lo + ((p_hi & 0xFFFF) << 16)
    return (p_hi >> 16) + (t >> 32), t & MASK32


def philox4x32(c: list[torch.Tensor], k0: int, k1: int) -> list[torch.Tensor]:
    """Philox4x32-10 of the counter words ``c[0..3]`` (int64 tensors of 32-bit words) under the key words k0, k1."""
    for _ in range(10):
        hi0, lo0 = _mulhilo(M0, c[0])
        hi1, lo1 = _mulhilo(M1, c[2])
        c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
        k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    return c


def philox_words(k: int, counters: torch.Tensor) -> list[torch.Tensor]:
    """The four words of 64-bit ``counters`` (int64; c2 = c3 = 0) under the 64-bit key ``k``."""
    zero = torch.zeros_like(counters)
    return philox4x32([counters & MASK32, (counters >> 32) & MASK32, zero, zero], k & MASK32, (k >> 32) & MASK32)


def _words(k: int, n: int, device) -> list[torch.Tensor]:
    blocks = -(-n // (4 * LANES))
    return philox_words(k, torch.arange(blocks * LANES, device=device, dtype=torch.int64).reshape(blocks, LANES))


def _f32(x: float, device) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32, device=device)


def _unit_half_open(w: torch.Tensor) -> torch.Tensor:
    return (w >> 8).to(torch.float32) * _f32(2.0 ** -24, w.device)


def _unit_open(w: torch.Tensor) -> torch.Tensor:
    return w.to(torch.float32) * _f32(2.0 ** -32, w.device) + _f32(2.0 ** -33, w.device)


LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
            -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)


def _log(x: torch.Tensor) -> torch.Tensor:
    """philox.c's ``logv``: log x for x in (0, 1]."""
    dev = x.device
    b = x.view(torch.int32)
    e = ((b >> 23) & 0xFF) - 126
    m = ((b & 0x007FFFFF) | 0x3F000000).view(torch.float32)
    small = m < _f32(0.707106781186547524, dev)
    e = e - small.to(torch.int32)
    m = torch.where(small, m + m, m) - _f32(1.0, dev)
    z = m * m
    y = _f32(LOG_POLY[0], dev)
    for coef in LOG_POLY[1:]:
        y = y * m + _f32(coef, dev)
    y = y * m * z
    fe = e.to(torch.float32)
    y = y + fe * _f32(-2.12194440e-4, dev)
    y = y - _f32(0.5, dev) * z
    return m + y + fe * _f32(0.693359375, dev)


def _cos_sin(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """philox.c's ``cos_sin``: (cos, sin) of 2 pi v for v in [0, 1)."""
    dev = v.device
    x = v * _f32(4.0, dev)
    n = (x + _f32(0.5, dev)).to(torch.int32)
    r = (x - n.to(torch.float32)) * _f32(1.57079632679489662, dev)
    r2 = r * r
    sr = r + r * r2 * (_f32(-1.6666654611e-1, dev)
                       + r2 * (_f32(8.3321608736e-3, dev) + r2 * _f32(-1.9515295891e-4, dev)))
    cr = (_f32(1.0, dev) - _f32(0.5, dev) * r2
          + r2 * r2 * (_f32(4.166664568298827e-2, dev) + r2 * (_f32(-1.388731625493765e-3, dev)
                                                                + r2 * _f32(2.443315711809948e-5, dev))))
    odd, neg_c, neg_s = (n & 1) == 1, ((n + 1) & 2) == 2, (n & 2) == 2
    c, s = torch.where(odd, sr, cr), torch.where(odd, cr, sr)
    return torch.where(neg_c, -c, c), torch.where(neg_s, -s, s)


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root (IEEE's, as the kernel's): in float64, then rounded (exact for a float32
    argument). torch's float32 ``sqrt`` on this CPU is off by an ulp for about 0.7% of arguments."""
    return torch.sqrt(x.double()).float()


def _normal_torch(k: int, n: int, device) -> torch.Tensor:
    w = _words(k, n, device)
    slots = []
    for h in (0, 2):
        rad = _sqrt(_log(_unit_open(w[h])) * _f32(-2.0, device))
        c, s = _cos_sin(_unit_half_open(w[h + 1]))
        slots += [rad * c, rad * s]
    return torch.stack(slots, dim=1).reshape(-1)[:n]


def _uniform_torch(k: int, n: int, device) -> torch.Tensor:
    return torch.stack([_unit_half_open(x) for x in _words(k, n, device)], dim=1).reshape(-1)[:n]
