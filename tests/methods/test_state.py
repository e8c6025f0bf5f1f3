"""The typed method state (``methods/state.py``) and K-FAC's Kronecker factors as one object (``kfac/kronecker.py``):
slicing, joining and mapping over nested states; the factors' damping, square roots, sampling and preconditioning
against dense linear algebra."""

import math

import pytest
import torch

from bnnbench.methods import State, state_class
from bnnbench.methods.kfac.kronecker import Kronecker
from bnnbench.methods.state import Node, cat

DT = torch.float64


@state_class
class _Leaf(Node):
    a: torch.Tensor
    b: torch.Tensor | None = None


@state_class
class _Nested(State):
    mean: torch.Tensor
    layers: tuple[_Leaf, ...]
    extra: torch.Tensor | None = None


def _state(R=4):
    r = torch.arange(R, dtype=DT)
    return _Nested(n_data=torch.arange(R) + 10, prior_prec=r[:, None].expand(R, 3).clone(), mean=r[:, None] * 2,
                   layers=(_Leaf(a=r[:, None, None] + torch.zeros(R, 2, 2, dtype=DT)), _Leaf(a=-r, b=r * 3)))


def test_a_state_slices_joins_and_maps_every_nested_tensor_on_the_replica_axis():
    s = _state()
    assert list(s.tensors()) == ["n_data", "prior_prec", "mean", "layers.0.a", "layers.1.a", "layers.1.b"]
    one = s[2]
    assert type(one) is _Nested and one.n_replicas == 1 and one.extra is None and one.noise_prec is None
    assert torch.equal(one.layers[1].b, torch.tensor([6.0], dtype=DT)) and one.layers[0].a.shape == (1, 2, 2)
    back = cat([s[0:1], s[1:3], s[3]])
    assert all(torch.equal(v, s.tensors()[k]) for k, v in back.tensors().items())
    doubled = s.map(lambda v: v * 2)
    assert torch.equal(doubled.layers[1].b, s.layers[1].b * 2) and doubled.layers[0].b is None
    moved = s.replace(mean=s.mean + 1)
    assert torch.equal(moved.mean, s.mean + 1) and moved.layers is s.layers and torch.equal(s.mean, _state().mean)


def test_a_state_is_frozen_and_says_so_when_read_as_a_dict():
    s = _state()
    with pytest.raises(AttributeError):
        s.mean = s.mean + 1
    with pytest.raises(TypeError, match=r"state.mean, not state\['mean'\]"):
        s["mean"]


def _spd(n, g):
    X = torch.randn(2, n, n, generator=g, dtype=DT)
    return X @ X.mT + 0.2 * torch.eye(n, dtype=DT)


def test_kronecker_damping_roots_sampling_and_preconditioning_against_dense_algebra():
    """A^g = A + pi sqrt(g) I, S^g = S + sqrt(g) / pi I (pi^2 = (tr A / dim A) / (tr S / dim S)); a draw M + C_A E C_S^T
    has Cov vec(W) = s^2 [A^g]^-1 (x) [S^g]^-1 (row-major vec); the inverses precondition V as [A^g]^-1 V [S^g]^-1, and
    so do the roots (scaled by 1 / s^2) at the same damping."""
    g = torch.Generator().manual_seed(0)
    a, b = 3, 2
    k = Kronecker(A=_spd(a, g), S=_spd(b, g))
    gamma, s = torch.tensor([0.3, 0.05], dtype=DT), torch.tensor([0.5, 2.0], dtype=DT)
    k = k.with_root(gamma, s[:, None, None]).with_inverse(gamma)
    V = torch.randn(2, a, b, generator=g, dtype=DT)
    n = a * b
    E = torch.eye(n, dtype=DT).reshape(n, a, b).expand(2, n, a, b)
    M = torch.randn(2, a, b, generator=g, dtype=DT)
    for r in range(2):
        A, S = k.A[r], k.S[r]
        pi = math.sqrt((A.trace() / a) / (S.trace() / b))
        Ag = A + pi * math.sqrt(gamma[r]) * torch.eye(a, dtype=DT)
        Sg = S + math.sqrt(gamma[r]) / pi * torch.eye(b, dtype=DT)
        T = (k.sample(M, E)[r] - M[r]).reshape(n, n).T
        assert torch.allclose(T @ T.T, s[r] ** 2 * torch.kron(torch.linalg.inv(Ag), torch.linalg.inv(Sg)))
        dense = torch.linalg.solve(torch.kron(Ag, Sg), V[r].flatten()).reshape(a, b)
        assert torch.allclose(k.precondition(V)[r], dense)
        assert torch.allclose(k.precondition_by_root(V, 1 / s[:, None, None] ** 2)[r], dense)
