"""Full-Gaussian natural-gradient VI on conjugate Bayesian linear regression: the GGN / Hessian update
converges to the closed-form posterior (mean and covariance); curvatures against dense references."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.methods.gaussian.full_gaussian import FullGaussianState
from bnnbench.core.models import MLP

DT = torch.float64


def _blr(N=40, D=3, tau=3.0, lam=0.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(N, D, generator=g, dtype=DT)
    y = X @ torch.tensor([0.7, -1.5, 2.0], dtype=DT)[:D] - 0.4 + torch.randn(N, generator=g, dtype=DT) / math.sqrt(tau)
    Xb = torch.cat([X, torch.ones(N, 1, dtype=DT)], 1)
    Lam = lam * torch.eye(D + 1, dtype=DT) + tau * Xb.T @ Xb
    return X, y, Lam, torch.linalg.solve(Lam, tau * Xb.T @ y), g


def _blr_problem(N, tau=3.0, lam=0.5):
    return Problem("gaussian", torch.tensor([N]), torch.full((1, 4), lam, dtype=DT),
                   noise_prec=torch.tensor([tau], dtype=DT), y_scale=torch.ones(1, dtype=DT))


def _method(curv, **kw):
    model = MLP([3, 1])
    cfg = dict(curvature=curv, lr=0.5, beta=0.5, decay_lr=0.0, decay_beta=0.0, train_samples=64, prec_init=1.0,
               init_mean="zero")
    cfg.update(kw)
    return model, METHODS["full_gaussian"](OmegaConf.create(cfg), model, "gaussian")


@pytest.mark.parametrize("curv, S, steps", [("ggn", 64, 200)])
def test_converges_to_the_closed_form_posterior(curv, S, steps):
    X, y, Lam, mu, g = _blr()
    model, method = _method(curv, train_samples=S, lr=1.0, decay_lr=0.6)
    N, tau, lam = len(X), 3.0, 0.5
    prob = Problem("gaussian", torch.tensor([N]), torch.full((1, 4), lam, dtype=DT),
                   noise_prec=torch.tensor([tau], dtype=DT), y_scale=torch.ones(1, dtype=DT))
    state = method.init(prob, g)
    batch = Batch(X[None], y[None], torch.tensor([N]))
    means = []
    for t in range(steps):
        state, _ = method.update(state, batch, g)
        if t >= steps // 2:
            means.append(state.mean[0])
    # the precision update is deterministic for a linear-Gaussian model: it converges geometrically
    assert torch.allclose(state.prec[0], Lam, rtol=1e-9)
    # the mean converges up to Monte Carlo noise: within a tenth of a posterior standard deviation
    post_sd = torch.linalg.inv(Lam).diagonal().sqrt()
    assert ((torch.stack(means).mean(0) - mu).abs() / post_sd).max() < 0.1


def test_ef_curvature_is_the_sum_of_gradient_outer_products():
    X, y, Lam, mu, g = _blr(N=6)
    model, method = _method("ef", train_samples=2)
    prob = _blr_problem(6)
    state = method.init(prob, g)
    theta = torch.randn(1, 2, 4, generator=g, dtype=DT)
    g_sum, C, _ = method.curvature_and_grad(state, theta, Batch(X[None], y[None], torch.tensor([6])))
    Xb = torch.cat([X, torch.ones(6, 1, dtype=DT)], 1)
    grads = torch.cat([(3.0 * (Xb @ theta[0, s] - y))[:, None] * Xb for s in range(2)])  # d NLL_i / d theta
    assert torch.allclose(g_sum[0], grads.sum(0))
    assert torch.allclose(C[0], grads.T @ grads)


def test_sampling_has_the_posterior_covariance():
    X, y, Lam, mu, g = _blr()
    model, method = _method("ggn")
    state = FullGaussianState(n_data=torch.tensor([40]), prior_prec=torch.full((1, 4), 0.5, dtype=DT), mean=mu[None],
                              prec=Lam[None], m=torch.zeros(1, 4, dtype=DT), t=torch.zeros(1, dtype=torch.long))
    I = torch.eye(4, dtype=DT)[None]
    M = (method.sample(state, I) - mu)[0].T  # theta - mu = M eps
    assert torch.allclose(M @ M.T, torch.linalg.inv(Lam))


def test_hessian_equals_ggn_for_a_linear_gaussian_model():
    """For a linear model with a Gaussian likelihood the NLL Hessian is exactly tau X^T X (= the GGN)."""
    X, y, Lam, mu, g = _blr(N=7)
    prob = _blr_problem(7)
    theta = torch.randn(1, 2, 4, generator=g, dtype=DT)
    batch = Batch(X[None], y[None], torch.tensor([7]))
    out = {}
    for curv in ("hessian", "ggn"):
        model, method = _method(curv, train_samples=2)
        state = method.init(prob, g)
        out[curv] = method.curvature_and_grad(state, theta, batch)[1][0]
    Xb = torch.cat([X, torch.ones(7, 1, dtype=DT)], 1)
    assert torch.allclose(out["hessian"], 2 * 3.0 * Xb.T @ Xb)  # two samples
    assert torch.allclose(out["ggn"], out["hessian"])


def test_kl_against_torch_distributions():
    X, y, Lam, mu, g = _blr()
    model, method = _method("ef")
    lam = torch.tensor([[0.5, 2.0, 1.0, 0.1]], dtype=DT)
    state = FullGaussianState(n_data=torch.tensor([40]), prior_prec=lam, mean=mu[None], prec=Lam[None],
                              m=torch.zeros(1, 4, dtype=DT), t=torch.zeros(1, dtype=torch.long))
    q = torch.distributions.MultivariateNormal(mu, precision_matrix=Lam)
    p = torch.distributions.MultivariateNormal(torch.zeros(4, dtype=DT), precision_matrix=torch.diag(lam[0]))
    assert torch.allclose(method.kl(state)[0], torch.distributions.kl_divergence(q, p))


@pytest.mark.parametrize("curv", ["ef", "ggn"])
def test_logistic_curvature_against_a_loop_over_examples_and_samples(curv):
    """The linear-model path (curvature summed over samples before the P x P product) against per-(example,
    sample) outer products: g = (sigmoid(f) - y) phi, C = g g^T (ef) or p (1 - p) phi phi^T (ggn)."""
    g = torch.Generator().manual_seed(3)
    N, S = 9, 3
    X = torch.randn(2, N, 3, generator=g, dtype=DT)
    y = (torch.rand(2, N, generator=g) < 0.5).to(DT)
    model = MLP([3, 1])
    method = METHODS["full_gaussian"](OmegaConf.create(dict(curvature=curv, lr=0.1, beta=0.1, train_samples=S,
                                                            prec_init=1.0, init_mean="zero")), model, "bernoulli")
    prob = Problem("bernoulli", torch.tensor([N, N]), torch.ones(2, 4, dtype=DT))
    state = method.init(prob, g)
    theta = torch.randn(2, S, 4, generator=g, dtype=DT)
    g_sum, C, _ = method.curvature_and_grad(state, theta, Batch(X, y, torch.tensor([N, N])))
    for r in range(2):
        g_ref, C_ref = torch.zeros(4, dtype=DT), torch.zeros(4, 4, dtype=DT)
        for s in range(S):
            for i in range(N):
                phi = torch.cat([X[r, i], torch.ones(1, dtype=DT)])
                p = torch.sigmoid(phi @ theta[r, s])
                gi = (p - y[r, i]) * phi
                g_ref += gi
                C_ref += torch.outer(gi, gi) if curv == "ef" else p * (1 - p) * torch.outer(phi, phi)
        assert torch.allclose(g_sum[r], g_ref)
        assert torch.allclose(C[r], C_ref)
        assert torch.allclose(method.curvature_and_grad(state, theta, Batch(X, y, torch.tensor([N, N])),
                                                        diagonal=True)[1][r], C_ref.diagonal())


def test_cached_cholesky_is_the_factor_of_the_new_precision():
    X, y, Lam, mu, g = _blr(N=10)
    model, method = _method("ggn", train_samples=2)
    prob = _blr_problem(10)
    state = method.init(prob, g)
    for _ in range(3):
        state, _ = method.update(state, Batch(X[None], y[None], torch.tensor([10])), g)
        L = state.prec_chol[0]
        assert torch.allclose(L @ L.T, state.prec[0])


def test_dense_ggn_of_a_categorical_likelihood_is_refused():
    """The categorical output curvature diag(p) - p p^T has no exact one-column square root: curvature=ggn's dense
    path says so rather than use the Monte Carlo one."""
    g = torch.Generator().manual_seed(0)
    model = MLP([2, 3])
    method = METHODS["full_gaussian"](OmegaConf.create(dict(curvature="ggn", lr=0.1, beta=0.1, train_samples=1,
                                                            prec_init=1.0, init_mean="zero")), model, "categorical")
    state = method.init(Problem("categorical", torch.tensor([4]), torch.ones(1, model.n_params, dtype=DT)), g)
    batch = Batch(torch.randn(1, 4, 2, generator=g, dtype=DT), torch.tensor([[0, 1, 2, 1]]), torch.tensor([4]))
    with pytest.raises(ValueError, match="curvature=ggn supports gaussian and bernoulli"):
        method.update(state, batch, g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_in_place_precision_update_rounds_as_the_plain_expression(dtype):
    """``mixed_prec`` is eq. 12 symmetrised, bit for bit the expression it replaced (so records repeat exactly), with
    exact zeros off the diagonal of the old precision (its first step) and of C (unused inputs); C_sum's buffer is
    its scratch, the old precision is left as it was."""
    from bnnbench.methods.gaussian.full_gaussian import mixed_prec
    g = torch.Generator().manual_seed(3)
    R, P = 3, 17
    X = torch.randn(R, P, 5, generator=g, dtype=dtype)
    X[:, 4] = 0   # a feature that never appears: a zero row and column of C
    C = X @ X.transpose(1, 2) * 7.3
    A = torch.randn(R, P, P, generator=g, dtype=dtype)
    for prec in (torch.diag_embed(torch.rand(R, P, generator=g, dtype=dtype) + 1), 0.5 * (A + A.transpose(1, 2))):
        scale = torch.rand(R, generator=g, dtype=dtype) * 100
        lam = torch.rand(R, P, generator=g, dtype=dtype)
        beta = torch.rand(R, generator=g, dtype=dtype)
        b = beta[:, None, None]
        plain = (1 - b) * prec + b * (scale[:, None, None] * C + torch.diag_embed(lam))
        plain = 0.5 * (plain + plain.transpose(-1, -2))
        prec_before = prec.clone()
        got = mixed_prec(prec, C.clone(), scale, lam, beta)
        bits = torch.int32 if dtype == torch.float32 else torch.int64
        assert torch.equal(got.view(bits), plain.view(bits))
        assert torch.equal(prec, prec_before)
