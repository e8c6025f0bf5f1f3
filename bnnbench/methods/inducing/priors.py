"""Weight priors of a layer with D inputs (the bias included) and ``out`` outputs: W ~ N(0, alpha^-1 I).

Ober & Aitchison (2020) Sec. 4 and the authors' library (``bayesfunc/priors.py``):

- ``standard``: alpha = 1 (``InsanePrior`` in the library).
- ``neal``: alpha = D, the variance 1 / fan-in that keeps activations of order one (Neal, 1996).
- ``scale``: alpha = D s with a random layer scale s = x^(-1/2), x ~ Gamma(2, 2) (shape, rate), and the variational
  posterior q(x) = Gamma(2 + e^a, 2 + e^b) (learned a, b, both initialised at 6: q starts near x = 1). Its term in the
  ELBO is the single-sample log p(x) - log q(x), as the library's ``VI_Scale``.
- ``spatial_iw`` (Eq. 21, App. B; the library's ``SpatialIWPrior``): a convolution's weights (C input channels,
  p = k^2 kernel pixels) have the precision (C I_C) kron Q (``precision.KroneckerPrec``) with a spatial precision
  Q ~ InverseWishart(Psi_0, nu_0), Psi_0 = nu_0 p I, nu_0 = p + 1 (the library's ``IWPrior``: IW(K = p I, nu_0) in
  its scaling, ``wishart``). Its variational posterior (``VI_InverseWishart``) conditions on p learned
  pseudo-observations y_j with weights w_j = e^{omega_j} (omega initialised at -5, y_j at N(0, I) draws):

      q(Q) = InverseWishart(Psi_0 + sum_j w_j y_j y_j^T, nu_0 + sum_j w_j),

  real-valued degrees of freedom, drawn by the Bartlett decomposition; its ELBO term is the single-sample
  log p(Q) - log q(Q). A fully connected layer (D inputs with the bias) is the library's fallback: C = D channels
  of one pixel, precision D Q with Q a scalar IW(2, 2) draw.
"""

from __future__ import annotations

import torch

from bnnbench.core import prng
from bnnbench.methods.inducing.gamma import reparam_standard_gamma, standard_gamma
from bnnbench.methods.inducing.precision import KroneckerPrec
from bnnbench.methods.inducing.wishart import (bartlett_factor, bartlett_noise, inverse_wishart_draw,
                                               inverse_wishart_log_prob)
from bnnbench.methods.state import Node, state_class

PRIORS = ("standard", "neal", "scale", "spatial_iw")
LIBRARY_UNFIXED_PRIORS = ("scale", "spatial_iw")  # not the library's ``FactorisedPrior``s (``layers.Factorised``)
SCALE_PRIOR_SHAPE = 2.0   # x ~ Gamma(2, 2): E[x] = 1
SCALE_INIT_LOG = 6.0      # q(x) = Gamma(2 + e^6, 2 + e^6) at the start
IW_INIT_LOG_WEIGHT = -5.0  # the pseudo-observations' weights e^-5 at the start: q(Q) starts near the prior


@state_class
class ScaleQ(Node):
    """q(x) = Gamma(2 + e^a, 2 + e^b) of the Scale prior's layer scale: a ``scale_log_shape``, b ``scale_log_rate``
    ``[R]``."""
    scale_log_shape: torch.Tensor
    scale_log_rate: torch.Tensor


@state_class
class InverseWishartQ(Node):
    """q(Q) of the spatial prior: the pseudo-observations y_j ``iw_pseudo_obs [R, p, p]`` (column j) and their log
    weights omega_j ``iw_log_weight [R, p]``."""
    iw_pseudo_obs: torch.Tensor
    iw_log_weight: torch.Tensor


def check_prior(name: str) -> str:
    if name not in PRIORS:
        raise ValueError(f"unknown prior {name!r}; valid priors: {', '.join(PRIORS)}")
    return name


class LayerPrior:
    """The prior precision of one layer's weights per replica and sample: alpha ``[R, S]`` (alpha I) or, for the
    spatial prior over more than one pixel, a ``KroneckerPrec``. ``fan_in`` = D, the weight matrix's rows;
    ``pixels`` = k^2 for a convolution (1 for a fully connected layer)."""

    def __init__(self, kind: str, fan_in: int, pixels: int = 1):
        self.kind = check_prior(kind)
        self.fan_in, self.pixels = int(fan_in), int(pixels)
        self.channels = self.fan_in // self.pixels

    def init_params(self, R: int, device, dtype, generator: torch.Generator | None = None
                    ) -> ScaleQ | InverseWishartQ | None:
        """The prior's own variational parameters at the start (None: ``standard`` and ``neal`` have none)."""
        if self.kind == "scale":
            init = torch.full((R,), SCALE_INIT_LOG, device=device, dtype=dtype)
            return ScaleQ(scale_log_shape=init, scale_log_rate=init.clone())
        if self.kind == "spatial_iw":
            p = self.pixels
            return InverseWishartQ(
                iw_pseudo_obs=prng.randn(R, p, p, generator=generator, device=device, dtype=dtype),
                iw_log_weight=torch.full((R, p), IW_INIT_LOG_WEIGHT, device=device, dtype=dtype))
        return None

    def q_scale(self, params) -> tuple[torch.Tensor, torch.Tensor]:
        """Shape and rate ``[R]`` of q(x)."""
        return (SCALE_PRIOR_SHAPE + params.scale_log_shape.exp(),
                SCALE_PRIOR_SHAPE + params.scale_log_rate.exp())

    def iw_prior(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Psi_0 = nu_0 p I ``[p, p]`` and nu_0 = p + 1 of the spatial prior."""
        p = self.pixels
        nu = torch.tensor(p + 1.0, device=like.device, dtype=like.dtype)
        return nu * p * torch.eye(p, device=like.device, dtype=like.dtype), nu

    def q_iw(self, params) -> tuple[torch.Tensor, torch.Tensor]:
        """Psi ``[R, p, p]`` and nu ``[R]`` of q(Q): Psi_0 + Y diag(w) Y^T, nu_0 + sum w."""
        y, w = params.iw_pseudo_obs, params.iw_log_weight.exp()
        Psi0, nu0 = self.iw_prior(y)
        return Psi0 + (y * w.unsqueeze(-2)) @ y.mT, nu0 + w.sum(-1)

    def noise(self, params, S: int, generator: torch.Generator):
        """x0 ~ Gamma(a_q, 1) ``[R, S]`` (``scale``); the Bartlett draws of q(Q) ``[R, S, p, p]``, ``[R, S, p]``
        (``spatial_iw``); None otherwise."""
        if self.kind == "scale":
            shape, _ = self.q_scale(params)
            return standard_gamma(shape.detach()[:, None].expand(-1, S).contiguous(), generator)
        if self.kind == "spatial_iw":
            _, nu = self.q_iw(params)
            return bartlett_noise(nu.detach()[:, None].expand(-1, S), self.pixels, generator)
        return None

    def prec(self, params, noise, R: int, S: int, like: torch.Tensor):
        """The prior precision (alpha ``[R, S]`` or a ``KroneckerPrec``) and the prior's own log p - log q
        ``[R, S]`` (zero for ``standard`` and ``neal``)."""
        zero = like.new_zeros(R, S)
        if self.kind == "standard":
            return zero + 1.0, zero
        if self.kind == "neal":
            return zero + float(self.fan_in), zero
        if self.kind == "spatial_iw":
            return self.spatial_prec(params, noise)
        shape, rate = self.q_scale(params)
        x = reparam_standard_gamma(shape[:, None].expand(-1, S), noise) / rate[:, None]
        p = torch.distributions.Gamma(torch.tensor(SCALE_PRIOR_SHAPE, dtype=x.dtype, device=x.device),
                                      torch.tensor(SCALE_PRIOR_SHAPE, dtype=x.dtype, device=x.device))
        q = torch.distributions.Gamma(shape[:, None], rate[:, None], validate_args=False)
        return self.fan_in * x.rsqrt(), p.log_prob(x) - q.log_prob(x)

    def spatial_prec(self, params, noise):
        Psi, nu = self.q_iw(params)
        normals, x0 = noise
        nu = nu[:, None].expand(x0.shape[:-1])
        Q, log_q = inverse_wishart_draw(Psi.unsqueeze(1), nu, bartlett_factor(nu, normals, x0))
        Psi0, nu0 = self.iw_prior(Q)
        log_p = inverse_wishart_log_prob(Q, Psi0, nu0)
        if self.pixels == 1:
            return self.channels * Q[..., 0, 0], log_p - log_q
        return KroneckerPrec(float(self.channels), self.channels, Q), log_p - log_q
