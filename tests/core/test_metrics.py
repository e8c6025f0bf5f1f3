"""Metrics against hand-computed values and loops over examples."""

import math

import numpy as np
import pytest
import torch

from bnnbench.core.metrics import (classification_metrics, kl_diag_gaussians, predictive_loglik,
                              regression_metrics, summarise)


def _gauss_logpdf(y, m, tau):
    return 0.5 * math.log(tau) - 0.5 * math.log(2 * math.pi) - 0.5 * tau * (y - m) ** 2


def test_regression_metrics_by_hand():
    # one replica, two samples, three test points
    f = torch.tensor([[[1.0, 2.0, 3.0], [2.5, 2.0, 5.0]]], dtype=torch.float64)
    y = torch.tensor([[1.5, 1.0, 4.5]], dtype=torch.float64)
    tau = torch.tensor([0.5], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    m = regression_metrics(f, tau, y, mask)
    mean = [1.75, 2.0, 4.0]
    rmse = math.sqrt(sum((a - b) ** 2 for a, b in zip(mean, [1.5, 1.0, 4.5])) / 3)
    lp = [[_gauss_logpdf(y[0, j].item(), f[0, s, j].item(), 0.5) for j in range(3)] for s in range(2)]
    pointwise = sum(math.log(0.5 * (math.exp(lp[0][j]) + math.exp(lp[1][j]))) for j in range(3)) / 3
    joint = (math.log(0.5 * (math.exp(sum(lp[0])) + math.exp(sum(lp[1]))))) / 3
    assert m["rmse"].item() == pytest.approx(rmse, rel=1e-12)
    assert m["loglik_pointwise"].item() == pytest.approx(pointwise, rel=1e-12)
    assert m["loglik_joint"].item() == pytest.approx(joint, rel=1e-12)
    # the conventions differ (Jensen): joint <= pointwise here
    assert m["loglik_joint"].item() < m["loglik_pointwise"].item()


def test_coverage_is_that_of_the_mixtures_central_intervals():
    """The interval ends by root finding on the Gaussian mixture's CDF (scipy), a loop over test points."""
    from scipy.optimize import brentq
    from scipy.stats import norm
    g = torch.Generator().manual_seed(1)
    R, S, T = 2, 4, 60
    f = torch.randn(R, S, T, generator=g, dtype=torch.float64)
    tau = torch.rand(R, S, generator=g, dtype=torch.float64) * 3 + 0.5
    y = 1.5 * torch.randn(R, T, generator=g, dtype=torch.float64)
    mask = torch.ones(R, T, dtype=torch.bool)
    mask[1, 45:] = False
    m = regression_metrics(f, tau, y, mask)
    for p in (0.5, 0.9):
        for r in range(R):
            inside = []
            for t in range(T):
                if not mask[r, t]:
                    continue
                sd = (1 / tau[r]).sqrt().numpy()
                cdf = lambda v: norm.cdf(v, f[r, :, t].numpy(), sd).mean()   # noqa: E731
                lo = brentq(lambda v: cdf(v) - (1 - p) / 2, -50, 50, xtol=1e-13)
                hi = brentq(lambda v: cdf(v) - (1 + p) / 2, -50, 50, xtol=1e-13)
                inside.append(lo <= y[r, t].item() <= hi)
            assert m[f"coverage_{round(100 * p)}"][r].item() == pytest.approx(np.mean(inside), abs=1e-12)
    assert 0 < m["coverage_50"].min() and (m["coverage_50"] < m["coverage_90"]).all()


def test_padding_is_ignored():
    g = torch.Generator().manual_seed(0)
    f = torch.randn(2, 7, 5, generator=g, dtype=torch.float64)
    y = torch.randn(2, 5, generator=g, dtype=torch.float64)
    tau = torch.tensor([2.0, 0.3], dtype=torch.float64)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 3:] = False
    full = regression_metrics(f, tau, y, mask)
    alone = regression_metrics(f[1:, :, :3], tau[1:], y[1:, :3], torch.ones(1, 3, dtype=torch.bool))
    for k in full:
        assert full[k][1].item() == pytest.approx(alone[k][0].item(), rel=1e-12)


def test_classification_metrics_loop():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 4, 6, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([[0, 1, 2, 2, 1, 0]])
    mask = torch.ones(1, 6, dtype=torch.bool)
    m = classification_metrics(logits, y, mask)
    p = torch.softmax(logits[0], -1).mean(0).numpy()  # [T, K]
    err = np.mean(p.argmax(-1) != y[0].numpy())
    nll = -np.mean(np.log(p[np.arange(6), y[0].numpy()]))
    assert m["error"].item() == pytest.approx(err)
    assert m["nll"].item() == pytest.approx(nll, rel=1e-10)
    # binary: one logit equals a two-class softmax with logits (0, f)
    f1 = torch.randn(1, 3, 5, 1, generator=g, dtype=torch.float64)
    yb = torch.tensor([[0, 1, 1, 0, 1]])
    mb = classification_metrics(f1, yb, torch.ones(1, 5, dtype=torch.bool))
    pb = torch.sigmoid(f1[0, :, :, 0]).mean(0).numpy()
    nll_b = -np.mean(np.where(yb[0].numpy() == 1, np.log(pb), np.log(1 - pb)))
    assert mb["nll"].item() == pytest.approx(nll_b, rel=1e-10)


def test_predictive_loglik_single_sample_conventions_agree():
    logp = torch.randn(3, 1, 8, dtype=torch.float64)
    mask = torch.ones(3, 8, dtype=torch.bool)
    ll = predictive_loglik(logp, mask)
    assert torch.allclose(ll["loglik_joint"], ll["loglik_pointwise"])
    assert torch.allclose(ll["loglik_joint"], logp[:, 0].mean(-1))


def test_summarise_stderr_convention():
    s = summarise([1.0, 2.0, 4.0, 5.0])
    assert s["mean"] == 3.0
    assert s["stderr"] == pytest.approx(np.std([1, 2, 4, 5], ddof=0) / 2)
    assert s["n"] == 4


def test_kl_diag_matches_torch_distributions():
    g = torch.Generator().manual_seed(2)
    mq, mp = torch.randn(2, 5, generator=g, dtype=torch.float64), torch.randn(2, 5, generator=g, dtype=torch.float64)
    vq = torch.rand(2, 5, generator=g, dtype=torch.float64) + 0.1
    vp = torch.rand(2, 5, generator=g, dtype=torch.float64) + 0.1
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mq, vq.sqrt()),
                                            torch.distributions.Normal(mp, vp.sqrt())).sum(-1)
    assert torch.allclose(kl_diag_gaussians(mq, vq, mp, vp), ref)
