"""The fused per-example outer-product kernel (``core/linalg/outer_times``) against the materialised per-example
gradients in float64 (``per_example.materialise``, itself checked against autograd on single examples in
test_low_rank.py)."""

import pytest
import torch

from bnnbench.core.linalg import outer_times
from bnnbench.core.linalg.per_example import forward_cache, materialise
from bnnbench.core.models.mlp import MLP

needs_kernel = pytest.mark.skipif(not outer_times.available(), reason="no C compiler builds the kernel here")

# (sizes, R, S, M, k): SLANG's UCI net at a few rows and at whole 16 x 16 blocks of the transposes (the first layer
# shared by the samples, a last layer of one unit);
# one sample (nothing shared); more layers, rows between whole vectors of 16, k above a register block's 4 units;
# a first layer wider than its output (d_in + 1 >= d_out); the shared first layer's fused path (k = 3, S = 2) with its
# rows in one group of 2 or 3 and in groups of 5, 4, 4 (an odd number of units, a last layer of two)
CASES = [([8, 50, 1], 3, 2, 10, 3), ([16, 50, 1], 2, 2, 40, 3), ([4, 6, 3], 2, 1, 16, 2), ([5, 20, 7, 2], 2, 3, 37, 5),
         ([9, 4, 1], 4, 2, 1, 3), ([1, 5, 1], 2, 2, 17, 3), ([2, 6, 1], 2, 2, 20, 3), ([12, 7, 2], 2, 2, 33, 3)]


def _factors(sizes, R, S, M, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = MLP(sizes)
    theta = torch.randn(R, S, model.n_params, generator=g, dtype=torch.float64)
    x = torch.randn(R, M, sizes[0], generator=g, dtype=torch.float64)
    layers = [(W.to(dtype).requires_grad_(True), b.to(dtype).requires_grad_(True)) for W, b in model.layers(theta)]
    f, acts, zs = forward_cache(model, layers, x.to(dtype))
    gs = torch.autograd.grad((f ** 2).sum() + f.sum(), zs)
    return model, [a.detach() for a in acts], gs


@needs_kernel
@pytest.mark.parametrize("sizes, R, S, M, k", CASES)
def test_product_matches_materialised_gradients_in_float64(sizes, R, S, M, k):
    model, acts64, gs64 = _factors(sizes, R, S, M, torch.float64)
    G = materialise(model, acts64, gs64)                                   # [R, P, S M]
    g = torch.Generator().manual_seed(1)
    Y = torch.randn(R, model.n_params, k, generator=g, dtype=torch.float64)
    c2 = torch.rand(R, generator=g, dtype=torch.float64) + 0.5
    expected = c2[:, None, None] * (G @ (G.transpose(1, 2) @ Y))
    _, acts, gs = _factors(sizes, R, S, M, torch.float32)
    packed, layers, S_, M_ = outer_times.pack(acts, gs)
    assert (S_, M_) == (S, M)
    assert layers[2] == int(S > 1)   # the first layer's inputs are the samples' shared data (stride 0)
    out = outer_times.times(packed, layers, S, M, Y.float(), c2.float())
    assert out.shape == Y.shape and out.dtype == torch.float32
    assert (out.double() - expected).abs().max() <= 2e-5 * expected.abs().max()
    # one replica alone: another replica's factors do not leak into it
    r = R - 1
    alone, *_ = outer_times.pack([a[r:r + 1] for a in acts], [gl[r:r + 1] for gl in gs])
    alone = outer_times.times(alone, layers, S, M, Y[r:r + 1].float(), c2[r:r + 1].float())
    assert torch.allclose(alone[0], out[r], rtol=0, atol=1e-6 * float(out.abs().max()))


@needs_kernel
def test_inputs_read_through_their_strides():
    """A first layer's inputs held once per sample (nothing shared) and gradients laid out examples-first give the
    same product: the kernel reads every input through its strides."""
    model, acts, gs = _factors([5, 20, 7, 2], 2, 3, 21, torch.float32)
    Y, c2 = torch.randn(2, model.n_params, 4), torch.rand(2) + 0.5
    packed, layers, S, M = outer_times.pack(acts, gs)
    out = outer_times.times(packed, layers, S, M, Y, c2)
    acts2 = [acts[0].contiguous(), *acts[1:]]
    gs2 = [g.transpose(1, 2).contiguous().transpose(1, 2) for g in gs]
    packed2, layers2, _, _ = outer_times.pack(acts2, gs2)
    assert layers2[2] == 0 and layers[2] == 1
    out2 = outer_times.times(packed2, layers2, S, M, Y, c2)
    assert torch.allclose(out2, out, rtol=0, atol=1e-6 * float(out.abs().max()))


@needs_kernel
def test_factors_that_do_not_tile_y_are_refused():
    model, acts, gs = _factors([4, 6, 3], 2, 2, 5, torch.float32)
    packed, layers, S, M = outer_times.pack(acts, gs)
    with pytest.raises(ValueError, match="do not tile"):
        outer_times.times(packed, layers, S, M, torch.randn(2, model.n_params + 1, 3), torch.ones(2))


@needs_kernel
def test_the_operator_passes_torchs_operator_checks():
    model, acts, gs = _factors([5, 7, 2], 2, 2, 9, torch.float32)
    layers, S, M = outer_times.layout(acts, gs)
    checks = ("test_schema", "test_faketensor", "test_aot_dispatch_static")
    torch.library.opcheck(outer_times._pack, (list(acts), list(gs), layers, S, M), test_utils=checks)
    packed = outer_times._pack(list(acts), list(gs), layers, S, M)
    torch.library.opcheck(outer_times.times, (packed, layers, S, M, torch.randn(2, model.n_params, 3), torch.ones(2)),
                          test_utils=checks)


def test_without_a_compiler_the_kernel_is_unavailable_and_says_what_runs_instead(no_c_compiler):
    with pytest.warns(RuntimeWarning, match="outer_times.c could not be built .*torch's products used instead"):
        assert not outer_times.available()


def _dense_range(A, probes, n_iter):
    """``low_rank.nystrom_range`` with the operator a dense float64 matrix ``A [R, P, P]`` (LAPACK's QR)."""
    from bnnbench.core.linalg.low_rank import nystrom_range
    return nystrom_range(lambda Y: A @ Y, probes, n_iter)


# (sizes, R, S, M, L, n_iter): SLANG Table 2's large sets' net (shared first layer, whole and partial blocks of 16
# rows), a rank above 1, one sample, a deeper net, n_iter = 1 (no power step: Q is the probes themselves), and k = 9
# probes (above add_low_rank's flat blocks: U^T Y by partial sums)
NYSTROM_CASES = [([16, 50, 1], 3, 2, 40, 1, 4), ([8, 50, 1], 2, 2, 10, 2, 4), ([4, 6, 3], 2, 1, 16, 1, 3),
                 ([5, 20, 7, 2], 2, 3, 37, 3, 4), ([9, 4, 1], 2, 2, 5, 1, 1), ([4, 6, 3], 2, 2, 10, 7, 3)]


@needs_kernel
@pytest.mark.parametrize("sizes, R, S, M, L, n_iter", NYSTROM_CASES)
def test_nystrom_subspace_matches_the_dense_operators(sizes, R, S, M, L, n_iter):
    """``nystrom_range`` of ``a2 U U^T + c2 G G^T`` equals ``low_rank.nystrom_range`` run on the operator formed as a
    dense float64 matrix (G materialised): Q with torch.linalg.qr's column signs, E and the shift nu; and so do the
    eigenpairs (``nystrom_top``) to float rounding."""
    from bnnbench.core.linalg.low_rank import nystrom_top
    model, acts64, gs64 = _factors(sizes, R, S, M, torch.float64)
    G = materialise(model, acts64, gs64)
    g = torch.Generator().manual_seed(2)
    P, k = model.n_params, L + 2
    U = 0.3 * torch.randn(R, P, L, generator=g, dtype=torch.float64)
    a2, c2 = torch.rand(R, generator=g, dtype=torch.float64), torch.rand(R, generator=g, dtype=torch.float64) + 0.5
    probes = 2 * torch.rand(R, P, k, generator=g, dtype=torch.float64) - 1
    A = a2[:, None, None] * (U @ U.transpose(1, 2)) + c2[:, None, None] * (G @ G.transpose(1, 2))
    Q0, E0, nu0 = _dense_range(A, probes, n_iter)
    _, acts, gs = _factors(sizes, R, S, M, torch.float32)
    Q, E, nu = outer_times.nystrom_range(acts, gs, U.float(), a2.float(), c2.float(), probes.float(), n_iter)
    assert Q.shape == E.shape == probes.shape and nu.shape == (R, 1, 1) and Q.dtype == torch.float32
    assert (Q.double() - Q0).abs().max() <= 1e-4
    assert (E.double() - E0).abs().max() <= 1e-5 * E0.abs().max()
    assert torch.allclose(nu.double(), nu0, rtol=1e-5, atol=0)
    e0, V0 = nystrom_top(Q0, E0, nu0, L)
    e, V = nystrom_top(Q, E, nu, L)
    assert torch.allclose(e.double(), e0, rtol=1e-4, atol=1e-6 * float(e0.abs().max()))
    VVt, VVt0 = V @ V.transpose(1, 2), V0 @ V0.transpose(1, 2)
    assert (VVt.double() - VVt0).abs().max() <= 1e-4


@needs_kernel
def test_nystrom_of_a_null_operator_takes_the_identitys_columns_as_lapack():
    """Zero gradients and U = 0: every Householder reflection is the identity (tau = 0), so Q = I[:, :k] as LAPACK's
    QR of a zero matrix gives, E = nu Q = 0."""
    model, acts, gs = _factors([4, 6, 1], 2, 2, 5, torch.float32)
    gs = [torch.zeros_like(gl) for gl in gs]
    P = model.n_params
    probes = torch.rand(2, P, 3)
    Q, E, nu = outer_times.nystrom_range(acts, gs, torch.zeros(2, P, 1), torch.ones(2), torch.ones(2), probes, 4)
    assert torch.equal(Q, torch.linalg.qr(torch.zeros(2, P, 3))[0])
    assert torch.equal(Q, torch.eye(P, 3).expand(2, P, 3))
    assert not E.any() and not nu.any()


@needs_kernel
def test_the_nystrom_operator_passes_torchs_operator_checks():
    model, acts, gs = _factors([5, 7, 2], 2, 2, 9, torch.float32)
    layers, S, M = outer_times.layout(acts, gs)
    P = model.n_params
    args = (list(acts), list(gs), layers, S, M, torch.randn(2, P, 1), torch.rand(2), torch.rand(2),
            torch.rand(2, P, 3), 4)
    torch.library.opcheck(outer_times._nystrom, args,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
