"""Mean-field Gaussian VI by the reparameterisation trick, optimised with Adam.

"Bayes by Backprop" (Blundell et al., 2015) as in SLANG Table 2, and "BBVI" of Vadam Table 1.
q(theta) = N(mu, diag(sigma^2)), sigma = softplus(rho), prior N(0, diag(lambda)^-1). Objective: the
negative ELBO per data point, estimated with S samples,

    L(mu, rho) = -(1/S) sum_s (1/M) sum_i log p(y_i | theta_s) + KL(q || p) / N,

with theta_s = mu + sigma * eps_s (or, optionally, the local reparameterisation trick).
The step size is the config's ``lr``, or each replica's own where a search gives one (``replica_hparams``: NNG
Table 1 selects BBB's on held-out rows, the paper stating none).
``learn_noise`` (Gaussian likelihood): the noise precision has a learned Gamma posterior, as the noisy natural
gradient methods' UCI protocol (``gamma_noise``), so that BBB runs beside them under the same model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import List, Optional

import torch
import torch.nn.functional as F

from bnnbench.core import prng
from bnnbench.core.linalg import mlp_relu
from bnnbench.core.metrics import kl_diag_gaussians
from bnnbench.methods import gamma_noise
from bnnbench.methods.adam import adam
from bnnbench.methods.base import Problem, hyper_state
from bnnbench.methods.gaussian.mean_field import MeanField, MeanFieldState
from bnnbench.methods.state import state_class
from bnnbench.core.models.mlp import MLP, softplus_inv


@dataclass(frozen=True)
class BBBConfig(gamma_noise.NoiseConfig):
    name: str = "bbb"
    lr: float = 1e-3
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    train_samples: int = 1              # MC samples per step
    local_reparam: bool = False         # local reparameterisation trick (Kingma et al., 2015)
    init_mean: str = "uniform_fan_in"   # uniform_fan_in (nn.Linear's default) | zero
    init_std: Optional[float] = None    # initial sigma; else init_rho (sigma = softplus(rho)); else 1/sqrt(init_prec)
    init_rho: Optional[float] = None
    init_prec: Optional[float] = 10.0


@state_class
class BBBState(MeanFieldState):
    """mu and rho (sigma = softplus(rho)), Adam's moments of each (m_mean, v_mean, m_rho, v_rho) after t steps; with
    ``learn_noise``, q(tau) in ``noise_q`` (``gamma_noise``); each replica's Adam step size ``lr`` ``[R]`` where the
    problem gives one (else the config's)."""
    rho: torch.Tensor
    m_mean: torch.Tensor
    v_mean: torch.Tensor
    m_rho: torch.Tensor
    v_rho: torch.Tensor
    t: torch.Tensor
    lr: torch.Tensor | None = None


# the compiled step's activations with the examples innermost from this minibatch size on (bench/step_ab.py against
# the units innermost, R = 100 / 20: 1.45x / 1.01x at nng_uci's 100 rows on kin8nm, 1.14x / 1.03x at vadam_uci's 128;
# 0.83x / 1.04x at vadam_uci's 32 on Boston, 0.76x / 0.83x at slang_uci's 10: fewer rows than a vector's lanes); the
# fused kernel takes over from mlp_relu.MIN_ROWS (the same 64) rows on
EXAMPLES_INNER_MIN_BATCH = 64


class BBB(MeanField):
    name = "bbb"
    compilable = True  # bench/compile_step.py: 1.3-2x faster compiled at UCI scale
    Config = BBBConfig
    conv = True  # with weight draws (the local reparameterisation trick is an MLP's)
    replica_hparams = MappingProxyType({"lr": (1e-4, 0.1)})   # Adam's step size, where a search gives one

    def init(self, problem: Problem, generator: torch.Generator) -> BBBState:
        cfg = self.cfg
        R = problem.n_replicas
        mean = self.init_params(problem, generator)
        if cfg.init_std is not None:
            std = cfg.init_std
            rho = torch.full_like(mean, softplus_inv(std))
        elif cfg.init_rho is not None:
            rho = torch.full_like(mean, cfg.init_rho)
        else:  # sigma = 1/sqrt(prec_init), as the Vadam code's BBVI
            rho = torch.full_like(mean, softplus_inv(cfg.init_prec ** -0.5))
        z = torch.zeros_like(mean)
        state = BBBState(**hyper_state(problem), mean=mean, rho=rho, m_mean=z, v_mean=z.clone(), m_rho=z.clone(),
                         v_rho=z.clone(), t=torch.zeros(R, dtype=torch.long, device=mean.device))
        if gamma_noise.learns_noise(cfg, self.likelihood):
            state = state.replace(**gamma_noise.init_state(cfg, R, mean.device, mean.dtype))
        return state

    def std(self, state):
        return F.softplus(state.rho)

    def noise(self, state, batch, generator):
        """The weights' eps, or with the local reparameterisation trick each layer's pre-activation draws."""
        if not self.cfg.local_reparam:
            return super().noise(state, batch, generator)
        R, S, B = state.mean.shape[0], self.cfg.train_samples, batch.x.shape[1]
        return [prng.randn(R, S, B, d_out, generator=generator, device=batch.x.device,
                            dtype=batch.x.dtype) for _, _, _, d_out in self.model.slices]

    def objective(self, state, mean, rho, batch, noise, examples_inner=False, fused=False):
        """(negative ELBO / N, NLL, KL) per replica and the outputs ``f`` of the samples; ``fused``: the network's
        forward pass and its gradient by the fused kernel (``core/linalg/mlp_relu``)."""
        sigma = F.softplus(rho)
        if fused:
            f = mlp_relu.forward(batch.x, mean.unsqueeze(1) + sigma.unsqueeze(1) * noise, self.model.sizes)
        elif self.cfg.local_reparam:
            f = self.model.forward_local_reparam(mean, sigma * sigma, batch.x, noise)
        else:
            layers = self.model.sampled_layers(mean, sigma, noise)
            f = (self.model.forward_layers(layers, batch.x, examples_inner=True) if examples_inner
                 else self.model.forward_layers(layers, batch.x))
        nll = self.nll(state, f, batch.y)
        prior_var = 1.0 / state.prior_prec
        kl = kl_diag_gaussians(mean, sigma * sigma, torch.zeros_like(mean), prior_var)
        return nll + kl / state.n_data.to(nll.dtype), nll, kl, f

    def compiled_step(self, compile):
        """``step`` compiled; on minibatches of at least ``mlp_relu.MIN_ROWS`` rows, the network's forward pass and
        gradient by the fused kernel (``core/linalg/mlp_relu``: a ReLU MLP in float32 on a CPU, without the local
        reparameterisation trick), else, on an MLP with minibatches of at least ``EXAMPLES_INNER_MIN_BATCH`` rows, its
        activations laid out with the examples innermost (``MLP.forward_layers``)."""
        mlp = type(self.model) is MLP
        kernel = mlp and not self.cfg.local_reparam and mlp_relu.available()

        def step(state, batch, noise, lr_scale=1.0):
            inner = mlp and batch.x.shape[1] >= EXAMPLES_INNER_MIN_BATCH
            fused = (kernel and batch.x.shape[1] >= mlp_relu.MIN_ROWS
                     and mlp_relu.applies(self.model, batch.x, state.mean.dtype))
            return self.step(state, batch, noise, lr_scale, examples_inner=inner, fused=fused)
        return compile(step)

    def step(self, state, batch, noise, lr_scale=1.0, examples_inner=False, fused=False):
        mean = state.mean.detach().requires_grad_(True)
        rho = state.rho.detach().requires_grad_(True)
        with torch.enable_grad():
            obj, nll, kl, f = self.objective(state, mean, rho, batch, noise, examples_inner, fused)
            g_mean, g_rho = torch.autograd.grad(obj.sum(), [mean, rho])
        t = state.t + 1
        lr = self.cfg.lr * lr_scale if state.lr is None else (state.lr * lr_scale)[:, None]
        betas, eps = tuple(self.cfg.betas), self.cfg.eps
        new_mean, m_mean, v_mean = adam(state.mean, g_mean, state.m_mean, state.v_mean, t, lr, betas, eps)
        new_rho, m_rho, v_rho = adam(state.rho, g_rho, state.m_rho, state.v_rho, t, lr, betas, eps)
        noise_changes = gamma_noise.step(self.cfg, state, f, batch.y, lr_scale) if state.noise_q is not None else {}
        new = state.replace(mean=new_mean, rho=new_rho, m_mean=m_mean, v_mean=v_mean, m_rho=m_rho, v_rho=v_rho, t=t,
                            **noise_changes)
        return new, {"objective": obj.detach(), "nll": nll.detach(), "kl": kl.detach()}
