"""The likelihoods' closed-form gradients in f against autograd of their log densities, the log densities
against torch.distributions, their samples against their moments, and the Gauss-Newton square roots against the
autograd Hessian of the negative log density."""

import pytest
import torch
import torch.nn.functional as F

from bnnbench.core.likelihoods import Bernoulli, Categorical, Gaussian

DT = torch.float64


def _cases():
    g = torch.Generator().manual_seed(0)
    R, S, B = 2, 3, 5
    tau = torch.tensor([0.5, 4.0], dtype=DT)
    yield ("gaussian", Gaussian(tau), torch.randn(R, S, B, 1, generator=g, dtype=DT),
           torch.randn(R, B, generator=g, dtype=DT))
    yield ("gaussian per-sample tau", Gaussian(torch.rand(R, S, generator=g, dtype=DT) + 0.1),
           torch.randn(R, S, B, 1, generator=g, dtype=DT), torch.randn(R, S, B, generator=g, dtype=DT))
    yield ("bernoulli", Bernoulli(), 3 * torch.randn(R, S, B, 1, generator=g, dtype=DT),
           (torch.rand(R, B, generator=g) < 0.5).to(DT))
    yield ("categorical", Categorical(), 2 * torch.randn(R, S, B, 4, generator=g, dtype=DT),
           torch.randint(0, 4, (R, S, B), generator=g))


@pytest.mark.parametrize("name, lik, f, y", list(_cases()), ids=[c[0] for c in _cases()])
def test_grad_f_is_the_gradient_of_log_prob(name, lik, f, y):
    f = f.requires_grad_(True)
    (ref,) = torch.autograd.grad(lik.log_prob(f, y).sum(), f)
    got = lik.grad_f(f.detach(), y)
    assert got.shape == f.shape
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_log_probs_match_torch_distributions():
    g = torch.Generator().manual_seed(1)
    f = torch.randn(1, 2, 3, 4, generator=g, dtype=DT)
    y = torch.randint(0, 4, (1, 3), generator=g)
    ref = torch.distributions.Categorical(logits=f).log_prob(y[:, None, :])
    assert torch.allclose(Categorical().log_prob(f, y), ref)
    tau = torch.tensor([2.0], dtype=DT)
    yr = torch.randn(1, 3, generator=g, dtype=DT)
    ref = torch.distributions.Normal(f[..., 0], tau.rsqrt()).log_prob(yr[:, None, :])
    assert torch.allclose(Gaussian(tau).log_prob(f[..., :1], yr), ref)
    yb = (torch.rand(1, 3, generator=g) < 0.5).to(DT)
    ref = torch.distributions.Bernoulli(logits=f[..., 0]).log_prob(yb[:, None, :].expand(1, 2, 3))
    assert torch.allclose(Bernoulli().log_prob(f[..., :1], yb), ref)


@pytest.mark.parametrize("name, lik, f, y", list(_cases()), ids=[c[0] for c in _cases()])
def test_sampled_score_is_grad_f_at_the_sampled_target(name, lik, f, y):
    u = lik.sample_noise(f.shape, torch.Generator().manual_seed(3), DT, "cpu")
    assert u.shape == (f.shape if name == "categorical" else f.shape[:-1])
    y_smp = lik.sample(f, u)
    assert y_smp.shape == f.shape[:-1]
    assert torch.allclose(lik.sampled_score(f, u), lik.grad_f(f, y_smp), rtol=1e-12, atol=1e-12)


def test_samples_have_the_likelihoods_moments():
    """``sample(f, sample_noise(...))`` draws from p(y | f): Gaussian mean f and variance 1/tau, Bernoulli frequency
    sigmoid(f), categorical frequencies softmax(f) (Gumbel-max), within 5 standard errors of 200000 draws."""
    g, n = torch.Generator().manual_seed(4), 200_000
    f = torch.tensor([0.3, -1.2, 2.0], dtype=DT).reshape(1, 1, 3, 1).expand(1, n, 3, 1)
    tau = torch.tensor([4.0], dtype=DT)
    lik = Gaussian(tau)
    y = lik.sample(f, lik.sample_noise(f.shape, g, DT, "cpu"))
    assert torch.allclose(y.mean(1), f[0, 0, :, 0], atol=5 * (1 / tau / n).sqrt().item())
    assert torch.allclose(y.var(1), 1 / tau.expand(3), rtol=5 * (2 / n) ** 0.5)
    lik = Bernoulli()
    p = torch.sigmoid(f[0, 0, :, 0])
    y = lik.sample(f, lik.sample_noise(f.shape, g, DT, "cpu"))
    assert set(y.unique().tolist()) <= {0.0, 1.0}
    assert ((y.mean(1)[0] - p).abs() < 5 * (p * (1 - p) / n).sqrt()).all()
    fk = torch.tensor([[0.5, -1.0, 2.0, 0.0]], dtype=DT).reshape(1, 1, 1, 4).expand(1, n, 1, 4)
    lik = Categorical()
    p = torch.softmax(fk[0, 0, 0], -1)
    y = lik.sample(fk, lik.sample_noise(fk.shape, g, DT, "cpu"))
    freq = torch.bincount(y.flatten(), minlength=4).to(DT) / n
    assert ((freq - p).abs() < 5 * (p * (1 - p) / n).sqrt()).all()


def _output_hessian(lik, f, y):
    """-d^2 log p(y | f) / df^2 per (replica, sample, example), ``[R, S, B, K, K]``, by double autograd."""
    f = f.detach().requires_grad_(True)
    (g,) = torch.autograd.grad(lik.log_prob(f, y).sum(), f, create_graph=True)
    rows = [torch.autograd.grad(g[..., k].sum(), f, retain_graph=True)[0] for k in range(f.shape[-1])]
    return -torch.stack(rows, -2)


@pytest.mark.parametrize("name, lik, f, y", list(_cases())[:3], ids=[c[0] for c in _cases()][:3])
def test_ggn_sqrt_output_gradient_squares_to_the_output_hessian(name, lik, f, y):
    """One output: the gradient r of ``ggn_sqrt_output`` in f has r^2 = Lambda, the Hessian of the negative log
    density in f (whatever y)."""
    f = f.requires_grad_(True)
    (r,) = torch.autograd.grad(lik.ggn_sqrt_output(f).sum(), f)
    assert torch.allclose(r * r, _output_hessian(lik, f, y)[..., 0], rtol=1e-12, atol=1e-14)


def test_categorical_ggn_sqrt_output_is_a_monte_carlo_root_of_the_output_hessian():
    """The gradient of ``ggn_sqrt_output`` is r = p - e_y~ for the label y~ drawn from softmax(f) by ``generator``,
    and E_y~[r r^T] = sum_k p_k (p - e_k)(p - e_k)^T is the Hessian of the negative log density in f."""
    name, lik, f, y = list(_cases())[3]
    K = f.shape[-1]
    f = f.requires_grad_(True)
    (r,) = torch.autograd.grad(lik.ggn_sqrt_output(f, torch.Generator().manual_seed(9)).sum(), f)
    p = torch.softmax(f.detach(), -1)
    y_smp = torch.multinomial(p.reshape(-1, K), 1, generator=torch.Generator().manual_seed(9)).reshape(p.shape[:-1])
    assert torch.allclose(r, p - F.one_hot(y_smp, K).to(DT), rtol=1e-12, atol=1e-14)
    roots = p.unsqueeze(-2) - torch.eye(K, dtype=DT)                      # [..., k, :] = p - e_k
    expected = (p[..., :, None, None] * roots[..., :, None] * roots[..., None, :]).sum(-3)
    assert torch.allclose(expected, _output_hessian(lik, f, y), rtol=1e-12, atol=1e-14)
