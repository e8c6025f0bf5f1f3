"""The approximate posterior of one fully connected layer's weights W (D = fan-in + 1 rows, the bias an input of
ones; ``out`` columns), on the replica and sample axes: inputs ``h [R, S, rows, D]`` give outputs
``[R, S, rows, out]`` and the layer's single-sample log p(W) - log q(W) ``[R, S]``.

Families (Ober & Aitchison, 2020, Sec. 2-3 and App. C; the library's ``factorised.py``, ``inducing.py``):

- ``Factorised``: q(W) = N(M / sqrt(D), diag(e^V) / D), the stored parameters scaled by 1 / sqrt(D) so that Adam's
  steps are of the same size in every layer (App. C); M starts as a N(0, 1) draw (a Neal-prior draw of W), e^V at
  1e-3 (``var_init_mult``). Its KL to N(0, alpha^-1 I) is taken in closed form given alpha. With ``local_reparam``
  each pre-activation is drawn from its marginal (Kingma et al., 2015) instead of W (no inducing rows then), of
  variance (h * h) e^V / D, or (h * h) e^V with ``marginal_var_unscaled``: the library's ``FactorisedLRParam`` under a
  prior it does not treat as fixed (its Scale prior) returns the unscaled e^V to the forward pass while its KL sees
  q, a mismatch that App. G's factorised Scale-prior column inherits (``method.FacConfig.marginal_var_unscaled``).
- ``Inducing``: q(W) the Bayesian linear regression of ``blr`` on pseudo-data. Global inducing: the inducing inputs are
  the first P rows of ``h`` (the learned U_0 propagated through the layers below); local inducing (``local=True``):
  the layer's own learned inputs (P = D, the smallest complete set, as the library's ``LILinear``). Pseudo-outputs V
  ``[P, out]`` start at N(0, 1) draws, the pseudo-precisions at e^-4 (``log_prec_init``); ``log_prec_lr`` scales the
  stored log-precision (its effective learning rate).
- ``PriorDraw``: q(W) = p(W), fresh prior draws, no KL (the lower layers of ``rand -> gi``).

Each family's parameters are a typed ``FactorisedQ`` or ``InducingQ`` (``PriorDraw``: none, ``None``), the
``weights`` of the layer's ``network.LayerQ``. The prior precision ``alpha`` is alpha ``[R, S]`` (alpha I) or a
``precision.KroneckerPrec`` (the spatial prior of a convolution). ``apply`` maps the inputs through sampled weights;
the convolutional families (``conv_layers``) override it and the weight rows (D = C k^2, no bias).
"""

from __future__ import annotations

import math

import torch

from bnnbench.core import prng
from bnnbench.methods.inducing.blr import sample_weights, sample_weights_dual
from bnnbench.methods.state import Node, state_class


@state_class
class FactorisedQ(Node):
    """q(W) = N(M / sqrt(D), diag(e^V) / D) of a factorised layer: M ``mean`` and V ``log_var`` ``[R, D, out]``."""
    mean: torch.Tensor
    log_var: torch.Tensor


@state_class
class InducingQ(Node):
    """The pseudo-data of an inducing layer: pseudo-outputs V ``pseudo_out [R, P, out]`` (a global-inducing
    convolution's ``[R, P, out, H, W]``), log pseudo-precisions / ``log_prec_lr`` ``log_prec [R, P]`` and, local
    inducing, the learned inputs ``inputs [R, P, D]`` (global inducing: None, the propagated U_0)."""
    pseudo_out: torch.Tensor
    log_prec: torch.Tensor
    inputs: torch.Tensor | None = None


class Layer:
    bias = 1  # a fully connected layer's inputs carry a column of ones

    def __init__(self, d_in: int, d_out: int):
        self.d_in, self.d_out, self.D = int(d_in), int(d_out), int(d_in) + self.bias

    def apply(self, h: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """h W for ``h [R, S, rows, D]`` and ``W [R, S, D, out]``."""
        return h @ W

    def apply_marginal(self, h, mean, var, noise):
        """Pre-activations drawn from their marginal under q(W) = N(mean, diag(var)) ``[R, D, out]``:
        h mean + ((h * h) var)^(1/2) eps."""
        mu = h @ mean.unsqueeze(1)
        return mu + ((h * h) @ var.unsqueeze(1)).clamp_min(0).sqrt() * noise

    def init_params(self, R, generator, device, dtype) -> FactorisedQ | InducingQ | None:
        """The layer's variational parameters at the start (None: it has none)."""
        return None

    def noise(self, params, R: int, S: int, rows: int, generator, like: torch.Tensor):
        """The standard normal draws of one forward pass (W's, or the pre-activations' under local reparam.)."""
        return prng.randn(R, S, self.D, self.d_out, generator=generator, device=like.device, dtype=like.dtype)

    def forward(self, params, h, alpha, noise, n_inducing: int):
        raise NotImplementedError


class Factorised(Layer):
    def __init__(self, d_in, d_out, var_init_mult: float = 1e-3, local_reparam: bool = False,
                 marginal_var_unscaled: bool = False):
        super().__init__(d_in, d_out)
        self.var_init_mult, self.local_reparam = float(var_init_mult), bool(local_reparam)
        self.marginal_var_unscaled = bool(marginal_var_unscaled)

    def init_params(self, R, generator, device, dtype):
        mean = prng.randn(R, self.D, self.d_out, generator=generator, device=device, dtype=dtype)
        return FactorisedQ(mean=mean, log_var=torch.full_like(mean, math.log(self.var_init_mult)))

    def noise(self, params, R, S, rows, generator, like):
        if self.local_reparam:
            return prng.randn(R, S, rows, self.d_out, generator=generator, device=like.device, dtype=like.dtype)
        return super().noise(params, R, S, rows, generator, like)

    def forward(self, params, h, alpha, noise, n_inducing):
        scale = 1.0 / self.D
        mean, var = params.mean * scale ** 0.5, params.log_var.exp() * scale
        if self.local_reparam:
            out = self.apply_marginal(h, mean, var * self.D if self.marginal_var_unscaled else var, noise)
        else:
            out = self.apply(h, mean.unsqueeze(1) + var.sqrt().unsqueeze(1) * noise)
        return out, -factorised_kl(mean, var, alpha)


def factorised_kl(mean: torch.Tensor, var: torch.Tensor, alpha) -> torch.Tensor:
    """KL(N(mean, diag(var)) || N(0, A^-1)) ``[R, S]`` for ``mean, var [R, D, out]``, summed over the columns:
    1/2 sum_j [tr(A diag(v_j)) + m_j^T A m_j - D - log det A - sum log v_j]."""
    m2 = (mean * mean).unsqueeze(1)
    v = var.unsqueeze(1)
    if isinstance(alpha, torch.Tensor):
        a = alpha[..., None, None]
        return 0.5 * (a * (v + m2) - 1 - torch.log(a) - torch.log(v)).sum((-1, -2))
    D, out = mean.shape[-2], mean.shape[-1]
    trace = (alpha.diagonal().unsqueeze(-1) * v).sum((-1, -2))
    return 0.5 * (trace + alpha.quad(mean.unsqueeze(1)) - D * out - out * alpha.logdet() - torch.log(v).sum((-1, -2)))


class Inducing(Layer):
    def __init__(self, d_in, d_out, n_inducing: int | None = None, local: bool = False,
                 log_prec_init: float = -4.0, log_prec_lr: float = 1.0):
        super().__init__(d_in, d_out)
        self.local = bool(local)
        self.P = self.D if local else int(n_inducing)
        self.log_prec_lr = float(log_prec_lr)
        self.log_prec_init = float(log_prec_init)

    def init_params(self, R, generator, device, dtype):
        pseudo_out = prng.randn(R, self.P, self.d_out, generator=generator, device=device, dtype=dtype)
        log_prec = torch.full((R, self.P), self.log_prec_init / self.log_prec_lr, device=device, dtype=dtype)
        inputs = (prng.randn(R, self.P, self.D, generator=generator, device=device, dtype=dtype) if self.local
                  else None)
        return InducingQ(pseudo_out=pseudo_out, log_prec=log_prec, inputs=inputs)

    def pseudo_prec(self, params) -> torch.Tensor:
        """Lambda = diag(exp(log_prec_lr * log_prec)) ``[R, P]``."""
        return (self.log_prec_lr * params.log_prec).exp()

    @property
    def dual(self) -> bool:
        """Fewer inducing points than weight rows: the regression in P x P algebra (``blr.sample_weights_dual``,
        which draws a pseudo-noise besides W's)."""
        return self.P < self.D

    def noise(self, params, R, S, rows, generator, like):
        z = super().noise(params, R, S, rows, generator, like)
        if not self.dual:
            return z
        return z, prng.randn(R, S, self.P, self.d_out, generator=generator, device=like.device, dtype=like.dtype)

    def inducing_inputs(self, params, h, n_inducing):
        return params.inputs.unsqueeze(1) if self.local else h[:, :, :n_inducing]

    def forward(self, params, h, alpha, noise, n_inducing):
        U = self.inducing_inputs(params, h, n_inducing)
        lam, V = self.pseudo_prec(params).unsqueeze(1), params.pseudo_out.unsqueeze(1)
        if self.dual:
            W, logpq = sample_weights_dual(U, lam, V, alpha, *noise)
        else:
            W, logpq = sample_weights(U, lam, V, alpha, noise)
        return self.apply(h, W), logpq


class PriorDraw(Layer):
    def forward(self, params, h, alpha, noise, n_inducing):
        if isinstance(alpha, torch.Tensor):
            return self.apply(h, alpha.rsqrt()[..., None, None] * noise), torch.zeros_like(alpha)
        return self.apply(h, alpha.whiten(noise)), noise.new_zeros(noise.shape[:2])
