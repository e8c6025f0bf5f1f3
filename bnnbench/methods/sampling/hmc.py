"""Hamiltonian Monte Carlo over the network's weights, C chains in every replica (Neal 2011, "MCMC using
Hamiltonian dynamics", Handbook of Markov Chain Monte Carlo, ch. 5).

The position q is the flat weight vector theta ``[P]`` or, with ``learn_noise``, (theta, z) with z = log tau the
log noise precision; the potential is the negative log joint density on the replica's N training rows,

    U(theta) = (tau / 2) sum_i (y_i - f(x_i; theta))^2 + (1/2) sum_p lambda_p theta_p^2                 (+ const),
    U(theta, z) = (e^z / 2) sum_i (y_i - f(x_i; theta))^2 - (N/2) z + (1/2) sum_p lambda_p theta_p^2
                  - a0 z + b0 e^z                        (tau ~ Gamma(a0, b0), the Jacobian d tau / dz = tau included),

and its gradient is back-propagated in closed form (``linalg.full_batch``: no autograd graph). A transition draws
p ~ N(0, M), M = diag(m) the mass matrix, and takes L leapfrog steps of size eps (Neal eq. 5.18-5.20),

    p <- p - (eps/2) grad U(q);   L times: q <- q + eps M^-1 p,  p <- p - eps grad U(q)   (the last momentum step
    halved),

then accepts (q', p') with probability alpha = min(1, exp(H(q, p) - H(q', p'))), H(q, p) = U(q) + p^T M^-1 p / 2.
With ``leapfrog_jitter`` j, each chain draws its L uniformly from {ceil((1 - j) L_max), ..., L_max} per transition.

Step size: during the first ``warmup`` transitions each chain adapts log eps by dual averaging towards the
acceptance rate delta = ``target_accept`` (Hoffman & Gelman 2014, "The No-U-Turn Sampler", JMLR 15, sec. 3.2.1):

    H_m = (1 - 1/(m + t0)) H_{m-1} + (delta - alpha_m) / (m + t0),   log eps_m = mu - sqrt(m) / gamma H_m,
    log eps_bar_m = m^-kappa log eps_m + (1 - m^-kappa) log eps_bar_{m-1},    mu = log(10 eps_0);

afterwards eps = eps_bar is frozen. Before the first adaptation eps_bar = eps_0 (its first update, of weight
1^-kappa = 1, overwrites it): without a warm-up every transition takes eps_0 = ``step_size``. With ``adapt_mass``,
M^-1 is the identity at first and then, as in Stan, the regularised variances of each coordinate's draws in windows
of the warm-up (``HMC.adapt``). After the warm-up every ``thin``-th state is kept in a ring buffer of the last
``keep`` per chain, stored in float32 whatever the run's dtype (compact: R C K P numbers); predictions use the kept
draws of all chains. The engine's epochs are transitions: HMC needs full-batch gradients (``full_batch``), so each
epoch is one batch holding every training row of every replica. ``lr_scale`` has no meaning here and is ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from bnnbench.core import prng
from bnnbench.core import mcmc
from bnnbench.core.errors import ConfigError
from bnnbench.core.linalg.full_batch import gaussian_energy_grad
from bnnbench.methods.base import Batch, Method, Predictive, Problem, hyper_state
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.state import State, state_class


@dataclass(frozen=True)
class HMCConfig(MethodConfig):
    name: str = "hmc"
    chains: int = 4                     # C chains per replica, each from its own initial weights
    warmup: int = 200                   # transitions of step-size adaptation (nothing kept)
    thin: int = 1                       # keep every thin-th transition after the warm-up
    keep: int = 100                     # draws kept per chain (the last ones, if more transitions follow)
    leapfrog_steps: int = 20            # L (the largest L with jitter)
    leapfrog_jitter: float = 0.0        # L ~ U{ceil((1 - j) L), ..., L} per chain and transition
    step_size: float = 1e-3             # eps_0, where dual averaging starts
    target_accept: float = 0.8          # delta
    da_gamma: float = 0.05              # dual averaging's gamma, t0, kappa (Hoffman & Gelman's values)
    da_t0: float = 10.0
    da_kappa: float = 0.75
    adapt_mass: bool = True             # diagonal mass matrix from the warm-up's draws (Stan's windows)
    init_mean: str = "uniform_fan_in"   # each chain's theta_0: uniform_fan_in | zero
    learn_noise: bool = False           # sample tau (Gaussian likelihood) with the weights, Gamma(a0, b0) prior
    noise_prior_shape: float = 6.0      # a0, b0 in normalised units (the noisy natural gradient protocol's)
    noise_prior_rate: float = 6.0
    rhat_max: float = 1.1               # runs whose R-hat of the test predictions exceeds this are flagged


def full_batch(batch: Batch) -> torch.Tensor:
    """Mask ``[R, B]`` of each replica's own rows in a full batch: ``engine.epoch_batches`` with a batch of at least
    N_max rows gives one batch per epoch whose first N_r rows are a permutation of replica r's N_r rows (then its
    rows wrap around); the potential uses exactly those."""
    B, n = batch.x.shape[1], batch.n_data
    if B < int(n.max()):
        raise ValueError(f"hmc needs full-batch gradients: a batch of {B} rows, a training set of {int(n.max())} "
                         "(protocol.batch_size must be at least the training-set size; protocol=hmc_uci)")
    return torch.arange(B, device=n.device)[None, :] < n[:, None]


def mass_windows(warmup: int) -> tuple[int, list[int]]:
    """Stan's warm-up windows: a fast interval of 75 transitions, slow windows of 25, 50, 100, ... transitions (the
    last stretched to the terminal fast interval) whose draws set the mass matrix, then 50 fast transitions (15%,
    75%, 10% of a warm-up shorter than 150). Returns (the first slow window's start, the windows' ends), in
    transitions counted from 1."""
    init, term, base = 75, 50, 25
    if init + term + base > warmup:
        init, term = int(0.15 * warmup), int(0.1 * warmup)
        base = warmup - init - term
    end_slow, start, size, ends = warmup - term, init, base, []
    while start < end_slow:
        end = start + size if start + 3 * size <= end_slow else end_slow
        ends.append(end)
        start, size = end, 2 * size
    return init, ends or [0]


@state_class
class HMCState(State):
    """C chains per replica: their positions theta ``[R, C, P]`` (and z = log tau ``[R, C]`` where the noise is
    learned, ``log_tau``); dual averaging's log eps, log eps_bar, H_bar, mu ``[R, C]`` and its count m ``da_m``;
    the sum of the acceptance probabilities alpha after the warm-up ``accept_sum``; the transitions t and the draws
    kept ``n_kept`` ``[R]``; the ring buffer of kept draws ``samples [R, C, K, P]`` (and ``tau_samples [R, C, K]``
    where the noise is learned), float32; the diagonal M^-1 ``inv_mass [R, D]`` and the running count, mean and sum
    of squares of the current mass window's draws (``mass_n``, ``mass_mean``, ``mass_m2``)."""
    theta: torch.Tensor
    log_eps: torch.Tensor
    log_eps_bar: torch.Tensor
    h_bar: torch.Tensor
    accept_sum: torch.Tensor
    t: torch.Tensor
    n_kept: torch.Tensor
    samples: torch.Tensor
    da_m: torch.Tensor
    mu: torch.Tensor
    inv_mass: torch.Tensor
    mass_n: torch.Tensor
    mass_mean: torch.Tensor
    mass_m2: torch.Tensor
    log_tau: torch.Tensor | None = None
    tau_samples: torch.Tensor | None = None


class HMC(Method):
    name = "hmc"
    Config = HMCConfig
    full_batch = True
    needs_autograd = False
    compilable = True  # its proposal (bench/hmc_numpyro.py: the trajectory compiled whole)
    compile_cpp_wrapper = True   # 50 leapfrog steps of [20, 20, 10] kernels: the Python wrapper's calls weigh
    compile_dynamic = None       # NNG Table 3's ten rounds, 20 to 29 rows

    def __init__(self, cfg, model, likelihood: str):
        super().__init__(cfg, model, likelihood)
        c = self.cfg
        for k in ("chains", "thin", "keep", "leapfrog_steps"):
            if not (isinstance(getattr(c, k), int) and getattr(c, k) >= 1):
                raise ConfigError(f"method.{k} must be an integer >= 1, got {getattr(c, k)!r}")
        if not (isinstance(c.warmup, int) and c.warmup >= 0):
            raise ConfigError(f"method.warmup must be an integer >= 0, got {c.warmup!r}")
        if not 0 < c.target_accept < 1 or not 0 <= c.leapfrog_jitter < 1 or c.step_size <= 0:
            raise ConfigError("method.target_accept must lie in (0, 1), method.leapfrog_jitter in [0, 1) and "
                              f"method.step_size above 0, got {c.target_accept}, {c.leapfrog_jitter}, {c.step_size}")

    def learns_noise(self) -> bool:
        return self.likelihood == "gaussian" and self.cfg.learn_noise

    def init(self, problem: Problem, generator: torch.Generator) -> HMCState:
        if self.likelihood != "gaussian":
            raise ValueError(f"hmc has a Gaussian likelihood's potential only, not {self.likelihood!r}")
        cfg, R, C = self.cfg, problem.n_replicas, self.cfg.chains
        lam = problem.prior_prec
        theta = self.model.init(R * C, generator, cfg.init_mean, device=lam.device, dtype=lam.dtype)
        log_eps = torch.full((R, C), math.log(cfg.step_size), device=lam.device, dtype=lam.dtype)
        K, P = cfg.keep, self.model.n_params
        fields = dict(theta=theta.reshape(R, C, P), log_eps=log_eps, log_eps_bar=log_eps.clone(),
                      h_bar=torch.zeros_like(log_eps), accept_sum=torch.zeros_like(log_eps),
                      t=torch.zeros(R, dtype=torch.long, device=lam.device),
                      n_kept=torch.zeros(R, dtype=torch.long, device=lam.device),
                      samples=torch.zeros(R, C, K, P, device=lam.device, dtype=torch.float32),
                      da_m=torch.zeros(R, dtype=torch.long, device=lam.device),
                      mu=torch.full_like(log_eps, math.log(10 * cfg.step_size)))
        if self.learns_noise():
            prior_mean = cfg.noise_prior_shape / cfg.noise_prior_rate
            fields.update(log_tau=torch.full_like(log_eps, math.log(prior_mean)),
                          tau_samples=torch.zeros(R, C, K, device=lam.device, dtype=torch.float32))
        D = P + int(self.learns_noise())
        return HMCState(**hyper_state(problem), **fields,
                        inv_mass=torch.ones(R, D, device=lam.device, dtype=lam.dtype),
                        mass_n=torch.zeros(R, device=lam.device, dtype=lam.dtype),
                        mass_mean=torch.zeros(R, D, device=lam.device, dtype=lam.dtype),
                        mass_m2=torch.zeros(R, D, device=lam.device, dtype=lam.dtype))

    def position(self, state: HMCState) -> torch.Tensor:
        """q ``[R, C, D]``: theta, and z = log tau as the last coordinate when the noise is learned."""
        if state.log_tau is not None:
            return torch.cat([state.theta, state.log_tau.unsqueeze(-1)], -1)
        return state.theta

    def potential(self, state: HMCState, q: torch.Tensor, batch: Batch, mask: torch.Tensor):
        """U(q) ``[R, C]`` and grad U(q) ``[R, C, D]`` on each replica's own rows (module docstring)."""
        P = self.model.n_params
        theta, lam = q[..., :P], state.prior_prec.unsqueeze(1)
        tau = q[..., P].exp() if q.shape[-1] > P else state.noise_prec.unsqueeze(1).expand(q.shape[:2])
        U, grad, sse = gaussian_energy_grad(self.model, theta, batch.x, batch.y, mask, tau)
        lam_theta = lam * theta
        grad = grad + lam_theta
        U = U + 0.5 * (lam_theta * theta).sum(-1)
        if q.shape[-1] > P:
            a0, b0 = self.cfg.noise_prior_shape, self.cfg.noise_prior_rate
            half_n = 0.5 * state.n_data.to(q.dtype).unsqueeze(1)
            z = q[..., P]
            U = U - (half_n + a0) * z + b0 * tau
            grad = torch.cat([grad, (0.5 * tau * sse - half_n - a0 + b0 * tau).unsqueeze(-1)], -1)
        return U, grad

    def noise(self, state, batch, generator):
        """(standard normal draws ``[R, C, D]`` of the momenta, log u ``[R, C]`` of the accept test, leapfrog steps L
        ``[R, C]``)."""
        q = self.position(state)
        R, C, D = q.shape
        p = prng.randn(R, C, D, generator=generator, device=q.device, dtype=q.dtype)
        log_u = prng.rand(R, C, generator=generator, device=q.device, dtype=q.dtype).log()
        L = self.cfg.leapfrog_steps
        lo = max(1, math.ceil((1 - self.cfg.leapfrog_jitter) * L))
        steps = torch.randint(lo, L + 1, (R, C), generator=generator, device=q.device) if lo < L else \
            torch.full((R, C), L, device=q.device)
        return p, log_u, steps

    def leapfrog(self, state, q, p, grad, eps, steps, batch, mask, inv_mass, n_max: int | None = None):
        """L = ``steps`` leapfrog steps of size ``eps`` ``[R, C, 1]`` per chain from (q, p) with grad U(q) = ``grad``
        and the kinetic energy p^T M^-1 p / 2, M^-1 = diag(``inv_mass`` ``[R, 1, D]``); chains with fewer steps than
        the longest stay where they stopped. Returns (q, p, U(q)). Eager, the loop runs to the longest chain's L
        (read from ``steps``); compiled (``n_max`` given: the largest L), it runs ``n_max`` times without reading a
        tensor, masked unless no chain can stop early: the same numbers, a chain that stopped keeps its (q, p) and
        the last U is the potential at the final q either way."""
        p = p - (0.5 * eps) * grad
        U = None
        if n_max is None:
            n_max = int(steps.max())
            uniform = int(steps.min()) == n_max     # every chain takes all steps: no masks
        else:
            uniform = self.cfg.leapfrog_jitter == 0
        eps_m = eps * inv_mass
        for l in range(n_max):
            if uniform:
                q = q + eps_m * p
            else:
                active = (steps > l).unsqueeze(-1)
                q = torch.where(active, q + eps_m * p, q)
            U, grad = self.potential(state, q, batch, mask)
            if uniform:
                p = p - ((0.5 * eps) if l == n_max - 1 else eps) * grad
            else:
                coef = torch.where((steps == l + 1).unsqueeze(-1), 0.5 * eps, eps)
                p = torch.where(active, p - coef * grad, p)
        return q, p, U

    def propose(self, state, z, log_u, steps, log_eps, batch, mask, n_max: int | None = None):
        """One transition's proposal and accept test for every chain: p = M^1/2 ``z``, the leapfrog trajectory of
        step exp(``log_eps``), alpha = min(1, exp(H(q, p) - H(q', p'))), accepted where log u < log alpha. Returns
        the new position ``[R, C, D]``, its U ``[R, C]`` and alpha. A pure function of tensors (``mask``: the
        batch's ``full_batch`` rows; ``n_max``: see ``leapfrog``), so the ``compile`` setting compiles it whole
        (``compiled_step``)."""
        q0 = self.position(state)
        inv_mass = state.inv_mass.unsqueeze(1)                                        # [R, 1, D]
        p0 = z * inv_mass.rsqrt()                                                     # p ~ N(0, M)
        U0, g0 = self.potential(state, q0, batch, mask)
        q1, p1, U1 = self.leapfrog(state, q0, p0, g0, log_eps.exp().unsqueeze(-1), steps, batch, mask, inv_mass,
                                   n_max)
        dH = (U0 + 0.5 * (inv_mass * p0 * p0).sum(-1)) - (U1 + 0.5 * (inv_mass * p1 * p1).sum(-1))
        log_alpha = torch.nan_to_num(dH, nan=-math.inf).clamp(max=0.0)               # a non-finite H: rejected
        alpha = log_alpha.exp()
        accept = log_u < log_alpha
        return torch.where(accept.unsqueeze(-1), q1, q0), torch.where(accept, U1, U0), alpha

    def compiled_step(self, compile):
        """``step`` with its proposal (``propose``: the whole leapfrog trajectory, L_max steps) compiled by
        ``compile``; the warm-up's adaptation and the kept draws, which read the transition count, stay eager."""
        propose = compile(lambda *args: self.propose(*args, n_max=self.cfg.leapfrog_steps))

        def step(state, batch, noise, lr_scale=1.0):
            # one layout at every call (the first state's theta and log tau are contiguous, a transition's slices of
            # the [R, C, P + 1] position where the noise precision is learned): strides are guarded, so the trajectory
            # would otherwise compile twice
            state = state.replace(**{k: v.contiguous() for k, v in state.tensors().items()})
            return self.step(state, batch, noise, lr_scale, propose=propose)
        return step

    def step(self, state, batch, noise, lr_scale=1.0, propose=None):
        z, log_u, steps = noise
        cfg = self.cfg
        n = int(state.t[0])           # transitions so far: the replicas move in lock step
        warm = n < cfg.warmup
        log_eps = state.log_eps if warm else state.log_eps_bar
        q, U, alpha = (propose or self.propose)(state, z, log_u, steps, log_eps, batch, full_batch(batch))

        P = self.model.n_params
        new = {"theta": q[..., :P], "t": state.t + 1}
        if q.shape[-1] > P:
            new["log_tau"] = q[..., P]
        if warm:
            new.update(self.adapt(state, q, alpha, n + 1))
        else:
            new["accept_sum"] = state.accept_sum + alpha
        after = n + 1 - cfg.warmup
        if after > 0 and after % cfg.thin == 0:
            n_kept = state.n_kept
            slot = torch.remainder(n_kept[:1], cfg.keep)
            new["samples"] = state.samples.index_copy(2, slot, q[..., :P].unsqueeze(2).float())
            if state.tau_samples is not None:
                new["tau_samples"] = state.tau_samples.index_copy(2, slot, q[..., P:].exp().float())
            new["n_kept"] = n_kept + 1
        return state.replace(**new), {"objective": U.mean(1) / state.n_data.to(U.dtype), "accept": alpha.mean(1)}

    def adapt(self, state: HMCState, q: torch.Tensor, alpha: torch.Tensor, m_total: int) -> dict:
        """The warm-up's updates after transition ``m_total``: dual averaging of log eps (module docstring), and with
        ``adapt_mass`` the diagonal M^-1 as Stan sets it (Stan Reference Manual, "HMC algorithm parameters"): the
        variances of the draws of each slow window (``mass_windows``), pooled over the replica's chains and shrunk,
        (n / (n + 5)) var + 10^-3 (5 / (n + 5)); at each window's end dual averaging restarts at mu = log(10 eps),
        with eps_bar = eps until its next update overwrites it (a warm-up whose last transition ends a window, one
        shorter than 10 transitions, then keeps that step size). Returns the changed fields of the state."""
        cfg = self.cfg
        da_m = state.da_m + 1
        m = da_m.to(q.dtype).unsqueeze(1)
        eta = 1.0 / (m + cfg.da_t0)
        h_bar = (1 - eta) * state.h_bar + eta * (cfg.target_accept - alpha)
        log_eps = state.mu - m.sqrt() / cfg.da_gamma * h_bar
        w = m ** -cfg.da_kappa
        out = {"da_m": da_m, "h_bar": h_bar, "log_eps": log_eps,
               "log_eps_bar": w * log_eps + (1 - w) * state.log_eps_bar}
        if not cfg.adapt_mass:
            return out
        start, ends = mass_windows(cfg.warmup)
        if not start < m_total <= ends[-1]:
            return out
        # the chains' draws merged into the running mean and sum of squares (Chan et al.'s pairwise update)
        n_a, C = state.mass_n.unsqueeze(1), q.shape[1]
        mean_b = q.mean(1)
        delta = mean_b - state.mass_mean
        n = n_a + C
        mean = state.mass_mean + delta * (C / n)
        m2 = state.mass_m2 + (q - mean_b.unsqueeze(1)).square().sum(1) + delta.square() * (n_a * C / n)
        out.update(mass_n=n[:, 0], mass_mean=mean, mass_m2=m2)
        if m_total in ends:
            var = m2 / (n - 1).clamp_min(1)
            out.update(inv_mass=n / (n + 5) * var + 1e-3 * 5 / (n + 5), mass_n=torch.zeros_like(n[:, 0]),
                       mass_mean=torch.zeros_like(mean), mass_m2=torch.zeros_like(m2), da_m=torch.zeros_like(da_m),
                       h_bar=torch.zeros_like(h_bar), log_eps_bar=log_eps,
                       mu=math.log(10) + log_eps)
        return out

    def kept(self, state: HMCState):
        """The kept draws in the order they were kept: theta ``[R, C, k, P]`` (the state's dtype) and tau
        ``[R, C, k]`` (or ``None`` for a fixed noise precision); before any is kept, the chains' current states."""
        k, K = int(state.n_kept[0]), state.samples.shape[2]
        dt = state.prior_prec.dtype
        if k == 0:
            tau = state.log_tau.exp().unsqueeze(-1) if state.log_tau is not None else None
            return state.theta.unsqueeze(2), tau
        order = torch.arange(k - min(k, K), k, device=state.samples.device) % K
        theta = state.samples.index_select(2, order).to(dt)
        tau = state.tau_samples.index_select(2, order).to(dt) if state.tau_samples is not None else None
        return theta, tau

    def predict(self, state, x, n_samples, generator):
        """Outputs of S = min(``n_samples``, C k) kept draws of all chains, evenly spaced over them."""
        theta, tau = self.kept(state)
        R, C, k, P = theta.shape
        theta = theta.reshape(R, C * k, P)
        if n_samples < C * k:
            pick = torch.linspace(0, C * k - 1, n_samples, device=theta.device).round().long()
            theta = theta.index_select(1, pick)
            tau = None if tau is None else tau.reshape(R, C * k).index_select(1, pick)
        elif tau is not None:
            tau = tau.reshape(R, C * k)
        f = self.model.forward(theta, x)
        return Predictive(f=f, noise_prec=state.noise_prec if tau is None else tau)

    def diagnostics(self, state: HMCState, data) -> dict:
        """Acceptance rate and step size per chain, and the rank-normalised split R-hat and the bulk and tail ESS
        (``mcmc``: Stan's and ArviZ's) over the C chains of the test predictions: f(x_t) (whose mean is the predictive
        mean) and f(x_t)^2 + 1/tau (whose mean minus the squared predictive mean is the predictive variance), their
        largest R-hat and smallest ESS over the test points, per replica (``data``: ``engine.ReplicaData``), and how
        well the predictive variances of independent parts of the run agree (``mcmc.predvar_agreement``); the run is
        flagged when an R-hat exceeds ``rhat_max``."""
        theta, tau = self.kept(state)
        R, C, k, P = theta.shape
        n_after = (state.t - self.cfg.warmup).clamp_min(1).to(state.accept_sum.dtype)
        out = {"chains": C, "kept_per_chain": k,
               "acceptance_rate": (state.accept_sum / n_after[:, None]).tolist(),
               "step_size": state.log_eps_bar.exp().tolist(), "rhat_threshold": self.cfg.rhat_max}
        if k < 4:
            return {**out, "flagged": True, "summary": f"only {k} draws kept per chain: no R-hat"}
        u = data.data_index
        with torch.no_grad():
            f = self.model.forward(theta.reshape(R, C * k, P), data.x_eval[u])[..., 0]  # [R, C k, T]
        f = f.reshape(R, C, k, -1).permute(0, 3, 1, 2).double().cpu().numpy()         # [R, T, C, k]
        inv_tau = (1 / state.noise_prec).reshape(R, 1, 1, 1) if tau is None else 1 / tau.unsqueeze(1)
        second = f * f + inv_tau.double().cpu().numpy()
        valid = data.eval_mask[u].cpu().numpy()                                        # [R, T]
        for name, draws in (("mean", f), ("var", second)):
            out[f"rhat_{name}_max"] = np.where(valid, mcmc.rhat(draws), -np.inf).max(1).tolist()
            out[f"ess_bulk_{name}_min"] = np.where(valid, mcmc.ess_bulk(draws), np.inf).min(1).tolist()
            out[f"ess_tail_{name}_min"] = np.where(valid, mcmc.ess_tail(draws), np.inf).min(1).tolist()
        out.update(mcmc.predvar_agreement(f, second, valid))
        worst = max(max(out["rhat_mean_max"]), max(out["rhat_var_max"]))
        out["flagged"] = bool(worst > self.cfg.rhat_max)
        halves = out.get("predvar_corr_chain_halves")
        least = {e: min(min(out[f"ess_{e}_mean_min"]), min(out[f"ess_{e}_var_min"])) for e in ("bulk", "tail")}
        out["summary"] = (f"R-hat of the test predictions <= {worst:.3f} (threshold {self.cfg.rhat_max}), "
                          f"bulk ESS >= {least['bulk']:.0f}, tail ESS >= {least['tail']:.0f} "
                          f"of {C * k} draws, acceptance {float(state.accept_sum.sum() / n_after.sum() / C):.2f}"
                          + (f", predictive variances of the two halves of the chains correlate >= {min(halves):.3f}"
                             if halves else ""))
        return out
