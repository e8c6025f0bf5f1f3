"""A network of ``modules`` whose weight layers carry one posterior family each, run on the replica and sample axes.

With global inducing points the learned inputs U_0 ``[R, P, d_0]`` (images flattened as the data) are prepended to
every batch and propagated through the *sampled* network (the library's ``InducingWrapper``): layer l's weights are
drawn from the regression on the propagated inducing rows U_{l-1}, then applied to every row, so the posterior of a
layer depends on the draws below it (Ober & Aitchison, 2020, Eq. 11-12). The outputs of the data rows are returned
with the sum over weight layers of the single-sample log p - log q of the weights and of the priors' own variables
(the Scale prior's layer scales, the spatial prior's Inverse-Wishart matrices):

    ELBO = E_q[ sum_i log p(y_i | f(x_i)) + log p(W, s) - log q(W, s) ].

The weight layers are numbered ``l0, l1, ...`` in the order the input meets them (a residual block's body in order);
their variational parameters are a typed ``InducingParams``: U_0 and one ``LayerQ`` per weight layer, in that order.
The families are assigned to them as in the paper: every one factorised (``fac``), local inducing (``li``) or global
inducing (``gi``), or factorised / prior draws below a global-inducing output layer (``fac_gi``, ``rand_gi``).
"""

from __future__ import annotations

import math

import torch

from bnnbench.core import prng
from bnnbench.methods.inducing import conv_layers, layers
from bnnbench.methods.inducing.architectures import mlp
from bnnbench.methods.inducing.layers import FactorisedQ, InducingQ
from bnnbench.methods.inducing.modules import WEIGHT_LAYERS, Conv2d, Linear, Residual
from bnnbench.methods.inducing.priors import LIBRARY_UNFIXED_PRIORS, InverseWishartQ, LayerPrior, ScaleQ
from bnnbench.methods.state import Node, state_class

FAMILIES = ("fac", "li", "gi", "fac_gi", "rand_gi")
BELOW_GI_OUTPUT = {"fac_gi": "fac", "rand_gi": "prior"}  # the lower layers' role where only the output layer is gi
ACTIVATIONS = ("relu", "linear")


@state_class
class LayerQ(Node):
    """One weight layer's variational parameters: its family's (``weights``: ``layers.FactorisedQ`` or
    ``layers.InducingQ``; None for prior draws) and its prior's own (``prior``: ``priors.ScaleQ`` or
    ``priors.InverseWishartQ``; None for ``standard`` and ``neal``)."""
    weights: FactorisedQ | InducingQ | None = None
    prior: ScaleQ | InverseWishartQ | None = None


@state_class
class InducingParams(Node):
    """The variational parameters of the network, each ``[R, ...]``: the global inducing inputs U_0 ``U0 [R, P, d_0]``
    (None without global inducing points), one ``LayerQ`` per weight layer (``layers``), and the Gaussian likelihood's
    log noise std ``log_noise_std [R]`` where it is learned (``method``; None otherwise)."""
    U0: torch.Tensor | None = None
    layers: tuple[LayerQ, ...]
    log_noise_std: torch.Tensor | None = None


def weight_layer(spec, shape, role: str, *, n_inducing: int, local_reparam: bool, var_init_mult: float,
                 log_prec_init: float, log_prec_lr: float, marginal_var_unscaled: bool = False):
    """The posterior of one weight layer: ``role`` fac | li | gi | prior, for inputs of ``shape``
    (``marginal_var_unscaled``: a factorised layer's marginal variance D times q's, ``layers.Factorised``)."""
    inducing = dict(log_prec_init=log_prec_init, log_prec_lr=log_prec_lr)
    if isinstance(spec, Linear):
        if role == "fac":
            return layers.Factorised(spec.d_in, spec.d_out, var_init_mult, local_reparam, marginal_var_unscaled)
        if role == "li":
            return layers.Inducing(spec.d_in, spec.d_out, local=True, **inducing)
        if role == "gi":
            return layers.Inducing(spec.d_in, spec.d_out, n_inducing, **inducing)
        return layers.PriorDraw(spec.d_in, spec.d_out)
    geometry = (spec.c_in, spec.c_out, spec.kernel, spec.padding, shape[1:])
    if role == "fac":
        return conv_layers.FactorisedConv(*geometry, var_init_mult, local_reparam)
    if role == "li":
        return conv_layers.LocalInducingConv(*geometry, **inducing)
    if role == "gi":
        return conv_layers.GlobalInducingConv(*geometry, n_inducing, **inducing)
    return conv_layers.PriorDrawConv(*geometry)


def weight_specs(modules, shape) -> list:
    """(spec, input shape) of every weight layer in order."""
    out = []
    for m in modules:
        if isinstance(m, Residual):
            out += weight_specs(m.body, shape)
        elif isinstance(m, WEIGHT_LAYERS):
            out.append((m, shape))
        shape = m.out_shape(shape)
    return out


class InducingNet:
    """``modules``: a sequence of ``modules`` (or the MLP's ``sizes = [d_0, hidden..., d_out]``, the activation
    ``activation`` between its layers); ``in_shape`` the shape of one input (``(d_0,)`` for an MLP); ``family`` one
    of ``FAMILIES``; ``prior`` one of ``priors.PRIORS``."""

    def __init__(self, modules, family: str, prior: str, *, in_shape=None, n_inducing: int = 100,
                 activation: str = "relu", local_reparam: bool = False, var_init_mult: float = 1e-3,
                 log_prec_init: float = -4.0, out_log_prec_init: float | None = None, log_prec_lr: float = 1.0,
                 marginal_var_unscaled: bool = False):
        if family not in FAMILIES:
            raise ValueError(f"unknown posterior family {family!r}; valid: {', '.join(FAMILIES)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
        if all(isinstance(m, int) for m in modules):
            modules, in_shape = mlp(modules, activation), (int(modules[0]),)
        self.modules, self.in_shape, self.family = list(modules), tuple(in_shape), family
        shape = self.in_shape
        for m in self.modules:
            shape = m.out_shape(shape)
        self.out_shape = shape
        specs = weight_specs(self.modules, self.in_shape)
        self.layers, self.priors = [], []
        for i, (spec, shape) in enumerate(specs):
            last = i == len(specs) - 1
            role = family if family not in BELOW_GI_OUTPUT else ("gi" if last else BELOW_GI_OUTPUT[family])
            lp = out_log_prec_init if (last and out_log_prec_init is not None) else log_prec_init
            layer = weight_layer(spec, shape, role, n_inducing=n_inducing, local_reparam=local_reparam,
                                 var_init_mult=var_init_mult, log_prec_init=lp, log_prec_lr=log_prec_lr,
                                 marginal_var_unscaled=marginal_var_unscaled and prior in LIBRARY_UNFIXED_PRIORS)
            self.layers.append(layer)
            self.priors.append(LayerPrior(prior, layer.D, spec.kernel ** 2 if isinstance(spec, Conv2d) else 1))
        self.n_inducing = int(n_inducing) if family in ("gi", "fac_gi", "rand_gi") else 0

    def activation_width(self) -> int:
        """The most elements of one input's activations after any module (the input included)."""
        width, shape = math.prod(self.in_shape), self.in_shape
        for m in self.modules:
            shape = m.out_shape(shape)
            width = max(width, math.prod(shape))
        return width

    @property
    def output_dim(self) -> int:
        return self.out_shape[-1]

    def init_params(self, R: int, generator, device, dtype) -> InducingParams:
        """The variational parameters at the start: ``U0`` and each weight layer's (its family's, then its
        prior's draws)."""
        U0 = None
        if self.n_inducing:
            d0 = 1
            for s in self.in_shape:
                d0 *= s
            U0 = prng.randn(R, self.n_inducing, d0, generator=generator, device=device, dtype=dtype)
        qs = []
        for layer, prior in zip(self.layers, self.priors):
            weights = layer.init_params(R, generator, device, dtype)        # the family's draws, then the prior's
            qs.append(LayerQ(weights=weights, prior=prior.init_params(R, device, dtype, generator)))
        return InducingParams(U0=U0, layers=tuple(qs))

    def noise(self, params: InducingParams, S: int, rows: int, generator) -> list:
        """Every draw of one forward pass over ``rows`` data rows: per weight layer [the prior's draws or None, the
        layer's eps]."""
        like = params.leaves()[0]
        R = like.shape[0]
        out = []
        for layer, prior, q in zip(self.layers, self.priors, params.layers):
            out.append([prior.noise(q.prior, S, generator),
                        layer.noise(q.weights, R, S, rows + self.n_inducing, generator, like)])
        return out

    def forward(self, params: InducingParams, x: torch.Tensor, noise: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs ``[R, S, B, d_out]`` for ``x [R, B, d_0]`` (images flat or not) and log p - log q ``[R, S]``."""
        eps = noise[0][1]
        R, S = x.shape[0], (eps[0] if isinstance(eps, tuple) else eps).shape[1]
        x = x.reshape(R, x.shape[1], -1)
        h = x.unsqueeze(1).expand(R, S, *x.shape[1:])
        if self.n_inducing:
            h = torch.cat([params.U0.unsqueeze(1).expand(R, S, *params.U0.shape[1:]), h], dim=2)
        if len(self.in_shape) > 1:
            h = h.reshape(R, S, h.shape[2], *self.in_shape)
        run = _Run(self, params, noise, x.new_zeros(R, S))
        h = run.modules(self.modules, h)
        return h[:, :, self.n_inducing:], run.logpq


class _Run:
    """One forward pass: the weight layers consumed in order, their log p - log q summed."""

    def __init__(self, net: InducingNet, params, noise, logpq):
        self.net, self.params, self.noise, self.logpq, self.i = net, params, noise, logpq, 0

    def modules(self, modules, h):
        for m in modules:
            if isinstance(m, Residual):
                h = h + self.modules(m.body, h)
            elif isinstance(m, WEIGHT_LAYERS):
                h = self.weight_layer(h)
            else:
                h = m(h)
        return h

    def weight_layer(self, h):
        i, net = self.i, self.net
        layer, prior, q = net.layers[i], net.priors[i], self.params.layers[i]
        R, S = h.shape[:2]
        alpha, lpq_prior = prior.prec(q.prior, self.noise[i][0], R, S, h)
        if layer.bias:
            h = torch.cat([h, torch.ones_like(h[..., :1])], dim=-1)
        h, lpq = layer.forward(q.weights, h, alpha, self.noise[i][1], net.n_inducing)
        self.logpq = self.logpq + lpq + lpq_prior
        self.i += 1
        return h
