"""Shared pieces of the weight-perturbation natural-gradient methods (VOGN, Vadam, Vprop):
Gaussian samples of the weights as per-layer leaves, minibatch gradients per MC sample, and the
per-example curvature (empirical Fisher or generalised Gauss-Newton) from activations and
back-propagated gradients (``bnnbench.core.linalg.per_example``)."""

from __future__ import annotations

import torch

from bnnbench.core.linalg import mlp_relu
from bnnbench.core.linalg.per_example import forward_cache, sum_grads, sum_sq_grads, sums_over_samples
from bnnbench.methods.base import likelihood_of


def as_leaves(layers):
    """Per-layer ``(W, b)`` as leaf tensors that require grad (gradients w.r.t. sampled weights)."""
    return [(W.detach().requires_grad_(True), b.detach().requires_grad_(True)) for W, b in layers]


def leaf_layers(model, mean, std, eps):
    """Sampled weights ``mean + std * eps`` per layer, each a leaf tensor that requires grad."""
    return as_leaves(model.sampled_layers(mean, std, eps))


def flat_grads(grads) -> torch.Tensor:
    """Per-layer ``(dW [R, S, d_in, d_out], db [R, S, d_out])`` -> flat ``[R, S, P]``."""
    return torch.cat([g.flatten(2) for g in grads], dim=-1)


def sample_gradients(method, state, layers, batch):
    """Gradient of the minibatch-mean negative log-likelihood at each sample: ``[R, S, P]``,
    and the per-replica mean NLL ``[R]``. ``layers``: per-layer leaves (``leaf_layers``), or the samples' flat
    parameters ``theta [R, S, P]`` (a leaf), whose ReLU network the fused kernel computes (``core/linalg/mlp_relu``)."""
    if isinstance(layers, torch.Tensor):
        with torch.enable_grad():
            f = mlp_relu.forward(batch.x, layers, method.model.sizes)
            nll = -likelihood_of(state, method.likelihood).log_prob(f, batch.y).mean(-1)  # [R, S]
            (g,) = torch.autograd.grad(nll.sum(), layers)
        return g, nll.mean(1).detach()
    with torch.enable_grad():
        f = method.model.forward_layers(layers, batch.x)
        nll = -likelihood_of(state, method.likelihood).log_prob(f, batch.y).mean(-1)  # [R, S]
        grads = torch.autograd.grad(nll.sum(), [t for wb in layers for t in wb])
    return flat_grads(grads), nll.mean(1).detach()


def per_example_stats(method, state, layers, batch, curvature: str, generator=None, over_samples: bool = False):
    """``(sum_i g_i, sum_i c_i, mean nll)``: per-sample sums over the minibatch of per-example NLL
    gradients ``g_i`` ``[R, S, P]`` and of the curvature ``c_i`` ``[R, S, P]`` (``over_samples``: their sums over
    the samples too, ``[R, P]``, by ``per_example.sums_over_samples``):

    * ``ef``: ``c_i = g_i^2`` (empirical Fisher diagonal);
    * ``ggn``: ``c_i = diag(J_i^T Lambda_i J_i)`` with ``J_i = df_i/dtheta`` and ``Lambda_i`` the Hessian of
      the NLL in the output, as the squares of the back-propagated square roots of ``Lambda_i`` (the likelihood's
      ``ggn_sqrt_output``: exact for the Gaussian and Bernoulli likelihoods, a one-sample Monte Carlo estimate of
      the Fisher, labels drawn from the model, for the categorical one).
    """
    model = method.model
    with torch.enable_grad():
        f, acts, zs = forward_cache(model, layers, batch.x)
        lik = likelihood_of(state, method.likelihood)
        nll_i = -lik.log_prob(f, batch.y)  # [R, S, B]
        gs = torch.autograd.grad(nll_i.sum(), zs, retain_graph=curvature != "ef")
        if curvature == "ef":
            hs = gs
        elif curvature == "ggn":
            hs = torch.autograd.grad(lik.ggn_sqrt_output(f, generator).sum(), zs)
        else:
            raise ValueError(f"unknown curvature {curvature!r}; valid: ef, ggn")
        if over_samples:
            g_sum, c_sum = sums_over_samples(model, acts, gs), sums_over_samples(model, acts, hs, square=True)
        else:
            g_sum, c_sum = sum_grads(model, acts, gs), sum_sq_grads(model, acts, hs)
    return g_sum, c_sum, nll_i.mean(dim=(1, 2)).detach()
