"""The sum of the per-example gradients' outer products of an MLP times a few vectors, ``c2 G G^T Y``, fused, for many
replicas at once on the CPU (``outer_times.c``).

G ``[R, P, n]`` holds the gradients of n = S M (sample, example) pairs, given by each layer's inputs and its
back-propagated gradients (``per_example``: example i's gradient of a layer ``[W; b]`` is ``[a_i; 1] g_i^T``);
``per_example.gradient_t_times`` followed by ``gradient_times`` computes the same product by torch's batched GEMMs.
SLANG's randomised eigensolvers (Mishkin et al., 2018; ``eig: nystrom`` and ``randomized``) apply
``(1 - beta) U U^T + beta G_hat`` five times a step to k = L + 2 vectors: at a Bayesian-optimisation round's 100
replicas x 200 pairs x 50 units those GEMMs pass ``[100, 51, 200]`` products through memory ten times a step, two
thirds of the step on naval (``torch.profiler``; results/README.md, Speed). The kernel takes one replica at a time, in
a buffer that stays in the cache, and forms the shared first layer's products once per example rather than once per
sample; ``pack`` transposes the inputs and gradients for it once a step. ``nystrom_range`` runs the Nystrom
eigensolver's whole subspace iteration (its five products and four orthonormalisations) one replica at a time, the
replica's packed operands staying in the core's cache throughout, where ``pack`` and ``times`` stream every replica's
through memory for each product (SLANG's compiled step on naval 1.3x, results/README.md, Speed). All three are operators
with shape rules (``bnnbench::outer_pack``, ``bnnbench::outer_times``, ``bnnbench::outer_nystrom``), so a compiled
step's graph holds them; the eager step, and so every record, keeps torch's products. Built at first use
(``c_kernels``); where it cannot be, one warning, and the compiled step keeps torch's products.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bnnbench.core.linalg import c_kernels

SOURCE = Path(__file__).with_name("outer_times.c")


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The built kernel (``c_kernels.build``), or None (with a warning) where no C compiler builds it."""
    p, n = ctypes.c_void_p, ctypes.c_long
    return c_kernels.build(SOURCE, "per-example outer-product", {
        "outer_pack_size": ([n, n, p, p, p, n], n),
        "outer_pack": ([p, p, p, p, p, p, p, n, n, n, n, p], None),
        "outer_times_work": ([n, n, p, n, n], n),
        "outer_times": ([p, p, p, p, n, p, p, p, n, n, n, n, p], None),
        "outer_nystrom_work": ([n, n, p, p, p, n, n, n], n),
        "outer_nystrom": ([p, p, p, p, p, p, p, n, n, n, n, p, n, p, p, p, n, n, p, p, p, p], None)},
        instead="torch's products")


def available() -> bool:
    """Whether the kernel is built (building it if need be)."""
    return _library() is not None


def applies(acts, gs) -> bool:
    """Whether the kernel computes the products for the layers' inputs and gradients (``layout``): float32 CPU tensors
    (a caller checks ``available`` once, outside a compiled step)."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (*acts, *gs))


def _longs(values) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.long)


def _padded(m: int) -> int:
    return -(-m // 16) * 16


def layout(acts, gs) -> tuple[list[int], int, int]:
    """``(layers, S, M)`` of the layers' inputs ``acts[l] [R, S, M, d_in]`` (``[R, 1, M, d_in]``, or stride 0 along S,
    where the S samples share them) and back-propagated gradients ``gs[l] [R, S, M, d_out]`` (``forward_cache``,
    ``backprop``): per layer ``j = d_in + 1, o = d_out, shared`` one after another, the samples S, the examples M."""
    R, S, M, _ = gs[0].shape
    if any(g.shape[:3] != (R, S, M) for g in gs) or any(a.shape[0] != R or a.shape[2] != M or a.shape[1] not in (1, S)
                                                         for a in acts):
        raise ValueError(f"outer_times: inputs {[list(a.shape) for a in acts]} and gradients "
                         f"{[list(g.shape) for g in gs]} are not one set of replicas x samples x examples")
    layers = []
    for a, g in zip(acts, gs):
        layers += [a.shape[3] + 1, g.shape[3], int(S > 1 and (a.shape[1] == 1 or a.stride(1) == 0))]
    return layers, S, M


def _split(layers: list[int]):
    j, o, shared = (_longs(layers[i::3]) for i in range(3))
    return j, o, shared, len(layers) // 3


def pack(acts, gs) -> tuple[torch.Tensor, list[int], int, int]:
    """``(packed, layers, S, M)``: the inputs and gradients (``layout``) transposed once for ``times``."""
    layers, S, M = layout(acts, gs)
    return _pack(list(acts), list(gs), layers, S, M), layers, S, M


def _pack_width(layers: list[int], S: int, M: int) -> int:
    Mp = _padded(M)
    return sum(j * (Mp if sh else S * Mp) + o * S * Mp for j, o, sh in zip(layers[0::3], layers[1::3], layers[2::3]))


def _operands(acts, gs) -> tuple[torch.Tensor, ...]:
    """The layers' inputs' and gradients' addresses and strides as the C functions take them (``a, astr, g, gstr``);
    the caller keeps them alive over the call."""
    return (_longs(a.data_ptr() for a in acts), _longs(s for a in acts for s in a.stride()),
            _longs(g.data_ptr() for g in gs), _longs(s for g in gs for s in g.stride()))


@torch.library.custom_op("bnnbench::outer_pack", mutates_args=(), device_types="cpu")
def _pack(acts: list[torch.Tensor], gs: list[torch.Tensor], layers: list[int], S: int, M: int) -> torch.Tensor:
    """``[R, W]``: per replica and layer, the inputs with a 1 appended ``[j, Ml]`` and the gradients ``[o, S Mp]``,
    examples innermost, each sample's M padded with zeros to Mp, a whole number of vectors (``outer_times.c``); read
    through their strides, copying nothing else."""
    lib = _library()
    j, o, shared, L = _split(layers)
    R = gs[0].shape[0]
    packed = torch.empty(R, _pack_width(layers, S, M), dtype=torch.float32)
    assert packed.data_ptr() % 64 == 0   # the kernel loads whole aligned vectors of 16 floats
    operands = _operands(acts, gs)
    lib.outer_pack(*(t.data_ptr() for t in operands), j.data_ptr(), o.data_ptr(), shared.data_ptr(), L, R, S, M,
                   packed.data_ptr())
    return packed


@_pack.register_fake
def _(acts, gs, layers, S, M):
    return gs[0].new_empty(gs[0].shape[0], _pack_width(layers, S, M))


@torch.library.custom_op("bnnbench::outer_times", mutates_args=(), device_types="cpu")
def times(packed: torch.Tensor, layers: list[int], S: int, M: int, Y: torch.Tensor, c2: torch.Tensor) -> torch.Tensor:
    """``c2 G G^T Y [R, P, k]`` for ``Y [R, P, k]`` and ``c2 [R]``, G given by ``pack``'s ``packed, layers, S, M``,
    each layer's block of P laid out ``[j, o]`` after the previous layer's (``MLP.slices``)."""
    lib = _library()
    if packed.data_ptr() % 64 or not packed.is_contiguous():   # the kernel's aligned vector loads
        packed = torch.empty(packed.shape, dtype=packed.dtype).copy_(packed)
    Y, c2 = Y.contiguous(), c2.contiguous()
    R, P, k = Y.shape
    j, o, shared, L = _split(layers)
    if int((j * o).sum()) != P:
        raise ValueError(f"outer_times: layers {list(zip(j.tolist(), o.tolist()))} do not tile Y {list(Y.shape)}")
    work = torch.empty(lib.outer_times_work(S, M, o.data_ptr(), L, k), dtype=torch.float32)
    out = torch.empty(R, P, k, dtype=torch.float32)
    lib.outer_times(packed.data_ptr(), j.data_ptr(), o.data_ptr(), shared.data_ptr(), L, Y.data_ptr(),
                    c2.data_ptr(), out.data_ptr(), R, S, M, k, work.data_ptr())
    return out


@times.register_fake
def _(packed, layers, S, M, Y, c2):
    return Y.new_empty(Y.shape)


def nystrom_range(acts, gs, U: torch.Tensor, a2: torch.Tensor, c2: torch.Tensor, probes: torch.Tensor,
                  n_iter: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``low_rank.nystrom_range`` of ``A = a2 U U^T + c2 G G^T`` (``U [R, P, L]``, ``a2, c2 [R]``, G given by the
    layers' inputs and gradients as for ``pack``) from ``probes [R, P, k]``: ``(Q, E, nu [R, 1, 1])``. One replica at a
    time, its inputs and gradients packed into a buffer that stays in the core's cache for all ``n_iter + 1``
    products (``times`` streams every replica's from memory for each), the orthonormal factors by Householder
    reflections as LAPACK's (the same column signs as ``torch.linalg.qr``), in float64."""
    layers, S, M = layout(acts, gs)
    Q, E, nu = _nystrom(list(acts), list(gs), layers, S, M, U, a2, c2, probes, n_iter)
    return Q, E, nu[:, None, None]


@torch.library.custom_op("bnnbench::outer_nystrom", mutates_args=(), device_types="cpu")
def _nystrom(acts: list[torch.Tensor], gs: list[torch.Tensor], layers: list[int], S: int, M: int, U: torch.Tensor,
             a2: torch.Tensor, c2: torch.Tensor, probes: torch.Tensor, n_iter: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lib = _library()
    j, o, shared, L = _split(layers)
    U, a2, c2, probes = U.contiguous(), a2.contiguous(), c2.contiguous(), probes.contiguous()
    R, P, k = probes.shape
    if int((j * o).sum()) != P or U.shape[:2] != (R, P):
        raise ValueError(f"outer_times: layers {list(zip(j.tolist(), o.tolist()))} do not tile probes "
                         f"{list(probes.shape)} and U {list(U.shape)}")
    operands = _operands(acts, gs)
    work = torch.empty(lib.outer_nystrom_work(S, M, j.data_ptr(), o.data_ptr(), shared.data_ptr(), L, k, U.shape[-1]),
                       dtype=torch.float32)
    Q, E, nu = probes.new_empty(R, P, k), probes.new_empty(R, P, k), probes.new_empty(R)
    lib.outer_nystrom(*(t.data_ptr() for t in operands), j.data_ptr(), o.data_ptr(), shared.data_ptr(), L, R, S, M,
                      U.data_ptr(), U.shape[-1], a2.data_ptr(), c2.data_ptr(), probes.data_ptr(), k, n_iter,
                      Q.data_ptr(), E.data_ptr(), nu.data_ptr(), work.data_ptr())
    return Q, E, nu


@_nystrom.register_fake
def _(acts, gs, layers, S, M, U, a2, c2, probes, n_iter):
    return probes.new_empty(probes.shape), probes.new_empty(probes.shape), probes.new_empty(probes.shape[0])
