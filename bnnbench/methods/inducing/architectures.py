"""The networks of the global inducing paper as ``modules`` sequences (``method.arch``):

- ``mlp``: the protocol's fully connected network, ``sizes = [d_0, hidden..., d_out]``, its activation after every
  hidden layer.
- ``mnist500_cnn`` (App. F): 2 x (conv-ReLU-maxpool 2) + conv-ReLU-linear, 64 channels. The paper does not give
  the kernel size: 3 here (padding 1, so 28 -> 14 -> 7 pixels and a 7 x 7 x 64 = 3136-feature linear layer).
- ``resnet8`` (Table 1; the library's ``examples/models/resnet8.py``): conv 3x3 - ReLU - block - avgpool 2 - block -
  avgpool 2 - block - global avgpool - linear, block = identity + (conv-ReLU-conv-ReLU), 32 channels, padding 1.

``channels`` (0: the architecture's default) shrinks the convolutional ones for tests.
"""

from __future__ import annotations

from bnnbench.methods.inducing.modules import (AvgPool, Conv2d, Flatten, GlobalAvgPool, Identity, Linear, MaxPool, ReLU,
                                       Residual)

ARCHS = ("mlp", "mnist500_cnn", "resnet8")
MNIST500_KERNEL = 3


def mlp(sizes, activation: str = "relu") -> list:
    act = {"relu": ReLU(), "linear": Identity()}[activation]
    layers = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:]):
        layers += [Linear(int(d_in), int(d_out)), act]
    return layers[:-1]


def mnist500_cnn(in_shape, n_out: int, channels: int = 64, kernel: int = MNIST500_KERNEL) -> list:
    C, H, W = in_shape
    pad = kernel // 2
    return [Conv2d(C, channels, kernel, pad), ReLU(), MaxPool(2),
            Conv2d(channels, channels, kernel, pad), ReLU(), MaxPool(2),
            Conv2d(channels, channels, kernel, pad), ReLU(), Flatten(),
            Linear(channels * (H // 4) * (W // 4), n_out)]


def resnet8(in_shape, n_out: int, channels: int = 32) -> list:
    C = in_shape[0]

    def block():
        return Residual((Conv2d(channels, channels, 3, 1), ReLU(), Conv2d(channels, channels, 3, 1), ReLU()))

    return [Conv2d(C, channels, 3, 1), ReLU(), block(), AvgPool(2), block(), AvgPool(2), block(), GlobalAvgPool(),
            Linear(channels, n_out)]


def build(arch: str, sizes, image_shape, activation: str = "relu", channels: int = 0) -> tuple[list, tuple]:
    """The modules and the input shape of ``arch`` for the protocol's MLP ``sizes`` (its input and output sizes) and
    the data set's ``image_shape`` (C, H, W)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; valid: {', '.join(ARCHS)}")
    if arch == "mlp":
        return mlp(sizes, activation), (int(sizes[0]),)
    shape = tuple(int(s) for s in image_shape)
    if len(shape) != 3 or shape[0] * shape[1] * shape[2] != int(sizes[0]):
        raise ValueError(f"arch={arch} needs the image shape (C, H, W) of the {sizes[0]} inputs, got {list(shape)}")
    kw = {"channels": int(channels)} if channels else {}
    return (mnist500_cnn if arch == "mnist500_cnn" else resnet8)(shape, int(sizes[-1]), **kw), shape
