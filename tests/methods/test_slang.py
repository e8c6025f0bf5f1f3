"""SLANG against the dense full-Gaussian empirical-Fisher natural-gradient update."""

import pytest
import torch
from omegaconf import OmegaConf

from bnnbench.core.linalg.per_example import per_example_grads
from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.core.models import MLP

DT = torch.float64


def _setup(rank, eig, per_example="fast", momentum=0.9, S=2):
    g = torch.Generator().manual_seed(0)
    model = MLP([2, 3, 1])  # P = 13
    cfg = dict(rank=rank, lr=0.1, beta=0.2, decay_lr=0.51, decay_beta=0.0, momentum=momentum, train_samples=S,
               s_init=1.0, init_mean="uniform_fan_in", eig=eig, n_iter=4, oversample=2, per_example=per_example)
    method = METHODS["slang"](OmegaConf.create(cfg), model, "gaussian")
    N, tau, lam = 25, 2.0, 0.8
    prob = Problem("gaussian", torch.tensor([N]), torch.full((1, model.n_params), lam, dtype=DT),
                   noise_prec=torch.tensor([tau], dtype=DT), y_scale=torch.ones(1, dtype=DT))
    state = method.init(prob, g)
    x = torch.randn(1, 4, 2, generator=g, dtype=DT)
    y = torch.randn(1, 4, generator=g, dtype=DT)
    return model, method, state, Batch(x, y, torch.tensor([N])), g, (N, tau, lam)


def _nll(tau):
    import math
    return lambda f, y: 0.5 * tau * (y - f[0]) ** 2 - 0.5 * math.log(tau) + 0.5 * math.log(2 * math.pi)


@pytest.mark.parametrize("eig, per_example", [("gram", "fast"), ("gram", "materialised"), ("randomized", "fast"),
                                                ("nystrom", "fast")])
def test_full_rank_slang_equals_full_gaussian_ef_update(eig, per_example):
    model, method, state, batch, g, (N, tau, lam) = _setup(rank=13, eig=eig, per_example=per_example)
    P = model.n_params
    mean = state.mean[0].clone()
    prec = torch.diag(state.d[0].clone())   # dense precision of q
    m = torch.zeros(P, dtype=DT)
    for t in range(1, 5):
        noise = method.noise(state, batch, g)
        theta = method.sample(state, noise[0])[0]          # the same samples for the reference
        state, _ = method.step(state, batch, noise)
        grads = torch.cat([per_example_grads(model, _nll(tau), theta[s], batch.x[0], batch.y[0])
                           for s in range(theta.shape[0])])  # [S*M, P]
        scale = N / grads.shape[0]
        g_hat = scale * grads.sum(0)
        G_hat = scale * grads.T @ grads
        alpha = 0.1 / (1 + t ** 0.51)
        prec = 0.8 * prec + 0.2 * (G_hat + lam * torch.eye(P, dtype=DT))
        m = 0.9 * m + 0.1 * g_hat
        mean = mean - alpha * torch.linalg.solve(prec, m / (1 - 0.9 ** t) + lam * mean)
        U, d = state.U[0], state.d[0]
        assert torch.allclose(U @ U.T + torch.diag(d), prec, rtol=1e-8, atol=1e-8)
        assert torch.allclose(state.mean[0], mean, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("S", [2, 4])  # P = 13 > L + MS = 10: Gram route; 13 <= 18: dense P x P route
def test_low_rank_keeps_top_eigenvalues_and_the_exact_diagonal(S):
    """With L < D the precision's diagonal is still exact (eqs. 8-10) and U U^T holds the top-L part."""
    model, method, state, batch, g, (N, tau, lam) = _setup(rank=2, eig="gram", momentum=0.0, S=S)
    for t in range(1, 4):
        noise = method.noise(state, batch, g)
        theta = method.sample(state, noise[0])[0]
        U_old, d_old = state.U[0], state.d[0]
        state, _ = method.step(state, batch, noise)
        grads = torch.cat([per_example_grads(model, _nll(tau), theta[s], batch.x[0], batch.y[0]) for s in range(S)])
        G_hat = N / grads.shape[0] * grads.T @ grads
        target = 0.8 * U_old @ U_old.T + 0.2 * G_hat
        U, d = state.U[0], state.d[0]
        e = torch.linalg.eigvalsh(target).flip(0)
        assert torch.allclose(torch.linalg.eigvalsh(U @ U.T).flip(0)[:2], e[:2], rtol=1e-8)
        full_diag = 0.8 * d_old + 0.2 * lam + target.diagonal()
        assert torch.allclose((U * U).sum(1) + d, full_diag, rtol=1e-8)


@pytest.mark.parametrize("rank, eig", [(8, "gram"), (8, "randomized"), (8, "nystrom"), (2, "gram"),
                                       (2, "randomized"), (2, "nystrom")])
def test_logistic_regression_against_the_dense_ef_update(rank, eig):
    """A linear model with a Bernoulli likelihood, where the S M per-example gradients are collapsed to M columns
    (``collapse_samples``): full rank equals the dense EF update; rank 2 (P = 8 > L + M: the Gram route) keeps the
    top two eigenvalues of the dense (1 - beta) U U^T + beta G_hat and the exact diagonal."""
    g = torch.Generator().manual_seed(1)
    model, S, N, lam = MLP([7, 1]), 3, 30, 0.7
    P = model.n_params
    cfg = dict(rank=rank, lr=0.1, beta=0.2, decay_lr=0.0, decay_beta=0.0, momentum=0.0, train_samples=S, s_init=1.0,
               init_mean="zero", eig=eig, n_iter=30, oversample=P - rank)
    method = METHODS["slang"](OmegaConf.create(cfg), model, "bernoulli")
    state = method.init(Problem("bernoulli", torch.tensor([N]), torch.full((1, P), lam, dtype=DT)), g)
    batch = Batch(torch.randn(1, 4, 7, generator=g, dtype=DT), (torch.rand(1, 4, generator=g) < 0.5).to(DT),
                  torch.tensor([N]))
    bce = lambda f, y: torch.nn.functional.binary_cross_entropy_with_logits(f[0], y)  # noqa: E731
    for t in range(3):
        noise = method.noise(state, batch, g)
        theta = method.sample(state, noise[0])[0]
        U_old, d_old, mean = state.U[0], state.d[0], state.mean[0]
        state, _ = method.step(state, batch, noise)
        grads = torch.cat([per_example_grads(model, bce, theta[s], batch.x[0], batch.y[0]) for s in range(S)])
        G_hat = N / grads.shape[0] * grads.T @ grads
        target = 0.8 * U_old @ U_old.T + 0.2 * G_hat
        U, d = state.U[0], state.d[0]
        assert torch.allclose((U * U).sum(1) + d, 0.8 * d_old + 0.2 * lam + target.diagonal(), rtol=1e-8)
        if rank == P:
            prec = U @ U.T + torch.diag(d)
            step = torch.linalg.solve(prec, N / grads.shape[0] * grads.sum(0) + lam * mean)
            assert torch.allclose(state.mean[0], mean - 0.1 * step, rtol=1e-8, atol=1e-10)
        e = torch.linalg.eigvalsh(target).flip(0)[:rank]
        assert torch.allclose(torch.linalg.eigvalsh(U @ U.T).flip(0)[:rank], e, rtol=1e-6)


@pytest.mark.parametrize("eig, M", [("gram", 4), ("gram", 16), ("randomized", 4), ("nystrom", 4)])
def test_eigenpairs_are_kept_relative_to_the_largest_at_any_scale(eig, M):
    """Features scaled by 1e-4 and prior precision 1e-9 (49-dimensional logistic regression, L = 3): the third
    eigenvalue of (1 - beta) U U^T + beta G_hat is below 1e-6 but far above float64's resolution of the largest. The
    first step keeps the top three and its mean step equals the exact top-3 update
    (M = 16: 48 per-example gradients, the dense P x P route; M = 4: the Gram route)."""
    g = torch.Generator().manual_seed(3)
    model, S, N, lam, L = MLP([48, 1]), 3, 50, 1e-9, 3
    P = model.n_params
    cfg = dict(rank=L, lr=0.1, beta=0.2, decay_lr=0.0, decay_beta=0.0, momentum=0.0, train_samples=S, s_init=1e-9,
               init_mean="zero", eig=eig, n_iter=30, oversample=P - L)
    method = METHODS["slang"](OmegaConf.create(cfg), model, "bernoulli")
    state = method.init(Problem("bernoulli", torch.tensor([N]), torch.full((1, P), lam, dtype=DT)), g)
    batch = Batch(1e-4 * torch.randn(1, M, 48, generator=g, dtype=DT),
                  (torch.rand(1, M, generator=g) < 0.5).to(DT), torch.tensor([N]))
    bce = lambda f, y: torch.nn.functional.binary_cross_entropy_with_logits(f[0], y)  # noqa: E731
    noise = method.noise(state, batch, g)
    theta = method.sample(state, noise[0])[0]
    d_old, mean = state.d[0], state.mean[0]
    new, _ = method.step(state, batch, noise)
    grads = torch.cat([per_example_grads(model, bce, theta[s], batch.x[0], batch.y[0]) for s in range(S)])
    G_hat = N / grads.shape[0] * grads.T @ grads
    target = 0.2 * G_hat                                     # U = 0 at the start
    e, V = torch.linalg.eigh(target)
    e, V = e.flip(0)[:L], V.flip(1)[:, :L]
    assert e[-1] < 1e-6 < e[0]   # the scale of the issue: the bias's eigenvalue is large, the third below 1e-6
    U_exact = V * e.sqrt()
    d_exact = 0.8 * d_old + 0.2 * lam + target.diagonal() - (U_exact ** 2).sum(1)
    g_hat = N / grads.shape[0] * grads.sum(0)
    prec = U_exact @ U_exact.T + torch.diag(d_exact)
    step = torch.linalg.solve(prec, g_hat + lam * mean)
    U = new.U[0]
    assert torch.allclose(torch.linalg.eigvalsh(U @ U.T).flip(0)[:L], e, rtol=1e-6)
    # a solve with this precision is exact to its condition number times the unit roundoff (kappa ~ 5e8 here, so
    # ~1e-7; both sides have such errors, and which way they round depends on the CPU's BLAS kernels): 100 kappa eps.
    # Dropping the third eigenpair moves the step by O(1) relative in its direction
    ev = torch.linalg.eigvalsh(prec)
    rtol = 100 * float(ev[-1] / ev[0]) * torch.finfo(DT).eps
    assert rtol < 1e-4
    assert torch.allclose(new.mean[0], mean - 0.1 * step, rtol=rtol, atol=0)


@pytest.mark.slow   # a compilation per case (15-25 s)
@pytest.mark.parametrize("settings", [{"eig": "randomized"}, {"eig": "nystrom"}, {"per_example": "materialised"},
                                      {"rank": 3, "momentum": 0.0}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_step_equals_the_eager_step_for_each_eigensolver(settings, dtype):
    """``compile=true`` (SLANG.compiled_step: the per-example gradients in closed form, the CPU's LAPACK eigensolver
    eager between the compiled parts): three steps equal the eager ones to float rounding (the contract's check,
    U through U U^T: its columns are eigenvectors, signs free) on the randomised and Nystrom eigensolvers, with
    materialised per-example gradients and at rank 3 (the default settings: tests/run/test_contract.py). Not at a
    rank near the parameter count (30 of 37 on this net): d's clamp of (old diagonal - |U_new|^2), two nearly equal
    numbers, then moves by 5e-5 relative in float32."""
    from bnnbench.run.contract import check_compiled
    try:
        assert check_compiled("slang", dtype, settings=settings) is None
    finally:
        torch._dynamo.reset()
