"""BBB against closed-form mean-field VI for Bayesian linear regression.

For y = X w + e, e ~ N(0, 1/tau), prior w ~ N(0, 1/lambda), and q = N(m, diag s^2):
  E_q[-log p(y|w)] = sum_i [0.5 tau ((y_i - x_i m)^2 + sum_d x_id^2 s_d^2) - 0.5 log tau + 0.5 log 2 pi],
and the optimal mean-field q has m = the exact posterior mean and s_d^2 = 1 / Lambda_dd, with
Lambda = lambda I + tau X^T X (the posterior precision).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from bnnbench.methods import BBB, Batch, Problem
from bnnbench.core.metrics import kl_diag_gaussians
from bnnbench.core.models import MLP

DT = torch.float64


def _blr(n=40, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=DT)
    w = torch.randn(d + 1, generator=g, dtype=DT)
    y = X @ w[:d] + w[d] + 0.5 * torch.randn(n, generator=g, dtype=DT)
    return X, y


def _closed_form_neg_elbo(X, y, m, s2, tau, lam):
    Xb = torch.cat([X, torch.ones(len(X), 1, dtype=DT)], 1)
    enll = (0.5 * tau * ((y - Xb @ m) ** 2 + (Xb ** 2) @ s2) - 0.5 * math.log(tau) + 0.5 * math.log(2 * math.pi)).sum()
    kl = kl_diag_gaussians(m, s2, torch.zeros_like(m), torch.full_like(m, 1 / lam))
    return (enll + kl) / len(X)


def _method(S=1, lr=0.01):
    model = MLP([3, 1])
    cfg = OmegaConf.create(dict(lr=lr, betas=[0.9, 0.999], eps=1e-8, train_samples=S, local_reparam=False,
                                init_mean="zero", init_std=0.3, init_rho=None, init_prec=None))
    return model, BBB(cfg, model, "gaussian")


def _state(method, model, n, tau, lam):
    prob = Problem("gaussian", torch.tensor([n]), torch.full((1, model.n_params), lam, dtype=DT),
                   noise_prec=torch.tensor([tau], dtype=DT), y_scale=torch.ones(1, dtype=DT))
    return method.init(prob, torch.Generator().manual_seed(0))



def test_objective_and_gradient_match_closed_form():
    X, y = _blr()
    tau, lam = 4.0, 0.5
    model, method = _method()
    state = _state(method, model, len(X), tau, lam)
    g = torch.Generator().manual_seed(1)
    state = state.replace(mean=torch.randn(1, model.n_params, generator=g, dtype=DT))
    state = state.replace(rho=torch.randn(1, model.n_params, generator=g, dtype=DT) - 1)
    batch = Batch(X[None], y[None], torch.tensor([len(X)]))
    S = 200000
    noise = torch.randn(1, S, model.n_params, generator=g, dtype=DT)
    mean = state.mean.clone().requires_grad_(True)
    rho = state.rho.clone().requires_grad_(True)
    obj = method.objective(state, mean, rho, batch, noise)[0]
    gm, gr = torch.autograd.grad(obj.sum(), [mean, rho])
    m2 = state.mean[0].clone().requires_grad_(True)
    r2 = state.rho[0].clone().requires_grad_(True)
    ref = _closed_form_neg_elbo(X, y, m2, F.softplus(r2) ** 2, tau, lam)
    gm_ref, gr_ref = torch.autograd.grad(ref, [m2, r2])
    assert obj.item() == pytest.approx(ref.item(), rel=5e-3)
    assert torch.allclose(gm[0], gm_ref, rtol=0.03, atol=0.02)
    assert torch.allclose(gr[0], gr_ref, rtol=0.03, atol=0.02)


@pytest.mark.slow
def test_converges_to_exact_mean_field_solution():
    X, y = _blr(n=60)
    tau, lam = 4.0, 0.5
    model, method = _method(S=16, lr=0.01)
    state = _state(method, model, len(X), tau, lam)
    batch = Batch(X[None], y[None], torch.tensor([len(X)]))
    g = torch.Generator().manual_seed(2)
    means, sds = [], []
    for t in range(6000):
        state, _ = method.update(state, batch, g)
        if t >= 4000:
            means.append(state.mean[0])
            sds.append(F.softplus(state.rho[0]))
    Xb = torch.cat([X, torch.ones(len(X), 1, dtype=DT)], 1)
    Lam = lam * torch.eye(4, dtype=DT) + tau * Xb.T @ Xb
    m_exact = torch.linalg.solve(Lam, tau * Xb.T @ y)
    s_exact = Lam.diagonal().rsqrt()
    assert torch.allclose(torch.stack(means).mean(0), m_exact, atol=0.01)
    assert torch.allclose(torch.stack(sds).mean(0), s_exact, rtol=0.05)


def test_a_replicas_own_step_size_is_the_step_of_a_config_with_that_step_size():
    """Each replica's ``lr`` (``Problem.hparams``, as a grid search over BBB's alpha gives it) makes, after the
    schedule's scale, exactly the step that a config with that ``lr`` makes for the replica alone."""
    X, y = _blr()
    model = MLP([3, 1])
    lrs = [0.01, 0.003, 0.001]
    prob = Problem("gaussian", torch.tensor([40] * 3), torch.full((3, model.n_params), 0.5, dtype=DT),
                   noise_prec=torch.full((3,), 4.0, dtype=DT), y_scale=torch.ones(3, dtype=DT),
                   hparams={"lr": torch.tensor(lrs, dtype=DT)})
    _, method = _method(S=2)
    state = method.init(prob, torch.Generator().manual_seed(0))
    assert torch.equal(state.lr, torch.tensor(lrs, dtype=DT))
    batch = Batch(X[None].expand(3, -1, -1), y[None].expand(3, -1), torch.tensor([40] * 3))
    alone = [_state(_method(S=2, lr=lr)[1], model, 40, 4.0, 0.5) for lr in lrs]
    g = torch.Generator().manual_seed(1)
    for t in range(4):
        scale = 1.0 if t < 2 else 0.1
        noise = method.noise(state, batch, g)
        state, _ = method.step(state, batch, noise, lr_scale=scale)
        for r, lr in enumerate(lrs):
            ref = _method(S=2, lr=lr)[1]
            alone[r], _ = ref.step(alone[r], Batch(X[None], y[None], torch.tensor([40])), noise[r:r + 1],
                                   lr_scale=scale)
            assert torch.allclose(state.mean[r], alone[r].mean[0], rtol=1e-12, atol=1e-15)
            assert torch.allclose(state.rho[r], alone[r].rho[0], rtol=1e-12, atol=1e-15)
    assert not torch.allclose(state.mean[0], state.mean[2])
