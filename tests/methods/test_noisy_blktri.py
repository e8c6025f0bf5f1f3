"""Noisy K-FAC with the block-tridiagonal inverse Fisher (``noisy_kfac_blktri``) against dense linear algebra: the
covariance its draws have and the preconditioner of its mean update equal the inverse of the block-tridiagonal
Gaussian graphical model (Martens & Grosse 2015, Sec. 4.3) formed densely from the same Kronecker statistics (for two
layers, the inverse of the whole 2 x 2 block matrix); samples have that covariance; without cross-layer statistics it
is block-diagonal noisy K-FAC; its KL, its cross-layer statistics and its replica invariance."""

import dataclasses
import math

import pytest
import torch
from omegaconf import OmegaConf

from bnnbench.run.contract import check_method, slice_noise
from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.methods.kfac.kronecker import Kronecker
from bnnbench.methods.kfac.noisy import KFACState
from bnnbench.core.models import MLP

DT = torch.float64
N, LAM = 40, 2.0
CFG = dict(lr=0.01, kl_weight=1.0, damping_ex=0.0, train_samples=2, learn_noise=False, beta=0.1, T_stats=1, T_inv=1,
           factor_init=1.0, momentum=0.0)


def _method(sizes, **cfg):
    model = MLP(sizes)
    method = METHODS["noisy_kfac_blktri"](OmegaConf.create({**CFG, **cfg}), model, "gaussian")
    return model, method


def _problem(model, R=1):
    return Problem("gaussian", torch.full((R,), N), torch.full((R, model.n_params), LAM, dtype=DT),
                   noise_prec=torch.ones(R, dtype=DT), y_scale=torch.ones(R, dtype=DT))


def _dims(model):
    return [(d_in + 1, d_out) for _, _, d_in, d_out in model.slices]


def _with_statistics(method, model, g, cross: bool = True):
    """A state whose factors are the second moments of random rows of (a_1, ..., a_L) and (g_1, ..., g_L), each
    correlated across layers through shared latents (so the cross-layer blocks matter): jointly positive definite,
    as EMAs of the same rows are."""
    state = method.init(_problem(model), g)
    dims = _dims(model)
    rows = 50
    blocks = {}   # (factor, kind, l) -> tensor: factor 0 the a's (A), 1 the g's (S); kind "diag" or "cross"
    for k, which in enumerate((0, 1)):   # 0: a (A factors), 1: g (S factors)
        sizes = [d[which] for d in dims]
        latent = torch.randn(rows, 3, generator=g, dtype=DT)
        X = torch.cat([latent @ torch.randn(3, n, generator=g, dtype=DT) + 0.5 * torch.randn(rows, n, generator=g,
                                                                                               dtype=DT)
                       for n in sizes], 1)
        J = X.T @ X / rows
        off = [0] + list(torch.tensor(sizes).cumsum(0))
        for l in range(len(sizes)):
            blk = J[off[l]:off[l + 1], off[l]:off[l + 1]]
            blocks[k, "diag", l] = blk[None].clone()
            if l < len(sizes) - 1:
                x = J[off[l]:off[l + 1], off[l + 1]:off[l + 2]]
                blocks[k, "cross", l] = (x if cross else torch.zeros_like(x))[None].clone()
    L = len(dims)
    state = state.replace(
        layers=tuple(Kronecker(A=blocks[0, "diag", l], S=blocks[1, "diag", l]) for l in range(L)),
        cross=tuple(Kronecker(A=blocks[0, "cross", l], S=blocks[1, "cross", l]) for l in range(L - 1)))
    return method._refresh(state, covariance=True, inverses=True)


def _dense_blocks(state, model, gamma):
    """The Fisher's tridiagonal blocks in the flat [W; b] layout (vec(a g^T) = a (x) g): F_ll = A^g (x) G^g with the
    factored Tikhonov damping of eq. 13 (pi from the traces), F_{l,l+1} = A_{l,l+1} (x) G_{l,l+1}."""
    L = len(model.slices)
    diag, off = [], []
    for l in range(L):
        A, S = state.layers[l].A[0], state.layers[l].S[0]
        pi = math.sqrt((A.trace() / A.shape[0]) / (S.trace() / S.shape[0]))
        diag.append(torch.kron(A + pi * math.sqrt(gamma) * torch.eye(A.shape[0], dtype=DT),
                               S + math.sqrt(gamma) / pi * torch.eye(S.shape[0], dtype=DT)))
        if l < L - 1:
            off.append(torch.kron(state.cross[l].A[0], state.cross[l].S[0]))
    return diag, off


def _assemble(diag, off, far=None):
    sizes = [d.shape[0] for d in diag]
    o = [0] + list(torch.tensor(sizes).cumsum(0))
    F = torch.zeros(o[-1], o[-1], dtype=DT)
    for l, D in enumerate(diag):
        F[o[l]:o[l + 1], o[l]:o[l + 1]] = D
        if l < len(off):
            F[o[l]:o[l + 1], o[l + 1]:o[l + 2]] = off[l]
            F[o[l + 1]:o[l + 2], o[l]:o[l + 1]] = off[l].T
    return F, o


def _ggm_inverse(diag, off):
    """Xi^T Lambda Xi from the dense blocks: Psi_l = F_{l,l+1} F_{l+1,l+1}^-1, Sigma_{l|l+1} = F_ll - Psi F_{l+1,l+1}
    Psi^T, Lambda = diag(Sigma_{1|2}^-1, ..., F_LL^-1), Xi = I - (Psi on the block super-diagonal) (M&G Sec. 4.3)."""
    L = len(diag)
    F, o = _assemble(diag, off)
    Xi = torch.eye(o[-1], dtype=DT)
    Lam = torch.zeros_like(Xi)
    for l in range(L):
        if l < L - 1:
            Psi = off[l] @ torch.linalg.inv(diag[l + 1])
            Xi[o[l]:o[l + 1], o[l + 1]:o[l + 2]] = -Psi
            Sigma = diag[l] - Psi @ diag[l + 1] @ Psi.T
        else:
            Sigma = diag[l]
        Lam[o[l]:o[l + 1], o[l]:o[l + 1]] = torch.linalg.inv(Sigma)
    return Xi.T @ Lam @ Xi, F, o


def _covariance(method, model, state):
    """Cov of the flat [W; b] draws, read off the linear map eps -> w - mu of ``_weights``."""
    dims = _dims(model)
    k = sum(a * b for a, b in dims)
    E = torch.eye(k, dtype=DT)
    eps, at = [], 0
    for a, b in dims:
        eps.append(E[:, at:at + a * b].reshape(1, k, a, b))
        at += a * b
    hom = method._weights(state, eps)
    T = torch.cat([(h[0] - method._hom(state.mean, l)[0]).reshape(k, -1) for l, h in enumerate(hom)], 1).T
    return T @ T.T


def _preconditioner(method, model, state):
    """The mean update's F^-1 as a dense matrix: ``_precondition_all`` on the unit vectors."""
    dims = _dims(model)
    k = sum(a * b for a, b in dims)
    cols = []
    for j in range(k):
        v = torch.zeros(k, dtype=DT)
        v[j] = 1
        Vs, at = [], 0
        for a, b in dims:
            Vs.append(v[at:at + a * b].reshape(1, a, b))
            at += a * b
        cols.append(torch.cat([x[0].flatten() for x in method._precondition_all(state, Vs)]))
    return torch.stack(cols, 1)


def _close(X, Y, tol=1e-10):
    assert (X - Y).abs().max() <= tol * Y.abs().max(), float((X - Y).abs().max() / Y.abs().max())


@pytest.mark.parametrize("damping_ex", [0.0, 0.3])
def test_two_layers_covariance_and_preconditioner_are_the_inverse_of_the_whole_block_matrix(damping_ex):
    g = torch.Generator().manual_seed(0)
    model, method = _method([3, 4, 1], damping_ex=damping_ex)
    state = _with_statistics(method, model, g)
    g_in = LAM / N
    diag, off = _dense_blocks(state, model, g_in)
    F, _ = _assemble(diag, off)   # two layers: the GGM's F^ is the whole 2 x 2 block matrix
    _close(_covariance(method, model, state), (1.0 / N) * torch.linalg.inv(F))
    _close(torch.linalg.inv(_ggm_inverse(diag, off)[0]), F)   # the dense GGM of the reference agrees
    diag, off = _dense_blocks(state, model, g_in + damping_ex)
    _close(_preconditioner(method, model, state), torch.linalg.inv(_assemble(diag, off)[0]))


@pytest.mark.parametrize("sizes", [[3, 4, 2, 1], [2, 3, 4, 3, 1]])
def test_deeper_chains_are_the_dense_block_tridiagonal_gaussian_graphical_model(sizes):
    """Three and four layers: the covariance equals the dense Xi^T Lambda Xi, is block tridiagonal, and its inverse
    agrees with the Kronecker Fisher on the tridiagonal blocks (the two properties that define F^)."""
    g = torch.Generator().manual_seed(1)
    model, method = _method(sizes, damping_ex=0.1)
    state = _with_statistics(method, model, g)
    diag, off = _dense_blocks(state, model, LAM / N)
    ref, F, o = _ggm_inverse(diag, off)
    cov = _covariance(method, model, state)
    _close(cov, ref / N)
    P = torch.linalg.inv(cov / (1.0 / N))
    for i in range(len(diag)):
        for j in range(len(diag)):
            blk = (slice(o[i], o[i + 1]), slice(o[j], o[j + 1]))
            if abs(i - j) <= 1:
                _close(P[blk], F[blk], 1e-9)
            else:
                assert cov[blk].abs().max() <= 1e-14 * cov.abs().max()
    diag, off = _dense_blocks(state, model, LAM / N + 0.1)
    _close(_preconditioner(method, model, state), _ggm_inverse(diag, off)[0])


def test_samples_have_the_covariance_the_method_claims():
    """2e5 draws through ``sample_layers`` (the predictive's path): every entry of the empirical covariance about the
    known mean within 5 standard errors of the dense covariance, se_ij = sqrt((S_ii S_jj + S_ij^2) / n) (the variance of
    a Gaussian's product moment; 231 entries: a false alarm has probability below 231 x 6e-7). The block-diagonal
    covariance fails the same check: the test can tell the two apart."""
    g = torch.Generator().manual_seed(2)
    model, method = _method([3, 4, 1])
    state = _with_statistics(method, model, g)
    diag, off = _dense_blocks(state, model, LAM / N)
    F, o = _assemble(diag, off)
    Sigma = torch.linalg.inv(F) / N
    n = 200_000
    layers = method.sample_layers(state, n, g)
    w = torch.cat([torch.cat([W[0], b[0].unsqueeze(-2)], -2).flatten(-2) for W, b in layers], -1)
    mu = torch.cat([method._hom(state.mean, l)[0].flatten() for l in range(2)])
    d = w - mu
    emp = d.T @ d / n
    se = torch.sqrt((torch.outer(Sigma.diagonal(), Sigma.diagonal()) + Sigma ** 2) / n)
    assert ((emp - Sigma).abs() / se).max() < 5
    assert ((d.mean(0)).abs() / torch.sqrt(Sigma.diagonal() / n)).max() < 5
    block_diag = torch.block_diag(*[torch.linalg.inv(D) for D in diag]) / N
    assert ((emp - block_diag).abs() / se).max() > 20


def test_without_cross_layer_statistics_it_is_block_diagonal_noisy_kfac():
    g = torch.Generator().manual_seed(3)
    model, method = _method([3, 4, 2, 1], damping_ex=0.2)
    state = _with_statistics(method, model, g, cross=False)
    kfac = METHODS["noisy_kfac"](OmegaConf.create({**CFG, "damping_ex": 0.2}), model, "gaussian")
    ref = kfac._refresh(KFACState(**{f.name: getattr(state, f.name) for f in dataclasses.fields(KFACState)}),
                        covariance=True, inverses=True)
    _close(_covariance(method, model, state), _covariance(kfac, model, ref))
    _close(_preconditioner(method, model, state), _preconditioner(kfac, model, ref))
    assert torch.allclose(method.kl(state), kfac.kl(ref), rtol=1e-10)


def test_kl_is_the_dense_gaussian_kl():
    g = torch.Generator().manual_seed(4)
    model, method = _method([3, 4, 2, 1], kl_weight=0.7)
    state = _with_statistics(method, model, g)
    state = state.replace(mean=torch.randn(1, model.n_params, generator=g, dtype=DT))
    Sigma = _covariance(method, model, state)
    mu = torch.cat([method._hom(state.mean, l)[0].flatten() for l in range(3)])
    eta = 1 / LAM
    q = torch.distributions.MultivariateNormal(mu, Sigma)
    p = torch.distributions.MultivariateNormal(torch.zeros_like(mu), eta * torch.eye(len(mu), dtype=DT))
    assert torch.allclose(method.kl(state), 0.7 * torch.distributions.kl_divergence(q, p), rtol=1e-10)


def test_cross_layer_statistics_are_the_means_over_samples_and_examples():
    """One step with beta~ = 1: A_{l,l+1} = mean over (sample, example) of a_l a_{l+1}^T (homogeneous), G_{l,l+1} of
    the sampled targets' back-propagated gradients, the first layer's inputs shared by the samples."""
    g = torch.Generator().manual_seed(5)
    model, method = _method([3, 4, 2, 1], beta=1.0, train_samples=3)
    state = method.init(_problem(model), g)
    x, y = torch.randn(1, 5, 3, generator=g, dtype=DT), torch.randn(1, 5, generator=g, dtype=DT)
    batch = Batch(x, y, state.n_data)
    noise = method.noise(state, batch, g)
    new, _ = method.step(state, batch, noise)
    layers = method._layers_from_hom(method._weights(state, noise[0]))
    _, _, acts, _, ds = method._backprop_observed_and_sampled(state, layers, x, y, noise[1])
    hom = [torch.cat([a.expand(1, 3, 5, -1), torch.ones(1, 3, 5, 1, dtype=DT)], -1) for a in acts]
    for l in range(2):
        A = torch.einsum("rsbi,rsbj->rij", hom[l], hom[l + 1]) / 15
        G = torch.einsum("rsbi,rsbj->rij", ds[l], ds[l + 1]) / 15
        assert torch.allclose(new.cross[l].A, A) and torch.allclose(new.cross[l].S, G)
        assert torch.allclose(new.layers[l].A, torch.einsum("rsbi,rsbj->rij", hom[l], hom[l]) / 15)
    A0, A1, Ax0 = new.layers[0].A, new.layers[1].A, new.cross[0].A
    J = torch.cat([torch.cat([A0, Ax0], -1), torch.cat([Ax0.mT, A1], -1)], -2)
    assert torch.linalg.eigvalsh(J).min() > -1e-12   # the joint second moment: positive semi-definite


def test_the_method_contract_and_replica_invariance_of_a_deeper_chain():
    assert [(c, why) for c, why in check_method("noisy_kfac_blktri") if why is not None] == []
    g = torch.Generator().manual_seed(6)
    model, method = _method([3, 5, 4, 1], momentum=0.9, train_samples=3, learn_noise=True)
    R = 3
    state = method.init(Problem("gaussian", torch.tensor([40, 25, 33]), torch.full((R, model.n_params), 1.5, dtype=DT),
                                noise_prec=torch.ones(R, dtype=DT), y_scale=torch.ones(R, dtype=DT)), g)
    for _ in range(4):
        x, y = torch.randn(R, 6, 3, generator=g, dtype=DT), torch.randn(R, 6, generator=g, dtype=DT)
        batch = Batch(x, y, state.n_data)
        noise = method.noise(state, batch, g)
        new, _ = method.step(state, batch, noise)
        for r in range(R):
            alone, _ = method.step(state[r], Batch(x[r:r + 1], y[r:r + 1], batch.n_data[r:r + 1]),
                                   slice_noise(noise, r))
            alone = alone.tensors()
            for k, v in new.tensors().items():
                assert torch.allclose(v[r:r + 1], alone[k], rtol=1e-10, atol=1e-12), (r, k)
        state = new
    assert all(torch.isfinite(v).all() for v in state.tensors().values() if v.is_floating_point())
    assert (state.cross[0].A.abs().sum() > 0) and (state.cross[1].S.abs().sum() > 0)
