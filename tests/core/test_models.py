"""MLP as a function of a flat parameter vector, against torch.nn layers."""

import pytest
import torch

from bnnbench.core.models import MLP

DT = torch.float64


def _nn_reference(model, theta, x):
    h = x
    for i, (W, b) in enumerate(model.layers(theta)):
        lin = torch.nn.Linear(W.shape[0], W.shape[1]).to(DT)
        with torch.no_grad():
            lin.weight.copy_(W.T)
            lin.bias.copy_(b)
        h = lin(h)
        if i < len(model.slices) - 1:
            h = torch.relu(h)
    return h


@pytest.mark.parametrize("sizes", [[3, 7, 5, 2], [3, 1]])   # [3, 1]: the single-output first layer's product
def test_forward_matches_nn_linear_per_replica_and_sample(sizes):
    g = torch.Generator().manual_seed(0)
    model = MLP(sizes)
    theta = torch.randn(4, 6, model.n_params, generator=g, dtype=DT)
    x = torch.randn(4, 9, 3, generator=g, dtype=DT)
    out = model.forward(theta, x)
    assert out.shape == (4, 6, 9, sizes[-1])
    for r in range(4):
        for s in range(6):
            assert torch.allclose(out[r, s], _nn_reference(model, theta[r, s], x[r]))


@pytest.mark.parametrize("sizes", [[3, 7, 5, 2], [3, 7, 1], [3, 1]])
def test_forward_with_the_examples_innermost_matches_nn_linear(sizes):
    """``forward_layers(examples_inner=True)`` (activations ``[R, S, d, B]``, BBB's compiled step) is the same
    network: against torch.nn per replica and sample, in hidden layers of several units and outputs of one or two."""
    g = torch.Generator().manual_seed(2)
    model = MLP(sizes)
    theta = torch.randn(4, 6, model.n_params, generator=g, dtype=DT)
    x = torch.randn(4, 9, 3, generator=g, dtype=DT)
    out = model.forward_layers(list(model.layers(theta)), x, examples_inner=True)
    assert out.shape == (4, 6, 9, sizes[-1])
    for r in range(4):
        for s in range(6):
            assert torch.allclose(out[r, s], _nn_reference(model, theta[r, s], x[r]))


def test_sampled_layers_equal_flat_sampling():
    g = torch.Generator().manual_seed(1)
    model = MLP([3, 4, 1])
    mean = torch.randn(2, model.n_params, generator=g, dtype=DT)
    std = torch.rand(2, model.n_params, generator=g, dtype=DT)
    eps = torch.randn(2, 5, model.n_params, generator=g, dtype=DT)
    x = torch.randn(2, 6, 3, generator=g, dtype=DT)
    flat = model.forward(mean[:, None] + std[:, None] * eps, x)
    assert torch.allclose(model.forward_layers(model.sampled_layers(mean, std, eps), x), flat)


def test_local_reparam_moments_of_a_linear_layer():
    """For one linear layer the output is exactly N(x mu_W + mu_b, x^2 var_W + var_b)."""
    g = torch.Generator().manual_seed(2)
    model = MLP([3, 1])
    mean = torch.randn(1, model.n_params, generator=g, dtype=DT)
    var = torch.rand(1, model.n_params, generator=g, dtype=DT)
    x = torch.randn(1, 2, 3, generator=g, dtype=DT)
    S = 200000
    noise = [torch.randn(1, S, 2, 1, generator=g, dtype=DT)]
    out = model.forward_local_reparam(mean, var, x, noise)[0, :, :, 0]
    ((Wm, bm),), ((Wv, bv),) = list(model.layers(mean[0])), list(model.layers(var[0]))
    mu = x[0] @ Wm[:, 0] + bm[0]
    v = (x[0] ** 2) @ Wv[:, 0] + bv[0]
    assert torch.allclose(out.mean(0), mu, atol=4 * (v / S).sqrt().max().item())
    assert torch.allclose(out.var(0), v, rtol=0.02)


def test_dropout_masks_rate_and_scaling():
    g = torch.Generator().manual_seed(3)
    model = MLP([50, 20, 1])
    p = torch.tensor([0.1, 0.5], dtype=DT)
    masks = model.dropout_masks(p, 40, 30, g, DT)
    assert [m.shape for m in masks] == [(2, 40, 30, 50), (2, 40, 30, 20)]
    m0 = masks[0]
    assert set(torch.unique(m0[0]).tolist()) == {0.0, 1 / 0.9}
    assert abs((m0[1] == 0).double().mean().item() - 0.5) < 0.02
    assert abs(m0.mean().item() - 1.0) < 0.02  # inverted dropout keeps the expectation


def test_init_uniform_fan_in_bounds():
    g = torch.Generator().manual_seed(4)
    model = MLP([16, 8, 1])
    theta = model.init(3, g)
    (W1, b1), (W2, b2) = model.layers(theta)
    assert W1.abs().max() <= 0.25 and b1.abs().max() <= 0.25   # 1/sqrt(16)
    assert W2.abs().max() <= 8 ** -0.5
    assert W1.abs().max() > 0.2  # actually spread over the range
