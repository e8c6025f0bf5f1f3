"""Global inducing points and its sibling families (bnnbench/methods/inducing, methods/inducing/method.py) against exact
references: closed-form Bayesian linear regression and log evidence, dense algebra, numerical integration of the Gamma
KL."""

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats

from bnnbench.methods.inducing import blr
from bnnbench.methods.inducing.gamma import kl_gamma, reparam_standard_gamma, standard_gamma
from bnnbench.methods.inducing.layers import Factorised
from bnnbench.methods.inducing.network import InducingNet
from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.core.models import MLP

DT = torch.float64


def _linear_data(n=30, d=3, tau=4.0, alpha=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=DT)
    w = torch.randn(d + 1, generator=g, dtype=DT) / math.sqrt(alpha)
    Xb = torch.cat([X, torch.ones(n, 1, dtype=DT)], 1)
    y = Xb @ w + torch.randn(n, generator=g, dtype=DT) / math.sqrt(tau)
    return X, Xb, y


def _exact_blr(Xb, y, tau, alpha):
    """Posterior mean, covariance and log evidence of y = Xb w + eps, w ~ N(0, I / alpha), eps ~ N(0, I / tau)."""
    n, D = Xb.shape
    cov = torch.linalg.inv(tau * Xb.T @ Xb + alpha * torch.eye(D, dtype=DT))
    mean = tau * cov @ Xb.T @ y
    K = Xb @ Xb.T / alpha + torch.eye(n, dtype=DT) / tau
    log_ev = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=DT), K).log_prob(y)
    return mean, cov, float(log_ev)


def _method(name, sizes, n, tau, activation="linear", **cfg):
    model = MLP(sizes, activation)
    method = METHODS[name]({"learn_noise": False, **cfg}, model, "gaussian")
    R = 1
    problem = Problem("gaussian", n_data=torch.tensor([n]), prior_prec=torch.ones(R, model.n_params, dtype=DT),
                      noise_prec=torch.tensor([tau], dtype=DT), y_scale=torch.ones(R, dtype=DT))
    return method, problem


def test_blr_sample_moments_equal_the_dense_posterior():
    g = torch.Generator().manual_seed(1)
    U = torch.randn(7, 4, generator=g, dtype=DT)
    lam = torch.rand(7, generator=g, dtype=DT) + 0.2
    V = torch.randn(7, 2, generator=g, dtype=DT)
    alpha = torch.tensor(3.0, dtype=DT)
    prec = U.T @ torch.diag(lam) @ U + 3.0 * torch.eye(4, dtype=DT)
    cov = torch.linalg.inv(prec)
    mean = cov @ U.T @ torch.diag(lam) @ V
    m, c = blr.posterior(U, lam, V, alpha)
    assert torch.allclose(m, mean, atol=1e-12) and torch.allclose(c, cov, atol=1e-12)
    z = torch.randn(200000, 4, 2, generator=g, dtype=DT)
    W, logpq = blr.sample_weights(U, lam, V, alpha.expand(200000), z)
    assert torch.allclose(W.mean(0), mean, atol=4 * cov.diagonal().max().sqrt() / math.sqrt(2e5))
    emp = torch.einsum("sik,sjk->ij", W - mean, W - mean) / (2 * 200000)
    assert torch.allclose(emp, cov, atol=0.01 * cov.abs().max())
    # log p - log q at each draw against dense Gaussian densities (their constants cancel)
    p = torch.distributions.MultivariateNormal(torch.zeros(4, dtype=DT), torch.eye(4, dtype=DT) / 3.0)
    q = [torch.distributions.MultivariateNormal(mean[:, j], cov) for j in range(2)]
    ref = sum(p.log_prob(W[:10, :, j]) - q[j].log_prob(W[:10, :, j]) for j in range(2))
    assert torch.allclose(logpq[:10], ref, atol=1e-10)


def _blr_problem(R=3, S=2, P=9, D=6, out=4, seed=2):
    g = torch.Generator().manual_seed(seed)
    U = torch.randn(R, S, P, D, generator=g, dtype=DT, requires_grad=True)
    lam = (torch.rand(R, S, P, generator=g, dtype=DT) + 0.2).requires_grad_()
    V = torch.randn(R, S, P, out, generator=g, dtype=DT, requires_grad=True)
    alpha = torch.tensor([1.0, 2.0, 3.0], dtype=DT)[:R, None].expand(R, S)
    z = torch.randn(R, S, D, out, generator=g, dtype=DT)
    return U, lam, V, alpha, z


def _draw_and_grads(draw, U, lam, V, alpha, z):
    W, logpq = draw(U, lam, V, alpha, z)
    weights = torch.linspace(-1, 2, W.numel(), dtype=DT).view_as(W)
    loss = (W * weights).sum() + (logpq * torch.linspace(-2, 1, logpq.numel(), dtype=DT).view_as(logpq)).sum()
    return (W, logpq, *torch.autograd.grad(loss, (U, lam, V)))


def _draw_by_root(U, lam, V, alpha, z):
    return blr._draw_from_root(blr.prec_root(blr.posterior_prec(U, lam, alpha)), (U * lam.unsqueeze(-1)).mT @ V,
                               alpha, z)


def test_the_draw_from_the_precisions_root_and_its_gradients_equal_the_cholesky_draws():
    """W = C (C^T U^T Lambda V + z) with C = L^-T (the compiled step's, ``prec_root``'s hand-written backward) against
    LAPACK's factor, solves and torch's autograd (the eager step's), values and gradients in U, Lambda and V; and
    ``prec_root``'s gradient in A against torch's Cholesky backward through C = L^-T formed densely."""
    ref = _draw_and_grads(blr.sample_weights, *_blr_problem())
    new = _draw_and_grads(_draw_by_root, *_blr_problem())
    for a, b in zip(new, ref):
        assert torch.allclose(a, b, rtol=1e-11, atol=1e-12 * float(b.detach().abs().max()))
    g = torch.Generator().manual_seed(3)
    X = torch.randn(5, 7, 7, generator=g, dtype=DT)
    A = (X @ X.mT + torch.eye(7, dtype=DT)).requires_grad_()
    G = torch.randn(5, 7, 7, generator=g, dtype=DT)
    dense = torch.linalg.inv(torch.linalg.cholesky(A)).mT
    assert torch.allclose(blr.prec_root(A), dense, atol=1e-12)
    grad_ref, = torch.autograd.grad((dense * G.triu()).sum(), A)
    grad_new, = torch.autograd.grad((blr.prec_root(A) * G.triu()).sum(), A)
    assert torch.allclose(grad_new, grad_ref, atol=1e-12 * float(grad_ref.abs().max()))


def test_a_compiled_draw_takes_the_precisions_root_and_equals_the_eager_draw():
    """Under ``torch.compile`` on a CPU, ``sample_weights`` draws from ``prec_root`` (seen by its outcome on a precision
    that is not positive definite: NaN there, where the eager draw raises LAPACK's error), equal to the eager draw."""
    compiled = torch.compile(blr.sample_weights, backend="eager", fullgraph=True)
    ref = _draw_and_grads(blr.sample_weights, *_blr_problem())
    new = _draw_and_grads(compiled, *_blr_problem())
    for a, b in zip(new, ref):
        assert torch.allclose(a, b, rtol=1e-11, atol=1e-12 * float(b.detach().abs().max()))
    U, lam, V, alpha, z = (x.detach() for x in _blr_problem())
    alpha = alpha.clone()
    alpha[1] = -50.0                               # replica 1's precision U^T Lambda U - 50 I: not positive definite
    with pytest.raises(torch.linalg.LinAlgError):
        blr.sample_weights(U, lam, V, alpha, z)
    W, logpq = compiled(U, lam, V, alpha, z)
    assert torch.isnan(W[1]).all() and torch.isfinite(W[[0, 2]]).all() and torch.isfinite(logpq[[0, 2]]).all()


@pytest.mark.parametrize("prior,alpha", [("standard", 1.0), ("neal", 4.0)])
def test_gi_with_the_data_as_pseudo_data_is_the_exact_posterior_and_its_elbo_the_log_evidence(prior, alpha):
    """One linear layer, inducing inputs = training inputs, pseudo-outputs = targets, pseudo-precision = tau: q(w) is
    the closed-form posterior and every single-sample ELBO equals the exact log evidence."""
    tau, n = 4.0, 30
    X, Xb, y = _linear_data(n=n, tau=tau, alpha=alpha)
    method, problem = _method("gi", [3, 1], n, tau, prior=prior, inducing=n, train_samples=5)
    g = torch.Generator().manual_seed(0)
    state = method.init(problem, g)
    (l0,) = state.q.layers
    l0 = l0.replace(weights=l0.weights.replace(pseudo_out=y[None, :, None].clone(),
                                               log_prec=torch.full((1, n), math.log(tau), dtype=DT)))
    state = state.replace(q=state.q.replace(U0=X[None].clone(), layers=(l0,)))
    mean, cov, log_ev = _exact_blr(Xb, y, tau, alpha)
    U = torch.cat([state.q.U0[0], torch.ones(n, 1, dtype=DT)], 1)
    m, c = blr.posterior(U, torch.full((n,), tau, dtype=DT), y[:, None], torch.tensor(alpha, dtype=DT))
    assert torch.allclose(m[:, 0], mean, atol=1e-10) and torch.allclose(c, cov, atol=1e-12)
    batch = Batch(x=X[None], y=y[None], n_data=torch.tensor([n]))
    params = state.q
    f, logpq = method.net.forward(params, batch.x, method.noise(state, batch, g))
    ll = torch.distributions.Normal(f[..., 0], tau ** -0.5).log_prob(y).sum(-1)
    assert torch.allclose(ll + logpq, torch.full_like(logpq, log_ev), atol=1e-9)
    obj, _, _ = method.objective(state, params, batch, method.noise(state, batch, g))
    assert obj.item() * n == pytest.approx(-log_ev, abs=1e-9)


def test_optimised_gi_on_a_linear_layer_is_tight_to_1e_6():
    """gi's pseudo-data (P = 8 random inducing inputs, pseudo-outputs, precisions) optimised by L-BFGS on the
    closed-form ELBO of a linear layer reach the exact log evidence: the method's own single-sample ELBO is within
    1e-6 of it at every draw."""
    tau, n, alpha = 4.0, 40, 4.0
    X, Xb, y = _linear_data(n=n, tau=tau, alpha=alpha, seed=3)
    _, _, log_ev = _exact_blr(Xb, y, tau, alpha)
    method, problem = _method("gi", [3, 1], n, tau, prior="neal", inducing=8, train_samples=4)
    g = torch.Generator().manual_seed(0)
    state = method.init(problem, g)
    (l0,) = state.q.layers
    leaves = {k: v.clone().requires_grad_(True) for k, v in (("U0", state.q.U0), ("pseudo_out", l0.weights.pseudo_out),
                                                              ("log_prec", l0.weights.log_prec))}

    def closed_form_elbo():
        U = torch.cat([leaves["U0"][0], torch.ones(8, 1, dtype=DT)], 1)
        m, c = blr.posterior(U, leaves["log_prec"][0].exp(), leaves["pseudo_out"][0],
                             torch.tensor(alpha, dtype=DT))
        m = m[:, 0]
        r = y - Xb @ m
        ell = n * 0.5 * math.log(tau / (2 * math.pi)) - 0.5 * tau * (r @ r + ((Xb @ c) * Xb).sum())
        kl = 0.5 * (alpha * c.trace() + alpha * m @ m - 4 - torch.logdet(alpha * c))
        return ell - kl

    opt = torch.optim.LBFGS(list(leaves.values()), lr=1, max_iter=2000, tolerance_grad=1e-12,
                            tolerance_change=1e-15, history_size=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = -closed_form_elbo()
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    l0 = l0.replace(weights=l0.weights.replace(pseudo_out=leaves["pseudo_out"].detach(),
                                               log_prec=leaves["log_prec"].detach()))
    state = state.replace(q=state.q.replace(U0=leaves["U0"].detach(), layers=(l0,)))
    batch = Batch(x=X[None], y=y[None], n_data=torch.tensor([n]))
    elbo = -n * torch.stack([method.objective(state, state.q, batch, method.noise(state, batch, g))[0]
                             for _ in range(20)])
    with torch.no_grad():
        assert float(closed_form_elbo()) <= log_ev + 1e-9
    assert (elbo - log_ev).abs().max() < 1e-6


@pytest.mark.parametrize("name", ["fac", "li", "gi", "fac_gi", "rand_gi"])
def test_deep_linear_elbo_stays_below_the_generating_models_evidence(name):
    """Data from a linear model; deep linear networks' ELBO (mean of many draws, after training) stays below the
    generating model's exact log evidence (an upper bound on a mismatched model's evidence in expectation)."""
    tau, n = 10.0, 50
    X, Xb, y = _linear_data(n=n, tau=tau, alpha=4.0, seed=5)
    _, _, log_ev = _exact_blr(Xb, y, tau, 4.0)
    method, problem = _method(name, [3, 8, 8, 1], n, tau, prior="neal", train_samples=4, lr=0.02,
                              **({"inducing": 20} if name not in ("fac", "li") else {}))
    g = torch.Generator().manual_seed(0)
    state = method.init(problem, g)
    batch = Batch(x=X[None], y=y[None], n_data=torch.tensor([n]))
    for _ in range(300):
        state, _ = method.update(state, batch, g)
    elbo = -n * torch.stack([method.objective(state, state.q, batch, method.noise(state, batch, g))[0]
                             for _ in range(200)])
    se = float(elbo.std() / math.sqrt(len(elbo)))
    assert float(elbo.mean()) < log_ev + 3 * se


def test_global_inducing_weights_depend_on_the_inducing_rows_only():
    """A data row's output does not change when the other data rows change (same draws): the weights are the
    regression on the propagated inducing rows, never on the batch."""
    net = InducingNet([2, 5, 5, 1], "gi", "neal", n_inducing=6)
    g = torch.Generator().manual_seed(0)
    params = net.init_params(2, g, "cpu", DT)
    x = torch.randn(2, 4, 2, generator=g, dtype=DT)
    noise = net.noise(params, 3, 4, g)
    f1, lpq1 = net.forward(params, x, noise)
    x2 = x.clone()
    x2[:, 1:] = torch.randn(2, 3, 2, generator=g, dtype=DT)
    f2, lpq2 = net.forward(params, x2, noise)
    assert torch.equal(f1[:, :, 0], f2[:, :, 0]) and torch.equal(lpq1, lpq2)
    assert not torch.allclose(f1[:, :, 1:], f2[:, :, 1:])


def test_factorised_kl_and_local_reparameterisation_against_references():
    g = torch.Generator().manual_seed(0)
    layer = Factorised(3, 2, local_reparam=True)
    params = layer.init_params(1, g, "cpu", DT)
    params = params.replace(log_var=torch.randn(1, 4, 2, generator=g, dtype=DT) - 1)
    h = torch.cat([torch.randn(1, 1, 5, 3, generator=g, dtype=DT), torch.ones(1, 1, 5, 1, dtype=DT)], -1)
    alpha = torch.tensor([[2.5]], dtype=DT)
    S = 100000
    out, logpq = layer.forward(params, h.expand(1, S, 5, 4), alpha.expand(1, S),
                               torch.randn(1, S, 5, 2, generator=g, dtype=DT), 0)
    mean = params.mean[0] / 2.0
    var = params.log_var[0].exp() / 4.0
    q = torch.distributions.Normal(mean, var.sqrt())
    p = torch.distributions.Normal(torch.zeros_like(mean), torch.full_like(mean, 2.5 ** -0.5))
    assert torch.allclose(-logpq[0, 0], torch.distributions.kl_divergence(q, p).sum(), atol=1e-12)
    mu, v = h[0, 0] @ mean, (h[0, 0] ** 2) @ var
    assert torch.allclose(out[0].mean(0), mu, atol=5 * (v.max() / S) ** 0.5)
    assert torch.allclose(out[0].var(0), v, rtol=0.03)


@pytest.mark.parametrize("prior", ["scale", "neal"])
def test_unscaled_marginal_variance_is_the_librarys_local_reparameterisation(prior):
    """``marginal_var_unscaled`` against bayesfunc's ``FactorisedLRParam.forward`` and ``AbstractLRLinear.forward``
    transcribed: under its ``ScalePrior`` (not a ``FactorisedPrior``) the pre-activations' variance is (X * X) e^V^T,
    under Neal's (X * X) (e^V / D)^T; the KL is q's own either way."""
    g = torch.Generator().manual_seed(1)
    net = InducingNet([3, 2], "fac", prior, local_reparam=True, marginal_var_unscaled=True)
    params = net.init_params(1, g, "cpu", DT)
    q = params.layers[0].weights.replace(log_var=torch.randn(1, 4, 2, generator=g, dtype=DT) - 1)
    params = params.replace(layers=(params.layers[0].replace(weights=q),))
    x = torch.randn(1, 5, 3, generator=g, dtype=DT)
    noise = net.noise(params, 1, 5, g)
    out, logpq = net.forward(params, x, noise)
    # the library: post_mean [out, D] = M^T / sqrt(D); under a FactorisedPrior post_log_var gains 2 log(1 / sqrt(D))
    X = torch.cat([x[0], torch.ones(5, 1, dtype=DT)], -1)
    post_mean = q.mean[0].T / 2.0
    post_var = q.log_var[0].T.exp() / (4.0 if prior == "neal" else 1.0)
    ref = X @ post_mean.T + ((X ** 2) @ post_var.T).sqrt() * noise[0][1][0, 0]
    assert torch.allclose(out[0, 0], ref, atol=1e-12)
    alpha, lpq_prior = net.priors[0].prec(params.layers[0].prior, noise[0][0], 1, 1, x)
    q_w = torch.distributions.Normal(q.mean[0] / 2.0, (q.log_var[0].exp() / 4.0).sqrt())
    p_w = torch.distributions.Normal(torch.zeros(4, 2, dtype=DT), alpha[0, 0].rsqrt().expand(4, 2))
    kl = torch.distributions.kl_divergence(q_w, p_w).sum()
    assert torch.allclose(logpq[0, 0], lpq_prior[0, 0] - kl, atol=1e-12)
    plain = InducingNet([3, 2], "fac", prior, local_reparam=True)
    out_plain, logpq_plain = plain.forward(params, x, noise)
    assert torch.equal(logpq_plain, logpq)
    assert torch.equal(out_plain, out) == (prior == "neal")


def test_gamma_kl_against_numerical_integration():
    for a_q, b_q, a_p, b_p in [(3.0, 2.0, 2.0, 2.0), (405.4, 405.4, 2.0, 2.0), (2.5, 7.0, 1.3, 0.4)]:
        q, p = stats.gamma(a_q, scale=1 / b_q), stats.gamma(a_p, scale=1 / b_p)
        lo, hi = q.ppf(1e-12), q.ppf(1 - 1e-12)
        ref, _ = integrate.quad(lambda x: q.pdf(x) * (q.logpdf(x) - p.logpdf(x)), lo, hi, limit=200, epsabs=1e-12)
        got = kl_gamma(*(torch.tensor(v, dtype=DT) for v in (a_q, b_q, a_p, b_p)))
        assert float(got) == pytest.approx(ref, rel=1e-7, abs=1e-10)


def test_standard_gamma_draws_and_their_implicit_gradient():
    g = torch.Generator().manual_seed(0)
    for a in (1.0, 2.0, 7.5, 405.0):
        x = standard_gamma(torch.full((100000,), a, dtype=DT), g).numpy()
        assert stats.kstest(x, stats.gamma(a).cdf).pvalue > 1e-3
    # d E[x0] / da = 1 and d E[log x0] / da = psi'(a): the reparameterised draws give them in expectation
    a = torch.tensor(3.0, dtype=DT, requires_grad=True)
    x0 = standard_gamma(torch.full((200000,), 3.0, dtype=DT), g)
    x = reparam_standard_gamma(a.expand(200000), x0)
    (gm,) = torch.autograd.grad(x.mean(), a, retain_graph=True)
    (gl,) = torch.autograd.grad(x.log().mean(), a)
    assert float(gm) == pytest.approx(1.0, abs=0.01)
    assert float(gl) == pytest.approx(float(torch.polygamma(1, torch.tensor(3.0))), rel=0.02)


def test_scale_prior_elbo_term_is_minus_the_gamma_kl_in_expectation():
    net = InducingNet([2, 3, 1], "rand_gi", "scale", n_inducing=4)
    g = torch.Generator().manual_seed(0)
    params = net.init_params(1, g, "cpu", DT)
    p = params.layers[0].prior.replace(scale_log_shape=torch.tensor([0.5], dtype=DT),
                                       scale_log_rate=torch.tensor([1.5], dtype=DT))
    prior = net.priors[0]
    S = 400000
    alpha, lpq = prior.prec(p, prior.noise(p, S, g), 1, S, params.U0)
    a_q, b_q = prior.q_scale(p)
    kl = kl_gamma(a_q, b_q, torch.tensor(2.0, dtype=DT), torch.tensor(2.0, dtype=DT))
    assert float(-lpq.mean()) == pytest.approx(float(kl), abs=4 * float(lpq.std()) / math.sqrt(S))
    # alpha = fan_in x^(-1/2): E[alpha] = fan_in b^(1/2) Gamma(a - 1/2) / Gamma(a)
    ref = 3 * float(b_q.sqrt() * torch.exp(torch.lgamma(a_q - 0.5) - torch.lgamma(a_q)))
    assert float(alpha.mean()) == pytest.approx(ref, rel=0.01)


def test_unknown_prior_and_family_are_clear_errors():
    with pytest.raises(ValueError, match="valid priors: standard, neal, scale"):
        METHODS["gi"]({"prior": "nosuch"}, MLP([2, 1]), "gaussian")
    with pytest.raises(ValueError, match="valid: fac, li, gi, fac_gi, rand_gi"):
        InducingNet([2, 1], "nosuch", "neal")
    np.testing.assert_equal(sorted(n for n in METHODS if n in ("fac", "li", "gi", "fac_gi", "rand_gi")),
                            ["fac", "fac_gi", "gi", "li", "rand_gi"])


@pytest.mark.parametrize("bad,said", [("method.prior=nosuch", "valid priors: standard, neal, scale, spatial_iw"),
                                      ("method.arch=nosuch", "valid: mlp, mnist500_cnn, resnet8"),
                                      ("method.inducing=0", "at least 1")])
def test_a_bad_family_setting_is_one_error_line_before_any_work(bad, said, tmp_path, capsys):
    from bnnbench.cli import main
    assert main(["run", "method=gi", "data=uci/yacht", bad, f"runs_root={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: method gi:") and said in err[0]
    assert not any(tmp_path.iterdir())
