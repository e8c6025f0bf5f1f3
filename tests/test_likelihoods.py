"""The likelihoods' closed-form gradients in f against autograd of their log densities, and the log densities
against torch.distributions."""

import pytest
import torch

from bnnbench.likelihoods import Bernoulli, Categorical, Gaussian

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
