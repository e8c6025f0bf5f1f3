"""Probabilistic back-propagation: the moment propagation against Monte Carlo, the ADF update of a linear model
against the dense Gaussian algebra of its tilted distribution, the Gamma moment matching against numerical
integration, and the epoch bookkeeping (wrapped rows skipped, the prior refined per replica)."""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy import integrate, stats

from bnnbench.methods import METHODS, Batch, Problem
from bnnbench.methods.adf.pbp import PBP, gamma_moment_match, layer_moments, relu_moments
from bnnbench.core.models import MLP

DT = torch.float64


def _method(model, **settings):
    return PBP(OmegaConf.merge(OmegaConf.structured(METHODS["pbp"].Config), settings), model, "gaussian")


def _problem(model, n_data):
    R = len(n_data)
    return Problem("gaussian", torch.tensor(n_data), torch.ones(R, model.n_params, dtype=DT))


def _assert_mc_moments(samples, mean, var, k=5.0):
    """``samples [n, ...]`` have the mean and variance ``mean``, ``var`` within k Monte Carlo standard errors
    (of the sample mean: sd / sqrt(n); of the sample variance: sqrt((m4 - var^2) / n))."""
    n = samples.shape[0]
    mc_mean, mc_var = samples.mean(0), samples.var(0)
    m4 = ((samples - mc_mean) ** 4).mean(0)
    assert torch.all((mc_mean - mean).abs() <= k * (mc_var / n).sqrt()), (mc_mean, mean)
    assert torch.all((mc_var - var).abs() <= k * ((m4 - mc_var ** 2) / n).sqrt()), (mc_var, var)


def test_first_layer_moments_through_relu_equal_monte_carlo():
    """Deterministic inputs and factorised Gaussian weights: the pre-activation is Gaussian, so the ReLU outputs'
    mean and variance are exact; checked against 400 000 draws of the weights."""
    g = torch.Generator().manual_seed(0)
    d_in, d_out, n = 3, 4, 400_000
    x = torch.randn(1, 2, d_in, generator=g, dtype=DT)
    W_m, b_m = torch.randn(1, d_in, d_out, generator=g, dtype=DT), torch.randn(1, d_out, generator=g, dtype=DT)
    W_v, b_v = torch.rand(1, d_in, d_out, generator=g, dtype=DT) + 0.1, torch.rand(1, d_out, generator=g, dtype=DT)
    mean, var = relu_moments(*layer_moments(x, None, W_m, b_m, W_v, b_v))
    W = W_m + W_v.sqrt() * torch.randn(n, d_in, d_out, generator=g, dtype=DT)
    b = b_m + b_v.sqrt() * torch.randn(n, d_out, generator=g, dtype=DT)
    h = torch.relu((x[0] @ W + b[:, None, :]) / math.sqrt(d_in + 1))      # [n, 2, d_out]
    _assert_mc_moments(h, mean[0], var[0])


def test_hidden_layer_moments_equal_monte_carlo():
    """Independent Gaussian inputs times independent Gaussian weights: the pre-activation's mean and variance are
    exact (its law is not Gaussian); the ReLU's moments are exact for a Gaussian pre-activation. Each against
    400 000 draws."""
    g = torch.Generator().manual_seed(1)
    d_in, d_out, n = 4, 3, 400_000
    m_in, v_in = torch.randn(1, 1, d_in, generator=g, dtype=DT), torch.rand(1, 1, d_in, generator=g, dtype=DT)
    W_m, b_m = torch.randn(1, d_in, d_out, generator=g, dtype=DT), torch.randn(1, d_out, generator=g, dtype=DT)
    W_v, b_v = torch.rand(1, d_in, d_out, generator=g, dtype=DT), torch.rand(1, d_out, generator=g, dtype=DT)
    m_z, v_z = layer_moments(m_in, v_in, W_m, b_m, W_v, b_v)
    h = m_in[0, 0] + v_in[0, 0].sqrt() * torch.randn(n, d_in, generator=g, dtype=DT)
    W = W_m[0] + W_v[0].sqrt() * torch.randn(n, d_in, d_out, generator=g, dtype=DT)
    b = b_m[0] + b_v[0].sqrt() * torch.randn(n, d_out, generator=g, dtype=DT)
    z = (torch.einsum("ni,nio->no", h, W) + b) / math.sqrt(d_in + 1)
    _assert_mc_moments(z, m_z[0, 0], v_z[0, 0])
    m = torch.tensor([-1.0, -0.5, 0.0, 1.2], dtype=DT)
    v = torch.tensor([0.5, 2.0, 1.0, 0.3], dtype=DT)
    mean, var = relu_moments(m, v)
    _assert_mc_moments(torch.relu(m + v.sqrt() * torch.randn(n, 4, generator=g, dtype=DT)), mean, var)


def test_relu_moments_stay_finite_far_in_the_tail():
    """alpha = m / sqrt(v) = -40: Phi(alpha) underflows the naive ratio; mean and variance are small and positive,
    E relu(z) ~ sqrt(v) phi(alpha) / alpha^2 (Mills' ratio's expansion)."""
    m, v = torch.tensor([-40.0], dtype=DT), torch.tensor([1.0], dtype=DT)
    mean, var = relu_moments(m, v)
    assert torch.isfinite(mean).all() and torch.isfinite(var).all()
    ref = stats.norm.pdf(40.0) / 40.0 ** 2
    assert mean.item() == pytest.approx(ref, rel=5e-3) and var.item() >= 0


def test_adf_update_of_a_linear_model_equals_the_tilted_moments():
    """One layer, no ReLU, the noise variance b / (a - 1) held at sigma^2: each ADF update's mean and variances are
    those of the tilted distribution N(w | m, diag v) N(y | phi^T w, sigma^2), phi = [x, 1] / sqrt(d + 1), by dense
    Gaussian algebra: Sigma = (diag(1/v) + phi phi^T / sigma^2)^-1, mu = Sigma (m / v + phi y / sigma^2)."""
    g = torch.Generator().manual_seed(2)
    d, sigma2 = 3, 0.3
    model = MLP([d, 1])
    method = _method(model)
    state = method.init(_problem(model, [10]), g)
    state = state.replace(var=torch.rand(1, model.n_params, generator=g, dtype=DT) + 0.5)
    m, v = state.mean[0].clone(), state.var[0].clone()
    for _ in range(6):
        x, y = torch.randn(1, d, generator=g, dtype=DT), torch.randn(1, generator=g, dtype=DT)
        state = state.replace(noise_a=torch.tensor([3.0], dtype=DT), noise_b=torch.tensor([2 * sigma2], dtype=DT))
        upd, _ = method.adf_update(state, x, y)
        phi = torch.cat([x[0], torch.ones(1, dtype=DT)]) / math.sqrt(d + 1)   # flat layout [W (d x 1), b]
        cov = torch.linalg.inv(torch.diag(1 / v) + torch.outer(phi, phi) / sigma2)
        m, v = cov @ (m / v + phi * y[0] / sigma2), torch.diagonal(cov).clone()
        assert torch.allclose(upd["mean"][0], m, rtol=1e-12, atol=1e-13)
        assert torch.allclose(upd["var"][0], v, rtol=1e-12, atol=1e-13)
        state = state.replace(mean=upd["mean"], var=upd["var"])


@pytest.mark.parametrize("a, b, y, m, v", [(6.0, 6.0, 0.8, 0.1, 0.2), (40.0, 7.0, -1.5, 0.3, 0.05),
                                           (2.5, 0.4, 2.0, -0.5, 1.0)])
def test_gamma_moment_match_equals_the_tilted_moments_by_quadrature(a, b, y, m, v):
    """Gamma(gamma | a, b) times f(gamma) = N(y | m, v + 1/gamma) (the exact Student-t likelihood factor): with
    Z(a + k, b) by quadrature, the matched Gamma's mean and variance are the tilted distribution's, also by
    quadrature."""
    def f(t):
        return stats.norm.pdf(y, m, math.sqrt(v + 1 / t))

    def z(shape, power=0):
        return integrate.quad(lambda t: t ** power * stats.gamma.pdf(t, shape, scale=1 / b) * f(t), 0, np.inf,
                              epsabs=0, epsrel=1e-12, limit=200)[0]
    log_z = [torch.tensor(math.log(z(a + k)), dtype=DT) for k in range(3)]
    a_new, b_new = gamma_moment_match(torch.tensor(a, dtype=DT), torch.tensor(b, dtype=DT), *log_z)
    e1, e2 = z(a, 1) / z(a), z(a, 2) / z(a)
    assert (a_new / b_new).item() == pytest.approx(e1, rel=1e-8)
    assert (a_new / b_new ** 2).item() == pytest.approx(e2 - e1 ** 2, rel=1e-7)


def test_refinement_visits_every_parameter_once():
    model = MLP([3, 4, 2, 1])
    order = _method(model).refine_order()
    assert sorted(order) == list(range(model.n_params))


def test_wrapped_rows_are_skipped_and_each_replica_refines_its_own_prior_alone():
    """Replicas of 4, 2 and 4 points in minibatches of 3 (the engine's epoch: 6 rows, the second replica's last 4
    and the others' last 2 wrap around): a wrapped row changes nothing (NaN there leaves the state finite), the
    refinement runs when a replica's pass ends, and every replica's steps equal its steps alone."""
    g = torch.Generator().manual_seed(3)
    model = MLP([2, 3, 1])
    method = _method(model)
    n = [4, 2, 4]
    state = method.init(_problem(model, n), g)
    x, y = torch.randn(3, 6, 2, generator=g, dtype=DT), torch.randn(3, 6, generator=g, dtype=DT)
    for r, n_r in enumerate(n):
        x[r, n_r:], y[r, n_r:] = float("nan"), float("nan")
    prior0 = state.prior_a.clone()
    for k in range(2):  # one epoch, two minibatches
        batch = Batch(x[:, 3 * k:3 * k + 3], y[:, 3 * k:3 * k + 3], state.n_data)
        new, st = method.step(state, batch, None)
        for r in range(3):
            alone, st_r = method.step(state[r], Batch(batch.x[r:r + 1], batch.y[r:r + 1],
                                                      batch.n_data[r:r + 1]), None)
            alone = alone.tensors()
            for key, v in new.tensors().items():
                assert torch.equal(v[r:r + 1], alone[key]), (key, r)
            assert torch.equal(st["objective"][r:r + 1], st_r["objective"])
        assert all(torch.isfinite(v).all() for v in new.tensors().values() if v.is_floating_point())
        refined = new.prior_a != state.prior_a
        assert refined.tolist() == ([False, True, False] if k == 0 else [True, False, True])
        state = new
    assert state.pos.tolist() == [0, 0, 0] and not torch.equal(state.prior_a, prior0)


def test_a_float32_run_gives_pbp_float64_data_and_state():
    """``dtype=float32`` (the default) still trains PBP in float64 (``Method.float64``; ``fit.program``)."""
    from types import SimpleNamespace

    from bnnbench.run.fit import FitOptions, program
    from bnnbench.run.protocol import RunSpec
    rng = np.random.default_rng(0)
    ds = SimpleNamespace(X=rng.normal(size=(30, 3)), y=rng.normal(size=30))
    spec = RunSpec(method=OmegaConf.structured(METHODS["pbp"].Config), model_hidden=[4], activation="relu",
                   task="regression", likelihood="gaussian", epochs=1, batch_size=5, eval_samples=2, eval_every=None,
                   normalize_x=True, normalize_y=True, noise_prec_units="normalised", bias_prior_prec=None,
                   loglik="pointwise")
    opts = FitOptions(device=torch.device("cpu"), dtype=torch.float32)
    method, data, problem = program(spec, ds, [(np.arange(20), np.arange(20, 30))], None,
                                    [{"prior_prec": 1.0, "noise_prec": 1.0}], opts)
    state = method.init(problem, torch.Generator().manual_seed(0))
    assert data.x_train.dtype == DT and state.mean.dtype == DT and state.noise_a.dtype == DT


@pytest.mark.slow   # one compilation, about 20-60 s in a fresh inductor cache
def test_the_compiled_step_equals_the_eager_one_across_the_ends_of_passes():
    """``compile=true`` (``PBP.compiled_step``: each point's ADF update compiled) through minibatches that run past
    some replicas' data (their rows skipped) and end their passes (the prior refined for those replicas): every
    state entry and the objective equal the eager step's to 1e-12 relative, at every step. Relative to the entry's
    largest value, except the sites' natural means: ``site_mnat = m / v - cav_mnat`` is a difference of natural means
    of order |m / v| that is near 0 here (the prior's mean is 0), so its rounding is relative to max |m / v|."""
    from bnnbench.run.compiled import compiled_step
    g = torch.Generator().manual_seed(3)
    model = MLP([3, 5, 1])
    method = _method(model)
    state = method.init(_problem(model, [7, 5, 9]), g)
    step = compiled_step(method)
    for _ in range(7):   # B = 4: the epoch is 12 rows, so passes end at steps 2 and 3 and the rows after n are skipped
        batch = Batch(torch.randn(3, 4, 3, generator=g, dtype=DT), torch.randn(3, 4, generator=g, dtype=DT),
                      state.n_data)
        eager, e_stats = method.step(state, batch, None)
        comp, c_stats = step(state, batch, None)
        comp = comp.tensors()
        for key, v in eager.tensors().items():
            if v.is_floating_point():
                scale = (eager.mean / eager.var).abs().max() if key == "site_mnat" else v.abs().max()
                assert float((comp[key] - v).abs().max() / scale.clamp_min(1e-300)) <= 1e-12, key
            else:
                assert torch.equal(comp[key], v), key
        assert torch.allclose(c_stats["objective"], e_stats["objective"], rtol=1e-12, atol=0)
        state = eager
