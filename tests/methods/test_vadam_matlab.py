"""The logistic-regression Vadam and VOGN of Khan et al.'s MATLAB code (Vadam Figure 2) against a
line-by-line numpy transcription of ``my_methods.m`` (dense matrices, loops over examples)."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.core.models import MLP

DT = torch.float64


def _problem(name, cfg, D=4, M=5, N=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = MLP([D, 1])
    method = METHODS[name](OmegaConf.create(cfg), model, "bernoulli")
    lam = torch.rand(1, model.n_params, generator=g, dtype=DT) + 0.5
    state = method.init(Problem("bernoulli", torch.full((1,), N), lam), g)
    return method, state, g


def _minibatch(g, M, D, N):
    x = torch.randn(1, M, D, generator=g, dtype=DT)
    y = (torch.rand(1, M, generator=g, dtype=DT) < 0.5).to(DT)
    return Batch(x, y, torch.full((1,), N))


def _logistic_grads(w, X, y):
    """Per-example gradients of log(1 + exp(-y~ x^T w)), y~ = 2y - 1 (``LogisticLoss.m``), rows of X = [x, 1]."""
    yt = 2 * y - 1
    return (-yt / (1 + np.exp(yt * (X @ w))))[:, None] * X


@pytest.mark.parametrize("name", ["vadam", "vogn"])
def test_steps_match_the_matlab_code(name):
    D, M, N, S = 4, 5, 30, 2
    if name == "vadam":
        cfg = dict(lr=0.3, beta=0.2, decay=0.55, momentum=0.9, train_samples=S, prec_init=1.0, init_mean="zero")
        method, state, g = _problem("vadam_matlab", cfg, D, M, N)
    else:
        cfg = dict(curvature="ef", covariance="diag", lr=0.3, beta=0.2, decay_lr=0.55, decay_beta=0.55, momentum=0.9,
                   train_samples=S, prec_init=1.0, init_mean="zero")
        method, state, g = _problem("full_gaussian", cfg, D, M, N)
    gamma = state.prior_prec[0].numpy()                       # [w, b] order, like the rows [x, 1]
    P = D + 1
    mu, Sigma = np.zeros(P), np.eye(P)
    S_mat = np.linalg.inv(Sigma)
    grad_momentum = np.zeros(P)
    for it in range(1, 5):
        batch = _minibatch(g, M, D, N)
        noise = method.noise(state, batch, g)
        state, _ = method.step(state, batch, noise)

        alpha, beta = 0.3 / (1 + it ** 0.55), 0.2 / (1 + it ** 0.55)
        X = np.hstack([batch.x[0].numpy(), np.ones((M, 1))])
        y = batch.y[0].numpy()
        U = np.linalg.cholesky(Sigma).T                          # chol(Sigma): upper, Sigma = U' U
        gsum, H = np.zeros(P), np.zeros((P, P))
        for s in range(S):
            w = mu + U.T @ noise[0, s].numpy()
            gi = _logistic_grads(w, X, y)
            gsum += gi.sum(0)
            H += gi.T @ gi                                       # LogisticLossGN: sum_i g_i g_i^T
        weight = N / M
        gbar, H = gsum / S * weight, H / S * weight
        grad_momentum = 0.9 * grad_momentum + 0.1 * (gbar + gamma * mu)
        m_hat = grad_momentum / (1 - 0.9 ** it)
        if name == "vadam":
            Hhat = np.diag(np.diag(np.outer(gbar, gbar) / N))
            S_mat = (1 - beta) * S_mat + beta * Hhat
            S_corr = S_mat / (1 - (1 - beta) ** it)
            Sigma = np.linalg.inv(S_corr + np.diag(gamma))
            mu = mu - alpha * np.linalg.solve(np.sqrt(S_corr) + np.diag(gamma), m_hat)
        else:
            S_mat = np.linalg.inv(Sigma)
            S_mat = (1 - beta) * S_mat + beta * (np.diag(np.diag(H)) + np.diag(gamma))
            Sigma = np.linalg.inv(S_mat)
            mu = mu - alpha * Sigma @ m_hat
        mean, cov = method.gaussian(state)
        np.testing.assert_allclose(mean[0].numpy(), mu, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(cov[0].numpy(), Sigma, rtol=1e-10, atol=1e-12)


def test_vogn_without_momentum_is_the_plain_update():
    cfg = dict(curvature="ef", covariance="diag", lr=0.3, beta=0.2, train_samples=2, prec_init=1.0,
               init_mean="zero")
    method, state, g = _problem("full_gaussian", {**cfg, "momentum": 0.0})
    plain, _, _ = _problem("full_gaussian", cfg)
    batch = _minibatch(g, 5, 4, 30)
    noise = method.noise(state, batch, g)
    a, _ = method.step(state, batch, noise)
    b, _ = plain.step(state, batch, noise)
    assert torch.equal(a.mean, b.mean) and torch.equal(a.prec, b.prec)
