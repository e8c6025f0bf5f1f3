"""Noisy natural gradient: K-FAC factors against the explicit Fisher, the sampled weights'
Kronecker covariance (eq. 13), the Gamma KL, and the noisy-Adam step against its equations."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.methods import State, gamma_noise, state_class
from bnnbench.methods.kfac.kronecker import Kronecker
from bnnbench.core.models import MLP
from bnnbench.run.config import ConfigError

DT = torch.float64
BASE = dict(lr=0.01, kl_weight=1.0, damping_ex=0.0, train_samples=2, init_mean="uniform_fan_in", learn_noise=True,
            noise_prior_shape=6.0, noise_prior_rate=6.0, noise_lr=0.001)
KFAC = dict(BASE, beta=0.1, T_stats=1, T_inv=1, factor_init=1.0, momentum=0.0)
ADAM = dict(BASE, betas=[0.9, 0.999], f_init=0.0)


def _problem(model, N=40, lam=2.0):
    return Problem("gaussian", torch.tensor([N]), torch.full((1, model.n_params), lam, dtype=DT),
                   noise_prec=torch.tensor([1.0], dtype=DT), y_scale=torch.ones(1, dtype=DT))


def test_gamma_noise_gradient_matches_autograd_of_the_objective():
    a0, b0, n = 6.0, 6.0, torch.tensor([40.0, 300.0], dtype=DT)
    z = torch.tensor([[0.3, -0.2], [2.0, 1.1]], dtype=DT, requires_grad=True)
    r2 = torch.tensor([0.7, 0.05], dtype=DT)
    a, b = z[:, 0].exp(), z[:, 1].exp()
    ell = 0.5 * (torch.digamma(a) - torch.log(b) - a / b * r2 - math.log(2 * math.pi))
    obj = -ell + torch.distributions.kl_divergence(torch.distributions.Gamma(a, b),
                                                   torch.distributions.Gamma(a0, b0)) / n
    (ref,) = torch.autograd.grad(obj.sum(), [z])
    assert torch.allclose(gamma_noise.objective_grad(a.detach(), b.detach(), r2, a0, b0, n), ref,
                          rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("damping_ex", [0.0, 0.3])
def test_sampled_weights_have_the_kronecker_covariance_of_eq13(damping_ex):
    g = torch.Generator().manual_seed(0)
    model = MLP([2, 3, 1])
    method = METHODS["noisy_kfac"](OmegaConf.create({**KFAC, "damping_ex": damping_ex}), model, "gaussian")
    state = method.init(_problem(model), g)
    R = 1
    layers = []
    for l, (_, _, d_in, d_out) in enumerate(model.slices):  # arbitrary SPD factors
        X = torch.randn(R, d_in + 1, d_in + 1, generator=g, dtype=DT)
        Y = torch.randn(R, d_out, d_out, generator=g, dtype=DT)
        layers.append(Kronecker(A=X @ X.transpose(1, 2) + 0.1 * torch.eye(d_in + 1, dtype=DT),
                                S=Y @ Y.transpose(1, 2) + 0.1 * torch.eye(d_out, dtype=DT)))
    state = method._refresh(state.replace(layers=tuple(layers)), covariance=True, inverses=True)
    N, lam, kl = 40, 2.0, 1.0
    g_in = kl * lam / N
    for l, (_, _, d_in, d_out) in enumerate(model.slices):
        A, S = state.layers[l].A[0], state.layers[l].S[0]
        pi = math.sqrt((A.trace() / A.shape[0]) / (S.trace() / S.shape[0]))
        A_d = A + pi * math.sqrt(g_in) * torch.eye(A.shape[0], dtype=DT)
        S_d = S + math.sqrt(g_in) / pi * torch.eye(S.shape[0], dtype=DT)
        n = (d_in + 1) * d_out
        E = torch.eye(n, dtype=DT).reshape(n, d_in + 1, d_out)  # W - M is linear in eps: read off its matrix
        eps = [torch.zeros(1, n, di + 1, do, dtype=DT) for _, _, di, do in model.slices]
        eps[l] = E[None]
        Wc = method._weights(state, eps)[l][0] - method._hom(state.mean, l)[0]
        T = Wc.reshape(n, n).T
        cov = T @ T.T  # Cov of vec(W) (row-major)
        assert torch.allclose(cov, torch.kron(kl / N * torch.linalg.inv(A_d), torch.linalg.inv(S_d)),
                              rtol=1e-8, atol=1e-12)
        # the mean update's natural gradient [A^g]^-1 V [S^g]^-1, damped by gamma = gamma_in + gamma_ex
        gam = g_in + damping_ex
        A_g = A + pi * math.sqrt(gam) * torch.eye(A.shape[0], dtype=DT)
        S_g = S + math.sqrt(gam) / pi * torch.eye(S.shape[0], dtype=DT)
        V = torch.randn(1, d_in + 1, d_out, generator=g, dtype=DT)
        Vs = [torch.zeros(1, di + 1, do, dtype=DT) for _, _, di, do in model.slices]
        Vs[l] = V
        assert torch.allclose(method._precondition_all(state, Vs)[l][0],
                              torch.linalg.inv(A_g) @ V[0] @ torch.linalg.inv(S_g))


def test_a_factor_indefinite_in_floating_point_is_clamped_as_the_authors_code_and_nan_is_not_an_exception():
    g = torch.Generator().manual_seed(4)
    model = MLP([2, 3, 1])
    method = METHODS["noisy_kfac"](OmegaConf.create(KFAC), model, "gaussian")
    state = method.init(Problem("gaussian", torch.tensor([40, 40]), torch.full((2, model.n_params), 2.0, dtype=DT),
                                noise_prec=torch.ones(2, dtype=DT), y_scale=torch.ones(2, dtype=DT)), g)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=DT))
    A_bad = Q @ torch.diag(torch.tensor([3.0, 1.0, 0.5, -0.4], dtype=DT)) @ Q.T   # below -damping: not PD once damped
    bad = state.layers[1].replace(A=torch.stack([A_bad, torch.full((4, 4), float("nan"), dtype=DT)]))
    state = method._refresh(state.replace(layers=(state.layers[0], bad)), covariance=True, inverses=True)
    A_d, _, floor, _ = state.layers[1].damped(torch.full((2,), 2.0 / 40, dtype=DT))
    assert floor[0] < 0.4
    A_clamped = Q @ torch.diag(torch.tensor([3.0, 1.0, 0.5, 0.0], dtype=DT)) @ Q.T + floor[0] * torch.eye(4, dtype=DT)
    cA = state.layers[1].cA[0] / math.sqrt(1.0 / 40)
    assert torch.allclose(cA @ cA.T, torch.linalg.inv(A_clamped))
    assert torch.isnan(state.layers[1].cA[1]).all()


def test_kfac_factors_match_the_explicit_fisher_of_a_tiny_network():
    """One example, weights at the mean (negligible posterior noise): A (x) E[S] equals the exact
    Fisher block tau J^T J of each layer; E[S] is estimated with targets sampled from the model."""
    from torch.func import jacrev
    g = torch.Generator().manual_seed(1)
    model = MLP([2, 3, 1])
    cfg = dict(KFAC, beta=1.0, kl_weight=1e-12, train_samples=40000, learn_noise=False)
    method = METHODS["noisy_kfac"](OmegaConf.create(cfg), model, "gaussian")
    state = method.init(_problem(model), g)
    tau = 2.0
    state = state.replace(noise_prec=torch.tensor([tau], dtype=DT))
    x, y = torch.randn(1, 1, 2, generator=g, dtype=DT), torch.randn(1, 1, generator=g, dtype=DT)
    new, _ = method.step(state, Batch(x, y, torch.tensor([40])), method.noise(state, Batch(x, y, None), g))
    theta = state.mean[0]
    for l in range(2):
        hom = method._hom(theta, l)

        def f_of(h, l=l):
            th = theta.clone()
            w, b, d_in, d_out = model.slices[l]
            th = torch.cat([th[:w.start], h[:-1].flatten(), h[-1], th[b.stop:]])
            return model.forward(th[None, None], x)[0, 0, 0, 0]

        J = jacrev(f_of)(hom).flatten()
        F = tau * torch.outer(J, J)
        K = torch.kron(new.layers[l].A[0], new.layers[l].S[0])
        assert torch.allclose(K, F, rtol=0.05, atol=0.05 * F.abs().max().item())


def test_noisy_adam_step_matches_algorithm_1():
    """Alg. 1 transcribed with a loop over examples: v is the minibatch-mean gradient, f the EMA of the
    minibatch mean of the *per-example* squared sampled-target gradients (the diagonal of
    F = Cov_{x, y ~ model}(Dw), eq. 8-11), not the square of the minibatch-mean gradient (~F/B)."""
    g = torch.Generator().manual_seed(2)
    model = MLP([2, 3, 1])
    cfg = dict(ADAM, learn_noise=False, train_samples=3)
    method = METHODS["noisy_adam"](OmegaConf.create(cfg), model, "gaussian")
    state = method.init(_problem(model), g)
    P, N, lam, tau = model.n_params, 40, 2.0, 1.0
    x, y = torch.randn(1, 5, 2, generator=g, dtype=DT), torch.randn(1, 5, generator=g, dtype=DT)
    batch = Batch(x, y, torch.tensor([N]))
    mu, m, f = state.mean[0].clone(), torch.zeros(P, dtype=DT), torch.zeros(P, dtype=DT)
    g_in = lam / N

    def grad_ll(w, yy):
        w = w.clone().requires_grad_(True)
        out = model.forward(w[None, None], x)[0, 0, :, 0]
        ll = (0.5 * math.log(tau) - 0.5 * math.log(2 * math.pi) - 0.5 * tau * (yy - out) ** 2).mean()
        return torch.autograd.grad(ll, w)[0], out.detach()

    def grad_i(w, i, yi):  # gradient of example i's log-likelihood alone
        w = w.clone().requires_grad_(True)
        out = model.forward(w[None, None], x[:, i:i + 1])[0, 0, 0, 0]
        return torch.autograd.grad(-0.5 * tau * (yi - out) ** 2, w)[0]

    for k in range(1, 4):
        eps, yn = method.noise(state, batch, g)
        state, _ = method.step(state, batch, (eps, yn))
        std = torch.sqrt(1.0 / N / (f + g_in))
        vs, fs = [], []
        for s in range(3):
            w = mu + std * eps[0, s]
            gr, out = grad_ll(w, y[0])
            y_s = out + yn[0, s] / math.sqrt(tau)  # targets sampled from the model
            vs.append(gr - g_in * w)
            fs.append(torch.stack([grad_i(w, i, y_s[i]) ** 2 for i in range(x.shape[1])]).mean(0))
        m = 0.9 * m + 0.1 * torch.stack(vs).mean(0)
        f = 0.999 * f + 0.001 * torch.stack(fs).mean(0)
        mu = mu + 0.01 * (m / (1 - 0.9 ** k)) / (f + g_in)
        assert torch.allclose(state.mean[0], mu, rtol=1e-10, atol=1e-12)
        assert torch.allclose(state.f[0], f, rtol=1e-10, atol=1e-15)


def test_matrix_normal_kl_against_dense():
    g = torch.Generator().manual_seed(5)
    model = MLP([2, 3, 1])
    method = METHODS["noisy_kfac"](OmegaConf.create(dict(KFAC, kl_weight=0.7)), model, "gaussian")
    state = method.init(_problem(model, lam=2.0), g)
    layers = []
    for l, (_, _, d_in, d_out) in enumerate(model.slices):
        X = torch.randn(1, d_in + 1, d_in + 1, generator=g, dtype=DT)
        layers.append(state.layers[l].replace(A=X @ X.transpose(1, 2) + 0.3 * torch.eye(d_in + 1, dtype=DT)))
    state = method._refresh(state.replace(layers=tuple(layers)), covariance=True, inverses=True)
    state = state.replace(mean=torch.randn(1, model.n_params, generator=g, dtype=DT))
    ref = 0.0
    for l, (_, _, d_in, d_out) in enumerate(model.slices):
        U = state.layers[l].cA[0] @ state.layers[l].cA[0].T
        V = state.layers[l].cS[0] @ state.layers[l].cS[0].T
        M = method._hom(state.mean, l)[0].flatten()
        k = M.numel()
        q = torch.distributions.MultivariateNormal(M, covariance_matrix=torch.kron(U, V))
        p = torch.distributions.MultivariateNormal(torch.zeros(k, dtype=DT),
                                                   covariance_matrix=0.5 * torch.eye(k, dtype=DT))
        ref += torch.distributions.kl_divergence(q, p)
    assert torch.allclose(method.kl(state)[0], 0.7 * ref)


def test_noisy_adam_fisher_is_the_per_example_fisher_of_a_tiny_network():
    """beta_2 = 0 (f = one minibatch estimate), weights at the mean (negligible posterior noise), many
    sampled targets: f equals the exact diagonal Fisher (1/B) sum_i tau J_i^2 of the minibatch,
    J_i = d f(x_i) / d theta (eq. 8-11: F = Cov_{x ~ p_D, y ~ p(y|x,w)}(Dw), per example)."""
    from torch.func import jacrev
    g = torch.Generator().manual_seed(3)
    model = MLP([2, 3, 1])
    cfg = dict(ADAM, betas=[0.9, 0.0], f_init=1.0, kl_weight=1e-12, train_samples=20000, learn_noise=False)
    method = METHODS["noisy_adam"](OmegaConf.create(cfg), model, "gaussian")
    state = method.init(_problem(model), g)
    tau, B = 2.0, 6
    state = state.replace(noise_prec=torch.tensor([tau], dtype=DT))
    x, y = torch.randn(1, B, 2, generator=g, dtype=DT), torch.randn(1, B, generator=g, dtype=DT)
    batch = Batch(x, y, torch.tensor([40]))
    new, _ = method.step(state, batch, method.noise(state, batch, g))
    theta = state.mean[0]
    J = jacrev(lambda th: model.forward(th[None, None], x)[0, 0, :, 0])(theta)  # [B, P]
    F_diag = tau * (J * J).mean(0)
    assert torch.allclose(new.f[0], F_diag, rtol=0.05, atol=0.02 * F_diag.max().item())
    assert not new.f.requires_grad  # no autograd graph carried from step to step


def test_noisy_kfac_momentum_step_against_dense_transcription():
    """Three steps of noisy K-FAC with momentum (the authors' regression code, mvg_optimizer.py): per layer
    m <- b1 m + (1 - b1) V, V = mean over particles of grad_W log p (minibatch mean) - gamma_in W, and
    vec(M) <- vec(M) + alpha (A^g (x) S^g)^-1 vec(m / (1 - b1^k)) with dense Kronecker inverses; the
    factors follow eq. 12 from a loop over examples."""
    g = torch.Generator().manual_seed(4)
    model = MLP([2, 3, 1])
    cfg = dict(KFAC, momentum=0.9, learn_noise=False, train_samples=2)
    method = METHODS["noisy_kfac"](OmegaConf.create(cfg), model, "gaussian")
    state = method.init(_problem(model), g)
    N, lam, tau, B, beta, alpha = 40, 2.0, 1.0, 4, 0.1, 0.01
    g_in = lam / N
    x, y = torch.randn(1, B, 2, generator=g, dtype=DT), torch.randn(1, B, generator=g, dtype=DT)
    batch = Batch(x, y, torch.tensor([N]))
    L = len(model.slices)
    mu = state.mean[0].clone()
    A = [state.layers[l].A[0].clone() for l in range(L)]
    S = [state.layers[l].S[0].clone() for l in range(L)]
    mom = [torch.zeros(d_in + 1, d_out, dtype=DT) for _, _, d_in, d_out in model.slices]

    def flat_from_hom(hs):
        return torch.cat([torch.cat([h[:-1].flatten(), h[-1]]) for h in hs])

    for k in range(1, 4):
        eps, yn = method.noise(state, batch, g)
        hom_s = [h[0].detach() for h in method._weights(state, eps)]  # sampled weights (eq. 13, tested above)
        damped = []
        for l in range(L):  # eq. 13 damping of the factors before this step
            pi = math.sqrt((A[l].trace() / A[l].shape[0]) / (S[l].trace() / S[l].shape[0]))
            damped.append((A[l] + pi * math.sqrt(g_in) * torch.eye(A[l].shape[0], dtype=DT),
                           S[l] + math.sqrt(g_in) / pi * torch.eye(S[l].shape[0], dtype=DT)))
        state, _ = method.step(state, batch, (eps, yn))
        newA = [torch.zeros_like(a) for a in A]
        newS = [torch.zeros_like(s_) for s_ in S]
        Vs = [torch.zeros_like(m_) for m_ in mom]
        for s in range(2):
            th = flat_from_hom([h[s] for h in hom_s]).requires_grad_(True)
            out = model.forward(th[None, None], x)[0, 0, :, 0]
            ll = (-0.5 * tau * (y[0] - out) ** 2).mean()
            gth = torch.autograd.grad(ll, th)[0]
            Ws = [h[s] for h in hom_s]
            for l, (w, b, d_in, d_out) in enumerate(model.slices):
                G = torch.cat([gth[w].reshape(d_in, d_out), gth[b][None]], 0)
                Vs[l] += (G - g_in * Ws[l]) / 2
            for i in range(B):  # eq. 12 per example: a a^T and Ds Ds^T, targets sampled from the model
                a0 = torch.cat([x[0, i], torch.ones(1, dtype=DT)])
                z0 = (a0 @ Ws[0]).requires_grad_(True)
                a1 = torch.cat([torch.relu(z0), torch.ones(1, dtype=DT)])
                z1 = a1 @ Ws[1]
                y_s = z1.detach()[0] + yn[0, s, i] / math.sqrt(tau)
                ds = torch.autograd.grad(-0.5 * tau * (y_s - z1[0]) ** 2, [z0, z1])
                for l, a_l in enumerate([a0, a1.detach()]):
                    newA[l] += torch.outer(a_l, a_l) / (2 * B)
                    newS[l] += torch.outer(ds[l], ds[l]) / (2 * B)
        steps = []
        for l in range(L):
            mom[l] = 0.9 * mom[l] + 0.1 * Vs[l]
            Ad, Sd = damped[l]
            step = torch.linalg.solve(torch.kron(Ad, Sd), (mom[l] / (1 - 0.9 ** k)).flatten()).reshape(mom[l].shape)
            steps.append(step)
            A[l] = (1 - beta) * A[l] + beta * newA[l]
            S[l] = (1 - beta) * S[l] + beta * newS[l]
        mu = mu + alpha * flat_from_hom(steps)
        assert torch.allclose(state.mean[0], mu, rtol=1e-9, atol=1e-12)
        for l in range(L):
            assert torch.allclose(state.layers[l].A[0], A[l], rtol=1e-9, atol=1e-12)
            assert torch.allclose(state.layers[l].S[0], S[l], rtol=1e-9, atol=1e-12)


@state_class
class _Steps(State):
    """A state with a step count only: what ``gamma_noise.step`` reads besides q(tau)."""
    t: torch.Tensor


def test_gamma_noise_converges_to_the_conjugate_posterior():
    """With the residuals fixed, N x (-E_q[log N(y | f, 1/tau)] + KL(q || p) / N) is the negative ELBO of tau given N
    points of mean squared residual r2, minimised by the conjugate posterior Gamma(a0 + N/2, b0 + N r2 / 2)."""
    from bnnbench.methods import gamma_noise
    g = torch.Generator().manual_seed(5)
    cfg = OmegaConf.create(dict(noise_prior_shape=6.0, noise_prior_rate=6.0, noise_lr=0.02, noise_lr_drop=False))
    N, R = torch.tensor([50, 400]), 2
    f = torch.randn(R, 3, 8, 1, generator=g, dtype=DT)
    y = torch.randn(R, 8, generator=g, dtype=DT)
    state = _Steps(n_data=N, prior_prec=torch.ones(R, 1, dtype=DT), t=torch.zeros(R, dtype=torch.long),
                   **gamma_noise.init_state(cfg, R, "cpu", DT))
    for _ in range(6000):
        state = state.replace(**gamma_noise.step(cfg, state, f, y, lr_scale=1.0), t=state.t + 1)
    r2 = ((y.unsqueeze(1) - f[..., 0]) ** 2).mean(dim=(1, 2))
    a, b = state.noise_q.log_ab.exp().unbind(-1)
    assert torch.allclose(a, (6.0 + N / 2).to(DT), rtol=5e-3)
    assert torch.allclose(b, 6.0 + N * r2 / 2, rtol=5e-3)
    assert torch.allclose(state.noise_prec, a / b)


def test_bbb_learns_the_noise_and_predicts_with_sampled_precisions():
    """BBB with ``learn_noise``: q(tau) moves from its prior and each predictive sample carries its own tau ~ q."""
    g = torch.Generator().manual_seed(6)
    model = MLP([2, 4, 1])
    cfg = OmegaConf.create(dict(lr=0.01, betas=[0.9, 0.999], eps=1e-8, train_samples=2, local_reparam=False,
                                init_mean="uniform_fan_in", init_std=None, init_rho=-6.0, init_prec=None,
                                learn_noise=True, noise_prior_shape=6.0, noise_prior_rate=6.0, noise_lr=0.01))
    method = METHODS["bbb"](cfg, model, "gaussian")
    state = method.init(_problem(model), g)
    x = torch.randn(1, 16, 2, generator=g, dtype=DT)
    batch = Batch(x, 3 * torch.randn(1, 16, generator=g, dtype=DT), torch.tensor([40]))
    for _ in range(50):
        state, _ = method.update(state, batch, g)
    assert state.noise_prec[0] < 0.9      # residuals of variance ~9 pull E[tau] below the prior's 1
    pred = method.predict(state, x, 7, g)
    assert pred.noise_prec.shape == (1, 7) and pred.noise_prec.std() > 0


def test_learn_noise_without_its_prior_is_a_clear_error():
    """BBB's config leaves the Gamma prior unset (protocol=nng_uci sets it): turning learn_noise on alone says what is
    missing."""
    cfg = OmegaConf.structured(gamma_noise.NoiseConfig(learn_noise=True, noise_prior_shape=6.0))
    with pytest.raises(ConfigError, match="method.noise_prior_rate, method.noise_lr"):
        gamma_noise.learns_noise(cfg, "gaussian")
    assert not gamma_noise.learns_noise(OmegaConf.structured(gamma_noise.NoiseConfig()), "gaussian")


@pytest.mark.parametrize("name", ["noisy_adam", "noisy_kfac"])
def test_sampled_target_cotangents_are_the_likelihood_gradient_and_update_runs_without_autograd(name):
    """The Gaussian's sampled-target cotangent sqrt(tau) eps equals d log N(y~ | f, 1/tau) / df at y~ = f + eps /
    sqrt(tau); ``update`` (inference mode: no autograd graph) gives the same state as ``step`` with grad mode on."""
    from bnnbench.core.likelihoods import Gaussian

    g = torch.Generator().manual_seed(5)
    model = MLP([3, 4, 1])
    method = METHODS[name](OmegaConf.create(KFAC if name == "noisy_kfac" else ADAM), model, "gaussian")
    state = method.init(_problem(model), g)
    x, y = torch.randn(1, 6, 3, generator=g, dtype=DT), torch.randn(1, 6, generator=g, dtype=DT)
    batch = Batch(x, y, torch.tensor([40]))
    noise = method.noise(state, batch, g)
    layers = (method._layers_from_hom(method._weights(state, noise[0])) if name == "noisy_kfac"
              else model.sampled_layers(state.mean, method.std(state), noise[0]))
    f, _, _, _, ds = method._backprop_observed_and_sampled(state, layers, x, y, noise[1])
    lik = Gaussian(state.noise_prec)
    assert torch.allclose(ds[-1], lik.grad_f(f, lik.sample(f, noise[1])), rtol=1e-10, atol=1e-12)

    g_state = g.get_state()
    with torch.enable_grad():
        ref, _ = method.step(state, batch, method.noise(state, batch, g))
    g.set_state(g_state)
    new, _ = method.update(state, batch, g)
    assert new.mean.is_inference() and not ref.mean.is_inference()
    new = new.tensors()
    for k, v in ref.tensors().items():
        if v.is_floating_point():
            assert torch.equal(new[k], v), k


def test_one_by_one_factor_square_root_matches_the_general_path_and_clamps_alike():
    """A 1 x 1 damped factor X (a layer with one output): C = X^-1/2; X <= 0 (indefinite in floating point) is clamped
    at the damping floor as the eigenvalue path does; a non-finite X gives NaN (the engine stops the run)."""
    from bnnbench.methods.kfac.kronecker import inv_chol_t

    X = torch.tensor([[[4.0]], [[-1.0]], [[0.0]], [[float("nan")]], [[float("-inf")]]], dtype=DT)
    floor = torch.tensor([1.0, 0.25, 0.04, 1.0, 1.0], dtype=DT)
    C = inv_chol_t(X, floor)[:, 0, 0]
    assert torch.allclose(C[:3], torch.tensor([0.5, 2.0, 5.0], dtype=DT))
    assert torch.isnan(C[3:]).all()
    X2 = torch.cat([X[:3], torch.zeros(3, 1, 1, dtype=DT)], -1)         # the same factor padded to 2 x 2 with a
    X2 = torch.cat([X2, torch.tensor([0.0, 1.0], dtype=DT).expand(3, 1, 2)], -2)  # unit block: the general path
    C2 = inv_chol_t(X2, floor[:3])
    assert torch.allclose(C2[:, 0, 0], C[:3])


def test_a_factor_not_positive_definite_even_clamped_gives_nan_not_an_exception():
    """A diverging replica's factor (finite, ~1e307, rank one) cannot be factorised even with its eigenvalues clamped:
    its C is NaN, so the engine marks that replica diverged and a selection round scores it as failed, while the
    other replicas' factors are exact (C C^T = X^-1)."""
    from bnnbench.methods.kfac.kronecker import inv_chol_t
    X = torch.full((2, 3, 3), 1e307, dtype=torch.float64)
    X[1] = torch.eye(3, dtype=torch.float64) * 2 + 0.5
    C = inv_chol_t(X, torch.tensor([1e-3, 1e-3], dtype=torch.float64))
    assert torch.isnan(C[0]).all()
    assert torch.allclose(C[1] @ C[1].T, torch.linalg.inv(X[1]))


@pytest.mark.slow   # a compilation
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_compiled_factor_root_takes_the_fallback_as_the_eager_one_does(dtype):
    """Compiled (``compile=true``), ``inv_chol_t`` is one graph (``fullgraph``: its fallback an operator after the
    SIMD kernel, not a branch on the host) and gives the eager C: for positive definite factors, indefinite ones
    (eigenvalues clamped at the damping floor), a non-finite one and one not positive definite even clamped (NaN
    both)."""
    from bnnbench.methods.kfac.kronecker import inv_chol_t
    g = torch.Generator().manual_seed(0)
    A = torch.randn(6, 4, 4, generator=g, dtype=torch.float64)
    X = A @ A.transpose(1, 2) + 0.1 * torch.eye(4, dtype=torch.float64)           # positive definite
    X[1] = X[1] - 3 * torch.eye(4, dtype=torch.float64) * torch.linalg.eigvalsh(X[1])[0].abs()   # indefinite
    X[2, 0, 0] = float("nan")
    X[3] = 1e307 if dtype == torch.float64 else 1e37                             # rank one, huge
    X = X.to(dtype)
    floor = torch.full((6,), 1e-2, dtype=dtype)
    full = inv_chol_t(X, floor)
    assert torch.isfinite(full[[0, 1, 4, 5]]).all() and torch.isnan(full[2]).all() and torch.isnan(full[3]).all()
    compiled = torch.compile(inv_chol_t, fullgraph=True, dynamic=False)
    try:
        for batch in (X, X[[0, 4, 5]]):   # with and without a factor that needs the fallback
            eager, comp = inv_chol_t(batch, floor[:len(batch)]), compiled(batch, floor[:len(batch)])
            assert torch.equal(torch.isnan(comp), torch.isnan(eager))
            ok = ~torch.isnan(eager)
            assert torch.allclose(comp[ok], eager[ok], rtol=1e-5 if dtype == torch.float32 else 1e-12)
    finally:
        torch._dynamo.reset()


def test_the_compiled_fallback_clamps_the_failed_replicas_alone(monkeypatch):
    """After the SIMD kernel, the compiled fallback (``bnnbench::clamped_root_where_failed``) eigendecomposes only the
    factors whose factorisation failed (a selection round's diverging candidate must not cost every replica a
    float64 eigendecomposition at every step) and gives each the clamped root that the eager fallback gives, NaN
    where the factor is not finite (without decomposing it); the others keep the kernel's C, bit for bit."""
    from bnnbench.core.linalg import chol_root
    from bnnbench.methods.kfac import kronecker
    g = torch.Generator().manual_seed(1)
    A = torch.randn(5, 6, 6, generator=g, dtype=DT)
    X = A @ A.transpose(1, 2) + 0.1 * torch.eye(6, dtype=DT)
    X[3] = X[3] - 2 * torch.linalg.eigvalsh(X[3])[-1] * torch.eye(6, dtype=DT)     # indefinite
    floor = torch.full((5,), 1e-2, dtype=DT)
    C, info = chol_root.chol_root(X)
    assert (info != 0).tolist() == [False, False, False, True, False]
    sizes = []
    factor = kronecker._clamped_factor
    monkeypatch.setattr(kronecker, "_clamped_factor", lambda X, floor: sizes.append(len(X)) or factor(X, floor))
    out = torch.ops.bnnbench.clamped_root_where_failed(X, floor, C, info)
    assert sizes == [1]
    assert torch.equal(out[[0, 1, 2, 4]], C[[0, 1, 2, 4]])
    eager = kronecker.inv_chol_t(X, floor)      # eager: LAPACK, its own fallback for replica 3
    assert torch.allclose(out[3] @ out[3].T, eager[3] @ eager[3].T, rtol=1e-10)
    sizes.clear()
    assert torch.equal(torch.ops.bnnbench.clamped_root_where_failed(X, floor, C, torch.zeros_like(info)), C)
    assert sizes == []
    X[1, 2, 4] = X[1, 4, 2] = float("nan")   # a diverged replica's factor: NaN, with no eigendecomposition
    C, info = chol_root.chol_root(X)
    assert (info != 0).tolist() == [False, True, False, True, False]
    out = torch.ops.bnnbench.clamped_root_where_failed(X, floor, C, info)
    assert sizes == [1] and torch.isnan(out[1]).all() and torch.isnan(kronecker.inv_chol_t(X, floor)[1]).all()
    assert torch.equal(out[[0, 2, 4]], C[[0, 2, 4]])
    assert torch.allclose(out[3] @ out[3].T, eager[3] @ eager[3].T, rtol=1e-10)


@pytest.mark.parametrize("name", ["noisy_adam", "noisy_kfac", "noisy_kfac_blktri"])
def test_a_replicas_own_kl_weight_is_the_run_of_a_config_with_that_kl_weight(name):
    """Each replica's lambda (``Problem.hparams["kl_weight"]``, as a grid search over it gives one) makes exactly the
    posterior, steps and KL that a config with that ``kl_weight`` makes for the replica alone: the covariance scale
    lambda / N, the intrinsic damping lambda / (N eta) and the tempered KL all follow the replica's own lambda."""
    from torch.utils._pytree import tree_map

    g = torch.Generator().manual_seed(0)
    model = MLP([2, 3, 2, 1])
    lams = [1.0, 0.3, 0.05]
    R, N = len(lams), 20
    X, y = torch.randn(N, 2, generator=g, dtype=DT), torch.randn(N, generator=g, dtype=DT)
    cfg = {**(ADAM if name == "noisy_adam" else KFAC), "train_samples": 3}

    def problem(n_rep, hp=None):
        return Problem("gaussian", torch.tensor([N] * n_rep), torch.full((n_rep, model.n_params), 2.0, dtype=DT),
                       noise_prec=torch.full((n_rep,), 1.5, dtype=DT), y_scale=torch.ones(n_rep, dtype=DT),
                       hparams=hp or {})

    method = METHODS[name](OmegaConf.create(cfg), model, "gaussian")
    state = method.init(problem(R, {"kl_weight": torch.tensor(lams, dtype=DT)}), torch.Generator().manual_seed(1))
    alone = [METHODS[name](OmegaConf.create({**cfg, "kl_weight": lam}), model, "gaussian") for lam in lams]
    states = [m.init(problem(1), torch.Generator().manual_seed(1)) for m in alone]
    for r in range(R):   # the same initial mean: only lambda differs
        states[r] = states[r].replace(mean=state.mean[r:r + 1].clone())
    batch = Batch(X[None].expand(R, -1, -1), y[None].expand(R, -1), torch.tensor([N] * R))
    gn = torch.Generator().manual_seed(2)
    for t in range(4):
        noise = method.noise(state, batch, gn)
        state, _ = method.step(state, batch, noise, lr_scale=1.0 if t < 2 else 0.1)
        for r in range(R):
            states[r], _ = alone[r].step(states[r], Batch(X[None], y[None], torch.tensor([N])),
                                         tree_map(lambda v: v[r:r + 1], noise), lr_scale=1.0 if t < 2 else 0.1)
            assert torch.allclose(state.mean[r], states[r].mean[0], rtol=1e-10, atol=1e-13)
    eps = method.noise(state, batch, torch.Generator().manual_seed(3))[0]
    for r in range(R):
        assert torch.allclose(method.kl(state)[r], alone[r].kl(states[r])[0], rtol=1e-10)
        if name == "noisy_adam":   # q's sd sqrt(lambda / (N (f + gamma_in)))
            assert torch.allclose(method.std(state)[r], alone[r].std(states[r])[0], rtol=1e-10)
        else:                      # the draws from the same eps: the covariance (lambda / N) F^-1
            for w, w1 in zip(method._weights(state, eps), alone[r]._weights(states[r], [e[r:r + 1] for e in eps])):
                assert torch.allclose(w[r], w1[0], rtol=1e-10, atol=1e-13)
    # lambda matters: a replica's KL at 0.05 is not its KL at 1
    assert not torch.allclose(state.mean[0], state.mean[2])
    if name == "noisy_adam":   # init_std sets f so that lambda / (N (f + gamma_in)) = init_std^2, whatever the lambda
        sd0 = METHODS[name](OmegaConf.create({**cfg, "init_std": 0.01}), model, "gaussian")
        s0 = sd0.init(problem(R, {"kl_weight": torch.tensor(lams, dtype=DT)}), torch.Generator().manual_seed(1))
        assert torch.allclose(sd0.std(s0), torch.full_like(s0.mean, 0.01), rtol=1e-12)
