"""The fused ReLU-network kernel (``core/linalg/mlp_relu``) against the network's forward pass and autograd, float64."""

import pytest
import torch

from bnnbench.core.linalg import mlp_relu
from bnnbench.core.models.mlp import MLP

pytestmark = pytest.mark.skipif(not mlp_relu.available(), reason="no C compiler builds the kernel here")

# rows: fewer than a vector's 16 lanes, a whole vector, between whole blocks; layers with one output unit, a few
# (dout < 4), and more than a register block of 4 (with a remainder)
CASES = [([3, 7, 5, 2], 3, 4, 9), ([8, 50, 1], 4, 2, 100), ([13, 50, 50, 1], 2, 3, 37), ([4, 6, 3], 2, 1, 16),
         ([2, 9, 1], 1, 1, 1)]


def _problem(sizes, R, S, B, seed=0):
    g = torch.Generator().manual_seed(seed)
    model = MLP(sizes)
    x = torch.randn(R, B, sizes[0], generator=g)
    theta = torch.randn(R, S, model.n_params, generator=g) * 0.5
    gf = torch.randn(R, S, B, sizes[-1], generator=g)
    return model, x, theta, gf


@pytest.mark.parametrize("sizes, R, S, B", CASES)
def test_forward_and_gradient_match_the_network_in_float64(sizes, R, S, B):
    model, x, theta, gf = _problem(sizes, R, S, B)
    th64 = theta.double().requires_grad_(True)
    f64 = model.forward(th64, x.double())
    (g64,) = torch.autograd.grad(f64, th64, gf.double())
    f = mlp_relu.forward(x, theta, sizes)
    g = mlp_relu.vjp(x, theta, gf, sizes)
    assert f.shape == f64.shape and g.shape == theta.shape
    assert (f.double() - f64).abs().max() <= 1e-5 * f64.abs().max()
    assert (g.double() - g64).abs().max() <= 1e-5 * g64.abs().max()
    # each network's gradient alone: another replica's or sample's inputs and weights do not leak into it
    r, s = R - 1, S - 1
    alone = mlp_relu.vjp(x[r:r + 1], theta[r:r + 1, s:s + 1], gf[r:r + 1, s:s + 1], sizes)
    assert torch.allclose(alone[0, 0], g[r, s], rtol=0, atol=1e-6 * float(g.abs().max()))


def test_autograd_through_the_operator_gives_its_vjp():
    sizes, R, S, B = [5, 20, 20, 1], 3, 2, 40
    model, x, theta, gf = _problem(sizes, R, S, B, seed=1)
    mean = theta[:, 0].clone().requires_grad_(True)
    eps = torch.randn(R, S, model.n_params)
    f = mlp_relu.forward(x, mean.unsqueeze(1) + 0.1 * eps, sizes)
    (g,) = torch.autograd.grad(f, mean, gf)
    expected = mlp_relu.vjp(x, mean.detach().unsqueeze(1) + 0.1 * eps, gf, sizes).sum(1)
    assert torch.equal(g, expected)


def test_the_operators_pass_torchs_operator_checks():
    sizes, R, S, B = [3, 7, 5, 2], 2, 2, 9
    _, x, theta, gf = _problem(sizes, R, S, B, seed=2)
    torch.library.opcheck(mlp_relu.forward, (x, theta, sizes),
                           test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    torch.library.opcheck(mlp_relu.vjp, (x, theta, gf, sizes), test_utils=("test_schema", "test_faketensor"))


def test_a_dead_unit_passes_no_gradient():
    """relu'(z) = 1[z > 0]: a hidden unit whose pre-activation is negative on every row gets no weight gradient."""
    sizes, R, S, B = [2, 3, 1], 1, 1, 20
    model, x, theta, gf = _problem(sizes, R, S, B, seed=3)
    w, b, _, _ = model.slices[0]
    theta[0, 0, w] = theta[0, 0, w].view(2, 3).index_fill(1, torch.tensor([1]), 0.0).flatten()
    theta[0, 0, b.start + 1] = -1.0          # unit 1: z = -1 on every row
    g = mlp_relu.vjp(x, theta, gf, sizes)
    W_grad = g[0, 0, w].view(2, 3)
    assert torch.all(W_grad[:, 1] == 0) and g[0, 0, b.start + 1] == 0
    assert torch.all(W_grad[:, 0] != 0)


def test_it_applies_to_small_relu_networks_in_float32_on_a_cpu():
    x = torch.zeros(2, 70, 8)
    assert mlp_relu.applies(MLP([8, 50, 1]), x, torch.float32)
    assert not mlp_relu.applies(MLP([8, 50, 1], activation="tanh"), x, torch.float32)
    assert not mlp_relu.applies(MLP([8, 50, 1]), x.double(), torch.float64)
    assert not mlp_relu.applies(MLP([784, 400, 400, 10]), torch.zeros(2, 70, 784), torch.float32)   # MAX_WIDTH
    assert not mlp_relu.applies(MLP([8, 50, 1]), x.requires_grad_(True), torch.float32)
