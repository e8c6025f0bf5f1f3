"""The SIMD eigensolver kernel (core/linalg/top_eigpair.c) against dense float64 ``torch.linalg.eigh``: the largest
eigenvalue and its vector for batches that fill the kernel's 8 lanes partly and wholly, on the matrices SLANG hands it
(PSD Gram matrices with exact null directions, a zero first row when U = 0 at the first step) and on general symmetric
ones, down to n = 1."""

import warnings

import pytest
import torch

from bnnbench.core.linalg import top_eigpair
from bnnbench.core.linalg.low_rank import SIMD_MAX_N, SIMD_MAX_N_LANES, top_eigh

DT = torch.float64


def _gram(R, n, rank=None, P=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(R, P, n, generator=g, dtype=DT)
    if rank is not None:   # columns beyond `rank` combinations of the first `rank`: n - rank exact zero eigenvalues
        B[..., rank:] = B[..., :rank] @ torch.randn(rank, n - rank, generator=g, dtype=DT)
    return B.transpose(1, 2) @ B


def _symmetric(R, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(R, n, n, generator=g, dtype=DT)
    return A + A.transpose(1, 2)


def _zero_first(A):
    A = A.clone()
    A[:, 0, :] = A[:, :, 0] = 0
    return A


CASES = {
    "gram 41 (SLANG L = 1 at UCI scale)": _gram(19, 41),
    "gram 129 (SLANG L = 1 on the boards)": _gram(9, 129, P=200),
    "gram of rank 6": _gram(8, 20, rank=6),
    "zero first row and column": _zero_first(_gram(9, 17)),
    "indefinite": _symmetric(13, 12),
    "negative definite": -_gram(5, 9),
    "n = 2": _symmetric(3, 2),
    "n = 1": _symmetric(10, 1),
    "scaled by 1e-8": _gram(7, 30) * 1e-8,
}


@pytest.fixture(scope="module", autouse=True)
def _kernel():
    if not top_eigpair.available():
        pytest.skip("no C compiler built the kernel")


@pytest.mark.parametrize("case", list(CASES))
def test_the_largest_eigenpair_matches_dense_eigh(case):
    A = CASES[case]
    e, V = top_eigpair.top_eigpair(A)
    ref_e, ref_V = torch.linalg.eigh(A)
    scale = A.abs().amax(dim=(1, 2)).clamp_min(1e-300)
    assert e.shape == (len(A), 1) and V.shape == (*A.shape[:2], 1) and e.dtype == V.dtype == DT
    assert ((e[:, 0] - ref_e[:, -1]).abs() / scale).max() < 1e-13
    assert torch.allclose(V.norm(dim=1), torch.ones(len(A), 1, dtype=DT), atol=1e-14)
    assert ((A @ V - e[:, None] * V).abs().amax(dim=(1, 2)) / scale).max() < 1e-13   # A v = e v
    assert ((V[..., 0] * ref_V[..., -1]).sum(-1).abs() - 1).abs().max() < 1e-12      # the same line as eigh's


def test_float32_in_float32_out_and_leading_batch_shape():
    A = _gram(12, 41).reshape(3, 4, 41, 41)
    e, V = top_eigpair.top_eigpair(A.float())
    assert e.shape == (3, 4, 1) and V.shape == (3, 4, 41, 1) and e.dtype == V.dtype == torch.float32
    ref_e, ref_V = torch.linalg.eigh(A)
    assert torch.allclose(e[..., 0].double(), ref_e[..., -1], rtol=1e-6)
    assert ((V[..., 0].double() * ref_V[..., -1]).sum(-1).abs() - 1).abs().max() < 1e-6


def test_a_zero_matrix_gives_zero_and_a_unit_vector():
    e, V = top_eigpair.top_eigpair(torch.zeros(3, 5, 5, dtype=DT))
    assert (e == 0).all() and torch.equal(V[..., 0], torch.eye(5, dtype=DT)[0].expand(3, 5))


def test_a_non_finite_matrix_gives_nan_in_its_lane_only():
    """A diverged replica's Gram matrix: NaN (not a finite value) for it, the other lanes untouched."""
    A = _gram(10, 6)
    bad = A.clone()
    bad[3, 4, 2] = float("nan")
    bad[7, 5, 5] = float("inf")
    e, V = top_eigpair.top_eigpair(bad)
    ok = torch.ones(10, dtype=torch.bool)
    ok[[3, 7]] = False
    assert e[~ok].isnan().all() and V[~ok].isnan().all()
    assert torch.equal(e[ok], top_eigpair.top_eigpair(A)[0][ok])


def test_the_lower_triangle_is_read():
    A = _gram(4, 10)
    upper_garbage = A + torch.triu(torch.full_like(A, 7.0), diagonal=1)
    assert torch.equal(top_eigpair.top_eigpair(upper_garbage)[0], top_eigpair.top_eigpair(A)[0])


def test_top_eigh_simd_agrees_with_lapack_and_rejects_unknown_kernels():
    A = _gram(10, 41).float()
    e, V = top_eigh(A, 1, kernel="simd")
    e_l, V_l = top_eigh(A, 1)
    assert torch.allclose(e, e_l, rtol=1e-5)
    assert ((V * V_l).sum(1).abs() - 1).abs().max() < 1e-5
    with pytest.raises(ValueError, match="valid: lapack, simd"):
        top_eigh(A, 1, kernel="magma")


def test_top_eigh_simd_leaves_matrices_above_its_size_to_lapack(monkeypatch):
    """Above SIMD_MAX_N the kernel is slower than ?syevr (bench/top_eigpair.py) unless 8 or more matrices fill its
    lanes, and above SIMD_MAX_N_LANES in any case; SLANG's MNIST step has n = 801."""
    calls = []
    kernel = top_eigpair.top_eigpair
    monkeypatch.setattr(top_eigpair, "top_eigpair", lambda A: calls.append(tuple(A.shape)) or kernel(A))
    n = SIMD_MAX_N_LANES
    top_eigh(_gram(2, SIMD_MAX_N + 1).float(), 1, kernel="simd")
    top_eigh(_gram(7, n).float(), 1, kernel="simd")
    top_eigh(_gram(8, n + 1, P=200).float(), 1, kernel="simd")
    assert calls == []
    top_eigh(_gram(2, SIMD_MAX_N).float(), 1, kernel="simd")
    top_eigh(_gram(8, n, P=200).float(), 1, kernel="simd")
    top_eigh(_gram(8, n, P=200).reshape(2, 4, n, n).float(), 1, kernel="simd")   # 8 matrices in two batch axes
    assert calls == [(2, SIMD_MAX_N, SIMD_MAX_N), (8, n, n), (2, 4, n, n)]


def test_without_a_compiler_top_eigh_warns_and_uses_lapack(no_c_compiler):
    A = _gram(3, 9)
    with pytest.warns(RuntimeWarning, match="could not be built"):
        e, V = top_eigh(A, 1, kernel="simd")
    assert torch.allclose(e, top_eigh(A, 1)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        top_eigh(A, 1, kernel="simd")   # said once
    with pytest.raises(RuntimeError, match="not available"):
        top_eigpair.top_eigpair(A)
