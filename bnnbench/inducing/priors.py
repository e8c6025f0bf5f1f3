"""Weight priors of a layer with D inputs (the bias included) and ``out`` outputs: W ~ N(0, alpha^-1 I).

Ober & Aitchison (2020) Sec. 4 and the authors' library (``bayesfunc/priors.py``):

- ``standard``: alpha = 1 (``InsanePrior`` in the library).
- ``neal``: alpha = D, the variance 1 / fan-in that keeps activations of order one (Neal, 1996).
- ``scale``: alpha = D s with a random layer scale s = x^(-1/2), x ~ Gamma(2, 2) (shape, rate), and the variational
  posterior q(x) = Gamma(2 + e^a, 2 + e^b) (learned a, b, both initialised at 6: q starts near x = 1). Its term in the
  ELBO is the single-sample log p(x) - log q(x), as the library's ``VI_Scale``.

The spatial Inverse-Wishart prior of convolutions (App. B) is in ``inducing/conv.py``.
"""

from __future__ import annotations

import torch

from bnnbench.inducing.gamma import reparam_standard_gamma, standard_gamma

PRIORS = ("standard", "neal", "scale")
SCALE_PRIOR_SHAPE = 2.0   # x ~ Gamma(2, 2): E[x] = 1
SCALE_INIT_LOG = 6.0      # q(x) = Gamma(2 + e^6, 2 + e^6) at the start


def check_prior(name: str) -> str:
    if name not in PRIORS:
        raise ValueError(f"unknown prior {name!r}; valid priors: {', '.join(PRIORS)}")
    return name


class LayerPrior:
    """The prior precision alpha ``[R, S]`` of one layer's weights, per replica and sample."""

    def __init__(self, kind: str, fan_in: int):
        self.kind = check_prior(kind)
        self.fan_in = int(fan_in)

    def init_params(self, R: int, device, dtype) -> dict[str, torch.Tensor]:
        if self.kind != "scale":
            return {}
        init = torch.full((R,), SCALE_INIT_LOG, device=device, dtype=dtype)
        return {"scale_log_shape": init, "scale_log_rate": init.clone()}

    def q_scale(self, params) -> tuple[torch.Tensor, torch.Tensor]:
        """Shape and rate ``[R]`` of q(x)."""
        return (SCALE_PRIOR_SHAPE + params["scale_log_shape"].exp(),
                SCALE_PRIOR_SHAPE + params["scale_log_rate"].exp())

    def noise(self, params, S: int, generator: torch.Generator) -> torch.Tensor | None:
        """x0 ~ Gamma(a_q, 1) ``[R, S]`` for the Scale prior (None otherwise)."""
        if self.kind != "scale":
            return None
        shape, _ = self.q_scale(params)
        return standard_gamma(shape.detach()[:, None].expand(-1, S).contiguous(), generator)

    def prec(self, params, noise, R: int, S: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """alpha ``[R, S]`` and the prior's own log p - log q ``[R, S]`` (zero unless ``scale``)."""
        zero = like.new_zeros(R, S)
        if self.kind == "standard":
            return zero + 1.0, zero
        if self.kind == "neal":
            return zero + float(self.fan_in), zero
        shape, rate = self.q_scale(params)
        x = reparam_standard_gamma(shape[:, None].expand(-1, S), noise) / rate[:, None]
        p = torch.distributions.Gamma(torch.tensor(SCALE_PRIOR_SHAPE, dtype=x.dtype, device=x.device),
                                      torch.tensor(SCALE_PRIOR_SHAPE, dtype=x.dtype, device=x.device))
        q = torch.distributions.Gamma(shape[:, None], rate[:, None], validate_args=False)
        return self.fan_in * x.rsqrt(), p.log_prob(x) - q.log_prob(x)
