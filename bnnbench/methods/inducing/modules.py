"""The modules a network of ``InducingNet`` is a sequence of, with their output shapes; activations carry the
replica, sample and row axes first: ``[R, S, rows, *shape]`` with shape ``(features,)`` or ``(C, H, W)``.

Weight layers (``Linear``: D = d_in + 1 rows, the bias an input of ones; ``Conv2d``: k x k, stride 1, zero padding,
no bias, as the library's convolutions) get a posterior family and a prior in ``network``; the others are fixed
maps: ``ReLU``, ``Identity``, ``MaxPool`` and ``AvgPool`` (k x k windows, stride k), ``GlobalAvgPool`` (the mean
over the pixels, ``(C, H, W) -> (C,)``: the library's ``AdaptiveAvgPool2d((1, 1))`` then ``Conv2d_2_FC``),
``Flatten`` and ``Residual`` (identity + body, the library's ``Sum(Sequential(), body)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Linear:
    d_in: int
    d_out: int

    def out_shape(self, shape):
        assert shape == (self.d_in,), (shape, self)
        return (self.d_out,)


@dataclass(frozen=True)
class Conv2d:
    c_in: int
    c_out: int
    kernel: int
    padding: int

    def out_shape(self, shape):
        C, H, W = shape
        assert C == self.c_in, (shape, self)
        return (self.c_out, H + 2 * self.padding - self.kernel + 1, W + 2 * self.padding - self.kernel + 1)


@dataclass(frozen=True)
class ReLU:
    def out_shape(self, shape):
        return shape

    def __call__(self, h):
        return torch.relu(h)


@dataclass(frozen=True)
class Identity:
    def out_shape(self, shape):
        return shape

    def __call__(self, h):
        return h


def _images(h: torch.Tensor) -> torch.Tensor:
    return h.reshape(-1, *h.shape[-3:])


@dataclass(frozen=True)
class _Pool:
    """k x k pooling of every image by ``pool`` (a ``torch.nn.functional`` 2-D pooling)."""
    kernel: int
    pool = None

    def out_shape(self, shape):
        C, H, W = shape
        return (C, H // self.kernel, W // self.kernel)

    def __call__(self, h):
        y = type(self).pool(_images(h), self.kernel)
        return y.reshape(*h.shape[:-2], *y.shape[-2:])


class MaxPool(_Pool):
    pool = staticmethod(F.max_pool2d)


class AvgPool(_Pool):
    pool = staticmethod(F.avg_pool2d)


@dataclass(frozen=True)
class GlobalAvgPool:
    def out_shape(self, shape):
        return (shape[0],)

    def __call__(self, h):
        return h.mean((-1, -2))


@dataclass(frozen=True)
class Flatten:
    def out_shape(self, shape):
        n = 1
        for s in shape:
            n *= s
        return (n,)

    def __call__(self, h):
        return h.reshape(*h.shape[:3], -1)


@dataclass(frozen=True)
class Residual:
    body: tuple

    def out_shape(self, shape):
        out = shape
        for m in self.body:
            out = m.out_shape(out)
        assert out == shape, (shape, out)
        return shape


WEIGHT_LAYERS = (Linear, Conv2d)
