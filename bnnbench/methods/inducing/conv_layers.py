"""The posterior families of a k x k convolution (stride 1, zero padding, no bias, as the library's convolutions),
on the replica and sample axes: inputs ``h [R, S, rows, C, H, W]`` give ``[R, S, rows, out, H', W']``.

The weights are W ``[R, S, D, out]`` with D = C k^2 rows in the order (channel, kernel row, kernel column): the
kernel ``[out, C, k, k]`` is W^T (the library's ``[out, in k^2]`` weights), so every family of ``layers`` carries
over with D = C k^2 (App. C's 1 / sqrt(D) scaling of the factorised parameters included):

- ``FactorisedConv``: weight draws, or with ``local_reparam`` output pixels drawn from their marginals
  conv(h, M) + conv(h^2, V)^(1/2) eps (Kingma et al., 2015).
- ``LocalInducingConv``: the regression on D learned patches (the library's ``LIConv2d``: a fully connected
  regression on the patch vectors).
- ``GlobalInducingConv``: the regression on the patches of the propagated inducing feature maps U ``[P, C, H, W]``
  with pseudo-outputs V ``[P, out, H, W]`` (one per inducing image and output pixel), the patches cut with circular
  boundaries and their products taken as autocorrelations (App. A, ``autocorrelation``; the library's
  ``GIConv2d``).
- ``PriorDrawConv``: prior draws.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bnnbench.core import prng
from bnnbench.methods.inducing.autocorrelation import autocorrelation
from bnnbench.methods.inducing.blr import sample_weights_from_stats
from bnnbench.methods.inducing.layers import Factorised, Inducing, InducingQ, PriorDraw


def conv2d_samples(h: torch.Tensor, W: torch.Tensor, k: int, padding: int) -> torch.Tensor:
    """The convolution of ``h [R, S, rows, C, H, W]`` with each replica's and sample's kernel ``W [R|1, S|1, C k^2,
    out]`` (one grouped convolution, the library's ``bconv2d``)."""
    R, S, rows, C = h.shape[:4]
    W = W.expand(R, S, *W.shape[2:])
    out = W.shape[-1]
    x = h.permute(2, 0, 1, 3, 4, 5).reshape(rows, R * S * C, *h.shape[-2:])
    kernel = W.mT.reshape(R * S * out, C, k, k)
    y = F.conv2d(x, kernel, padding=padding, groups=R * S)
    return y.reshape(rows, R, S, out, *y.shape[-2:]).permute(1, 2, 0, 3, 4, 5)


class Conv:
    """A k x k convolution's geometry: ``c_in`` channels of ``in_hw`` pixels in, ``c_out`` out, zero padding."""
    bias = 0

    def conv_init(self, c_in: int, kernel: int, padding: int, in_hw):
        self.c_in, self.kernel, self.padding = int(c_in), int(kernel), int(padding)
        self.in_hw = tuple(int(n) for n in in_hw)
        self.out_hw = tuple(n + 2 * self.padding - self.kernel + 1 for n in self.in_hw)

    def apply(self, h, W):
        return conv2d_samples(h, W, self.kernel, self.padding)

    def apply_marginal(self, h, mean, var, noise):
        mu = conv2d_samples(h, mean.unsqueeze(1), self.kernel, self.padding)
        v = conv2d_samples(h * h, var.unsqueeze(1), self.kernel, self.padding)
        # patches of zeros (no bias input: zero padding, dead ReLUs) have v = 0, where sqrt's derivative is infinite
        positive = v > 0
        return mu + torch.where(positive, v, 1.0).sqrt() * positive * noise


class FactorisedConv(Conv, Factorised):
    def __init__(self, c_in, c_out, kernel, padding, in_hw, var_init_mult: float = 1e-3,
                 local_reparam: bool = False):
        self.conv_init(c_in, kernel, padding, in_hw)
        super().__init__(c_in * kernel ** 2, c_out, var_init_mult, local_reparam)

    def noise(self, params, R, S, rows, generator, like):
        if self.local_reparam:
            return prng.randn(R, S, rows, self.d_out, *self.out_hw, generator=generator, device=like.device,
                               dtype=like.dtype)
        return prng.randn(R, S, self.D, self.d_out, generator=generator, device=like.device, dtype=like.dtype)


class LocalInducingConv(Conv, Inducing):
    def __init__(self, c_in, c_out, kernel, padding, in_hw, log_prec_init: float = -4.0, log_prec_lr: float = 1.0):
        self.conv_init(c_in, kernel, padding, in_hw)
        super().__init__(c_in * kernel ** 2, c_out, local=True, log_prec_init=log_prec_init,
                         log_prec_lr=log_prec_lr)


class GlobalInducingConv(Conv, Inducing):
    dual = False  # the regression has P H W rows, its statistics come from ``autocorrelation``

    def __init__(self, c_in, c_out, kernel, padding, in_hw, n_inducing: int, log_prec_init: float = -4.0,
                 log_prec_lr: float = 1.0):
        self.conv_init(c_in, kernel, padding, in_hw)
        super().__init__(c_in * kernel ** 2, c_out, n_inducing, log_prec_init=log_prec_init,
                         log_prec_lr=log_prec_lr)

    def init_params(self, R, generator, device, dtype):
        return InducingQ(pseudo_out=prng.randn(R, self.P, self.d_out, *self.in_hw, generator=generator,
                                                device=device, dtype=dtype),
                         log_prec=torch.full((R, self.P), self.log_prec_init / self.log_prec_lr, device=device,
                                             dtype=dtype))

    def regression_stats(self, params, U):
        """U^T Lambda U and U^T Lambda V ``[R, S, D, D]``, ``[R, S, D, out]`` of the inducing maps ``U [R, S, P,
        C, H, W]``."""
        root = (0.5 * self.log_prec_lr * params.log_prec).exp()[..., None, None, None]   # Lambda^(1/2)
        return autocorrelation(root.unsqueeze(1) * U, (root * params.pseudo_out).unsqueeze(1), self.kernel)

    def weights(self, params, h, alpha, noise, n_inducing):
        """A draw W ``[R, S, D, out]`` and its log p - log q ``[R, S]``, given the inducing rows of ``h``."""
        ULU, ULV = self.regression_stats(params, h[:, :, :n_inducing])
        return sample_weights_from_stats(ULU, ULV, alpha, noise)

    def forward(self, params, h, alpha, noise, n_inducing):
        W, logpq = self.weights(params, h, alpha, noise, n_inducing)
        return self.apply(h, W), logpq


class PriorDrawConv(Conv, PriorDraw):
    def __init__(self, c_in, c_out, kernel, padding, in_hw):
        self.conv_init(c_in, kernel, padding, in_hw)
        super().__init__(c_in * kernel ** 2, c_out)
