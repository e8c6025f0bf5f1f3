"""``core/mt_draws``: torch's CPU draws bit for bit (``torch.randn`` / ``torch.rand`` of float32 from a generator),
and the generator left where torch leaves it, so ``rng=torch``'s records stand."""

import platform
import shutil
import subprocess

import numpy as np
import pytest
import torch

from bnnbench.core import mt_draws, prng

x86 = platform.machine() in ("x86_64", "AMD64")
SIZES = [16, 17, 31, 255, 256, 257, 623, 624, 625, 1000, 1248, 4099, 100_003, (20, 4, 751), (7, 33, 5)]


def _bits(t):
    return t.contiguous().view(torch.int32)


@pytest.mark.skipif(not x86, reason="the kernel reproduces torch's x86-64 CPU draws")
def test_the_kernel_is_checked_and_used_here():
    assert mt_draws.available()
    assert mt_draws.applies((1000,), torch.Generator(), None, None)
    assert mt_draws.applies((16, 16), None, "cpu", torch.float32)
    assert not mt_draws.applies((255,), None, None, None)                  # below MIN_N: torch's call
    assert not mt_draws.applies((1000,), None, None, torch.float64)
    if torch.cuda.is_available():
        assert not mt_draws.applies((1000,), torch.Generator("cuda"), "cuda", None)


@pytest.mark.parametrize("normal", [True, False])
def test_draws_are_torchs_bits_and_leave_the_generator_as_torch_does(normal):
    """From the same seed, prng's draws under rng=torch and torch's own, in turn over sizes across the kernel's
    threshold, the 16-block tail rule and the twister's 624-word blocks: the same bits, the same generator state
    after each, and torch's next draws the same."""
    ours, theirs = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    draw, ref = (prng.randn, torch.randn) if normal else (prng.rand, torch.rand)
    for size in SIZES * 2:
        size = size if isinstance(size, tuple) else (size,)
        a, b = draw(*size, generator=ours), ref(*size, generator=theirs)
        assert a.shape == b.shape and a.dtype == b.dtype == torch.float32
        assert torch.equal(_bits(a), _bits(b)), size
        assert torch.equal(ours.get_state(), theirs.get_state()), size
    assert torch.equal(torch.randn(5, generator=ours), torch.randn(5, generator=theirs))


def test_the_default_generator_is_drawn_from_and_advanced_like_torch():
    torch.manual_seed(3)
    a = prng.randn(2000)
    b = prng.rand(300, 2)
    torch.manual_seed(3)
    assert torch.equal(_bits(a), _bits(torch.randn(2000))) and torch.equal(_bits(b), _bits(torch.rand(300, 2)))
    torch.manual_seed(3)
    prng.randn(2000), prng.rand(300, 2)
    after = torch.randn(40)
    torch.manual_seed(3)
    torch.randn(2000), torch.rand(300, 2)
    assert torch.equal(after, torch.randn(40))


def test_normals_are_the_box_muller_of_the_uniforms_in_float64():
    """The normals against their definition: n uniforms u from the same state, then per block of 16 the pairs
    (j, j + 8): sqrt(-2 log(1 - u_j)) (cos, sin)(2 pi u_{j+8}), in float64, within float32's polynomial error."""
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    n = 4096
    z = prng.randn(n, generator=g1).double().numpy()
    u = torch.rand(n, generator=g2).double().numpy().reshape(-1, 2, 8)
    r = np.sqrt(-2 * np.log(1 - u[:, 0]))
    ref = np.stack([r * np.cos(2 * np.pi * u[:, 1]), r * np.sin(2 * np.pi * u[:, 1])], 1).reshape(-1)
    np.testing.assert_allclose(z, ref, rtol=2e-6, atol=2e-6)


def test_where_the_check_fails_torch_draws(monkeypatch):
    monkeypatch.setattr(mt_draws, "available", lambda: False)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert not mt_draws.applies((1000,), g1, None, None)
    assert torch.equal(prng.randn(1000, generator=g1), torch.randn(1000, generator=g2))


def test_a_kernel_that_draws_otherwise_is_refused_with_a_warning(monkeypatch):
    """``available`` compares with torch: a kernel off by one bit in one number is not used."""
    import ctypes
    lib = mt_draws._library()
    if lib is None:
        pytest.skip("no C compiler")

    class OffByOne:
        def __init__(self, fn):
            self.fn = fn

        def __call__(self, state, out, n):
            self.fn(state, out, n)
            ctypes.c_int32.from_address(out + 4 * (n // 2)).value ^= 1

    class Lib:
        mt_normal, mt_uniform = OffByOne(lib.mt_normal), OffByOne(lib.mt_uniform)
    mt_draws.available.cache_clear()
    monkeypatch.setattr(mt_draws, "_library", lambda: Lib)
    try:
        with pytest.warns(RuntimeWarning, match="does not reproduce"):
            assert not mt_draws.available()
    finally:
        mt_draws.available.cache_clear()


@pytest.mark.skipif(not (x86 and shutil.which("cc")), reason="needs a C compiler on x86-64")
def test_the_portable_form_draws_the_same_bits(tmp_path):
    """Built without AVX2 and FMA (``-march=x86-64``), the kernel's scalar Box-Muller (``fmaf`` where the wheel
    fuses) draws the same bits as its vector form and torch."""
    import ctypes
    so = tmp_path / "mt_draws_portable.so"
    subprocess.run(["cc", "-O2", "-march=x86-64", "-std=c99", "-shared", "-fPIC", "-o", str(so),
                    str(mt_draws.SOURCE), "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    lib.mt_normal.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    g1, g2 = torch.Generator().manual_seed(6), torch.Generator().manual_seed(6)
    for n in (16, 17, 1000, 100_003):
        state = g1.get_state()
        out = torch.empty(n)
        lib.mt_normal(state.data_ptr(), out.data_ptr(), n)
        g1.set_state(state)
        assert torch.equal(_bits(out), _bits(torch.randn(n, generator=g2))), n
