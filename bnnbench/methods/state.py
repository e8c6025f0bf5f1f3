"""A method's state: a frozen dataclass of tensors, each with the replica axis first.

Every method declares its state as a subclass of ``State`` decorated with ``@state_class`` (a frozen, keyword-only
dataclass registered as a pytree), so that its entries are named and typed fields rather than the string keys of a
dict whose presence switches behaviour. ``State`` holds what every method reads, the per-replica hyper-parameters of
its ``Problem``; a subclass adds its own tensors, optional ones as ``None`` defaults, and nested ``Node`` objects
(also ``@state_class``; e.g. a tuple of K-FAC's per-layer ``Kronecker`` factors) where a family has them. The harness
treats any state alike through the pytree: ``state[index]`` slices replicas, ``map`` applies a function to every
tensor, ``tensors`` names them for messages, ``replace`` is a step's new state.

Plain frozen dataclasses rather than ``tensordict``'s ``tensorclass``: at UCI scale a step is bound by per-call
overhead, and a tensorclass costs 0.7 us a field read and 10 us to build (a frozen dataclass: 0.04 and 0.5 us;
measured with tensordict 0.15.3 on this CPU), i.e. 5-8% of a 20-replica UCI step.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, TypeVar

import torch
from torch.utils import _pytree as pytree

T = TypeVar("T", bound="State")
N = TypeVar("N", bound="Node")


def state_class(cls: type[N]) -> type[N]:
    """``cls`` as a frozen keyword-only dataclass whose fields are the nodes of a pytree (``torch.compile`` traces
    through it, ``State.map`` maps over it)."""
    cls = dataclasses.dataclass(frozen=True, kw_only=True)(cls)
    pytree.register_dataclass(cls)
    return cls


class Node:
    """A frozen dataclass of tensors declared with ``@state_class``: a method's ``State`` or an object nested in it
    (``gamma_noise.NoiseQ``, K-FAC's ``Kronecker`` factors, the inducing families' parameters)."""

    def replace(self: N, **changes) -> N:
        """A copy with ``changes`` (the fields' new values): a step's new state."""
        return dataclasses.replace(self, **changes)

    def map(self: N, fn: Callable[[torch.Tensor], torch.Tensor]) -> N:
        """The same object with ``fn`` applied to every tensor (nested ones included)."""
        return pytree.tree_map(lambda v: fn(v) if torch.is_tensor(v) else v, self)

    def leaves(self) -> list[torch.Tensor]:
        """Every tensor in ``pytree.tree_flatten``'s order (the fields' order, depth first; None skipped)."""
        return [v for v in pytree.tree_leaves(self) if torch.is_tensor(v)]

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor by its path (``"mean"``, ``"layers.0.A"``), for checks and messages."""
        leaves, _ = pytree.tree_flatten_with_path(self)
        return {".".join(_key(k) for k in path): v for path, v in leaves if torch.is_tensor(v)}


@state_class
class State(Node):
    """The replicas' hyper-parameters (``Problem``): training-set size N, prior precision lambda ``[R, P]``, the
    Gaussian noise precision tau where the likelihood has one (a learned one's current E_q[tau]) and the std of the
    training targets (regression); and q(tau), where a method learns the noise precision (``gamma_noise``)."""
    n_data: torch.Tensor
    prior_prec: torch.Tensor
    noise_prec: torch.Tensor | None = None
    y_scale: torch.Tensor | None = None
    noise_q: Node | None = None   # gamma_noise.NoiseQ (which imports this module)

    def __getitem__(self: T, index) -> T:
        """The replicas ``index`` of every tensor; an int keeps the replica axis."""
        if isinstance(index, str):
            raise TypeError(f"a {type(self).__name__} is indexed by replicas; its entries are fields: "
                            f"state.{index}, not state[{index!r}]")
        if isinstance(index, int):
            index = slice(index, index + 1)
        return self.map(lambda v: v[index])

    @property
    def n_replicas(self) -> int:
        return int(self.n_data.shape[0])


def cat(states: list[T]) -> T:
    """The states of consecutive replica chunks joined along the replica axis (the inverse of slicing them)."""
    return pytree.tree_map(lambda *vs: torch.cat(vs, 0) if torch.is_tensor(vs[0]) else vs[0], *states)


def _key(k) -> str:
    for attr in ("name", "idx", "key"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)
