"""VGG-style convolutional network evaluated for many parameter vectors at once, on the MLP's flat layout.

Architecture (Simonyan & Zisserman, 2015, as the noisy natural gradient authors halved it for CIFAR-10): 3x3
convolutions with SAME padding, each followed by an optional batch normalisation and a ReLU, 2x2 max-pools ("M"),
then fully connected layers. Every parametrised layer ``l`` is the affine map ``z = a W_l + b_l`` of the MLP
(``models/mlp.py``) applied to a *patch*: a convolution's input at output position t is the patch ``a_t`` of its
input maps, flattened channel-major (``F.unfold``: ``d_in = c_in k^2``, ordered (channel, row, column)), so that

    z_t = a_t W + b,   W [c_in k^2, c_out],

and the flat parameter vector ``theta [P]`` is laid out exactly as the MLP's, ``[W_1 (d_in x d_out), b_1, ...]``
(``slices``). Methods written for that layout (BBB, MAP, SGD, noisy Adam, noisy and plain K-FAC) run on it;
``forward_cache`` and ``backprop`` hand them every layer's patches and back-propagated gradients with the positions
as extra rows (``[R, S, B T_l, d]``, ``T_l`` output positions), the patch-expanded form Kronecker-factored curvature
for convolutions works on (Grosse & Martens, 2016: ``dW = sum_t a_t ds_t^T``).

Batch normalisation has no parameters here (the authors' K-FAC trains no BN scale or shift: only "w" variables are
in its optimiser) and normalises by the statistics of the batch it is given, per replica, sample and channel, in
training and in evaluation (evaluation batches: ``eval_rows`` rows; the authors' code keeps running averages for
test time: a stated deviation, results/README.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bnnbench.core import prng
from bnnbench.core.models.mlp import MLP, affine

BN_EPS = 1e-5

# the halved VGG16 of noisy natural gradient's CIFAR-10 experiments (the protocol sheet noisy_kfac.md 4.2)
VGG16_HALF = [32, 32, "M", 64, 64, "M", 128, 128, 128, "M", 256, 256, 256, "M", 256, 256, 256, "M"]


class ConvNet(MLP):
    """``arch``: conv widths and "M" (2x2 max-pool); ``fc``: hidden widths of the fully connected part."""

    convolutional = True

    def __init__(self, image_shape, arch, n_out: int, fc=(), batch_norm: bool = False, kernel: int = 3,
                 activation: str = "relu", eval_rows: int = 500):
        if activation != "relu":
            raise ValueError(f"unknown activation {activation!r} for a convolutional network; valid: relu")
        if len(image_shape) != 3:
            raise ValueError(f"a convolutional network needs images (C, H, W), got input shape {list(image_shape)}")
        c, h, w = (int(s) for s in image_shape)
        self.image_shape = self.input_shape = (c, h, w)
        self.kernel, self.batch_norm, self.eval_rows = int(kernel), bool(batch_norm), int(eval_rows)
        self.activation, self._act = "relu", torch.relu
        self.ops, self.slices, self.positions, sizes = [], [], [], [c * h * w]
        offset = 0

        def add(d_in, d_out, t):
            nonlocal offset
            ws = slice(offset, offset + d_in * d_out)
            bs = slice(offset + d_in * d_out, offset + d_in * d_out + d_out)
            offset = bs.stop
            self.slices.append((ws, bs, d_in, d_out))
            self.positions.append(t)
            return len(self.slices) - 1

        for item in arch:
            if item == "M":
                if h < 2 or w < 2:
                    raise ValueError(f"max-pool of a {h}x{w} map in arch {list(arch)}")
                h, w = h // 2, w // 2
                self.ops.append(("pool", None))
            else:
                l = add(c * self.kernel ** 2, int(item), h * w)
                c = int(item)
                self.ops.append(("conv", (l, h, w)))
            sizes.append(c * h * w)
        d = c * h * w
        for width in [*fc, n_out]:
            l = add(d, int(width), 1)
            self.ops.append(("fc", l))
            d = int(width)
            sizes.append(d)
        self.sizes = sizes
        self.n_params = offset
        self.arch, self.fc = list(arch), [int(x) for x in fc]

    @property
    def is_linear(self) -> bool:
        return False

    def fan_out(self, device=None, dtype=torch.float32) -> torch.Tensor:
        """``[P]`` fan-out of the layer each parameter belongs to (a convolution's: c_out k^2)."""
        out = torch.empty(self.n_params, device=device, dtype=dtype)
        conv = {arg[0] for kind, arg in self.ops if kind == "conv"}
        for l, (w, b, _, d_out) in enumerate(self.slices):
            out[w.start:b.stop] = d_out * (self.kernel ** 2 if l in conv else 1)
        return out

    def dropout_masks(self, *args, **kwargs):
        raise ValueError("MC dropout is not built for convolutional networks (model=mlp)")

    def forward_local_reparam(self, *args, **kwargs):
        raise ValueError("the local reparameterisation trick is not built for convolutional networks "
                         "(method.local_reparam=false)")

    # ----------------------------------------------------------------------------------------------------------------
    def forward_layers(self, layers, x, dropout_masks=None):
        """Outputs ``[R, S, B, n_out]``; without autograd in ``eval_rows`` chunks of rows (each its own BN batch)."""
        if dropout_masks is not None:
            self.dropout_masks()
        if torch.is_grad_enabled() or x.shape[1] <= self.eval_rows:
            return self._run(layers, x, cache=False)[0]
        return torch.cat([self._run(layers, x[:, i:i + self.eval_rows], cache=False)[0]
                          for i in range(0, x.shape[1], self.eval_rows)], dim=2)

    def forward_cache(self, layers, x, patches: bool = True):
        """Outputs plus per layer the input patches ``a [R, S, B T, d_in]`` (expanded over samples with stride 0 where
        they share them) and the pre-activations ``z``, differentiable (``backprop``): a convolution's as maps
        ``[B, R, S, c_out, H, W]``, a dense layer's ``[R, S, B, d_out]``.
        ``patches=False`` leaves the convolutions' patches out (their entries are None): a step that needs the weight
        gradient only takes it from autograd through the convolution."""
        return self._run(layers, x, cache=True, patches=patches)

    def backprop(self, layers, acts, zs, g_out):
        """``d loss / d z_l`` per layer for output cotangents ``g_out [R, S, K B, n_out]`` (K cotangents of the same
        B examples one after another), by autograd through pools and batch normalisation: ``[R, S, K B T_l, d]``,
        the K blocks one after another in the rows. The output is the last pre-activation, ``f = z_L``."""
        B = zs[-1].shape[-2]
        per_k = [(*torch.autograd.grad(zs[-1], zs[:-1], g, retain_graph=True), g)
                 for g in g_out.unflatten(-2, (g_out.shape[-2] // B, B)).unbind(-3)]
        return [torch.cat([self._rows(gk[l]) for gk in per_k], dim=-2) for l in range(len(zs))]

    @staticmethod
    def _rows(z):
        """Maps ``[B, R, S, C, H, W]`` -> rows ``[R, S, B H W, C]`` (the patches' order); rows stay rows."""
        if z.dim() == 4:
            return z
        B, R, S, C, H, W = z.shape
        return z.permute(1, 2, 0, 4, 5, 3).reshape(R, S, B * H * W, C)

    def sum_sq_grads(self, acts, gs):
        """``sum_b (d loss_b / d theta)^2`` ``[R, S, P]``: a convolution's per-example gradient ``sum_t a_t g_t^T``
        summed over positions before squaring."""
        parts = []
        for a, g, t in zip(acts, gs, self.positions):
            B = g.shape[-2] // t
            a4, g4 = a.unflatten(-2, (B, t)), g.unflatten(-2, (B, t))
            gw = torch.einsum("rsbti,rsbto->rsbio", a4, g4) if t > 1 else a4[..., 0, :, None] * g4[..., 0, None, :]
            parts.append((gw * gw).sum(2).flatten(-2))
            gb = g4.sum(-2)
            parts.append((gb * gb).sum(2))
        return torch.cat(parts, dim=-1)

    def _run(self, layers, x, cache: bool, patches: bool = True):
        """The forward pass on maps laid out ``[B, R, S, C, H, W]``: a convolution of every (replica, sample)'s own
        weights is one grouped ``conv2d`` over the B images (6x faster on a CPU than the patches' GEMM with its
        backward pass); with ``cache`` the patches are formed beside it for the curvature."""
        R, B = x.shape[:2]
        S = max(W.shape[1] for W, _ in layers)
        h = x.transpose(0, 1).reshape(B, R, 1, *self.image_shape)
        acts, zs = [], []
        k = self.kernel
        for kind, arg in self.ops:
            if kind == "pool":
                h = F.max_pool2d(h.flatten(1, 3), 2).unflatten(1, h.shape[1:4])
                continue
            Wl, bl = layers[arg[0] if kind == "conv" else arg]
            if kind == "conv":
                _, H, W_ = arg
                Sh, C = h.shape[2], h.shape[3]
                if cache and not patches:
                    acts.append(None)
                elif cache:   # patches [R, Sh, B T, C k^2], channel-major as the weights' rows
                    a = F.unfold(h.detach().flatten(1, 3), k, padding=k // 2).unflatten(1, (R, Sh, C * k * k))
                    acts.append(_expand(a.permute(1, 2, 0, 4, 3).reshape(R, Sh, B * H * W_, C * k * k), S))
                hs = h.expand(B, R, Wl.shape[1], C, H, W_) if Sh != Wl.shape[1] else h
                Wc = Wl.transpose(-1, -2).reshape(-1, C, k, k)                            # [R S c_out, C, k, k]
                z = F.conv2d(hs.reshape(B, -1, H, W_), Wc, bl.reshape(-1), padding=k // 2, groups=R * Wl.shape[1])
                z = z.view(B, R, Wl.shape[1], -1, H, W_)
            else:
                a = h.flatten(3).permute(1, 2, 0, 3) if h.dim() > 4 else h               # [R, S, B, d_in]
                if cache:
                    acts.append(_expand(a, S))
                z = self._affine(a, Wl, bl, S)                                              # [R, S, B, d_out]
            if cache:
                if not z.requires_grad:    # the first layer of a method without autograd parameters
                    z.requires_grad_()
                zs.append(z)
            h = self._after(z, kind, arg)
        return h, acts, zs

    def _after(self, z, kind, arg):
        """A layer's output from its pre-activation ``z``: a convolution's maps ``[B, R, S, C, H, W]`` [batch
        normalised per replica, sample and channel and] through the ReLU; the last layer's is ``z`` itself."""
        if kind == "fc":
            return torch.relu(z) if arg < len(self.slices) - 1 else z
        if self.batch_norm:
            z = (z - z.mean((0, 4, 5), keepdim=True)) * torch.rsqrt(z.var((0, 4, 5), unbiased=False, keepdim=True)
                                                                    + BN_EPS)
        return torch.relu(z)

    @staticmethod
    def _affine(a, W, b, S):
        """``a W + b`` for ``a [R, Sa, n, d_in]``, ``W [R, Sw, d_in, d_out]``: inputs shared by the samples
        (``Sa = 1``) meet the S weights as one ``[n, d_in] x [d_in, S d_out]`` GEMM per replica."""
        R, Sa, n, d_in = a.shape
        Sw, d_out = W.shape[1], W.shape[-1]
        if Sa == 1 and Sw > 1:
            z = a[:, 0] @ W.permute(0, 2, 1, 3).reshape(R, d_in, Sw * d_out)
            return z.view(R, n, Sw, d_out).permute(0, 2, 1, 3) + b.unsqueeze(-2)
        return affine(a, W, b)

    def init(self, n_replicas: int, generator: torch.Generator, scheme: str = "uniform_fan_in",
             device=None, dtype=torch.float32) -> torch.Tensor:
        """``uniform_fan_in`` (PyTorch's Conv2d / Linear default, fan-in c_in k^2) or ``xavier_uniform`` (Glorot:
        U(+-sqrt(6 / (fan_in + fan_out))) on weights, biases 0; the noisy natural gradient authors' init)."""
        if scheme != "xavier_uniform":
            return super().init(n_replicas, generator, scheme, device, dtype)
        u = prng.rand(n_replicas, self.n_params, generator=generator, device=device, dtype=dtype)
        bound = torch.sqrt(6.0 / (self.fan_in(device, dtype) + self.fan_out(device, dtype)))
        return torch.where(self.bias_mask(device), 0.0, (2.0 * u - 1.0) * bound)

    def describe(self) -> str:
        conv = "-".join(str(a) for a in self.arch)
        return f"conv {conv} (k={self.kernel}{', BN' if self.batch_norm else ''}) fc {self.fc + [self.output_dim]}"

    @property
    def output_dim(self) -> int:
        return self.slices[-1][3]


def _expand(a, S):
    """``a [R, Sa, ...]`` over S samples, stride 0 where they share it (Sa = 1)."""
    return a.expand(a.shape[0], S, *a.shape[2:]) if a.shape[1] != S else a


def flops_per_example(model: ConvNet) -> float:
    """Multiply-adds of one forward pass of one example (conv and fully connected layers)."""
    return float(sum(d_in * d_out * t for (_, _, d_in, d_out), t in zip(model.slices, model.positions)))


__all__ = ["ConvNet", "VGG16_HALF", "flops_per_example"]
