"""Global inducing point variational inference and the families it is compared with (Ober & Aitchison, 2020):
``fac`` (factorised), ``li`` (local inducing), ``gi`` (global inducing), ``fac_gi`` and ``rand_gi`` (factorised or
prior-drawn lower layers under a global-inducing output layer), each with the prior ``standard``, ``neal``,
``scale`` or ``spatial_iw`` (``bnnbench/methods/inducing``), over the protocol's MLP or one of the paper's convolutional
networks (``arch``: ``mlp``, ``mnist500_cnn``, ``resnet8``; ``inducing/architectures.py``) on the data set's images
(inputs arrive flattened; ``image_shape`` (C, H, W), unset: the data set's).

Every variational parameter (inducing inputs, pseudo-outputs and pseudo-precisions, factorised means and variances,
the Scale prior's Gamma parameters, and the Gaussian likelihood's noise scale, a point estimate as the library's
``NormalLearnedScale``) is trained by Adam on the negative ELBO per data point, estimated with S samples,

    L = -(1/S) sum_s [ (1/B) sum_i log p(y_i | f_s(x_i)) + beta_t (log p(W_s, s_s) - log q(W_s, s_s)) / N ],

beta_t = min(1, t / kl_ramp_steps) the optional KL tempering of the paper's CIFAR-10 run (1 without it). The method's
priors are its own (``method.prior``): the protocol's prior precision is not used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from bnnbench.methods.inducing.architectures import ARCHS, build as build_arch
from bnnbench.methods.inducing.network import InducingNet, InducingParams
from bnnbench.methods.inducing.priors import check_prior
from bnnbench.core.likelihoods import Gaussian
from bnnbench.methods.adam import adam
from bnnbench.methods.base import Method, Predictive, Problem, hyper_state, likelihood_of
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.state import State, state_class

INDUCING_INITS = ("randn", "batch")


@dataclass(frozen=True)
class InducingFamilyConfig(MethodConfig):
    prior: str = "neal"                 # standard | neal | scale | spatial_iw
    arch: str = "mlp"                   # mlp (the protocol's MLP) | mnist500_cnn | resnet8
    image_shape: Optional[List[int]] = None  # (C, H, W) of the inputs; None: the data set's
    channels: Optional[int] = None      # convolutional channels (None: the architecture's: 64 mnist500_cnn, 32 resnet8)
    train_samples: int = 1              # MC samples per step (1: the authors' CIFAR-10 script)
    lr: float = 1e-2
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    learn_noise: bool = True            # Gaussian likelihood: learn the noise scale (point estimate)
    init_log_noise_std: float = 0.0     # its start, in the normalised units of the targets
    kl_ramp_steps: int = 0              # KL weight rising linearly from 0 to 1 over these steps (0: no tempering)

    def net_settings(self) -> dict:
        """The ``InducingNet`` keywords of this family's own settings (each family's Config adds its): no global
        inducing points unless a family has them."""
        return {"n_inducing": 0}


@dataclass(frozen=True)
class FacConfig(InducingFamilyConfig):
    name: str = "fac"
    var_init_mult: float = 1e-3         # initial variance / prior (Neal) variance
    local_reparam: bool = True          # draw pre-activations (UCI); false: draw the weights
    marginal_var_unscaled: bool = False  # as the library under the Scale prior: the pre-activations' variance from
                                         # e^V, D times q's e^V / D (its KL sees q); App. G's Scale-prior column

    def net_settings(self) -> dict:
        return {**super().net_settings(), "var_init_mult": self.var_init_mult, "local_reparam": self.local_reparam,
                "marginal_var_unscaled": self.marginal_var_unscaled}


@dataclass(frozen=True)
class LIConfig(InducingFamilyConfig):
    name: str = "li"
    log_prec_init: float = -4.0         # initial log pseudo-precision
    log_prec_lr: float = 1.0            # multiplies the stored log-precision (its learning rate)

    def net_settings(self) -> dict:
        return {**super().net_settings(), "log_prec_init": self.log_prec_init, "log_prec_lr": self.log_prec_lr}


@dataclass(frozen=True)
class GIConfig(InducingFamilyConfig):
    name: str = "gi"
    inducing: int = 100                 # P global inducing inputs
    inducing_init: str = "randn"        # randn: N(0, 1) draws | batch: the first training minibatch (and, for a
                                        # categorical likelihood, its one-hot labels as the output pseudo-outputs)
    log_prec_init: float = -4.0
    out_log_prec_init: Optional[float] = None  # the output layer's (None: log_prec_init)
    log_prec_lr: float = 1.0

    def net_settings(self) -> dict:
        return {"n_inducing": self.inducing, "log_prec_init": self.log_prec_init,
                "out_log_prec_init": self.out_log_prec_init, "log_prec_lr": self.log_prec_lr}


@dataclass(frozen=True)
class FacGIConfig(GIConfig):
    name: str = "fac_gi"
    var_init_mult: float = 1e-3

    def net_settings(self) -> dict:
        return {**super().net_settings(), "var_init_mult": self.var_init_mult}


@dataclass(frozen=True)
class RandGIConfig(GIConfig):
    name: str = "rand_gi"


@state_class
class InducingState(State):
    """The variational parameters theta (``q``: ``network.InducingParams``) and Adam's moments of each, ``m`` and
    ``v`` (the same structure), after t steps; a learned noise's precision tau = e^(-2 log sigma) is ``noise_prec``."""
    q: InducingParams
    m: InducingParams
    v: InducingParams
    t: torch.Tensor


class InducingFamily(Method):
    """One posterior family over the layers of the network (``family``); subclasses name it."""

    family = "gi"
    objective_is_elbo = True
    compilable = True   # on the MLP (compiles_with); bench/step_ab.py: 1.5-2.5x at App. G's UCI setting
    # kernels called from C++: 1.08-1.24x for fac and gi at App. G's R = 20 (bench/step_ab.py), none at R = 100; the
    # compiled contract checks of the inducing families take as long either way (8.3-8.6 min in a fresh cache)
    compile_cpp_wrapper = True

    @classmethod
    def compiles_with(cls, cfg) -> bool:
        """The protocol MLP's step compiles (one graph, checked by the contract); the convolutional architectures'
        have not been compiled."""
        return cls.compilable and cls.Config.of(cfg).arch == "mlp"

    def __init__(self, cfg, model, likelihood):
        super().__init__(cfg, model, likelihood)
        c = self.cfg
        self.check_settings(c)
        image_shape = c.image_shape or model.input_shape   # unset: the data set's (the network's)
        modules, in_shape = build_arch(c.arch, model.sizes, image_shape, model.activation, c.channels or 0)
        self.net = InducingNet(modules, self.family, c.prior, in_shape=in_shape, activation=model.activation,
                               **c.net_settings())

    def activation_width(self) -> int:
        """The largest module output of the network (a CNN's feature maps, not the protocol MLP's widths)."""
        return self.net.activation_width()

    @classmethod
    def check_settings(cls, c: InducingFamilyConfig) -> None:
        check_prior(c.prior)
        if c.arch not in ARCHS:
            raise ValueError(f"unknown architecture {c.arch!r}; valid: {', '.join(ARCHS)}")
        if isinstance(c, GIConfig) and c.inducing_init not in INDUCING_INITS:
            raise ValueError(f"unknown inducing_init {c.inducing_init!r}; valid: {', '.join(INDUCING_INITS)}")
        if isinstance(c, GIConfig) and c.inducing < 1:
            raise ValueError(f"method.inducing must be at least 1, got {c.inducing}")
        if c.kl_ramp_steps < 0:
            raise ValueError(f"method.kl_ramp_steps must be >= 0, got {c.kl_ramp_steps}")

    def learns_noise(self) -> bool:
        return self.likelihood == "gaussian" and self.cfg.learn_noise

    def init(self, problem: Problem, generator: torch.Generator) -> InducingState:
        R, like = problem.n_replicas, problem.prior_prec
        params = self.net.init_params(R, generator, like.device, like.dtype)
        hyper = hyper_state(problem)
        if self.learns_noise():
            params = params.replace(log_noise_std=torch.full((R,), self.cfg.init_log_noise_std, device=like.device,
                                                             dtype=like.dtype))
            hyper["noise_prec"] = torch.exp(-2 * params.log_noise_std)
        return InducingState(**hyper, q=params, m=params.map(torch.zeros_like), v=params.map(torch.zeros_like),
                             t=torch.zeros(R, dtype=torch.long, device=like.device))

    def noise(self, state, batch, generator):
        return self.net.noise(state.q, self.cfg.train_samples, batch.x.shape[1], generator)

    def _likelihood(self, state, params: InducingParams):
        if self.learns_noise():
            return Gaussian(torch.exp(-2 * params.log_noise_std))
        return likelihood_of(state, self.likelihood)

    def inducing_from_batch(self, params: InducingParams, batch, first: torch.Tensor) -> InducingParams:
        """Replicas at their first step (``first [R]``) take the batch's first rows as inducing inputs (and one-hot
        labels as the output layer's pseudo-outputs, categorical likelihood), as the authors' CIFAR-10 script."""
        U0 = params.U0
        m = min(U0.shape[1], batch.x.shape[1])
        mask = first[:, None, None]
        x = batch.x[:, :m].reshape(U0.shape[0], m, -1)
        params = params.replace(U0=torch.where(mask, torch.cat([x, U0[:, m:]], 1), U0))
        if self.likelihood == "categorical":
            out = params.layers[-1]
            V = out.weights.pseudo_out
            onehot = F.one_hot(batch.y[:, :m].long(), V.shape[-1]).to(V.dtype)
            out = out.replace(weights=out.weights.replace(pseudo_out=torch.where(mask, torch.cat([onehot, V[:, m:]], 1),
                                                                                  V)))
            params = params.replace(layers=(*params.layers[:-1], out))
        return params

    def objective(self, state, params: InducingParams, batch, noise):
        """(negative tempered ELBO per data point, NLL, the single-sample KL estimate) per replica ``[R]``."""
        f, logpq = self.net.forward(params, batch.x, noise)
        ll = self._likelihood(state, params).log_prob(f, batch.y).mean(dim=(1, 2))
        kl = -logpq.mean(1)
        beta = 1.0
        if self.cfg.kl_ramp_steps > 0:
            beta = ((state.t + 1).to(kl.dtype) / self.cfg.kl_ramp_steps).clamp(max=1.0)
        return -ll + beta * kl / state.n_data.to(kl.dtype), -ll, kl

    def step(self, state, batch, noise, lr_scale=1.0):
        params = state.q
        if self.net.n_inducing and self.cfg.inducing_init == "batch":
            params = self.inducing_from_batch(params, batch, state.t == 0)
        leaves = params.map(lambda v: v.detach().requires_grad_(True))
        with torch.enable_grad():
            obj, nll, kl = self.objective(state, leaves, batch, noise)
            grads = torch.autograd.grad(obj.sum(), leaves.leaves())
        t = state.t + 1
        lr, betas, eps = self.cfg.lr * lr_scale, tuple(self.cfg.betas), self.cfg.eps
        thetas, structure = pytree.tree_flatten(params)
        steps = [adam(theta, g, m1, m2, t, lr, betas, eps)
                 for theta, g, m1, m2 in zip(thetas, grads, state.m.leaves(), state.v.leaves())]
        q, m, v = (pytree.tree_unflatten([s[k] for s in steps], structure) for k in range(3))
        new = state.replace(q=q, m=m, v=v, t=t)
        if self.learns_noise():
            new = new.replace(noise_prec=torch.exp(-2 * q.log_noise_std))
        return new, {"objective": obj.detach(), "nll": nll.detach(), "kl": kl.detach()}

    def predict(self, state, x, n_samples, generator):
        params = state.q
        with torch.no_grad():
            f, _ = self.net.forward(params, x, self.net.noise(params, n_samples, x.shape[1], generator))
        return Predictive(f=f, noise_prec=state.noise_prec)


class Factorised(InducingFamily):
    name, family, Config = "fac", "fac", FacConfig


class LocalInducing(InducingFamily):
    name, family, Config = "li", "li", LIConfig


class GlobalInducing(InducingFamily):
    name, family, Config = "gi", "gi", GIConfig


class FactorisedGlobalInducing(InducingFamily):
    name, family, Config = "fac_gi", "fac_gi", FacGIConfig


class RandomGlobalInducing(InducingFamily):
    name, family, Config = "rand_gi", "rand_gi", RandGIConfig
