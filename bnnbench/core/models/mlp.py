"""Fully connected network evaluated for many parameter vectors at once.

Parameters live in one flat vector ``theta`` of length ``P`` per replica (and per MC sample), laid out
layer by layer as ``[W_1 (d_in x d_out, row-major), b_1, W_2, b_2, ...]``. Every method works on this
flat vector, so a Gaussian ``q(theta)`` is a mean ``[R, P]`` plus a covariance structure, whatever the
network. The forward pass broadcasts a replica axis ``R`` and a sample axis ``S``:
``theta [R, S, P]`` and ``x [R, B, D]`` give outputs ``[R, S, B, d_out]`` as batched matmuls.
"""

from __future__ import annotations

import math

import torch

from bnnbench.core import prng

_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh, "linear": lambda h: h}
# act'(z) from the pre-activation z and the activation h = act(z); relu'(z) = 1[z > 0] = sign(h), one float op
# (a comparison and a cast to float cost 9x more on a CPU)
_ACT_GRADS = {"relu": lambda z, h: torch.sign(h), "tanh": lambda z, h: 1 - h * h,
              "linear": lambda z, h: torch.ones_like(h)}


def affine(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor, first: bool = False) -> torch.Tensor:
    """``h W + b`` for ``h [R, S or 1, B, d_in]``, ``W [R, S, d_in, d_out]``, ``b [R, S, d_out]``.

    A first layer with one output unit (logistic regression: the samples share the inputs, ``h`` has one sample or
    is expanded over them) is one ``[B, d_in] x [d_in, S]`` product per replica; broadcast as S matrix-vector
    products it is ~15x slower on CPU. Another layer with one output unit is a multiply and a sum over d_in (3x faster
    than R S matrix-vector products)."""
    if first and W.shape[-1] == 1 and (h.shape[1] == 1 or h.stride(1) == 0):
        z = torch.matmul(h[:, 0], W[..., 0].transpose(-1, -2))            # [R, B, S]
        return z.transpose(1, 2).unsqueeze(-1) + b.unsqueeze(-2)
    if W.shape[-1] == 1:
        return (h * W.transpose(-1, -2)).sum(-1, keepdim=True) + b.unsqueeze(-2)
    return torch.matmul(h, W) + b.unsqueeze(-2)


class MLP:
    def __init__(self, sizes: list[int], activation: str = "relu", input_shape: tuple[int, ...] = ()):
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid: {sorted(_ACTIVATIONS)}")
        self.sizes = [int(s) for s in sizes]
        self.activation = activation
        self.input_shape = tuple(int(s) for s in input_shape)   # (C, H, W) of image inputs, flattened here; () tabular
        self._act = _ACTIVATIONS[activation]
        self._act_grad = _ACT_GRADS[activation]
        self.slices = []  # (W slice, b slice, d_in, d_out) per layer
        offset = 0
        for d_in, d_out in zip(self.sizes[:-1], self.sizes[1:]):
            w = slice(offset, offset + d_in * d_out)
            offset += d_in * d_out
            b = slice(offset, offset + d_out)
            offset += d_out
            self.slices.append((w, b, d_in, d_out))
        self.n_params = offset

    def act_grad(self, z: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The activation's derivative at ``z``, given ``h = act(z)``."""
        return self._act_grad(z, h)

    @property
    def output_dim(self) -> int:
        return self.sizes[-1]

    @property
    def is_linear(self) -> bool:
        """One layer with one output (logistic / linear regression): f = phi^T theta, phi = [x, 1]."""
        return len(self.slices) == 1 and self.output_dim == 1

    def layers(self, theta: torch.Tensor):
        """Yield ``(W [..., d_in, d_out], b [..., d_out])`` views of ``theta [..., P]``.

        The views are one ``split`` of ``theta``, whose backward is one concatenation of the layers' gradients. (The
        same views by slicing have a backward that pads each layer's gradient to ``[..., P]`` and adds them: the same
        values eagerly, but compiled, inductor fuses the padding into one kernel that gathers each layer's part through
        a modular index, element by element: BBB's compiled step 1.3-1.4x slower at UCI scale, bench/step_ab.py.)"""
        lead = theta.shape[:-1]
        parts = theta.split(self.split_sizes(), -1)
        for (_, _, d_in, d_out), W, b in zip(self.slices, parts[0::2], parts[1::2]):
            yield W.reshape(*lead, d_in, d_out), b

    def split_sizes(self) -> list[int]:
        """The lengths of ``[W_1, b_1, W_2, b_2, ...]`` in ``theta``, which they tile in this order. (A plain method:
        dynamo breaks the compiled graph at a ``functools.cached_property``.)"""
        sizes, offset = [], 0
        for w, b, _, _ in self.slices:
            if w.start != offset or b.start != w.stop:
                raise ValueError("the layers' slices do not tile theta in order")
            sizes += [w.stop - w.start, b.stop - b.start]
            offset = b.stop
        return sizes

    def sampled_layers(self, mean: torch.Tensor, std: torch.Tensor, eps: torch.Tensor):
        """Per-layer weights ``mean + std * eps`` for ``mean, std [R, P]`` and ``eps [R, S, P]``.

        Built layer by layer from slices of ``mean`` and ``std`` so that back-propagation writes
        ``[R, P]`` gradients, not ``[R, S, P]`` ones (slicing a sampled flat vector would).
        """
        out = []
        for (Wm, bm), (Ws, bs), (We, be) in zip(self.layers(mean.unsqueeze(1)), self.layers(std.unsqueeze(1)),
                                                 self.layers(eps)):
            out.append((Wm + Ws * We, bm + bs * be))
        return out

    def bias_mask(self, device=None) -> torch.Tensor:
        """Boolean ``[P]``: True where the parameter is a bias."""
        mask = torch.zeros(self.n_params, dtype=torch.bool, device=device)
        for _, b, _, _ in self.slices:
            mask[b] = True
        return mask

    def fan_in(self, device=None, dtype=torch.float32) -> torch.Tensor:
        """``[P]`` fan-in of the layer each parameter belongs to."""
        fan = torch.empty(self.n_params, device=device, dtype=dtype)
        for w, b, d_in, _ in self.slices:
            fan[w] = d_in
            fan[b] = d_in
        return fan

    def init(self, n_replicas: int, generator: torch.Generator, scheme: str = "uniform_fan_in",
             device=None, dtype=torch.float32) -> torch.Tensor:
        """Initial ``theta [R, P]``.

        ``uniform_fan_in`` is PyTorch's ``nn.Linear`` default (Kaiming-uniform with a=sqrt(5)):
        U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases, as in the SLANG/Vadam code.
        """
        if scheme == "zero":
            return torch.zeros(n_replicas, self.n_params, device=device, dtype=dtype)
        if scheme != "uniform_fan_in":
            raise ValueError(f"unknown init scheme {scheme!r}; valid: uniform_fan_in, zero")
        u = prng.rand(n_replicas, self.n_params, generator=generator, device=device, dtype=dtype)
        bound = self.fan_in(device, dtype).rsqrt()
        return (2.0 * u - 1.0) * bound

    def forward(self, theta: torch.Tensor, x: torch.Tensor,
                dropout_masks: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Network outputs ``[R, S, B, d_out]`` for ``theta [R, S, P]`` and inputs ``x [R, B, D]``.

        ``dropout_masks[l]`` (``[R, S, B, d_in]``, already scaled by 1/(1-p)) multiplies the input of
        layer ``l`` (inverted dropout, Gal & Ghahramani's MC dropout).
        """
        return self.forward_layers(list(self.layers(theta)), x, dropout_masks)

    def forward_layers(self, layers: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor,
                       dropout_masks: list[torch.Tensor] | None = None,
                       examples_inner: bool = False) -> torch.Tensor:
        """``forward`` from per-layer ``(W [R, S, d_in, d_out], b [R, S, d_out])``. ``examples_inner``: the same
        function with each layer's activations laid out ``[R, S, d, B]`` (``z^T = W^T h^T + b``), the outputs
        transposed back at the end: compiled, the sums over a layer's units are then sums of rows, vectorised along
        the B examples (bench/hidden_layout.py); the same numbers to float rounding, not bitwise."""
        if examples_inner and dropout_masks is None:
            return self._forward_examples_inner(layers, x)
        h = x.unsqueeze(1)
        n_layers = len(self.slices)
        for i, (W, b) in enumerate(layers):
            if dropout_masks is not None:
                h = h * dropout_masks[i]
            h = affine(h, W, b, first=i == 0)
            if i < n_layers - 1:
                h = self._act(h)
        return h

    def _forward_examples_inner(self, layers, x: torch.Tensor) -> torch.Tensor:
        h = x.transpose(-1, -2).unsqueeze(1)                                  # [R, 1, D, B]
        n_layers = len(self.slices)
        for i, (W, b) in enumerate(layers):
            if W.shape[-1] == 1:   # one output unit: a multiply and a sum over d_in
                h = (h * W).sum(-2, keepdim=True) + b.unsqueeze(-1)
            else:
                h = torch.matmul(W.transpose(-1, -2), h) + b.unsqueeze(-1)
            if i < n_layers - 1:
                h = self._act(h)
        return h.transpose(-1, -2)

    # what per-example curvature needs of a network (``linalg.per_example``); a convolutional network
    # (``convnet.ConvNet``) gives the same with its positions as rows, back-propagating by autograd
    convolutional = False

    def forward_cache(self, layers, x: torch.Tensor):
        """Outputs ``[R, S, B, d_out]`` plus per layer the input ``a`` and the pre-activation ``z``."""
        h = x.unsqueeze(1)
        acts, zs = [], []
        n = len(layers)
        for i, (W, b) in enumerate(layers):
            a = h.expand(*W.shape[:2], *h.shape[2:])
            z = affine(a, W, b, first=i == 0)
            acts.append(a)
            zs.append(z)
            h = self._act(z) if i < n - 1 else z
        return h, acts, zs

    def backprop(self, layers, acts, zs, g_out: torch.Tensor) -> list[torch.Tensor]:
        """``g_l = d loss / d z_l`` per layer from the output cotangent ``g_out [R, S, K B, d_out]`` (K cotangents of
        the same B examples one after another), without autograd: ``g_{l-1} = (g_l W_l^T) * act'(z_{l-1})``."""
        g, gs = g_out, [g_out]
        for l in range(len(layers) - 1, 0, -1):
            z = zs[l - 1]
            W = layers[l][0]
            # one output unit: g W^T is an outer product, exactly the broadcast product (2x faster than a batched GEMM)
            g = g * W.transpose(-1, -2) if W.shape[-1] == 1 else torch.matmul(g, W.transpose(-1, -2))
            B = z.shape[-2]
            d = self.act_grad(z, acts[l]).unsqueeze(-3)
            g = (g.unflatten(-2, (g.shape[-2] // B, B)) * d).flatten(-3, -2)
            gs.insert(0, g)
        return gs

    def sum_sq_grads(self, acts, gs) -> torch.Tensor:
        """``sum_i (d loss_i / d theta)^2`` ``[R, S, P]`` from ``a`` and ``g`` per layer: ``(a^2)^T (g^2)`` for the
        weights and ``sum_i g_i^2`` for the biases."""
        parts = []
        for a, g in zip(acts, gs):
            g2 = g * g
            parts.append(torch.matmul((a * a).transpose(-1, -2), g2).flatten(-2))
            parts.append(g2.sum(-2))
        return torch.cat(parts, dim=-1)

    def dropout_masks(self, p: torch.Tensor, n_samples: int, batch: int, generator,
                      dtype=torch.float32) -> list[torch.Tensor]:
        """Inverted-dropout masks ``[R, S, B, d_in]`` per layer: Bernoulli(1 - p_r) / (1 - p_r)."""
        return self.masks_of(self.dropout_uniforms(p.shape[0], n_samples, batch, generator, p.device, dtype), p)

    def dropout_uniforms(self, R: int, n_samples: int, batch: int, generator, device=None,
                         dtype=torch.float32) -> list[torch.Tensor]:
        """The U(0, 1) draws ``[R, S, B, d_in]`` per layer of ``dropout_masks``."""
        return [prng.rand(R, n_samples, batch, d_in, generator=generator, device=device, dtype=dtype)
                for _, _, d_in, _ in self.slices]

    @staticmethod
    def masks_of(uniforms: list[torch.Tensor], p: torch.Tensor) -> list[torch.Tensor]:
        """Inverted-dropout masks 1[u < 1 - p_r] / (1 - p_r) from ``dropout_uniforms``' draws u (a training step makes
        them inside its compiled graph: made with the draws, outside it, they took about 2 ms of MC dropout's 8 ms
        step at R = 100)."""
        keep = (1.0 - p).to(uniforms[0].dtype)[:, None, None, None]
        return [(u < keep).to(u.dtype) / keep for u in uniforms]

    def forward_local_reparam(self, mean: torch.Tensor, var: torch.Tensor, x: torch.Tensor,
                              noise: list[torch.Tensor]) -> torch.Tensor:
        """Outputs ``[R, S, B, d_out]`` under mean-field ``q = N(mean, diag(var))`` by the local
        reparameterisation trick (Kingma, Salimans & Welling, 2015): each pre-activation is drawn
        from its Gaussian marginal ``N(h W_mu + b_mu, h^2 W_var + b_var)``, independently per
        example; ``noise[l]`` is the standard normal draw ``[R, S, B, d_out]`` of layer ``l``.
        """
        S = noise[0].shape[1]
        h = x.unsqueeze(1).expand(x.shape[0], S, *x.shape[1:])
        n_layers = len(self.slices)
        for i, ((Wm, bm), (Wv, bv)) in enumerate(zip(self.layers(mean), self.layers(var))):
            mu = torch.matmul(h, Wm.unsqueeze(1)) + bm[:, None, None, :]
            v = torch.matmul(h * h, Wv.unsqueeze(1)) + bv[:, None, None, :]
            h = mu + v.clamp_min(0).sqrt() * noise[i]
            if i < n_layers - 1:
                h = self._act(h)
        return h


def softplus_inv(y: float) -> float:
    """x with softplus(x) = y."""
    return y + math.log(-math.expm1(-y))

