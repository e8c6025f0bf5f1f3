"""A fully connected network whose layers carry one posterior family each, run on the replica and sample axes.

With global inducing points the learned inputs U_0 ``[R, P, d_0]`` are prepended to every batch and propagated through
the *sampled* network (the library's ``InducingWrapper``): layer l's weights are drawn from the regression on the
propagated inducing rows U_{l-1}, then applied to every row, so the posterior of a layer depends on the draws below it
(Ober & Aitchison, 2020, Eq. 11-12). The outputs of the data rows are returned with the sum over layers of the single-
sample log p - log q of the weights and of the Scale prior's layer scales:

    ELBO = E_q[ sum_i log p(y_i | f(x_i)) + log p(W, s) - log q(W, s) ].
"""

from __future__ import annotations

import torch

from bnnbench.inducing.layers import Factorised, Inducing, PriorDraw
from bnnbench.inducing.priors import LayerPrior

FAMILIES = ("fac", "li", "gi", "fac_gi", "rand_gi")
ACTIVATIONS = {"relu": torch.relu, "linear": lambda h: h}


class InducingNet:
    """``sizes`` = [d_0, hidden..., d_out]; ``family`` one of ``FAMILIES``: every layer factorised (``fac``), local
    inducing (``li``), global inducing (``gi``), or factorised / prior draws below a global-inducing output layer
    (``fac_gi``, ``rand_gi``)."""

    def __init__(self, sizes, family: str, prior: str, *, n_inducing: int = 100, activation: str = "relu",
                 local_reparam: bool = False, var_init_mult: float = 1e-3, log_prec_init: float = -4.0,
                 out_log_prec_init: float | None = None, log_prec_lr: float = 1.0):
        if family not in FAMILIES:
            raise ValueError(f"unknown posterior family {family!r}; valid: {', '.join(FAMILIES)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
        self.sizes, self.family = [int(s) for s in sizes], family
        self.act = ACTIVATIONS[activation]
        n_layers = len(self.sizes) - 1
        self.layers, self.priors = [], []
        for i, (d_in, d_out) in enumerate(zip(self.sizes[:-1], self.sizes[1:])):
            last = i == n_layers - 1
            lp = out_log_prec_init if (last and out_log_prec_init is not None) else log_prec_init
            if family == "fac":
                layer = Factorised(d_in, d_out, var_init_mult, local_reparam)
            elif family == "li":
                layer = Inducing(d_in, d_out, local=True, log_prec_init=lp, log_prec_lr=log_prec_lr)
            elif family == "gi" or last:
                layer = Inducing(d_in, d_out, n_inducing, log_prec_init=lp, log_prec_lr=log_prec_lr)
            elif family == "fac_gi":
                layer = Factorised(d_in, d_out, var_init_mult)
            else:
                layer = PriorDraw(d_in, d_out)
            self.layers.append(layer)
            self.priors.append(LayerPrior(prior, d_in + 1))
        self.n_inducing = int(n_inducing) if family in ("gi", "fac_gi", "rand_gi") else 0

    @property
    def output_dim(self) -> int:
        return self.sizes[-1]

    def init_params(self, R: int, generator, device, dtype) -> dict[str, torch.Tensor]:
        """The variational parameters ``{name: [R, ...]}``: ``U0`` and ``l<i>.<name>`` per layer."""
        params = {}
        if self.n_inducing:
            params["U0"] = torch.randn(R, self.n_inducing, self.sizes[0], generator=generator, device=device,
                                       dtype=dtype)
        for i, (layer, prior) in enumerate(zip(self.layers, self.priors)):
            for k, v in {**layer.init_params(R, generator, device, dtype),
                         **prior.init_params(R, device, dtype)}.items():
                params[f"l{i}.{k}"] = v
        return params

    def layer_params(self, params, i: int) -> dict[str, torch.Tensor]:
        pre = f"l{i}."
        return {k[len(pre):]: v for k, v in params.items() if k.startswith(pre)}

    def noise(self, params, S: int, rows: int, generator) -> list:
        """Every draw of one forward pass over ``rows`` data rows: per layer [prior's x0 or None, layer's eps]."""
        like = next(iter(params.values()))
        R = like.shape[0]
        out = []
        for i, (layer, prior) in enumerate(zip(self.layers, self.priors)):
            p = self.layer_params(params, i)
            out.append([prior.noise(p, S, generator), layer.noise(p, R, S, rows + self.n_inducing, generator, like)])
        return out

    def forward(self, params, x: torch.Tensor, noise: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs ``[R, S, B, d_out]`` for ``x [R, B, d_0]`` and log p - log q ``[R, S]``."""
        R, S = x.shape[0], noise[0][1].shape[1]
        h = x.unsqueeze(1).expand(R, S, *x.shape[1:])
        if self.n_inducing:
            h = torch.cat([params["U0"].unsqueeze(1).expand(R, S, *params["U0"].shape[1:]), h], dim=2)
        logpq = x.new_zeros(R, S)
        last = len(self.layers) - 1
        for i, (layer, prior) in enumerate(zip(self.layers, self.priors)):
            p = self.layer_params(params, i)
            alpha, lpq_prior = prior.prec(p, noise[i][0], R, S, x)
            h = torch.cat([h, torch.ones_like(h[..., :1])], dim=-1)
            h, lpq = layer.forward(p, h, alpha, noise[i][1], self.n_inducing)
            logpq = logpq + lpq + lpq_prior
            if i < last:
                h = self.act(h)
        return h[:, :, self.n_inducing:], logpq
