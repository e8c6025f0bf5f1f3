"""The ``rng`` setting's draws (bnnbench/core/prng.py, philox.c): Philox4x32-10 against the known-answer vectors of its
authors' Random123 library and a plain-integer loop, the C kernel against the torch operations bit for bit, Box-Muller
against float64, the draws' distribution, and ``rng=torch`` as torch's own draws."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from bnnbench.core import prng

MASK = 0xFFFFFFFF

# Random123's kat_vectors: philox4x32 10 rounds, counter (4 words), key (2 words) -> the four output words
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((MASK,) * 4, (MASK, MASK), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


def philox_loop(c, k):
    """Philox4x32-10 on Python integers, one round at a time as Salmon et al. (2011) define it."""
    c, (k0, k1) = list(c), k
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & MASK, (p0 >> 32) ^ c[3] ^ k1, p0 & MASK]
        k0, k1 = (k0 + 0x9E3779B9) & MASK, (k1 + 0xBB67AE85) & MASK
    return c


@pytest.mark.parametrize("counter, key, words", KAT)
def test_philox_gives_random123s_known_answers(counter, key, words):
    assert tuple(philox_loop(counter, key)) == words
    out = prng.philox4x32([torch.tensor([w]) for w in counter], *key)
    assert tuple(int(w) for w in out) == words


def test_the_counters_words_match_the_integer_loop_past_32_bits():
    k = 0x299F31D0A4093822
    counters = torch.tensor([0, 1, 2 ** 32 - 1, 2 ** 32, 2 ** 40 + 17, 2 ** 63 - 1])
    got = torch.stack(prng.philox_words(k, counters), dim=1).tolist()
    assert got == [philox_loop((c & MASK, c >> 32, 0, 0), (k & MASK, k >> 32)) for c in counters.tolist()]


def _reference(k: int, n: int, normal: bool) -> np.ndarray:
    """philox.c's layout and formulas in float64 (math.log, cos, sin), from the integer loop's words."""
    out = np.empty(-(-n // 64) * 64)
    for c in range(len(out) // 4):
        b, lane = divmod(c, 16)
        w = philox_loop((c, 0, 0, 0), (k & MASK, k >> 32))
        for h in (0, 2):
            if normal:
                u, v = w[h] * 2.0 ** -32 + 2.0 ** -33, (w[h + 1] >> 8) * 2.0 ** -24
                rad = math.sqrt(-2 * math.log(u))
                pair = rad * math.cos(2 * math.pi * v), rad * math.sin(2 * math.pi * v)
            else:
                pair = (w[h] >> 8) * 2.0 ** -24, (w[h + 1] >> 8) * 2.0 ** -24
            out[64 * b + 16 * h + lane], out[64 * b + 16 * (h + 1) + lane] = pair
    return out[:n]


@pytest.mark.parametrize("normal", [True, False])
def test_the_draws_are_the_formulas_of_the_counters_words(normal):
    k, n = 0x0123456789ABCDEF, 300   # not a whole number of blocks: the tail too
    got = (prng.normal if normal else prng.uniform)(k, (n,)).double().numpy()
    ref = _reference(k, n, normal)
    if normal:
        np.testing.assert_allclose(got, ref, rtol=0, atol=6e-7 * max(1.0, np.abs(ref).max()))
    else:
        np.testing.assert_array_equal(got, ref)   # multiples of 2^-24: exact in float32


@pytest.mark.parametrize("k", [0, 1, 0x0123456789ABCDEF, 2 ** 63 - 1])
def test_the_kernel_and_the_torch_operations_draw_the_same_bits(k):
    if prng._library() is None:
        pytest.skip("no C compiler here: the torch operations are the only way")
    for n in (1, 63, 64, 65, 255, 256, 257, 5000, 100_003):
        for normal in (True, False):
            kernel = prng._draw(k, (n,), "cpu", normal)
            ops = (prng._normal_torch if normal else prng._uniform_torch)(k, n, "cpu")
            assert torch.equal(kernel.view(torch.int32), ops.view(torch.int32)), (k, n, normal)


def test_without_a_c_compiler_the_same_draws_come_from_torchs_operations(no_c_compiler):
    with pytest.warns(RuntimeWarning, match="the same draws by torch's operations"):
        got = prng.normal(12345, (7, 9))
    assert prng._library() is None
    np.testing.assert_allclose(got.reshape(-1).double().numpy(), _reference(12345, 63, True), rtol=0, atol=4e-6)


def test_the_draws_are_standard_normal_and_uniform():
    z = prng.normal(2026, (1_000_000,)).double()
    assert abs(z.mean().item()) < 5e-3 and abs(z.var().item() - 1) < 5e-3       # 5 standard errors
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    u = prng.uniform(2026, (1_000_000,)).double()
    assert u.min() >= 0 and u.max() < 1
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-3
    a, b = prng.normal(1, (100_000,)).double(), prng.normal(2, (100_000,)).double()
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.015          # keys: independent streams


def test_rng_torch_is_torchs_draws_and_philox_takes_one_key_from_the_generator():
    g, h = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(prng.randn(3, 4, generator=g), torch.randn(3, 4, generator=h))
    assert torch.equal(prng.rand((2, 5), generator=g), torch.rand((2, 5), generator=h))
    with prng.mode("philox"):
        z = prng.randn(3, 4, generator=g)
        u = prng.rand(2, 5, generator=g)
        z64 = prng.randn(2, generator=g, dtype=torch.float64)    # not float32: torch's
    k1, k2 = prng.key(h), prng.key(h)
    assert torch.equal(z, prng.normal(k1, (3, 4))) and torch.equal(u, prng.uniform(k2, (2, 5)))
    assert z.dtype == torch.float32 and z.shape == (3, 4)
    assert torch.equal(z64, torch.randn(2, generator=h, dtype=torch.float64))
    assert torch.equal(torch.rand(3, generator=g), torch.rand(3, generator=h))    # the generator moved as said
    assert prng.current() == "torch"


def test_an_unknown_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="valid: torch, philox"):
        with prng.mode("mt"):
            pass
