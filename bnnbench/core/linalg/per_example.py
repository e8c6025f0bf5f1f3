"""Per-example gradient statistics of an MLP from activations and back-propagated gradients.

For a linear layer ``z = a W + b`` the gradient of example i's loss is ``dW_i = a_i^T g_i`` and
``db_i = g_i``, with ``a_i`` the layer input and ``g_i = d loss_i / d z_i``. Hence, without forming
the per-example gradients (docs/design.md, "Curvature without materialising"):

    sum_i dW_i^2 = (a^2)^T (g^2),      sum_i db_i^2 = sum_i g_i^2.

``g`` comes from one backward pass of the *sum* of per-example losses, because examples do not
interact. ``per_example_grads`` materialises the gradients with ``torch.func`` (the reference used in
tests and the fallback for layers without this rule).
"""

from __future__ import annotations

import torch

from bnnbench.core.models.mlp import MLP


def forward_cache(model: MLP, layers, x: torch.Tensor):
    """Outputs ``[R, S, B, d_out]`` plus per layer the input ``a`` and the pre-activation ``z``
    (``z`` is part of the graph, so ``autograd.grad(loss, zs)`` gives the back-propagated ``g``): the network's own
    (``MLP.forward_cache``; a convolutional network's patches and pre-activations have the positions as rows)."""
    return model.forward_cache(layers, x)


def backprop(model: MLP, layers, acts, zs, g_out: torch.Tensor) -> list[torch.Tensor]:
    """Back-propagated gradients ``g_l = d loss / d z_l`` of every layer from the output cotangent
    ``g_out = d loss / d f``, without autograd: ``g_{l-1} = (g_l W_l^T) * act'(z_{l-1})``.

    ``g_out [R, S, K B, d_out]`` may hold K cotangents of the same B examples one after another (observed and sampled
    targets, say): one pass serves them all. ``acts``, ``zs`` as ``forward_cache`` returns them. A convolutional
    network back-propagates by autograd (``ConvNet.backprop``: its rows are examples x positions)."""
    return model.backprop(layers, acts, zs, g_out)


def collapse_samples(model: MLP, acts, gs, how: str = "rss"):
    """For a linear model with one output, ``(acts, gs)`` of M examples x S samples -> one "sample" of M examples.

    Every per-example gradient is ``g_is = r_is phi_i`` with ``phi_i = [x_i, 1]``, so ``sum_{i,s} g_is = sum_i
    (sum_s r_is) phi_i`` (``how="sum"``) and ``sum_{i,s} g_is g_is^T = sum_i w_i phi_i phi_i^T`` with ``w_i =
    sum_s r_is^2`` (``how="rss"``: the M columns ``sqrt(w_i) phi_i`` replace the S M columns of G in every product
    with G G^T, S times fewer flops, and give the same diagonal). Other models come back unchanged."""
    if not model.is_linear or acts[0].shape[1] == 1:
        return acts, gs
    g = gs[0].sum(1, keepdim=True) if how == "sum" else gs[0].square().sum(1, keepdim=True).sqrt()
    return [acts[0][:, :1]], [g]


def sum_sq_grads(model: MLP, acts, gs) -> torch.Tensor:
    """``sum_i (d loss_i / d theta)^2`` as a flat ``[R, S, P]`` tensor from ``a`` and ``g`` per layer (a convolutional
    network's: ``ConvNet.sum_sq_grads``, positions summed per example before squaring)."""
    return model.sum_sq_grads(acts, gs)


def sum_grads(model: MLP, acts, gs) -> torch.Tensor:
    """``sum_i d loss_i / d theta`` as a flat ``[R, S, P]`` tensor."""
    parts = []
    for a, g in zip(acts, gs):
        parts.append(torch.matmul(a.transpose(-1, -2), g).flatten(-2))
        parts.append(g.sum(-2))
    return torch.cat(parts, dim=-1)


def sums_over_samples(model: MLP, acts, gs, square: bool = False) -> torch.Tensor:
    """``sum_s sum_i`` of the per-example gradients ``g_si`` (``square``: of their squares ``g_si^2``) as a flat
    ``[R, P]`` tensor: ``sum_grads(...).sum(1)`` (``sum_sq_grads(...).sum(1)``) summed in another order.

    Where the S samples share a layer's input (the first layer's ``a_i = x_i``), ``sum_s sum_i x_i g_si = x^T
    (sum_s g_s)`` and ``sum_s sum_i x_i^2 g_si^2 = (x^2)^T (sum_s g_s^2)``: S times fewer products, the bias's sum from
    the same ``[R, M, d_out]`` sum over samples. Another layer contracts over samples and examples at once (a
    multiply-and-sum where it has one output unit). Compiled, these are fewer passes over the ``[R, S, M, d]``
    activations than per-sample sums (VOGN's step, bench/step_ab.py). A convolutional network sums its own
    per-sample sums."""
    if model.convolutional:
        return (sum_sq_grads(model, acts, gs) if square else sum_grads(model, acts, gs)).sum(1)
    parts = []
    for a, g in zip(acts, gs):
        if square:
            g = g * g
        if a.shape[1] == 1 or a.stride(1) == 0:
            x, g_s = a[:, 0], g.sum(1)                                          # [R, M, d_in], [R, M, d_out]
            parts += [torch.matmul((x * x if square else x).transpose(-1, -2), g_s).flatten(-2), g_s.sum(1)]
        elif g.shape[-1] == 1:
            parts += [((a * a if square else a) * g).sum((1, 2)), g.sum((1, 2, 3)).unsqueeze(-1)]
        else:
            A, G = a.flatten(1, 2), g.flatten(1, 2)                             # [R, S M, d_in], [R, S M, d_out]
            parts += [torch.matmul((A * A if square else A).transpose(-1, -2), G).flatten(-2), G.sum(1)]
    return torch.cat(parts, dim=-1)


def per_example_grads(model: MLP, loss_fn, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Reference: per-example gradients ``[B, P]`` of ``loss_fn(f(x_i; theta), y_i)`` for one
    parameter vector ``theta [P]`` by ``torch.func.vmap(grad)``."""
    from torch.func import grad, vmap

    def single(th, xi, yi):
        f = model.forward(th[None, None], xi[None, None])[0, 0, 0]
        return loss_fn(f, yi).sum()  # f: the [d_out] output of example i

    return vmap(grad(single), in_dims=(None, 0, 0))(theta, x, y)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``[R, S, B, ...]`` -> ``[R, S*B, ...]`` (one column of G per (sample, example) pair)."""
    return t.reshape(t.shape[0], t.shape[1] * t.shape[2], *t.shape[3:])


def layer_factors(acts, gs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer ``(a1t, g [R, n, d_out])``: the layer inputs with a 1 appended (the bias's input), transposed, and
    the back-propagated gradients, one row per (sample, example) pair, n = S M. With the layer's parameters laid out
    as ``[W; b]`` (``MLP.slices``), example i's gradient is ``a1_i g_i^T``. ``a1t`` is ``[R, d_in + 1, n]``, or
    ``[R, d_in + 1, M]`` where the S samples share the layer's input (the first layer: ``forward_cache`` expands the
    data over samples), which lets the products below contract over the samples before the examples. Built once
    per step for ``gradient_gram``, ``gradient_t_times`` and ``gradient_times``."""
    out = []
    for a, g in zip(acts, gs):
        if a.shape[1] > 1 and a.stride(1) == 0:
            a = a[:, :1]
        a = _flat(a)
        a1t = a.new_empty(a.shape[0], a.shape[2] + 1, a.shape[1])
        a1t[:, :-1].copy_(a.transpose(1, 2))
        a1t[:, -1] = 1
        out.append((a1t, _flat(g)))
    return out


def gradient_gram(factors) -> torch.Tensor:
    """``G^T G [R, n, n]`` of the per-example gradients without forming them: for a linear layer
    ``<g_i, g_j> = (a_i . a_j + 1)(g_i . g_j)`` (weights and bias), summed over layers."""
    out = 0
    for a1t, g in factors:
        K = a1t.transpose(1, 2) @ a1t
        S = g.shape[1] // a1t.shape[2]
        out = out + (K.repeat(1, S, S) if S > 1 else K) * (g @ g.transpose(1, 2))
    return out


def gradient_t_times(model: MLP, factors, V: torch.Tensor) -> torch.Tensor:
    """``G^T V [R, n, k]`` for ``V [R, P, k]``: ``<g_i, v> = sum_jo a1_ij V_jo g_io`` with ``V_jo`` the layer's
    ``[W; b]`` block of v. Contracts the longer of the two layer dimensions in the GEMM and the shorter
    elementwise; products are laid out ``[k, n]`` so that the GEMM's output has n columns rather than k. Where
    the S samples share the inputs, ``a1^T V`` is formed once per example (M rows, not S M)."""
    R, _, k = V.shape
    out = 0
    for (w, b, d_in, d_out), (a1t, g) in zip(model.slices, factors):
        j, n, M = d_in + 1, g.shape[1], a1t.shape[2]
        Vl = V[:, w.start:b.stop].reshape(R, j, d_out, k)
        if j < d_out:   # ([R, j k, o] @ [R, o, n]) * a1 -> sum over j; n = S M: a1t [R, j, M] broadcasts over S
            T = (Vl.permute(0, 1, 3, 2).reshape(R, j * k, d_out) @ g.transpose(1, 2)).view(R, j, k, n // M, M)
            out = out + (T * a1t[:, :, None, None]).sum(1).view(R, k, n)
        elif M < n:     # [R, M, j] @ [R, j, o k], then per example [S, o] @ [o, k]
            S = n // M
            T = (a1t.transpose(1, 2) @ Vl.reshape(R, j, d_out * k)).view(R * M, d_out, k)
            gi = g.view(R, S, M, d_out).transpose(1, 2).reshape(R * M, S, d_out)
            out = out + (gi @ T).view(R, M, S, k).permute(0, 3, 2, 1).reshape(R, k, n)
        else:           # ([R, o k, j] @ [R, j, n]) * g -> sum over o
            T = (Vl.reshape(R, j, d_out * k).transpose(1, 2) @ a1t).view(R, d_out, k, n)
            out = out + (T * g.transpose(1, 2).unsqueeze(2)).sum(1)
    return out.transpose(1, 2)


def gradient_times(model: MLP, factors, W: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``G W [R, P, k]`` for ``W [R, n, k]``: ``sum_i W_ik a1_i g_i^T`` per layer. Where the S samples share the
    inputs, ``sum_s W_sk g_s`` is formed per example first (a GEMM over M examples, not S M).
    With ``out`` the product is added to it in place (``out += G W``), without a second ``[R, P, k]`` buffer."""
    R, n, k = W.shape
    if out is None:
        out = W.new_zeros(R, model.n_params, k)
    Wt = W.transpose(1, 2).contiguous()
    for (w, b, d_in, d_out), (a1t, g) in zip(model.slices, factors):
        j, M = d_in + 1, a1t.shape[2]
        ol = out[:, w.start:b.stop].view(R, j, d_out, k)
        if j < d_out:            # [R, j k, n] @ [R, n, o]
            aW = (a1t[:, :, None, None] * Wt.view(R, 1, k, n // M, M)).view(R, j * k, n)
            ol += (aW @ g).view(R, j, k, d_out).transpose(2, 3)
        elif M < n:              # per example [o, S] @ [S, k], then [R, j, M] @ [R, M, o k]
            S = n // M
            gi = g.view(R, S, M, d_out).permute(0, 2, 3, 1).reshape(R * M, d_out, S)
            Wi = W.view(R, S, M, k).transpose(1, 2).reshape(R * M, S, k)
            ol += (a1t @ (gi @ Wi).view(R, M, d_out * k)).view(R, j, d_out, k)
        elif d_out * k < 16:     # [R, o k, n] @ [R, n, j]: a GEMM with o k output rows, not columns
            gW = (g.transpose(1, 2).unsqueeze(2) * Wt.unsqueeze(1)).reshape(R, d_out * k, n)
            ol += (gW @ a1t.transpose(1, 2)).view(R, d_out, k, j).permute(0, 3, 1, 2)
        else:                    # [R, j, n] @ [R, n, o k]
            gW = (g.unsqueeze(-1) * W.unsqueeze(-2)).view(R, n, d_out * k)
            ol += (a1t @ gW).view(R, j, d_out, k)
    return out


def materialise(model: MLP, acts, gs) -> torch.Tensor:
    """Per-example gradients as columns, ``G [R, P, n]`` (reference path; O(P n) memory)."""
    parts = []
    for a, g in zip(acts, gs):
        a, g = _flat(a), _flat(g)
        parts.append((a.unsqueeze(-1) * g.unsqueeze(-2)).flatten(2).transpose(1, 2))
        parts.append(g.transpose(1, 2))
    return torch.cat(parts, dim=1)
