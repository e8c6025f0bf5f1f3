"""The mean-field methods' shared posterior (``methods.mean_field``): each method's sigma against its closed form,
predictions as the network at theta_s = mu + sigma * eps_s, the dense Gaussian, the KL of the diagonal-precision
methods, and the predictive noise precision drawn from a learned q(tau)."""

import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.methods.gaussian.mean_field import DiagonalPrecision, MeanField
from bnnbench.core.models import MLP

DT = torch.float64
R, N = 3, 40
NOISE = dict(learn_noise=True, noise_prior_shape=6.0, noise_prior_rate=6.0, noise_lr=0.01)
CFGS = {
    "bbb": dict(lr=0.01, betas=[0.9, 0.99], eps=1e-8, train_samples=2, init_mean="uniform_fan_in", init_rho=-1.0),
    "vogn": dict(lr=0.01, beta=0.9, train_samples=2, curvature="ef", init_mean="uniform_fan_in"),
    "vadam": dict(lr=0.01, betas=[0.9, 0.99], train_samples=2, prec_init=5.0, init_mean="uniform_fan_in"),
    "vprop": dict(lr=0.01, beta=0.99, train_samples=2, init_mean="uniform_fan_in"),
    "vadam_matlab": dict(lr=0.01, beta=0.1, decay=0.55, momentum=0.9, train_samples=2, prec_init=1.0,
                         init_mean="uniform_fan_in"),
    "noisy_adam": dict(lr=0.01, betas=[0.9, 0.999], kl_weight=0.5, damping_ex=0.0, f_init=2.0, train_samples=2,
                       init_mean="uniform_fan_in", learn_noise=False),
}


def _sigma(name, cfg, state):
    """sigma of each method's parameterisation, written out."""
    n = state.n_data.to(DT)[:, None]
    if name == "bbb":
        return F.softplus(state.rho)
    if name in ("vadam", "vprop"):
        return 1 / torch.sqrt(n * state.s + state.prior_prec)
    if name == "noisy_adam":
        gamma_in = cfg["kl_weight"] * state.prior_prec / n
        return torch.sqrt(cfg["kl_weight"] / (n * (state.f + gamma_in)))
    return 1 / torch.sqrt(state.prec)


def _trained(name, cfg, steps=3):
    g = torch.Generator().manual_seed(0)
    model = MLP([3, 4, 1])
    method = METHODS[name](OmegaConf.create(cfg), model, "gaussian")
    lam = torch.rand(R, 1, generator=g, dtype=DT).expand(R, model.n_params) + 0.5
    prob = Problem("gaussian", torch.full((R,), N), lam.clone(), noise_prec=torch.tensor([1.0, 2.0, 3.0], dtype=DT),
                   y_scale=torch.ones(R, dtype=DT))
    state = method.init(prob, g)
    batch = Batch(torch.randn(R, 5, 3, generator=g, dtype=DT), torch.randn(R, 5, generator=g, dtype=DT), prob.n_data)
    for _ in range(steps):  # a few steps: sigma away from its initial value
        state, _ = method.update(state, batch, g)
    return model, method, state


@pytest.mark.parametrize("name", sorted(CFGS))
def test_predictions_are_the_network_at_mu_plus_sigma_eps(name):
    model, method, state = _trained(name, CFGS[name])
    assert isinstance(method, MeanField)
    sigma = _sigma(name, CFGS[name], state)
    assert torch.allclose(method.std(state), sigma, rtol=1e-12)
    x = torch.randn(R, 6, 3, generator=torch.Generator().manual_seed(1), dtype=DT)
    pred = method.predict(state, x, 7, torch.Generator().manual_seed(2))
    eps = torch.randn(R, 7, model.n_params, generator=torch.Generator().manual_seed(2), dtype=DT)
    ref = model.forward(state.mean.unsqueeze(1) + sigma.unsqueeze(1) * eps, x)
    assert pred.f.shape == (R, 7, 6, 1)
    assert torch.allclose(pred.f, ref, rtol=1e-10, atol=1e-12)
    assert torch.equal(pred.noise_prec, state.noise_prec)
    mean, cov = method.gaussian(state)
    assert torch.equal(mean, state.mean)
    assert torch.allclose(cov, torch.diag_embed(sigma ** 2), rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(n for n in CFGS if issubclass(METHODS[n], DiagonalPrecision)))
def test_diagonal_precision_kl_is_the_gaussian_kl_to_the_prior(name):
    _, method, state = _trained(name, CFGS[name])
    q = torch.distributions.Normal(state.mean, _sigma(name, CFGS[name], state))
    p = torch.distributions.Normal(torch.zeros_like(state.mean), state.prior_prec.rsqrt())
    assert torch.allclose(method.kl(state), torch.distributions.kl_divergence(q, p).sum(-1), rtol=1e-10)


@pytest.mark.parametrize("name", ["bbb", "noisy_adam"])
def test_a_learned_noise_precision_is_drawn_from_q_tau_per_sample(name):
    """With ``learn_noise``, each predictive sample carries its own tau_s ~ Gamma(a, b) = q(tau), drawn from torch's
    global generator."""
    _, method, state = _trained(name, {**CFGS[name], **NOISE})
    a, b = state.noise_q.log_ab[:, 0].exp(), state.noise_q.log_ab[:, 1].exp()
    assert not torch.allclose(a, torch.full_like(a, 6.0))  # q(tau) has moved from the prior
    x = torch.randn(R, 6, 3, generator=torch.Generator().manual_seed(1), dtype=DT)
    torch.manual_seed(5)
    pred = method.predict(state, x, 7, torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    ref = torch.distributions.Gamma(a[:, None].expand(-1, 7), b[:, None].expand(-1, 7)).sample()
    assert pred.noise_prec.shape == (R, 7) and torch.equal(pred.noise_prec, ref)
    assert math.isclose(state.noise_prec[0].item(), (a[0] / b[0]).item(), rel_tol=1e-12)


@pytest.mark.parametrize("name", sorted(CFGS))
def test_compiled_predictions_are_the_same_draws_through_the_fused_kernel(name):
    """``compiled_predict`` (a run with ``compile=true`` evaluates with it): in float32 on a CPU the same networks
    theta_s = mu + sigma * eps_s from the same draws, computed by the fused kernel, to float32 rounding; in float64 it
    is ``predict`` itself."""
    from bnnbench.core.linalg import mlp_relu
    model, method, state = _trained(name, CFGS[name])
    x = torch.randn(R, 37, 3, generator=torch.Generator().manual_seed(1), dtype=DT)
    ref = method.predict(state, x, 9, torch.Generator().manual_seed(2))
    assert method.compiled_predict()(state, x, 9, torch.Generator().manual_seed(2)).f.equal(ref.f)   # float64
    state32 = state.map(lambda t: t.float() if t.is_floating_point() else t)
    ref = method.predict(state32, x.float(), 9, torch.Generator().manual_seed(2))
    pred = method.compiled_predict()(state32, x.float(), 9, torch.Generator().manual_seed(2))
    assert pred.f.dtype == torch.float32 and pred.f.shape == ref.f.shape
    assert (pred.f - ref.f).abs().max() <= 1e-5 * ref.f.abs().max()
    assert torch.equal(pred.noise_prec, ref.noise_prec)
    if mlp_relu.available():
        calls = []
        kernel = mlp_relu.forward
        mlp_relu.forward = lambda *a: calls.append(1) or kernel(*a)
        try:
            method.compiled_predict()(state32, x.float(), 9, torch.Generator().manual_seed(2))
        finally:
            mlp_relu.forward = kernel
        assert calls
