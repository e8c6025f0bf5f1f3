"""Noisy natural gradient (Zhang, Sun, Duvenaud & Grosse, ICML 2018): noisy Adam (NNG-FFG,
Algorithm 1) and noisy K-FAC (NNG-MVG, Algorithm 2).

Prior N(0, eta I) (prior precision 1/eta), KL weight lambda, intrinsic damping
gamma_in = lambda / (N eta), gamma = gamma_in + gamma_ex. The Fisher uses targets sampled from the
model (the true Fisher, footnote to eq. 8), not the observed ones.

Noisy Adam:  w ~ N(mu, (lambda/N) diag(f + gamma_in)^-1);  v = grad log p(y|x,w) - gamma_in w;
             m <- b1 m + (1 - b1) v;  f <- b2 f + (1 - b2) (grad log p(y~|x,w))^2;
             mu <- mu + alpha (m / (1 - b1^k)) / (f + gamma).
             v is the minibatch mean of the per-example gradients; f's increment is the minibatch mean of
             the per-example *squared* gradients (the diagonal of the per-example Fisher of eq. 8-11), not
             the square of the minibatch-mean gradient, which is ~F/B.
Noisy K-FAC: per layer (homogeneous weights [W; b], inputs a with a 1 appended)
             A <- (1 - b) A + b E[a a^T],  S <- (1 - b) S + b E[Ds Ds^T]  (every T_stats steps);
             A^g = A + pi sqrt(g) I, S^g = S + sqrt(g) / pi I, pi^2 = (tr A / dim A) / (tr S / dim S) (eq. 13);
             W ~ MN(M, (lambda/N) [A^g_in]^-1, [S^g_in]^-1);  M <- M + alpha [A^g]^-1 V [S^g]^-1,
             V = grad_W log p(y|x,w) - gamma_in W;  inverses recomputed every T_inv steps;
             optional momentum on V with bias correction (the authors' regression code; 0 = Alg. 2).

Regression with an unknown noise precision (the paper's UCI protocol, App. C.1): a learned Gamma posterior
q(tau), ``gamma_noise``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import List, Optional

import torch

from bnnbench.core import prng
from bnnbench.core.linalg.per_example import backprop, forward_cache, sum_grads, sum_sq_grads, sums_over_samples
from bnnbench.core.metrics import kl_diag_gaussians
from bnnbench.methods import gamma_noise
from bnnbench.methods.base import Method, Problem, hyper_state, likelihood_of
from bnnbench.methods.gaussian.mean_field import MeanField, MeanFieldState
from bnnbench.methods.kfac.kronecker import Kronecker, homogeneous_rows
from bnnbench.methods.state import State, state_class


def kl_clip_coeff(cfg, t: torch.Tensor, lr: float, step: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """min(1, sqrt(c_k / (lr^2 <step, V>))) per replica ``[R]``, ``step = F~^-1 V`` the preconditioned update and
    ``<step, V> = step^T F~ step`` its squared norm in the damped curvature it was preconditioned with; c_k =
    kl_clip x kl_clip_decay ^ floor(k / kl_clip_every), constant without a decay. The trust region of the CIFAR-10
    experiments (App. C.2: alpha = min(alpha_max, sqrt(c / (v^T F v)))), tf.contrib.kfac's ``norm_constraint`` in
    the authors' code (C1)."""
    c = cfg.kl_clip
    if cfg.kl_clip_decay is not None:
        c = c * cfg.kl_clip_decay ** torch.div(t, int(cfg.kl_clip_every or 1), rounding_mode="floor").to(
            step.dtype)
    sq = (lr ** 2) * (step * V).sum(-1)
    return torch.sqrt(c / sq.clamp_min(torch.finfo(step.dtype).tiny)).clamp(max=1.0)


def _col(lam, dims: int):
    """lambda as a factor of ``[R, ...]`` tensors with ``dims`` trailing axes: the float, or the per-replica ``[R]``
    viewed as ``[R, 1 x dims]``."""
    return lam if isinstance(lam, float) else lam.reshape(-1, *[1] * dims)


def _summed_gradient(a, d_y, g_W, S: int):
    """sum_s grad_W mean_b log p(y | x, W_s) of one layer, ``[R, d_in + 1, d_out]``, and the layer's homogeneous
    input rows ``(a1, R, B, shared)`` (``homogeneous_rows``) where they were formed (None for a convolution:
    autograd's ``g_W`` summed over the samples). On an MLP, one GEMM over samples and examples (sum_{s,b} a_sb
    dz_sb^T) rather than a gradient materialised per sample."""
    if g_W is not None:
        return g_W.sum(1), None
    a1, R, B, shared = homogeneous_rows(a)
    d_y = d_y.sum(1) if shared else d_y.reshape(R, S * B, -1)
    # one output: a multiply and a sum, 4x faster on a CPU than a GEMV per replica
    grad = (a1 * d_y).sum(1).unsqueeze(-1) if d_y.shape[-1] == 1 else a1.transpose(1, 2) @ d_y
    return grad, (a1, R, B, shared)


@dataclass(frozen=True)
class NoisyAdamConfig(gamma_noise.NoiseConfig):
    name: str = "noisy_adam"
    lr: float = 0.01                    # alpha (the paper's alpha~ for UCI)
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # beta_1 (momentum), beta_2 = 1 - beta~
    kl_weight: float = 1.0              # lambda
    damping_ex: float = 0.0             # extrinsic damping gamma_ex
    f_init: float = 1.0                 # initial Fisher estimate f (used when init_std is None)
    init_std: Optional[float] = None    # initial posterior std: sets f so that lambda / (N (f + gamma_in)) = init_std^2
    train_samples: int = 10
    init_mean: str = "uniform_fan_in"   # uniform_fan_in | zero | xavier_uniform (a ConvNet's: the CIFAR-10 code's)
    kl_clip: Optional[float] = None     # the CIFAR-10 trust region, as noisy K-FAC's (c_0 = 1e-4 for noisy Adam)
    kl_clip_decay: Optional[float] = None
    kl_clip_every: Optional[int] = None
    learn_noise: bool = True            # a Gaussian likelihood's q(tau) = Gamma(a, b) learned (the UCI protocol)
    noise_prior_shape: Optional[float] = 6.0   # Gamma(a0, b0) prior on tau (normalised units)
    noise_prior_rate: Optional[float] = 6.0
    noise_lr: Optional[float] = 0.001   # Adam on (log a, log b): the authors' regression/model.py
    noise_lr_drop: bool = False         # regression/train.py: the x0.1 drop scales alpha, beta, omega, not the noise lr


@dataclass(frozen=True)
class NoisyKFACConfig(gamma_noise.NoiseConfig):
    name: str = "noisy_kfac"
    lr: float = 0.01                    # alpha
    beta: float = 0.001                 # beta~: EMA rate of the Kronecker factors
    kl_weight: float = 1.0              # lambda
    damping_ex: float = 0.0             # gamma_ex
    T_stats: int = 1                    # factor updates every T_stats steps
    T_inv: int = 1                      # inverses of the damped factors every T_inv steps
    factor_init: float = 1.0            # A, S start at factor_init * I (the code's I + T T^T is random, not reproduced)
    momentum: float = 0.9               # on V, bias-corrected (regression/ops/mvg_optimizer.py); 0 = Alg. 2
    # ema: the regression code's m <- mu m + (1 - mu) V, bias-corrected, before preconditioning; heavy_ball: the
    # classification code's tf.contrib.kfac velocity u <- mu u + (clipped preconditioned step), the step alpha u
    momentum_type: str = "ema"
    train_samples: int = 10
    init_mean: str = "uniform_fan_in"   # uniform_fan_in | zero | xavier_uniform (a ConvNet's: the CIFAR-10 code's)
    # KL clipping (CIFAR-10, App. C.2): the step times min(1, sqrt(c_k / (alpha^2 v^T F v))), c_k = kl_clip x
    # kl_clip_decay ^ floor(k / kl_clip_every) (None: no decay): the trust region of the authors' classification code
    # (c_0 = 1e-3, x 0.95 every 390 steps, one CIFAR-10 epoch at minibatch 128)
    kl_clip: Optional[float] = None
    kl_clip_decay: Optional[float] = None
    kl_clip_every: Optional[int] = None
    learn_noise: bool = True
    noise_prior_shape: Optional[float] = 6.0
    noise_prior_rate: Optional[float] = 6.0
    noise_lr: Optional[float] = 0.001
    noise_lr_drop: bool = False

class _NoisyBase(Method):
    """Shared: intrinsic damping, the learned Gamma noise posterior, sampled-target gradients."""

    conv = True  # runs on models/convnet.py's networks

    @property
    def needs_autograd(self) -> bool:
        """An MLP's cotangents and backward pass are closed-form; a convolutional network back-propagates by autograd
        through its pools and batch normalisation (``ConvNet.backprop``)."""
        return self.model.convolutional

    def _common_init(self, problem: Problem, generator: torch.Generator) -> dict:
        """The state fields every member has: the hyper-parameters, the mean, the step count and, where it is
        learned, q(tau)."""
        R = problem.n_replicas
        mean = self.init_params(problem, generator)
        fields = {**hyper_state(problem), "mean": mean, "t": torch.zeros(R, dtype=torch.long, device=mean.device)}
        if gamma_noise.learns_noise(self.cfg, self.likelihood):
            fields.update(gamma_noise.init_state(self.cfg, R, mean.device, mean.dtype))
        return fields

    def lam(self, kl_weight: torch.Tensor | None):
        """lambda, the KL weight: each replica's own ``kl_weight [R]`` (a state's or a problem's) where a search gives
        one (``replica_hparams``: NNG Table 3 selects it per trial on held-out training rows), else the config's."""
        return float(self.cfg.kl_weight) if kl_weight is None else kl_weight

    def gamma_in(self, state):
        """lambda / (N eta) = kl_weight * prior_prec / N, per parameter ``[R, P]``."""
        return _col(self.lam(state.kl_weight), 1) * state.prior_prec / state.n_data.to(state.mean.dtype)[:, None]

    def _noise_step(self, state, f, y, lr_scale) -> dict:
        """Adam step on q(tau)'s (log a, log b) (``gamma_noise.step``); nothing without a learned noise."""
        return gamma_noise.step(self.cfg, state, f, y, lr_scale) if state.noise_q is not None else {}

    def _target_noise(self, state, batch, generator, n_samples: int | None = None):
        """The standard draws of targets y~ ~ p(y | x, w) for the true Fisher (``Likelihood.sample_noise``), for
        ``n_samples`` weight draws (default ``train_samples``)."""
        S = self.cfg.train_samples if n_samples is None else n_samples
        f_shape = (state.mean.shape[0], S, batch.x.shape[1], self.model.output_dim)
        return likelihood_of(state, self.likelihood).sample_noise(f_shape, generator, batch.x.dtype, batch.x.device)

    def _backprop_observed_and_sampled(self, state, layers, x, y, y_noise, sampled: bool = True):
        """One forward pass, then one manual backward pass (``backprop``) for two cotangents, both in closed form
        (``grad_f``, ``sampled_score``): the back-propagated gradients ``dz`` of the minibatch-mean log-likelihood of
        the observed targets and ``ds`` of the per-example log-likelihoods of targets drawn from the model (the true
        Fisher's). Returns ``f, ll [R, S], acts, dz, ds``; a convolution's rows are examples x positions
        (``ConvNet.forward_cache``, whose backward pass is autograd's: the cotangents and outputs leave its graph).
        ``sampled=False`` skips the sampled targets' cotangent (``ds`` is then None): a step that updates no factor."""
        f, acts, zs = forward_cache(self.model, layers, x)
        lik = likelihood_of(state, self.likelihood)   # the Gaussian's precision: E_q[tau] = a / b
        B = x.shape[-2]
        fd = f.detach()
        g_obs = lik.grad_f(fd, y) / B
        rows = [a.shape[-2] for a in acts]
        acts = [a.detach() for a in acts]
        if not sampled:
            return fd, lik.log_prob(fd, y).mean(-1), acts, backprop(self.model, layers, acts, zs, g_obs), None
        if torch.compiler.is_compiling():   # two passes, each fused into its consumers, not one buffer read twice
            return (fd, lik.log_prob(fd, y).mean(-1), acts, backprop(self.model, layers, acts, zs, g_obs),
                    backprop(self.model, layers, acts, zs, lik.sampled_score(fd, y_noise)))
        gs = backprop(self.model, layers, acts, zs, torch.cat([g_obs, lik.sampled_score(fd, y_noise)], -2))
        return (fd, lik.log_prob(fd, y).mean(-1), acts,
                [g[..., :n, :] for g, n in zip(gs, rows)], [g[..., n:, :] for g, n in zip(gs, rows)])


@state_class
class NoisyAdamState(MeanFieldState):
    """The mean mu, the momentum m and the Fisher diagonal estimate f of Alg. 1 after t steps; each replica's KL
    weight lambda ``[R]`` where the problem gives one (else the config's)."""
    m: torch.Tensor
    f: torch.Tensor
    t: torch.Tensor
    kl_weight: torch.Tensor | None = None


class NoisyAdam(_NoisyBase, MeanField):
    name = "noisy_adam"
    compilable = True  # bench/compile_step.py: 1.3-2x faster compiled at UCI scale
    Config = NoisyAdamConfig
    replica_hparams = MappingProxyType({"kl_weight": (0.01, 1.0)})   # lambda, where a search gives one

    def init(self, problem: Problem, generator: torch.Generator) -> NoisyAdamState:
        fields = self._common_init(problem, generator)
        mean = fields["mean"]
        if self.cfg.init_std is not None:  # f + gamma_in = lambda / (N sigma_0^2): the code's sigma_0 = 1e-5
            N = problem.n_data.to(mean.dtype)[:, None]
            lam = _col(self.lam(problem.hparams.get("kl_weight")), 1)
            gamma_in = lam * problem.prior_prec / N
            f0 = lam / (N * self.cfg.init_std ** 2) - gamma_in
            f0 = f0.clamp_min(0).expand_as(mean).clone()
        else:
            f0 = torch.full_like(mean, self.cfg.f_init)
        return NoisyAdamState(**fields, m=torch.zeros_like(mean), f=f0)

    def std(self, state):
        N = state.n_data.to(state.mean.dtype)[:, None]
        return torch.sqrt(_col(self.lam(state.kl_weight), 1) / N / (state.f + self.gamma_in(state)))

    def noise(self, state, batch, generator):
        """The weights' eps and the draws of the sampled targets."""
        return super().noise(state, batch, generator), self._target_noise(state, batch, generator)

    def step(self, state, batch, noise, lr_scale=1.0):
        eps, y_noise = noise
        mean, gin = state.mean, self.gamma_in(state)
        layers = self.model.sampled_layers(mean, self.std(state), eps)
        f, ll, acts, dz, ds = self._backprop_observed_and_sampled(state, layers, batch.x, batch.y, y_noise)
        # Fisher diagonal = the mean over the minibatch of the squared *per-example* gradients, as
        # F = Cov_{x ~ p_D, y ~ p(y|x,w)}(Dw) (paper eq. 8-11, Alg. 1: (grad_w log p(y|x,w))^2 of one
        # example; authors' code gd-zhang/noisy-K-FAC ops/fisher_factors.py FullyConnectedDiagonalFactor:
        # (1/B) sum_i (a_i (x) ds_i)^2). The square of the minibatch-mean gradient is ~F/B, not F.
        if torch.compiler.is_compiling():   # summed over samples and examples together (fewer passes: 1.3-1.9x)
            S = eps.shape[1]
            fisher_bar = sums_over_samples(self.model, acts, ds, square=True) / (batch.x.shape[1] * S)
            v = sums_over_samples(self.model, acts, dz) / S - gin * (mean + self.std(state) * eps.mean(1))
        else:                               # per sample, the order the committed records were made in
            g = sum_grads(self.model, acts, dz)                                  # [R, S, P] gradient of ll
            fisher_bar = (sum_sq_grads(self.model, acts, ds) / batch.x.shape[1]).mean(1)
            w = mean.unsqueeze(1) + self.std(state).unsqueeze(1) * eps            # the sampled weights [R, S, P]
            v = (g - gin.unsqueeze(1) * w).mean(1)
        b1, b2 = float(self.cfg.betas[0]), 1 - (1 - float(self.cfg.betas[1])) * lr_scale
        t = state.t + 1
        m = b1 * state.m + (1 - b1) * v
        fisher = b2 * state.f + (1 - b2) * fisher_bar
        m_hat = m / (1 - b1 ** t.to(mean.dtype))[:, None]
        step = m_hat / (fisher + gin + self.cfg.damping_ex)
        lr = self.cfg.lr * lr_scale
        if self.cfg.kl_clip is not None:
            step = step * kl_clip_coeff(self.cfg, t, lr, step, m_hat)[:, None]
        new_mean = mean + lr * step
        new = state.replace(mean=new_mean, m=m, f=fisher, t=t, **self._noise_step(state, f, batch.y, lr_scale))
        nll = -ll.mean(1)
        return new, {"objective": nll, "nll": nll}

    def kl(self, state):
        """lambda KL(q(w) || p(w)) (the tempered KL of the noisy-NG objective)."""
        mean = state.mean
        return self.lam(state.kl_weight) * kl_diag_gaussians(mean, self.var(state), torch.zeros_like(mean),
                                                              1 / state.prior_prec)


@state_class
class KFACState(State):
    """The mean (the flat layout of every layer's ``[W; b]``), the step count t, each layer's ``Kronecker`` factors
    (with what the method derives from them), and the momentum of the mean update: per layer (``ema``, the regression
    code's) or flat (``heavy_ball``, the classification code's velocity), or none (momentum 0)."""
    mean: torch.Tensor
    t: torch.Tensor
    layers: tuple[Kronecker, ...]
    mom: tuple[torch.Tensor, ...] | None = None
    velocity: torch.Tensor | None = None
    kl_weight: torch.Tensor | None = None   # lambda per replica ``[R]`` where the problem gives one


class KroneckerFactored(_NoisyBase):
    """What K-FAC and noisy K-FAC share: per layer the ``Kronecker`` factors ``A_l``, ``S_l`` from the sampled targets'
    back-propagated gradients, and the step ``M <- M + alpha F~^-1 V``, V = grad log p(y|x,w) - gamma_in W (with
    momentum and KL clipping), at the weights ``_weights`` gives (noisy K-FAC's draws, K-FAC's mean); after a step,
    ``_refresh`` derives from the new factors what the next one uses (noisy K-FAC's covariance square roots, K-FAC's
    damped inverses). Neither is the other with parts switched off: each defines its weights and what it derives."""

    @classmethod
    def check_settings(cls, cfg) -> None:
        if cfg.momentum_type not in ("ema", "heavy_ball"):
            raise ValueError(f"momentum_type must be ema or heavy_ball, got {cfg.momentum_type!r}")
        if cfg.kl_clip_decay is not None and not cfg.kl_clip_every:
            raise ValueError("kl_clip_decay needs kl_clip_every (the steps between decays)")

    State = KFACState   # the state class (the block-tridiagonal subclass's has its cross-layer factors)

    def init(self, problem: Problem, generator: torch.Generator) -> KFACState:
        fields = self._common_init(problem, generator)
        mean, R = fields["mean"], problem.n_replicas
        sl = self.model.slices
        layers = tuple(Kronecker.identity(R, d_in, d_out, self.cfg.factor_init, mean.dtype, mean.device)
                       for _, _, d_in, d_out in sl)
        mom = velocity = None
        if self.cfg.momentum > 0 and self.cfg.momentum_type == "heavy_ball":
            velocity = torch.zeros_like(mean)
        elif self.cfg.momentum > 0:
            mom = tuple(torch.zeros(R, d_in + 1, d_out, dtype=mean.dtype, device=mean.device)
                        for _, _, d_in, d_out in sl)
        state = self.State(**fields, layers=layers, mom=mom, velocity=velocity, **self._init_extra_factors(mean))
        return self._refresh(state, covariance=True, inverses=True)

    def _init_extra_factors(self, mean: torch.Tensor) -> dict:
        """State fields of curvature statistics beyond each layer's ``A_l``, ``S_l`` (none here; the block-tridiagonal
        subclass's cross-layer factors)."""
        return {}

    def _update_extra_factors(self, state, rows, beta: float, n_samples: int, n_ex: int) -> dict:
        """The EMA updates of ``_init_extra_factors``'s statistics from each layer's ``rows = [(a1, shared, ds)]`` of a
        step that updates the factors (``homogeneous_rows``' inputs and the sampled targets' back-propagated
        gradients ``[R, S B, d_out]``); none here."""
        return {}

    # homogeneous weights [d_in + 1, d_out] <-> the flat layout [W (d_in x d_out), b]: the flat block of a layer is
    # [W; b] row-major, so a view of it
    def _hom(self, theta, l):
        w, b, d_in, d_out = self.model.slices[l]
        return theta[..., w.start:b.stop].unflatten(-1, (d_in + 1, d_out))

    def _flat(self, hom_list):
        return torch.cat([h.flatten(-2) for h in hom_list], -1)

    def _gammas(self, state):
        N = state.n_data.to(state.mean.dtype)
        lam = state.prior_prec[:, 0]  # one prior precision 1/eta for all parameters (the paper's prior)
        g_in = self.lam(state.kl_weight) * lam / N
        return g_in, g_in + self.cfg.damping_ex

    def _refresh(self, state, covariance: bool, inverses: bool):
        """The state with what is derived from its factors recomputed: the posterior's (``covariance``) and the mean
        update's (``inverses``)."""
        raise NotImplementedError

    def _precondition_all(self, state, Vs):
        """The mean update's natural gradient of every layer, ``F~^-1 V`` for the list ``Vs`` of ``[R, d_in + 1,
        d_out]`` (block-diagonal: layer by layer, [A^g]^-1 V [S^g]^-1 by the damped inverses)."""
        return [layer.precondition(V) for layer, V in zip(state.layers, Vs)]

    def _weights(self, state, eps):
        """Each layer's weights ``[R, S, d_in + 1, d_out]`` at which a step takes its gradients, from the draws
        ``eps`` of ``noise``."""
        raise NotImplementedError

    def _layers_from_hom(self, hom):
        return [(h[..., :-1, :], h[..., -1, :]) for h in hom]

    def predict(self, state, x, n_samples, generator):
        return self._predictive(state, self.model.forward_layers(self.sample_layers(state, n_samples, generator), x))

    def step(self, state, batch, noise, lr_scale=1.0):
        eps, y_noise = noise
        t = state.t + 1
        T_stats, T_inv = self.cfg.T_stats, self.cfg.T_inv
        # the step count is read (a host sync, and a graph break under torch.compile) only where a schedule needs it
        k = int(t[0]) if T_stats > 1 or T_inv > 1 else 1
        hom = self._weights(state, eps)
        # the sampled targets' back-propagated gradients feed the factors only (every T_stats steps)
        if self.model.convolutional:
            f, ll, acts, grads, ds = self._conv_grads(state, hom, batch, y_noise, factors=k % T_stats == 0)
            dz = [None] * len(hom)
        else:
            f, ll, acts, dz, ds = self._backprop_observed_and_sampled(state, self._layers_from_hom(hom), batch.x,
                                                                     batch.y, y_noise, sampled=k % T_stats == 0)
            grads = [None] * len(hom)
        g_in, _ = self._gammas(state)
        # Momentum on V with Adam-style bias correction, as the authors' regression code
        # (pomonam/NoisyNaturalGradient regression/ops/mvg_optimizer.py: ratio = 0.1, bias_corr); Alg. 2
        # omits it "for simplicity". momentum = 0 gives Alg. 2 exactly.
        b1 = self.cfg.momentum
        bias_corr = (1 - b1 ** t.to(state.mean.dtype))[:, None, None] if state.mom is not None else None
        g_in = g_in[:, None, None]
        beta = self.cfg.beta * lr_scale
        Vs, rows, moms, layers = [], [], [], list(state.layers)
        n_ex = batch.x.shape[1]
        for l, (a, d_y, d_s, W, g_W) in enumerate(zip(acts, dz, ds or [None] * len(acts), hom, grads)):
            S_ = W.shape[1]
            grad, homog = _summed_gradient(a, d_y, g_W, S_)
            V = grad / S_ - g_in * W.mean(1)
            if state.mom is not None:
                moms.append(b1 * state.mom[l] + (1 - b1) * V)
                V = moms[l] / bias_corr
            Vs.append(V)
            if k % T_stats == 0:
                layers[l], row = state.layers[l].averaged(homog or homogeneous_rows(a), d_s, S_, n_ex, beta)
                rows.append(row)
        extra = self._update_extra_factors(state, rows, beta, S_, n_ex) if rows else {}
        step = self._flat(self._precondition_all(state, Vs))
        lr = self.cfg.lr * lr_scale
        if self.cfg.kl_clip is not None:
            step = step * kl_clip_coeff(self.cfg, t, lr, step, self._flat(Vs))[:, None]
        velocity = state.velocity
        if velocity is not None:
            step = velocity = b1 * velocity + step
        new = state.replace(mean=state.mean + lr * step, t=t, layers=tuple(layers), velocity=velocity,
                            mom=tuple(moms) if state.mom is not None else None, **extra,
                            **self._noise_step(state, f, batch.y, lr_scale))
        new = self._refresh(new, covariance=k % T_stats == 0, inverses=k % T_inv == 0)
        nll = -ll.mean(1)
        return new, {"objective": nll, "nll": nll}

    def _conv_grads(self, state, hom, batch, y_noise, factors: bool):
        """A convolutional network's step quantities: the outputs, ``ll [R, S]``, autograd's gradient of the
        minibatch-mean log-likelihood with respect to each sampled ``[W; b]`` (``[R, S, d_in + 1, d_out]``) and, for a
        step that updates the factors, the patches and the sampled targets' back-propagated gradients (else None:
        forming the patches is most of a step's memory traffic)."""
        hom = [h.detach().requires_grad_() for h in hom]
        layers = self._layers_from_hom(hom)
        lik = likelihood_of(state, self.likelihood)
        with torch.enable_grad():
            f, acts, zs = self.model.forward_cache(layers, batch.x, patches=factors)
            fd = f.detach()
            grads = torch.autograd.grad(f, hom, lik.grad_f(fd, batch.y) / batch.x.shape[1], retain_graph=factors)
            ds = self.model.backprop(layers, acts, zs, lik.sampled_score(fd, y_noise)) if factors else None
        acts = [None if a is None else a.detach() for a in acts]
        return fd, lik.log_prob(fd, batch.y).mean(-1), acts, grads, ds


class NoisyKFAC(KroneckerFactored):
    """Noisy K-FAC for fully connected layers (and convolutions): the posterior MN(M_l, (lambda/N) [A^g_in]^-1,
    [S^g_in]^-1) per layer, a step at weights drawn from it; each layer's ``Kronecker`` keeps the covariance's square
    roots ``cA``, ``cS`` and, where the mean update needs another damping or refresh, its damped inverses."""

    name = "noisy_kfac"
    Config = NoisyKFACConfig
    replica_hparams = MappingProxyType({"kl_weight": (0.01, 1.0)})   # lambda, where a search gives one
    compilable = True   # bench/step_ab.py
    # the step's many small extern calls (Cholesky, triangular solves, bmm) made from C++: 1.08-1.26x at R = 20 and 10
    # (bench/step_ab.py), compiled in 52 s against 73 (check_compiled in a fresh inductor cache)
    compile_cpp_wrapper = True

    @property
    def _inverses_from_covariance(self) -> bool:
        """Without extrinsic damping and with both refreshed together, the damped inverses of the mean update are
        the covariance factors': [A^g]^-1 = C_A C_A^T N / lambda, [S^g]^-1 = C_S C_S^T (never formed)."""
        return self.cfg.damping_ex == 0 and self.cfg.T_inv == self.cfg.T_stats

    def _refresh(self, state, covariance: bool, inverses: bool):
        g_in, g = self._gammas(state)
        scale = torch.sqrt(self.lam(state.kl_weight) / state.n_data.to(state.mean.dtype))[:, None, None]
        layers = []
        for layer in state.layers:
            if covariance:  # square roots of (lambda/N) [A^g_in]^-1 and [S^g_in]^-1: C = chol(X)^-T (unique)
                layer = layer.with_root(g_in, scale)
            if inverses and not self._inverses_from_covariance:
                layer = layer.with_inverse(g)
            layers.append(layer)
        return state.replace(layers=tuple(layers))

    def _precondition_all(self, state, Vs):
        if not self._inverses_from_covariance:
            return super()._precondition_all(state, Vs)
        n_over_kl = (state.n_data.to(Vs[0].dtype) / self.lam(state.kl_weight))[:, None, None]
        return [layer.precondition_by_root(V, n_over_kl) for layer, V in zip(state.layers, Vs)]

    def noise(self, state, batch, generator):
        R, S_ = state.mean.shape[0], self.cfg.train_samples
        eps = [prng.randn(R, S_, d_in + 1, d_out, generator=generator, dtype=batch.x.dtype, device=batch.x.device)
               for _, _, d_in, d_out in self.model.slices]
        return eps, self._target_noise(state, batch, generator)

    def _weights(self, state, eps):
        """W_l = M_l + cA_l E cS_l^T, so Cov vec(W_l) = (lambda/N)[A^g_in]^-1 (x) [S^g_in]^-1."""
        return [layer.sample(self._hom(state.mean, l), eps[l]) for l, layer in enumerate(state.layers)]

    def sample_layers(self, state, n_samples, generator):
        R = state.mean.shape[0]
        eps = [prng.randn(R, n_samples, d_in + 1, d_out, generator=generator, dtype=state.mean.dtype,
                           device=state.mean.device) for _, _, d_in, d_out in self.model.slices]
        return self._layers_from_hom(self._weights(state, eps))

    def kl(self, state):
        """lambda KL(MN(M, U, V) || N(0, eta I)) per layer, U = cA cA^T, V = cS cS^T (triangular factors):
        0.5 [tr(U) tr(V) / eta + ||M||^2 / eta - k + k log eta - d_out log|U| - d_in log|V|]."""
        eta = 1.0 / state.prior_prec[:, 0]
        total = 0
        for l, ((_, _, d_in, d_out), layer) in enumerate(zip(self.model.slices, state.layers)):
            cA, cS, M = layer.cA, layer.cS, self._hom(state.mean, l)
            k = (d_in + 1) * d_out
            logdet_U = 2 * torch.log(cA.diagonal(dim1=-2, dim2=-1).abs()).sum(-1)
            logdet_V = 2 * torch.log(cS.diagonal(dim1=-2, dim2=-1).abs()).sum(-1)
            total = total + 0.5 * ((cA * cA).sum((-2, -1)) * (cS * cS).sum((-2, -1)) / eta
                                   + (M * M).sum((-2, -1)) / eta - k + k * torch.log(eta)
                                   - d_out * logdet_U - (d_in + 1) * logdet_V)
        return self.lam(state.kl_weight) * total
