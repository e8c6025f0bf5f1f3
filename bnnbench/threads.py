"""Torch's intra-op thread count of a run: the ``threads`` setting (``auto`` or an integer >= 1).

``auto`` is 1 for networks under ``MANY_PARAMS`` parameters (every UCI MLP: 301-1101; every logistic regression:
11-257) and the cores this process may use for larger ones (MNIST's 784-400-400-10: 478 410). Measured on this
2-core host (results/README.md, Speed):

* A UCI step is hundreds of tiny operations; a second thread adds a fork and a join to each and gains nothing
  even on idle cores (Boston's BBB, 3 epochs: 0.14-0.16 s at either count). Beside other processes every join
  waits for a descheduled thread: beside six busy processes the same run took 8.9-11.8 s at torch's default
  2 threads (64-77x) and 0.55-0.61 s at 1 (3.6-4.1x; ``bench/threads_contention.py``, 2026-11-25, quiet host
  otherwise). Logistic regression is the same (SLANG Table 1 cells, 2 epochs, at load 5: 0.1-0.7 s at 1 thread,
  3-45 s at 2).
* An MNIST step is a few large matrix products, which a second core shares: on idle cores Adam / BBB / SLANG L = 8
  steps took 10.5 / 37.7 / 180.4 ms at 1 thread and 6.4 / 24.5 / 110.4 ms at 2, 1.5-1.6x faster
  (``python bench/mnist_epoch.py --ranks 8 --steps 4 --threads 1,2``, 2026-11-25 19:18). Beside other jobs the
  second thread loses here too (same command at load 4.6: Adam 22.7 -> 276 ms, SLANG L = 8 463 -> 1395 ms), so
  on a shared host MNIST runs are better at ``threads=1`` (``experiment=slang_table3`` pins it: its records ran so).

Where the count changes numbers (an A/B of the same command at 1 and 2 threads, record metrics compared): never
on the UCI sets (BBB, SLANG, noisy K-FAC on Boston; Vadam on power; noisy Adam on protein; a BO round on kin8nm:
bitwise equal), in logistic-regression states after 2 epochs (a1a, USPS, australian) or on MNIST's first 2000
images scored on 500; in the last float32 digit of evaluations over large test sets, whose reductions
torch splits over threads (MNIST's 10 000 test images: ``loglik_joint`` 1.2e-7 apart; a1a's 30 956: ``ece``
1e-7 relative). So a count above 1 is part of the configuration hash (``results.HASH_DEFAULTS``: at 1, the count
of the records made before this setting, it is left out and those records stay valid). torch 2.13's batched LU
(``linalg.inv``, ``solve``, ``logdet``) is wrong above 1 thread for batches of matrices of ~150 rows or more
(pytorch/pytorch#142815): the full-Gaussian KL on USPS (20 x 257 x 257) fails there ("Pivots given to lu_solve
must all be greater or equal to 1"); ``auto`` keeps logistic regression at 1 thread.

A run applies its count with ``apply`` once it knows its network (after reading the data set, before any torch
work) and records it (``record.json``: ``config.threads`` and ``versions.torch_threads``). Parallelism for small
networks comes from processes: a worker of ``workers=W`` gets ``max(1, threads // W)`` threads, and each cell of
``reproduce --jobs N`` may use ``cores() // N`` cores (``share_cores``), so ``auto`` stays 1 for its small networks.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from bnnbench.config import ConfigError

MANY_PARAMS = 100_000   # between the largest configured small network (1101) and MNIST's (478 410)
_SHARE: list[int] = []  # the cores this process may use, when a parent process shares them out


def available_cores() -> int:
    """The cores the OS lets this process run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def share_cores(n: int) -> None:
    """Let this process (a worker of ``reproduce --jobs``) use ``n`` cores: ``auto`` is at most ``n``."""
    _SHARE[:] = [max(1, int(n))]


def cores() -> int:
    """The cores this process may use: its share (``share_cores``), else all available ones."""
    return _SHARE[0] if _SHARE else available_cores()


def check(setting) -> None:
    """``ConfigError`` unless ``setting`` is ``auto`` or an integer >= 1."""
    if setting == "auto" or (isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1):
        return
    raise ConfigError(f"threads must be auto or an integer >= 1, got {setting!r}")


def network_params(spec, ds) -> int:
    """Parameters of the run's network (an MLP of ``spec.model_hidden`` on data set ``ds``); a convolutional network
    counts as many (its cost is in its convolutions, not its parameters: ``auto`` gives it the cores)."""
    if getattr(spec, "conv", None):
        return MANY_PARAMS
    out_dim = int(ds.n_classes) if spec.task == "multiclass" else 1
    sizes = [int(np.prod(ds.X.shape[1:])), *spec.model_hidden, out_dim]
    return sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))


def choose(setting, n_params: int) -> int:
    """The thread count of ``setting`` for a network of ``n_params`` parameters."""
    check(setting)
    if setting != "auto":
        return int(setting)
    return cores() if n_params >= MANY_PARAMS else 1


def apply(n: int) -> None:
    """Set torch's intra-op threads (with MKL's and OpenMP's) to ``n``, and its inter-op threads where torch still
    allows it (once per process, before any inter-op work)."""
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # already set or started in this process (an earlier run of it)
        pass
