"""Probabilistic back-propagation (PBP; Hernandez-Lobato & Adams, ICML 2015), as the authors' code
(HIPS/Probabilistic-Backpropagation, theano/PBP_net) runs it.

Model: each layer's pre-activation is z = (W h + b) / sqrt(d_in + 1), ReLU between layers, y = f(x) + eps,
eps ~ N(0, 1/gamma); prior w ~ N(0, 1/lambda) on every weight and bias, lambda ~ Gamma(6, 6) and
gamma ~ Gamma(6, 6) (shape, rate; normalised targets). Approximation: q(w) = prod_p N(w_p | m_p, v_p),
q(gamma) = Gamma(a, b), q(lambda) = Gamma(a_lambda, b_lambda). Both precisions are learned: the run's fixed prior
and noise precisions (``Problem``) are not used.

Assumed density filtering, one data point at a time. The marginal likelihood of (x, y) under q, with the outputs'
mean and variance propagated through the network (``layer_moments``, ``relu_moments``) and the Student-t over gamma
taken as a Gaussian with the variance b / (a - 1),

    Z(a, b) = N(y | m_L(x), v_L(x) + b / (a - 1)),

updates every weight by the moment-matching rules of ADF (PBP_net network.py)

    m <- m + v d log Z / dm,        v <- v - v^2 [(d log Z / dm)^2 - 2 d log Z / dv],

and q(gamma) by matching the tilted distribution's first two moments (``gamma_moment_match``) from
Z(a, b), Z(a + 1, b), Z(a + 2, b). A weight update leaving a variance <= 1e-100 or a NaN keeps the old moments.
After every pass over the data, the prior factors N(w_p | 0, 1/lambda) are refined by expectation propagation,
one weight after another (``refine_prior``). A step processes its minibatch's points in order, all replicas at
once; the rows after a replica's own N in the engine's epoch (``engine.epoch_batches``: smaller sets wrap around)
are skipped, so that each replica sees each of its points once per epoch, as PBP does.

Predictions are PBP's moment-matched Gaussian N(y | m_L(x), v_L(x) + b / (a - 1)): ``predict`` draws f_s ~
N(m_L(x), v_L(x)) per test point with the noise precision (a - 1) / b, whose Monte Carlo test log-likelihood tends
to that of the Gaussian as S grows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from bnnbench.core import prng
from bnnbench.methods.base import Method, Predictive, Problem
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.state import State, state_class

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
MIN_VAR = 1e-100  # PBP_net's guard: a weight update leaving v below it (or a NaN) is undone


@dataclass(frozen=True)
class PBPConfig(MethodConfig):
    name: str = "pbp"
    prior_shape: float = 6.0        # Gamma(a, b) prior on the weights' precision lambda (PBP_net prior.py)
    prior_rate: float = 6.0
    noise_prior_shape: float = 6.0  # Gamma(a, b) prior on the noise precision gamma, normalised targets
    noise_prior_rate: float = 6.0
    refine_prior: bool = True       # EP refinement of the prior factors after every pass over the data


def relu_moments(m: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of max(z, 0) for z ~ N(m, v) (PBP_net network_layer.py), alpha = m / sqrt(v):

        E = Phi(alpha) (m + sqrt(v) r),   Var = E (m + sqrt(v) r) Phi(-alpha) + Phi(alpha) v (1 - r (r + alpha)),

    with the inverse Mills ratio r = phi(alpha) / Phi(alpha) (in logs: stable for very negative alpha)."""
    s = v.sqrt()
    alpha = m / s
    r = torch.exp(-0.5 * alpha * alpha - LOG_SQRT_2PI - torch.special.log_ndtr(alpha))
    cdf = torch.special.ndtr(alpha)
    m_aux = m + s * r
    mean = cdf * m_aux
    var = mean * m_aux * torch.special.ndtr(-alpha) + cdf * v * (1 - r * (r + alpha))
    return mean, var


def layer_moments(m: torch.Tensor, v: torch.Tensor | None, W_m, b_m, W_v, b_v) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of z = (h W + b) / sqrt(d_in + 1) for independent h ~ (m, v) ``[R, T, d_in]`` (``v``
    None: deterministic inputs) and factorised Gaussian weights ``W [R, d_in, d_out]``, ``b [R, d_out]``
    (PBP_net network_layer.py):

        E z = (m W_m + b_m) / sqrt(d_in + 1),
        Var z = (m^2 W_v + v W_m^2 + v W_v + b_v) / (d_in + 1)."""
    d_in = W_m.shape[-2]
    mean = (torch.bmm(m, W_m) + b_m.unsqueeze(1)) / math.sqrt(d_in + 1)
    var = torch.bmm(m * m, W_v) + b_v.unsqueeze(1)
    if v is not None:
        var = var + torch.bmm(v, W_m * W_m + W_v)
    return mean, var / (d_in + 1)


def gaussian_moment_match(m, v, dlogz_dm, dlogz_dv):
    """The mean and variance of N(m, v) times a factor with normaliser Z(m, v) (the ADF rules PBP uses)."""
    return m + v * dlogz_dm, v - v * v * (dlogz_dm * dlogz_dm - 2 * dlogz_dv)


def gamma_moment_match(a, b, log_z0, log_z1, log_z2):
    """Shape and rate of the Gamma with the mean and variance of Gamma(gamma | a, b) f(gamma) / Z(a, b), given
    log Z(a, b), log Z(a + 1, b), log Z(a + 2, b): E gamma = (a / b) Z1 / Z0,
    E gamma^2 = a (a + 1) / b^2 Z2 / Z0, so

        a' = [Z0 Z2 / Z1^2 (a + 1) / a - 1]^-1,      b' = [Z2 / Z1 (a + 1) / b - Z1 / Z0 a / b]^-1."""
    a_new = 1 / (torch.exp(log_z2 - 2 * log_z1 + log_z0) * (a + 1) / a - 1)
    b_new = 1 / (torch.exp(log_z2 - log_z1) * (a + 1) / b - torch.exp(log_z1 - log_z0) * a / b)
    return a_new, b_new


def log_gaussian(y, m, v):
    return -0.5 * torch.log(v) - LOG_SQRT_2PI - 0.5 * (y - m) ** 2 / v


@state_class
class PBPState(State):
    """q(w) = N(mean, var) ``[R, P]``; the prior factors' sites N(w_p | site_mnat / site_prec, 1 / site_prec) and
    Gamma(lambda | site_shape + 1, site_rate) ``[R, P]``; q(lambda) = Gamma(prior_a, prior_b) and q(gamma) =
    Gamma(noise_a, noise_b) ``[R]``; the replica's position ``pos`` in the engine's epoch and the epoch's largest
    training set ``n_max`` ``[R]``."""
    n_max: torch.Tensor
    pos: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor
    site_prec: torch.Tensor
    site_mnat: torch.Tensor
    site_shape: torch.Tensor
    site_rate: torch.Tensor
    prior_a: torch.Tensor
    prior_b: torch.Tensor
    noise_a: torch.Tensor
    noise_b: torch.Tensor


class PBP(Method):
    name = "pbp"
    Config = PBPConfig
    # PBP_net computes in float64 (theano's floatX); in float32, 2 of Boston's 20 replicas went non-finite in the
    # second epoch (nng_uci, seed 0)
    float64 = True
    # the per-point ADF update compiled (``compiled_step``); the loop over a minibatch's points and the prior's EP
    # sweep stay eager
    compilable = True

    def init(self, problem: Problem, generator: torch.Generator) -> PBPState:
        """q(w) = N(m_0, b_lambda / (a_lambda - 1)), m_0 ~ N(0, 1 / (d_in + 1)) (PBP_net breaks the symmetry with
        random means; the prior factors start at N(0, b_lambda / (a_lambda - 1)) with mean 0); q(lambda), q(gamma)
        their priors."""
        if self.likelihood != "gaussian":
            raise ValueError(f"pbp is a regression method (Gaussian likelihood), not {self.likelihood}")
        cfg = self.cfg
        lam = problem.prior_prec
        R, P = lam.shape
        eps = prng.randn(R, P, generator=generator, device=lam.device, dtype=lam.dtype)
        mean = eps * self.model.fan_in(lam.device, lam.dtype).add(1).rsqrt()
        a_w, b_w = cfg.prior_shape, cfg.prior_rate
        site_prec = torch.full_like(mean, (a_w - 1) / b_w)

        def per_replica(value):
            return torch.full((R,), float(value), device=lam.device, dtype=lam.dtype)
        n = problem.n_data
        return PBPState(n_data=n, prior_prec=lam, n_max=n.max().expand(R).clone(), pos=torch.zeros_like(n),
                        mean=mean, var=1 / site_prec, site_prec=site_prec, site_mnat=torch.zeros_like(mean),
                        site_shape=torch.zeros_like(mean), site_rate=torch.zeros_like(mean),
                        prior_a=per_replica(a_w), prior_b=per_replica(b_w),
                        noise_a=per_replica(cfg.noise_prior_shape), noise_b=per_replica(cfg.noise_prior_rate))

    def output_moments(self, mean: torch.Tensor, var: torch.Tensor, x: torch.Tensor):
        """Mean and variance ``[R, T, d_out]`` of the network's outputs at ``x [R, T, D]`` under q(w)."""
        m, v = x, None
        layers = list(zip(self.model.layers(mean), self.model.layers(var)))
        for i, ((W_m, b_m), (W_v, b_v)) in enumerate(layers):
            m, v = layer_moments(m, v, W_m, b_m, W_v, b_v)
            if i < len(layers) - 1:
                m, v = relu_moments(m, v)
        return m, v

    def noise(self, state, batch, generator):
        return None

    def log_z(self, mean, var, a, b, x, y):
        """log Z(a, b) ``[R]`` of the point ``(x [R, D], y [R])`` under q, with the output's mean and variance."""
        m, v = self.output_moments(mean, var, x.unsqueeze(1))
        m, v = m[:, 0, 0], v[:, 0, 0]
        return log_gaussian(y, m, v + b / (a - 1)), m, v

    @staticmethod
    def matched(mean, var, a, b, y, m, v, log_z, g_m, g_v):
        """The ADF rules from log Z and its gradients: the new (mean, var), where they are usable ``ok`` (variance
        above ``MIN_VAR``, no NaN), and q(gamma)'s new (a, b)."""
        new_mean, new_var = gaussian_moment_match(mean, var, g_m, g_v)
        ok = (new_var > MIN_VAR) & ~torch.isnan(new_mean) & ~torch.isnan(new_var)  # NaN > x is False
        new_a, new_b = gamma_moment_match(a, b, log_z, log_gaussian(y, m, v + b / a),
                                          log_gaussian(y, m, v + b / (a + 1)))
        return new_mean, new_var, ok, new_a, new_b

    def adf_update(self, state: PBPState, x: torch.Tensor, y: torch.Tensor) -> tuple[dict, torch.Tensor]:
        """One ADF update on the point ``(x [R, D], y [R])`` of every replica: the new (mean, var, noise_a,
        noise_b) and log Z(a, b) ``[R]``."""
        a, b = state.noise_a, state.noise_b
        mean = state.mean.detach().requires_grad_(True)
        var = state.var.detach().requires_grad_(True)
        with torch.enable_grad():
            log_z, m, v = self.log_z(mean, var, a, b, x, y)
            g_m, g_v = torch.autograd.grad(log_z.sum(), [mean, var])
        m, v, log_z = m.detach(), v.detach(), log_z.detach()
        new_mean, new_var, ok, new_a, new_b = self.matched(state.mean, state.var, a, b, y, m, v, log_z, g_m, g_v)
        return {"mean": torch.where(ok, new_mean, state.mean), "var": torch.where(ok, new_var, state.var),
                "noise_a": new_a, "noise_b": new_b}, log_z

    def adf_point(self, mean, var, a, b, x, y, real, log_z_sum):
        """``adf_update`` on the point ``(x [R, D], y [R])`` where ``real [R]`` (the others keep their moments) as one
        function of tensors, its gradients by ``torch.func.grad``: what the compiled step compiles. Returns the new
        ``(mean, var, noise_a, noise_b)`` and ``log_z_sum`` plus the real replicas' log Z(a, b)."""
        def summed(mean, var):
            log_z, m, v = self.log_z(mean, var, a, b, x, y)
            return log_z.sum(), (m, v, log_z)

        (g_m, g_v), (m, v, log_z) = torch.func.grad(summed, argnums=(0, 1), has_aux=True)(mean, var)
        new_mean, new_var, ok, new_a, new_b = self.matched(mean, var, a, b, y, m, v, log_z, g_m, g_v)
        ok = real[:, None] & ok
        return (torch.where(ok, new_mean, mean), torch.where(ok, new_var, var), torch.where(real, new_a, a),
                torch.where(real, new_b, b), log_z_sum + torch.where(real, log_z, torch.zeros_like(log_z)))

    def compiled_step(self, compile):
        """``step`` with each point's ADF update (``adf_point``) compiled by ``compile``: the update is a few dozen
        small kernels on ``[R, P]``, so eagerly a step is bound by their dispatch."""
        point = compile(self.adf_point)

        def step(state, batch, noise, lr_scale=1.0):
            return self.step(state, batch, noise, lr_scale, point=point)
        return step

    def step(self, state, batch, noise, lr_scale=1.0, point=None):
        """ADF over the minibatch's points in turn; the prior's EP refinement for the replicas whose pass over
        their data ended in this minibatch. ``lr_scale`` does not apply (PBP has no step size). ``point``: the
        compiled ``adf_point`` (``compiled_step``)."""
        B = batch.x.shape[1]
        n, pos = state.n_data, state.pos
        new = state
        log_z_sum = torch.zeros_like(state.noise_a)
        moments = (state.mean, state.var, state.noise_a, state.noise_b)
        for j in range(B):
            real = pos + j < n
            if not bool(real.any()):
                break
            if point is not None:
                *moments, log_z_sum = point(*moments, batch.x[:, j], batch.y[:, j], real, log_z_sum)
                continue
            upd, log_z = self.adf_update(new, batch.x[:, j], batch.y[:, j])
            new = new.replace(**{k: torch.where(real.view(-1, *[1] * (val.dim() - 1)), val, getattr(new, k))
                                 for k, val in upd.items()})
            log_z_sum = log_z_sum + torch.where(real, log_z, torch.zeros_like(log_z))
        if point is not None:
            new = new.replace(**dict(zip(("mean", "var", "noise_a", "noise_b"), moments)))
        seen = (n - pos).clamp(0, B)
        done = (pos < n) & (pos + B >= n)
        if self.cfg.refine_prior and bool(done.any()):
            new = self.refine_prior(new, done)
        epoch_len = (state.n_max + B - 1) // B * B
        objective = -log_z_sum / seen.clamp_min(1).to(log_z_sum.dtype)
        return new.replace(pos=(pos + B) % epoch_len), {"objective": objective}

    def refine_order(self) -> list[int]:
        """The flat indices of the parameters in PBP_net's order of refinement: layer by layer, each output unit's
        weights then its bias."""
        order = []
        for w, b, d_in, d_out in self.model.slices:
            for j in range(d_out):
                order += [w.start + k * d_out + j for k in range(d_in)] + [b.start + j]
        return order

    def refine_prior(self, state: PBPState, where: torch.Tensor) -> PBPState:
        """One EP sweep over the prior factors N(w_p | 0, 1/lambda) Gamma(lambda), one weight after another
        (PBP_net prior.py), for the replicas ``where``. Each weight: the cavity q / site in w_p and in
        lambda; the tilted distribution's moments from Z = N(m_cav | 0, v_cav + b_cav / (a_cav - 1)) as in the ADF
        update; the site becomes the new q over the cavity. Skipped where the cavity is improper
        (v_cav <= 0 or >= 1e6, b_cav <= 0, a_cav <= 1)."""
        order = torch.tensor(self.refine_order(), device=state.mean.device)
        cols = {k: getattr(state, k)[:, order].T.contiguous() for k in ("mean", "var", "site_prec", "site_mnat",
                                                                       "site_shape", "site_rate")}
        out = {k: [] for k in cols}
        a, b = state.prior_a, state.prior_b
        for p in range(order.numel()):
            m, v = cols["mean"][p], cols["var"][p]
            cav_prec = 1 / v - cols["site_prec"][p]
            cav_mnat = m / v - cols["site_mnat"][p]
            v_cav = 1 / cav_prec
            m_cav = cav_mnat * v_cav
            a_cav = a - cols["site_shape"][p]
            b_cav = b - cols["site_rate"][p]
            ok = where & (v_cav > 0) & (v_cav < 1e6) & (b_cav > 0) & (a_cav > 1)
            s0 = v_cav + b_cav / (a_cav - 1)
            log_z0 = log_gaussian(0.0, m_cav, s0)
            m_new, v_new = gaussian_moment_match(m_cav, v_cav, -m_cav / s0, 0.5 * (m_cav * m_cav / s0 - 1) / s0)
            a_new, b_new = gamma_moment_match(a_cav, b_cav, log_z0, log_gaussian(0.0, m_cav, v_cav + b_cav / a_cav),
                                              log_gaussian(0.0, m_cav, v_cav + b_cav / (a_cav + 1)))
            new = {"mean": m_new, "var": v_new, "site_prec": 1 / v_new - cav_prec,
                   "site_mnat": m_new / v_new - cav_mnat, "site_shape": a_new - a_cav, "site_rate": b_new - b_cav}
            for k, val in new.items():
                out[k].append(torch.where(ok, val, cols[k][p]))
            a, b = torch.where(ok, a_new, a), torch.where(ok, b_new, b)
        return state.replace(prior_a=a, prior_b=b, **{
            k: torch.empty_like(getattr(state, k)).index_copy_(1, order, torch.stack(vals, 1))
            for k, vals in out.items()})

    def predict(self, state, x, n_samples, generator):
        """f_s ~ N(m_L(x), v_L(x)) per test point with the noise precision (a - 1) / b: PBP's moment-matched
        predictive N(y | m_L, v_L + b / (a - 1)) by S samples."""
        m, v = self.output_moments(state.mean, state.var, x)
        eps = prng.randn(m.shape[0], n_samples, *m.shape[1:], generator=generator, device=m.device, dtype=m.dtype)
        return Predictive(f=m.unsqueeze(1) + v.sqrt().unsqueeze(1) * eps,
                          noise_prec=(state.noise_a - 1) / state.noise_b)
