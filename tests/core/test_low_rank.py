"""Low-rank-plus-diagonal operations against dense linear algebra."""

import pytest
import torch

from bnnbench.core.linalg.low_rank import (fast_eig, fast_inverse, fast_sample, kl_low_rank_to_diag,
                                      logdet_precision, nystrom_eig, precision_diag_of_cov, top_eigh)
from bnnbench.core.linalg.per_example import (forward_cache, gradient_gram, gradient_t_times, gradient_times,
                                         layer_factors, materialise)
from bnnbench.core.models import MLP

DT = torch.float64


def _ud(R=3, P=7, L=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(R, P, L, generator=g, dtype=DT), torch.rand(R, P, generator=g, dtype=DT) + 0.2, g


def _dense(U, d):
    return U @ U.transpose(-1, -2) + torch.diag_embed(d)


def test_fast_inverse_matches_solve():
    U, d, g = _ud()
    v = torch.randn(3, 7, generator=g, dtype=DT)
    assert torch.allclose(fast_inverse(U, d, v), torch.linalg.solve(_dense(U, d), v.unsqueeze(-1))[..., 0])
    V = torch.randn(3, 7, 4, generator=g, dtype=DT)
    assert torch.allclose(fast_inverse(U, d, V), torch.linalg.solve(_dense(U, d), V))


@pytest.mark.parametrize("L", [1, 2])
@pytest.mark.parametrize("zero_U", [False, True])
def test_fast_sample_has_the_exact_covariance(zero_U, L):
    U, d, _ = _ud(L=L)
    if zero_U:
        U = torch.zeros_like(U)  # SLANG's initial state: mean field
    I = torch.eye(7, dtype=DT).expand(3, 7, 7)
    M = fast_sample(U, d, I).transpose(1, 2)  # z = M eps, so Cov z = M M^T
    assert torch.allclose(M @ M.transpose(1, 2), torch.linalg.inv(_dense(U, d)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lapacks_1x1_eigh_is_its_entry_and_one_exactly(dtype):
    """What ``fast_sample`` relies on to skip the call at L = 1 without moving a SLANG L = 1 record's digits."""
    g = torch.Generator().manual_seed(3)
    A = torch.rand(200, 1, 1, generator=g, dtype=DT) * 10.0 ** torch.randint(-30, 30, (200, 1, 1), generator=g)
    e, Q = torch.linalg.eigh(A.to(dtype))
    assert torch.equal(e, A.to(dtype)[..., 0]) and torch.equal(Q, torch.ones_like(Q))


def test_fast_sample_empirical_covariance():
    U, d, g = _ud(R=1)
    z = fast_sample(U, d, torch.randn(1, 400000, 7, generator=g, dtype=DT))[0]
    cov = torch.linalg.inv(_dense(U, d))[0]
    assert torch.allclose(torch.cov(z.T), cov, atol=0.02 * cov.diagonal().max().item())


@pytest.mark.parametrize("eig", [fast_eig, nystrom_eig])
def test_randomised_eig_matches_eigh(eig):
    g = torch.Generator().manual_seed(1)
    P, L = 40, 4
    Q, _ = torch.linalg.qr(torch.randn(2, P, P, generator=g, dtype=DT))
    spec = torch.cat([torch.tensor([50.0, 30.0, 20.0, 10.0], dtype=DT), 0.5 ** torch.arange(P - 4, dtype=DT)])
    A = Q @ torch.diag_embed(spec.expand(2, P)) @ Q.transpose(1, 2)
    e, V = eig(lambda Y: A @ Y, torch.randn(2, P, L + 2, generator=g, dtype=DT), L, n_iter=6)
    ref_e, ref_V = torch.linalg.eigh(A)
    assert torch.allclose(e, ref_e.flip(-1)[:, :L], rtol=1e-6)
    proj = (V.transpose(1, 2) @ ref_V.flip(-1)[:, :, :L]).abs()  # same subspace, vectors up to sign
    assert torch.allclose(proj.diagonal(dim1=1, dim2=2), torch.ones(2, L, dtype=DT), atol=1e-6)


@pytest.mark.parametrize("n_iter", [1, 4])
def test_nystrom_eig_exact_when_the_rank_fits_the_probes(n_iter):
    """An operator of rank <= k is recovered exactly by the Nystrom step (one product suffices), whatever n_iter."""
    g = torch.Generator().manual_seed(3)
    P, L, k = 30, 2, 4
    B = torch.randn(2, P, k, generator=g, dtype=DT)
    A = B @ B.transpose(1, 2)
    e, V = nystrom_eig(lambda Y: A @ Y, 2 * torch.rand(2, P, k, generator=g, dtype=DT) - 1, L, n_iter=n_iter)
    ref_e, ref_V = torch.linalg.eigh(A)
    assert torch.allclose(e, ref_e.flip(-1)[:, :L], rtol=1e-9)
    proj = (V.transpose(1, 2) @ ref_V.flip(-1)[:, :, :L]).abs()
    assert torch.allclose(proj.diagonal(dim1=1, dim2=2), torch.ones(2, L, dtype=DT), atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [1, 3, 9])
def test_top_eigh_matches_eigh(dtype, k):
    """LAPACK ?syevr's top-k against torch.linalg.eigh, on PSD Gram matrices of rank 6 < n = 9 (SLANG's Gram
    matrices have exact zero eigenvalues), in a [2, 3] batch; the matrix is rebuilt from the pairs for k = n."""
    g = torch.Generator().manual_seed(2)
    B = torch.randn(2, 3, 9, 6, generator=g, dtype=DT)
    A = (B @ B.transpose(-1, -2)).to(dtype)
    e, V = top_eigh(A, k)
    ref_e, ref_V = torch.linalg.eigh(A.double())
    ref_e, ref_V = ref_e.flip(-1)[..., :k], ref_V.flip(-1)[..., :k]
    assert e.shape == (2, 3, k) and V.shape == (2, 3, 9, k) and e.dtype == V.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    assert torch.allclose(e.double(), ref_e, atol=tol * ref_e.abs().max())
    top = min(k, 6)   # the null space has no preferred basis: compare the vectors of the nonzero eigenvalues
    proj = (V[..., :top].double().transpose(-1, -2) @ ref_V[..., :top]).abs()
    assert torch.allclose(proj.diagonal(dim1=-2, dim2=-1), torch.ones(2, 3, top, dtype=DT), atol=tol * 10)
    if k == 9:
        assert torch.allclose((V * e.unsqueeze(-2)) @ V.transpose(-1, -2), A, atol=tol * 10 * A.abs().max())


def test_low_rank_kl_logdet_and_diag_against_dense():
    U, d, g = _ud()
    prec = _dense(U, d)
    cov = torch.linalg.inv(prec)
    assert torch.allclose(precision_diag_of_cov(U, d), cov.diagonal(dim1=1, dim2=2))
    assert torch.allclose(logdet_precision(U, d), torch.logdet(prec))
    mean = torch.randn(3, 7, generator=g, dtype=DT)
    lam = torch.rand(3, 7, generator=g, dtype=DT) + 0.5
    ref = torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(mean, precision_matrix=prec),
        torch.distributions.MultivariateNormal(torch.zeros_like(mean), precision_matrix=torch.diag_embed(lam)))
    assert torch.allclose(kl_low_rank_to_diag(mean, U, d, lam), ref)


# [3, 5, 2]: a layer with d_in + 1 < d_out and one with few outputs; [6, 8, 7, 1]: d_in + 1 >= d_out, 7 k >= 16;
# [9, 4, 3]: a first layer with d_in + 1 >= d_out, whose input the samples share
@pytest.mark.parametrize("sizes", [[3, 5, 2], [6, 8, 7, 1], [9, 4, 3]])
def test_implicit_gradient_products_match_materialised(sizes):
    g = torch.Generator().manual_seed(2)
    model = MLP(sizes)
    theta = torch.randn(2, 3, model.n_params, generator=g, dtype=DT)
    layers = [(W.detach().requires_grad_(True), b.detach().requires_grad_(True)) for W, b in model.layers(theta)]
    x = torch.randn(2, 4, sizes[0], generator=g, dtype=DT)
    f, acts, zs = forward_cache(model, layers, x)
    gs = torch.autograd.grad((f ** 2).sum() + f.sum(), zs)
    G = materialise(model, acts, gs)  # [R, P, n]
    assert G.shape == (2, model.n_params, 12)
    # columns are the per-example gradients: check one against autograd on that example alone
    th = theta[1, 2].clone().requires_grad_(True)
    out = model.forward(th[None, None], x[1:2, 3:4])
    (gi,) = torch.autograd.grad((out ** 2).sum() + out.sum(), th)
    assert torch.allclose(G[1, :, 2 * 4 + 3], gi)
    V = torch.randn(2, model.n_params, 3, generator=g, dtype=DT)
    W = torch.randn(2, 12, 3, generator=g, dtype=DT)
    factors = layer_factors(acts, gs)
    assert torch.allclose(gradient_gram(factors), G.transpose(1, 2) @ G)
    assert torch.allclose(gradient_t_times(model, factors, V), G.transpose(1, 2) @ V)
    assert torch.allclose(gradient_times(model, factors, W), G @ W)
    acc = V.clone()
    assert gradient_times(model, factors, W, out=acc) is acc and torch.allclose(acc, V + G @ W)
