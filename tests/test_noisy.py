"""Noisy natural gradient: K-FAC factors against the explicit Fisher, the sampled weights'
Kronecker covariance (eq. 13), the Gamma KL, and the noisy-Adam step against its equations."""

import math

import torch
from omegaconf import OmegaConf

from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.methods.noisy import kl_gamma
from bnnbench.models import MLP

DT = torch.float64
BASE = dict(lr=0.01, kl_weight=1.0, damping_ex=0.0, train_samples=2, init_mean="uniform_fan_in", learn_noise=True,
            noise_prior_shape=6.0, noise_prior_rate=6.0, noise_lr=0.001)
KFAC = dict(BASE, beta=0.1, T_stats=1, T_inv=1, factor_init=1.0)
ADAM = dict(BASE, betas=[0.9, 0.999], f_init=0.0)


def _problem(model, N=40, lam=2.0):
    return Problem("gaussian", torch.tensor([N]), torch.full((1, model.n_params), lam, dtype=DT),
                   noise_prec=torch.tensor([1.0], dtype=DT), y_scale=torch.ones(1, dtype=DT))


def test_kl_gamma_matches_torch():
    a, b = torch.tensor([2.5, 7.0], dtype=DT), torch.tensor([0.5, 3.0], dtype=DT)
    ref = torch.distributions.kl_divergence(torch.distributions.Gamma(a, b), torch.distributions.Gamma(6.0, 6.0))
    assert torch.allclose(kl_gamma(a, b, 6.0, 6.0), ref)


def test_sampled_weights_have_the_kronecker_covariance_of_eq13():
    g = torch.Generator().manual_seed(0)
    model = MLP([2, 3, 1])
    method = METHODS["noisy_kfac"](OmegaConf.create(KFAC), model, "gaussian")
    state = method.init(_problem(model), g)
    R = 1
    for l, (_, _, d_in, d_out) in enumerate(model.slices):  # arbitrary SPD factors
        X = torch.randn(R, d_in + 1, d_in + 1, generator=g, dtype=DT)
        Y = torch.randn(R, d_out, d_out, generator=g, dtype=DT)
        state[f"A{l}"] = X @ X.transpose(1, 2) + 0.1 * torch.eye(d_in + 1, dtype=DT)
        state[f"S{l}"] = Y @ Y.transpose(1, 2) + 0.1 * torch.eye(d_out, dtype=DT)
    state = method._refresh(state, covariance=True, inverses=True)
    N, lam, kl = 40, 2.0, 1.0
    g_in = kl * lam / N
    for l, (_, _, d_in, d_out) in enumerate(model.slices):
        A, S = state[f"A{l}"][0], state[f"S{l}"][0]
        pi = math.sqrt((A.trace() / A.shape[0]) / (S.trace() / S.shape[0]))
        A_d = A + pi * math.sqrt(g_in) * torch.eye(A.shape[0], dtype=DT)
        S_d = S + math.sqrt(g_in) / pi * torch.eye(S.shape[0], dtype=DT)
        n = (d_in + 1) * d_out
        E = torch.eye(n, dtype=DT).reshape(n, d_in + 1, d_out)  # W - M is linear in eps: read off its matrix
        eps = [torch.zeros(1, n, di + 1, do, dtype=DT) for _, _, di, do in model.slices]
        eps[l] = E[None]
        Wc = method._sample_hom(state, eps)[l][0] - method._hom(state["mean"], l)[0]
        T = Wc.reshape(n, n).T
        cov = T @ T.T  # Cov of vec(W) (row-major)
        assert torch.allclose(cov, torch.kron(kl / N * torch.linalg.inv(A_d), torch.linalg.inv(S_d)), rtol=1e-8, atol=1e-12)
        assert torch.allclose(state[f"iA{l}"][0], torch.linalg.inv(A_d)) and torch.allclose(state[f"iS{l}"][0], torch.linalg.inv(S_d))


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
    state["noise_prec"] = torch.tensor([tau], dtype=DT)
    x, y = torch.randn(1, 1, 2, generator=g, dtype=DT), torch.randn(1, 1, generator=g, dtype=DT)
    new, _ = method.step(state, Batch(x, y, torch.tensor([40])), method.noise(state, Batch(x, y, None), g))
    theta = state["mean"][0]
    for l in range(2):
        hom = method._hom(theta, l)

        def f_of(h, l=l):
            th = theta.clone()
            w, b, d_in, d_out = model.slices[l]
            th = torch.cat([th[:w.start], h[:-1].flatten(), h[-1], th[b.stop:]])
            return model.forward(th[None, None], x)[0, 0, 0, 0]

        J = jacrev(f_of)(hom).flatten()
        F = tau * torch.outer(J, J)
        K = torch.kron(new[f"A{l}"][0], new[f"S{l}"][0])
        assert torch.allclose(K, F, rtol=0.05, atol=0.05 * F.abs().max().item())


def test_noisy_adam_step_matches_algorithm_1():
    g = torch.Generator().manual_seed(2)
    model = MLP([2, 3, 1])
    cfg = dict(ADAM, learn_noise=False, train_samples=3)
    method = METHODS["noisy_adam"](OmegaConf.create(cfg), model, "gaussian")
    state = method.init(_problem(model), g)
    P, N, lam, tau = model.n_params, 40, 2.0, 1.0
    x, y = torch.randn(1, 5, 2, generator=g, dtype=DT), torch.randn(1, 5, generator=g, dtype=DT)
    batch = Batch(x, y, torch.tensor([N]))
    mu, m, f = state["mean"][0].clone(), torch.zeros(P, dtype=DT), torch.zeros(P, dtype=DT)
    g_in = lam / N

    def grad_ll(w, yy):
        w = w.clone().requires_grad_(True)
        out = model.forward(w[None, None], x)[0, 0, :, 0]
        ll = (0.5 * math.log(tau) - 0.5 * math.log(2 * math.pi) - 0.5 * tau * (yy - out) ** 2).mean()
        return torch.autograd.grad(ll, w)[0], out.detach()

    for k in range(1, 4):
        eps, yn = method.noise(state, batch, g)
        state, _ = method.step(state, batch, (eps, yn))
        std = torch.sqrt(1.0 / N / (f + g_in))
        vs, fs = [], []
        for s in range(3):
            w = mu + std * eps[0, s]
            gr, out = grad_ll(w, y[0])
            gs, _ = grad_ll(w, out + yn[0, s] / math.sqrt(tau))  # targets sampled from the model
            vs.append(gr - g_in * w)
            fs.append(gs ** 2)
        m = 0.9 * m + 0.1 * torch.stack(vs).mean(0)
        f = 0.999 * f + 0.001 * torch.stack(fs).mean(0)
        mu = mu + 0.01 * (m / (1 - 0.9 ** k)) / (f + g_in)
        assert torch.allclose(state["mean"][0], mu, rtol=1e-10, atol=1e-12)
        assert torch.allclose(state["f"][0], f, rtol=1e-10, atol=1e-15)


def test_matrix_normal_kl_against_dense():
    g = torch.Generator().manual_seed(5)
    model = MLP([2, 3, 1])
    method = METHODS["noisy_kfac"](OmegaConf.create(dict(KFAC, kl_weight=0.7)), model, "gaussian")
    state = method.init(_problem(model, lam=2.0), g)
    for l, (_, _, d_in, d_out) in enumerate(model.slices):
        X = torch.randn(1, d_in + 1, d_in + 1, generator=g, dtype=DT)
        state[f"A{l}"] = X @ X.transpose(1, 2) + 0.3 * torch.eye(d_in + 1, dtype=DT)
    state = method._refresh(state, covariance=True, inverses=True)
    state["mean"] = torch.randn(1, model.n_params, generator=g, dtype=DT)
    ref = 0.0
    for l, (_, _, d_in, d_out) in enumerate(model.slices):
        U = state[f"cA{l}"][0] @ state[f"cA{l}"][0].T
        V = state[f"cS{l}"][0] @ state[f"cS{l}"][0].T
        M = method._hom(state["mean"], l)[0].flatten()
        k = M.numel()
        q = torch.distributions.MultivariateNormal(M, covariance_matrix=torch.kron(U, V))
        p = torch.distributions.MultivariateNormal(torch.zeros(k, dtype=DT), covariance_matrix=0.5 * torch.eye(k, dtype=DT))
        ref += torch.distributions.kl_divergence(q, p)
    assert torch.allclose(method.kl(state)[0], 0.7 * ref)
