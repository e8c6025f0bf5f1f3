"""VOGN / Vadam / Vprop and the per-example curvature they use, against exact references."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from bnnbench.core.linalg.per_example import (backprop, forward_cache, per_example_grads, sum_grads, sum_sq_grads,
                                              sums_over_samples)
from bnnbench.methods import METHODS, Batch, Problem, State
from bnnbench.methods.gaussian.natural import per_example_stats
from bnnbench.core.models import MLP

DT = torch.float64


def _gauss_nll(tau):
    return lambda f, y: 0.5 * tau * (y - f) ** 2 - 0.5 * math.log(tau) + 0.5 * math.log(2 * math.pi)


def test_per_example_sums_match_vmap_reference():
    g = torch.Generator().manual_seed(0)
    model = MLP([3, 5, 4, 1])
    R, S, B = 2, 3, 6
    theta = torch.randn(R, S, model.n_params, generator=g, dtype=DT)
    x = torch.randn(R, B, 3, generator=g, dtype=DT)
    y = torch.randn(R, B, generator=g, dtype=DT)
    tau = 2.5
    layers = [(W.requires_grad_(True), b.requires_grad_(True)) for W, b in
              ((W.detach(), b.detach()) for W, b in model.layers(theta))]
    f, acts, zs = forward_cache(model, layers, x)
    loss = _gauss_nll(tau)(f[..., 0], y.unsqueeze(1)).sum()
    gs = torch.autograd.grad(loss, zs)
    sq, sm = sum_sq_grads(model, acts, gs), sum_grads(model, acts, gs)
    for r in range(R):
        for s in range(S):
            ref = per_example_grads(model, _gauss_nll(tau), theta[r, s], x[r], y[r])  # [B, P]
            assert torch.allclose(sq[r, s], (ref ** 2).sum(0))
            assert torch.allclose(sm[r, s], ref.sum(0))


@pytest.mark.parametrize("sizes", [[3, 5, 4, 1], [3, 5, 4, 2], [3, 1]])
def test_sums_over_samples_match_the_loop_over_samples_and_examples(sizes):
    """The sums over samples and examples (every layer kind: the first layer's input shared by the samples, a hidden
    layer, one or two output units, a linear model) against per-example gradients looped over samples."""
    g = torch.Generator().manual_seed(5)
    model = MLP(sizes)
    R, S, B, K = 2, 3, 6, sizes[-1]
    theta = torch.randn(R, S, model.n_params, generator=g, dtype=DT)
    x = torch.randn(R, B, 3, generator=g, dtype=DT)
    y = torch.randn(R, B, K, generator=g, dtype=DT)
    nll = lambda f, yi: 0.5 * 2.5 * ((yi - f) ** 2).sum(-1)   # noqa: E731
    layers = [(W.detach().requires_grad_(True), b.detach().requires_grad_(True)) for W, b in model.layers(theta)]
    f, acts, zs = forward_cache(model, layers, x)
    gs = torch.autograd.grad(nll(f, y.unsqueeze(1)).sum(), zs)
    ref = torch.stack([torch.stack([per_example_grads(model, nll, theta[r, s], x[r], y[r]) for s in range(S)])
                       for r in range(R)])                      # [R, S, B, P]
    assert torch.allclose(sums_over_samples(model, acts, gs), ref.sum((1, 2)), rtol=1e-12, atol=1e-12)
    assert torch.allclose(sums_over_samples(model, acts, gs, square=True), (ref ** 2).sum((1, 2)), rtol=1e-12,
                          atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_manual_backprop_of_two_cotangents_matches_autograd(activation):
    g = torch.Generator().manual_seed(3)
    model = MLP([3, 5, 4, 2], activation=activation)
    R, S, B = 2, 3, 6
    theta = torch.randn(R, S, model.n_params, generator=g, dtype=DT)
    x = torch.randn(R, B, 3, generator=g, dtype=DT)
    layers = [(W.detach().requires_grad_(True), b.detach().requires_grad_(True)) for W, b in model.layers(theta)]
    f, acts, zs = forward_cache(model, layers, x)
    c1, c2 = torch.randn(2, R, S, B, 2, generator=g, dtype=DT)
    ref1 = torch.autograd.grad((f * c1).sum(), zs, retain_graph=True)
    ref2 = torch.autograd.grad((f * c2).sum(), zs)
    gs = backprop(model, layers, [a.detach() for a in acts], [z.detach() for z in zs], torch.cat([c1, c2], -2))
    for g_l, r1, r2 in zip(gs, ref1, ref2):
        assert torch.allclose(g_l[..., :B, :], r1) and torch.allclose(g_l[..., B:, :], r2)


@pytest.mark.parametrize("lik", ["gaussian", "bernoulli"])
def test_ggn_diagonal_matches_explicit_jacobians(lik):
    from torch.func import jacrev, vmap
    g = torch.Generator().manual_seed(1)
    model = MLP([3, 4, 1])
    theta = torch.randn(1, 1, model.n_params, generator=g, dtype=DT)
    x = torch.randn(1, 5, 3, generator=g, dtype=DT)
    y = ((torch.rand(1, 5, generator=g, dtype=DT) > 0.5).to(DT) if lik == "bernoulli"
         else torch.randn(1, 5, generator=g, dtype=DT))
    method = METHODS["vogn"](OmegaConf.create({"curvature": "ggn"}), model, lik)
    state = State(n_data=torch.tensor([5]), prior_prec=torch.ones(1, model.n_params, dtype=DT),
                  noise_prec=torch.tensor([3.0], dtype=DT))
    layers = [(W.detach().requires_grad_(True), b.detach().requires_grad_(True)) for W, b in model.layers(theta)]
    _, c_sum, _ = per_example_stats(method, state, layers, Batch(x, y, torch.tensor([5])), "ggn")
    J = vmap(jacrev(lambda th, xi: model.forward(th[None, None], xi[None, None])[0, 0, 0, 0]),
             in_dims=(None, 0))(theta[0, 0], x[0])  # [B, P]
    f = model.forward(theta, x)[0, 0, :, 0]
    lam = torch.full_like(f, 3.0) if lik == "gaussian" else torch.sigmoid(f) * (1 - torch.sigmoid(f))
    assert torch.allclose(c_sum[0, 0], (lam[:, None] * J ** 2).sum(0))


def _blr_problem(model, X, tau, lam):
    n = X.shape[0]
    return Problem("gaussian", torch.tensor([n]), torch.full((1, model.n_params), lam, dtype=DT),
                   noise_prec=torch.tensor([tau], dtype=DT), y_scale=torch.ones(1, dtype=DT))


def test_vogn_ggn_fixed_point_is_the_exact_mean_field_solution():
    """Linear model, Gaussian likelihood: the exact mean-field posterior (mean = posterior mean,
    precision = diag of the posterior precision) is a fixed point of VOGN with the GGN."""
    g = torch.Generator().manual_seed(2)
    N, D, tau, lam = 50, 3, 4.0, 0.7
    X = torch.randn(N, D, generator=g, dtype=DT)
    y = X @ torch.tensor([1.0, -2.0, 0.5], dtype=DT) + 0.3 + 0.5 * torch.randn(N, generator=g, dtype=DT)
    model = MLP([D, 1])
    method = METHODS["vogn"](OmegaConf.create(dict(lr=0.5, beta=0.9, train_samples=4000, curvature="ggn",
                                                   prec_init=None, init_mean="zero")), model, "gaussian")
    state = method.init(_blr_problem(model, X, tau, lam), g)
    Xb = torch.cat([X, torch.ones(N, 1, dtype=DT)], 1)
    Lam = lam * torch.eye(D + 1, dtype=DT) + tau * Xb.T @ Xb
    mu = torch.linalg.solve(Lam, tau * Xb.T @ y)
    state = state.replace(mean=mu[None].clone(), prec=Lam.diagonal()[None].clone())
    batch = Batch(X[None], y[None], torch.tensor([N]))
    new, _ = method.update(state, batch, g)
    assert torch.allclose(new.prec, state.prec, rtol=1e-12)  # the GGN of a linear model is exact
    assert torch.allclose(new.mean, state.mean, atol=0.01)   # only Monte Carlo noise moves the mean
    # away from the fixed point the mean moves towards it
    state = state.replace(mean=mu[None] + 0.3)
    new, _ = method.update(state, batch, g)
    assert (new.mean - mu).abs().sum() < (state.mean - mu).abs().sum()


@pytest.mark.parametrize("name", ["vadam", "vprop"])
def test_vadam_vprop_step_matches_the_equations(name):
    g = torch.Generator().manual_seed(3)
    model = MLP([2, 3, 1])
    P, N, lam, tau = model.n_params, 30, 2.0, 1.5
    cfg = dict(lr=0.05, train_samples=3, prec_init=None, init_mean="uniform_fan_in",
               **({"betas": [0.9, 0.99]} if name == "vadam" else {"beta": 0.95}))
    method = METHODS[name](OmegaConf.create(cfg), model, "gaussian")
    prob = Problem("gaussian", torch.tensor([N]), torch.full((1, P), lam, dtype=DT),
                   noise_prec=torch.tensor([tau], dtype=DT), y_scale=torch.ones(1, dtype=DT))
    state = method.init(prob, g)
    assert torch.all(state.s == 0)  # prec_init = lambda
    x, y = torch.randn(1, 4, 2, generator=g, dtype=DT), torch.randn(1, 4, generator=g, dtype=DT)
    batch = Batch(x, y, torch.tensor([N]))
    mu, s = state.mean[0].clone(), state.s[0].clone()
    m = torch.zeros(P, dtype=DT)
    for t in range(1, 4):
        eps = torch.randn(1, 3, P, generator=g, dtype=DT)
        state, _ = method.step(state, batch, eps)
        grads = []
        for k in range(3):  # plain transcription, one sample at a time
            th = (mu + eps[0, k] / torch.sqrt(N * s + lam)).requires_grad_(True)
            f = model.forward(th[None, None], x)[0, 0, :, 0]
            loss = _gauss_nll(tau)(f, y[0]).mean()
            grads.append(torch.autograd.grad(loss, th)[0])
        gb = torch.stack(grads).mean(0)
        g2 = (torch.stack(grads) ** 2).mean(0)
        lt = lam / N
        if name == "vadam":
            m = 0.9 * m + 0.1 * (gb + lt * mu)
            s = 0.99 * s + 0.01 * g2
            mu = mu - 0.05 * (m / (1 - 0.9 ** t)) / (torch.sqrt(s / (1 - 0.99 ** t)) + lt)
        else:
            s = 0.95 * s + 0.05 * g2
            mu = mu - 0.05 * (gb + lt * mu) / (torch.sqrt(s) + lt)
        assert torch.allclose(state.mean[0], mu, rtol=1e-10, atol=1e-12)
        assert torch.allclose(state.s[0], s, rtol=1e-10, atol=1e-14)
