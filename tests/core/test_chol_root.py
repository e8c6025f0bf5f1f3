"""The SIMD Cholesky kernel (core/linalg/chol_root.c) against dense float64 LAPACK: ``C = L^-T`` for batches that fill
its 8 lanes partly and wholly, at the sizes noisy K-FAC hands it and around its 4-row blocks; the failing pivot of a
matrix that is not positive definite or not finite, in its lane only; and the compiled noisy K-FAC factor root that
calls it."""

import warnings

import pytest
import torch

from bnnbench.core.linalg import chol_root as cr

DT = torch.float64


def _spd(R, n, seed=0, dtype=DT):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(R, n, n + 3, generator=g, dtype=DT)
    return (A @ A.transpose(1, 2) + 0.1 * torch.eye(n, dtype=DT)).to(dtype)


def _reference(X):
    return torch.linalg.inv(torch.linalg.cholesky(X.double())).transpose(-1, -2)


@pytest.fixture(scope="module", autouse=True)
def _kernel():
    if not cr.available():
        pytest.skip("no C compiler built the kernel")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 9, 14, 50, 51, 101, cr.MAX_N])
@pytest.mark.parametrize("R", [1, 8, 19])
def test_the_root_is_the_transposed_inverse_of_lapacks_cholesky_factor(n, R):
    X = _spd(R, n, seed=n * 100 + R)
    C, info = cr.chol_root(X)
    ref = _reference(X)
    assert C.dtype == DT and C.shape == X.shape and info.shape == (R,) and info.eq(0).all()
    assert torch.equal(C.tril(-1), torch.zeros_like(C))
    assert (C - ref).abs().max() <= 1e-12 * ref.abs().max()
    assert torch.allclose(C @ C.transpose(-1, -2), torch.linalg.inv(X), rtol=1e-9, atol=1e-9 * ref.abs().max() ** 2)


def test_float32_in_float32_out_computed_in_float64_and_only_the_lower_triangle_read():
    X = _spd(11, 51, dtype=torch.float32)
    garbage = X + torch.triu(torch.full_like(X, 1e30), 1)   # above the diagonal: never read
    C, info = cr.chol_root(garbage)
    assert C.dtype == torch.float32 and info.eq(0).all()
    ref = _reference(X)   # of the same float32 entries, in float64: the kernel loses only the output's rounding
    scale = ref.abs().amax(dim=(1, 2), keepdim=True)
    assert ((C.double() - ref).abs() <= torch.finfo(torch.float32).eps / 2 * ref.abs() + 1e-12 * scale).all()


def test_a_matrix_not_positive_definite_or_not_finite_gives_its_failing_pivot_in_its_lane_only():
    X = _spd(10, 6)
    X[1] = X[1] - 2 * torch.eye(6, dtype=DT) * torch.linalg.eigvalsh(X[1])[-1]   # negative definite: pivot 1
    X[3, 2, 1] = X[3, 1, 2] = float("nan")                                       # NaN in row 2: pivot 2
    X[5, 4, 4] = float("inf")                                                    # inf on the diagonal: pivot 5
    X[7] = torch.ones(6, 6, dtype=DT)                                            # rank one: pivot 2
    C, info = cr.chol_root(X)
    assert info.tolist() == [0, 1, 0, 3, 0, 5, 0, 2, 0, 0]
    _, lapack_info = torch.linalg.cholesky_ex(X[[1, 3, 7]])
    assert info[[1, 3, 7]].tolist() == lapack_info.tolist()   # as LAPACK's, where LAPACK detects it
    good = info == 0
    assert (C[good] - _reference(X[good])).abs().max() <= 1e-12 * _reference(X[good]).abs().max()


def test_the_operator_and_inv_chol_t_compiled_call_the_kernel_up_to_its_size(monkeypatch):
    """Traced by dynamo (``fullgraph``: the kernel and its fallback operators, LAPACK's fallback a ``torch.cond``),
    the compiled factor root (``methods/kfac/kronecker.inv_chol_t``) calls the kernel for n <= MAX_N and LAPACK
    above."""
    from bnnbench.methods.kfac.kronecker import inv_chol_t
    calls = []
    kernel = cr.chol_root
    monkeypatch.setattr(cr, "chol_root", lambda X: calls.append(tuple(X.shape)) or kernel(X))
    compiled = torch.compile(inv_chol_t, fullgraph=True, dynamic=False, backend="eager")
    try:
        for n in (5, cr.MAX_N + 1):
            X = _spd(3, n)
            floor = torch.full((3,), 1e-3, dtype=DT)
            C = compiled(X, floor)
            assert (C - inv_chol_t(X, floor)).abs().max() <= 1e-12 * C.abs().max()
    finally:
        torch._dynamo.reset()
    assert calls == [(3, 5, 5)]


def test_without_a_compiler_the_operator_warns_and_uses_lapack(no_c_compiler):
    X = _spd(3, 9)
    with pytest.warns(RuntimeWarning, match="Cholesky kernel chol_root.c could not be built"):
        C, info = torch.ops.bnnbench.chol_root_simd(X)
    assert info.eq(0).all() and (C - _reference(X)).abs().max() <= 1e-12 * C.abs().max()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.ops.bnnbench.chol_root_simd(X)   # said once
    with pytest.raises(RuntimeError, match="not available"):
        cr.chol_root(X)
