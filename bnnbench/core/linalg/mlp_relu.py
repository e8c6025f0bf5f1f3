"""A small ReLU network's forward pass and its gradient, fused, for many networks at once on the CPU (``mlp_relu.c``).

For ``theta [R, S, P]`` (``core/models/mlp.py``'s layout) and inputs ``x [R, B, D]`` shared by the S samples,
``forward`` gives the outputs ``f [R, S, B, d_L]`` of ``MLP.forward`` and ``vjp`` the gradient of ``sum(gf * f)`` in
``theta``, back-propagation through ``z_l = a_{l-1} W_l + b_l``, ``a_l = relu(z_l)``. The compiled steps of the
methods that train an MLP by the gradient of a sampled or point network (BBB: Blundell et al., 2015) spend most of a
step there at UCI scale: torch forms each layer's activations for all R S networks as one batched product, so a
Bayesian-optimisation round's 100 replicas x 2 samples x 100 rows x 50 units (4 MB) pass through memory four times a
step. The kernel takes one network at a time, its activations (recomputed by ``vjp``) in a buffer that stays in the
cache. It is an operator with a shape rule and a gradient (``bnnbench::mlp_relu``), so a compiled step's graph holds
it and autograd differentiates through it; ``applies`` says where a compiled step takes it. The eager step, and so
every record, keeps torch's products. Built at first use (``c_kernels``); where it cannot be, one warning, and the
compiled step keeps torch's products.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bnnbench.core.linalg import c_kernels
from bnnbench.core.models.mlp import MLP

SOURCE = Path(__file__).with_name("mlp_relu.c")
# the compiled steps take the kernel on minibatches of this many rows and more: below a few vectors of 16 rows its
# padding and its per-network loops lose to torch's batched products (bench/step_ab.py, R = 100 / 20: BBB 0.8x / 0.8x at
# slang_uci's 10 rows on Boston; 3.2x / 1.5-1.7x at nng_uci's and vadam_uci's 100 and 128 on kin8nm)
MIN_ROWS = 64
# and on networks whose layers have at most this many units: the UCI nets it was measured on (up to 13 inputs, 50
# hidden units); a wide layer (MNIST's 784-400-400-10) is a GEMM that torch's BLAS runs near the core's peak, on all
# its threads, where the kernel takes one
MAX_WIDTH = 128


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The built kernel (``c_kernels.build``), or None (with a warning) where no C compiler builds it."""
    p, n = ctypes.c_void_p, ctypes.c_long
    return c_kernels.build(SOURCE, "fused MLP", {
        "mlp_relu_work": ([n, p, n], n),
        "mlp_relu_forward": ([p, p, p, n, n, n, p, n, p], None),
        "mlp_relu_vjp": ([p, p, p, p, n, n, n, p, n, p], None)}, instead="torch's products")


def available() -> bool:
    """Whether the kernel is built (building it if need be)."""
    return _library() is not None


def applies(model, x: torch.Tensor, theta_dtype: torch.dtype) -> bool:
    """Whether the kernel computes ``model`` on inputs ``x``: a ReLU MLP of layers up to ``MAX_WIDTH`` units, float32
    CPU tensors, inputs that need no gradient (a caller checks ``available`` once, outside a compiled step)."""
    return (type(model) is MLP and model.activation == "relu" and max(model.sizes) <= MAX_WIDTH
            and x.device.type == "cpu" and x.dtype == theta_dtype == torch.float32 and not x.requires_grad)


def _sizes(sizes: list[int]) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.long)


def _work(lib, B: int, d: torch.Tensor) -> torch.Tensor:
    return torch.empty(lib.mlp_relu_work(B, d.data_ptr(), len(d) - 1), dtype=torch.float32)


@torch.library.custom_op("bnnbench::mlp_relu", mutates_args=(), device_types="cpu")
def forward(x: torch.Tensor, theta: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Outputs ``f [R, S, B, sizes[-1]]`` of the ReLU networks ``theta [R, S, P]`` on ``x [R, B, sizes[0]]``."""
    lib = _library()
    x, theta = x.contiguous(), theta.contiguous()
    R, S, _ = theta.shape
    B = x.shape[1]
    d = _sizes(sizes)
    f = torch.empty(R, S, B, sizes[-1], dtype=theta.dtype)
    work = _work(lib, B, d)   # held here: a temporary's memory would be freed before the call
    lib.mlp_relu_forward(x.data_ptr(), theta.data_ptr(), f.data_ptr(), R, S, B, d.data_ptr(), len(sizes) - 1,
                         work.data_ptr())
    return f


@forward.register_fake
def _(x, theta, sizes):
    return theta.new_empty(theta.shape[0], theta.shape[1], x.shape[1], sizes[-1])


@torch.library.custom_op("bnnbench::mlp_relu_vjp", mutates_args=(), device_types="cpu")
def vjp(x: torch.Tensor, theta: torch.Tensor, gf: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """``d sum(gf * f) / d theta [R, S, P]`` for ``f = forward(x, theta, sizes)`` and cotangents ``gf`` of f's shape."""
    lib = _library()
    x, theta, gf = x.contiguous(), theta.contiguous(), gf.contiguous()
    R, S, P = theta.shape
    B = x.shape[1]
    d = _sizes(sizes)
    g = torch.empty(R, S, P, dtype=theta.dtype)
    work = _work(lib, B, d)
    lib.mlp_relu_vjp(x.data_ptr(), theta.data_ptr(), gf.data_ptr(), g.data_ptr(), R, S, B, d.data_ptr(),
                     len(sizes) - 1, work.data_ptr())
    return g


@vjp.register_fake
def _(x, theta, gf, sizes):
    return torch.empty_like(theta)


def _setup(ctx, inputs, output):
    x, theta, sizes = inputs
    ctx.save_for_backward(x, theta)
    ctx.sizes = sizes


def _backward(ctx, gf):
    x, theta = ctx.saved_tensors
    return None, vjp(x, theta, gf, ctx.sizes), None


forward.register_autograd(_backward, setup_context=_setup)
