"""The engine's divergence check (``engine._finite_state``) against the elementwise definition."""

import torch

from bnnbench.methods.state import Node, state_class
from bnnbench.run.engine import _finite_state


@state_class
class _Toy(Node):
    mean: torch.Tensor
    prec: torch.Tensor
    t: torch.Tensor
    empty: torch.Tensor


def test_a_replica_is_finite_where_every_floating_entry_of_its_state_is():
    """Each replica is flagged by its own entries alone: a NaN, +inf or -inf anywhere in any floating tensor (of either
    precision) makes it non-finite; integer and empty tensors are not read; huge finite values stay finite."""
    g = torch.Generator().manual_seed(0)
    R = 7
    state = _Toy(mean=torch.randn(R, 5, 3, generator=g), prec=torch.rand(R, 4, generator=g, dtype=torch.float64),
                 t=torch.arange(R), empty=torch.zeros(R, 0))
    state.mean[1, 4, 2] = float("nan")
    state.mean[2, 0, 0] = float("inf")
    state.prec[3, 3] = -float("inf")
    state.prec[4, 0] = float("nan")
    state.mean[5] = 3e38                       # finite, near float32's largest
    state.prec[6] = -1e308
    ref = torch.stack([torch.isfinite(state.mean[r]).all() & torch.isfinite(state.prec[r]).all() for r in range(R)])
    assert ref.tolist() == [True, False, False, False, False, True, True]
    assert torch.equal(_finite_state(state), ref)
