"""The Gaussian data term of many networks on one shared full batch and its gradient, without autograd.

For C parameter vectors theta_c ``[R, C, P]`` of an MLP (HMC's chains) and the rows x_i ``[R, N, D]`` they share,

    E_c = (tau_c / 2) sum_i m_i (f(x_i; theta_c) - y_i)^2,        m_i in {0, 1} (a replica's own rows),

and dE_c / dtheta_c by back-propagation: g_L = tau (f - y) m at the output, and per layer l (input a, output z),
dW_l = a^T g_l, db_l = sum_i g_l, g_{l-1} = (g_l W_l^T) act'(z_{l-1}). The activations are laid out ``[R, N, C, d]``
(chains beside the units), so that the first layer of all C networks is one GEMM ``[N, D] x [D, C d_1]`` per replica
and its weight gradient one ``[D, N] x [N, C d_1]``, rather than C small products: on a CPU this makes the step
about as fast as an autograd forward and backward pass of the same networks (bench/hmc_leapfrog.py).
"""

from __future__ import annotations

import torch

from bnnbench.core.models.mlp import MLP


def _layer(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``h [R, N, C, i] x W [R, C, i, o] + b [R, C, o]`` -> ``[R, N, C, o]`` (one output: a product and a sum)."""
    if W.shape[-1] == 1:
        return torch.einsum("rnci,rci->rnc", h, W[..., 0]).unsqueeze(-1) + b.unsqueeze(1)
    return torch.einsum("rnci,rcio->rnco", h, W) + b.unsqueeze(1)


def _act_backward(model: MLP, g: torch.Tensor, z: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """g act'(z) given h = act(z); for ReLU the fused kernel of its autograd backward (one pass)."""
    if model.activation == "relu":
        return torch.ops.aten.threshold_backward(g, h, 0)
    return g * model.act_grad(z, h)


def gaussian_energy_grad(model: MLP, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
                         tau: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E ``[R, C]``, dE/dtheta ``[R, C, P]``, the sum of squared residuals ``[R, C]``) of the module docstring for
    ``theta [R, C, P]``, ``x [R, N, D]``, ``y [R, N]``, ``mask [R, N]`` and ``tau [R, C]``; one output unit."""
    R, C, _ = theta.shape
    N = x.shape[1]
    layers = list(model.layers(theta))
    W1, b1 = layers[0]
    d1 = W1.shape[-1]
    z = torch.baddbmm(b1.reshape(R, 1, C * d1), x, W1.permute(0, 2, 1, 3).reshape(R, -1, C * d1)).view(R, N, C, d1)
    zs, hs = [z], []
    for W, b in layers[1:]:
        hs.append(model._act(zs[-1]))
        zs.append(_layer(hs[-1], W, b))
    r = (zs[-1][..., 0] - y.unsqueeze(-1)) * mask.unsqueeze(-1).to(theta.dtype)            # [R, N, C]
    sse = (r * r).sum(1)
    g = (tau.unsqueeze(1) * r).unsqueeze(-1)                                               # [R, N, C, 1]
    grads = []
    for l in range(len(layers) - 1, 0, -1):
        W, a = layers[l][0], hs[l - 1]
        gW = (a * g).sum(1).unsqueeze(-1) if W.shape[-1] == 1 else torch.einsum("rnci,rnco->rcio", a, g)
        grads[:0] = [gW.reshape(R, C, -1), g.sum(1)]
        g = g * W[..., 0].unsqueeze(1) if W.shape[-1] == 1 else torch.einsum("rnco,rcio->rnci", g, W)
        g = _act_backward(model, g, zs[l - 1], a)
    gW1 = torch.bmm(x.transpose(1, 2), g.reshape(R, N, C * d1)).view(R, -1, C, d1).permute(0, 2, 1, 3)
    grads[:0] = [gW1.reshape(R, C, -1), g.sum(1)]
    return 0.5 * tau * sse, torch.cat(grads, -1), sse
