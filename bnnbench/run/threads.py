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

The load (issue 31). ``auto`` gave a convolutional network both cores beside three other jobs: 392 s where one thread
took 27 s. For a large network ``auto`` is now the cores this process may use (``usable_cores``: its affinity mask,
``os.sched_getaffinity``, capped by a cgroup CPU quota) that are not busy with other work, at least 1: with one of
two cores busy it is 1. How busy: ``busy_cores`` samples ``/proc/stat`` over the usable CPUs for ``SAMPLE_S`` while
this process sleeps, so it counts other processes only and the load of this moment. ``os.getloadavg()[0]`` (scaled
to the usable share of the machine's cores) is the fallback where ``/proc/stat`` is missing; it is not the first
choice because it trails by a minute and counts this process's own past work: in a ``reproduce`` of several cells
in one process, the previous cell's two threads would make the next one look crowded.

What that does to records and hashes. Small networks (every UCI and logistic-regression cell) are 1 thread whatever
the load: no measurement, no change, and every committed record keeps its hash (the large-network records pin
``threads=N`` on their command line). A large network's count under ``auto`` now depends on the load at its start,
and a count above 1 is hashed, since it can move the last float32 digit of a large evaluation. Hashing the count
is kept (the record says exactly how its numbers were made), and the count is made sticky instead: ``adopt_earlier``
(called by ``execute.resolve_run`` with the run directory) gives an ``auto`` run the count of the finished record
or the resume state already in its run directory, when that is all that differs. So a cell whose record exists is
skipped under any load, and a job killed by a scheduler and resubmitted to a busier or idler node resumes from its
checkpoint at the count it started with (the same numbers as an uninterrupted run), instead of starting afresh
under a new hash. Two fresh runs of the same large cell under different loads can still differ in the last digit
of a large evaluation; pin ``threads=N`` where that matters (``experiment=slang_table3`` does).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch

from bnnbench.run.config import ConfigError

MANY_PARAMS = 100_000   # between the largest configured small network (1101) and MNIST's (478 410)
_SHARE: list[int] = []  # the cores this process may use, when a parent process shares them out
SAMPLE_S = 0.25         # how long ``busy_cores`` watches the usable CPUs
BUSY_LEFT = 0.5         # a core counts as free when less than this much of it is busy with other work
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")   # cgroup v2 CPU quota ("max 100000" or "<quota> <period>")
PROC_STAT = Path("/proc/stat")


def _affinity() -> set[int] | None:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def available_cores() -> int:
    """The cores the OS lets this process run on (its affinity mask, not the machine's count)."""
    cpus = _affinity()
    return len(cpus) if cpus is not None else os.cpu_count() or 1


def _cgroup_quota() -> float | None:
    """The CPUs' worth of time a cgroup v2 quota allows this process (``None``: no quota, or none readable)."""
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        return None if quota == "max" else float(quota) / float(period)
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """The cores this process may use: its affinity mask, capped by a cgroup CPU quota (a container, a SLURM job)."""
    n, quota = available_cores(), _cgroup_quota()
    return max(1, min(n, int(quota + 0.5))) if quota else n


def _cpu_times(cpus) -> dict[int, tuple[int, int]]:
    """``{cpu: (busy, total)}`` jiffies from ``/proc/stat`` (busy: all but idle and iowait)."""
    out = {}
    for line in PROC_STAT.read_text().splitlines():
        name, *vals = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        k = int(name[3:])
        if k in cpus:
            v = [int(x) for x in vals]
            out[k] = (sum(v) - v[3] - (v[4] if len(v) > 4 else 0), sum(v))
    return out


def busy_cores(sample_s: float = SAMPLE_S) -> float:
    """How many of the usable cores other work keeps busy now: ``/proc/stat`` over ``sample_s`` seconds on the CPUs
    of this process's affinity mask while it sleeps; else ``os.getloadavg()[0]`` times the usable share of the
    machine's cores; else 0."""
    cpus = _affinity() or set(range(os.cpu_count() or 1))
    try:
        before = _cpu_times(cpus)
        time.sleep(sample_s)
        after = _cpu_times(cpus)
        deltas = [(after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in before if k in after]
        if deltas and sum(t for _, t in deltas) > 0:
            return sum(b / t for b, t in deltas if t > 0)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.getloadavg()[0] * len(cpus) / (os.cpu_count() or len(cpus))
    except (OSError, AttributeError):
        return 0.0


def free_cores() -> int:
    """The usable cores not busy with other work, at least 1 (``auto`` for a large network)."""
    return max(1, int(usable_cores() - busy_cores() + BUSY_LEFT))


def share_cores(n: int) -> None:
    """Let this process (a worker of ``reproduce --jobs``) use ``n`` cores: ``auto`` is at most ``n``."""
    _SHARE[:] = [max(1, int(n))]


def cores() -> int:
    """The cores this process may use: its share (``share_cores``), else all usable ones."""
    return _SHARE[0] if _SHARE else usable_cores()


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
    """The thread count of ``setting`` for a network of ``n_params`` parameters: ``auto`` is 1 for a small network
    and, for a large one, the cores this process may use that other work leaves free (at least 1)."""
    check(setting)
    if setting != "auto":
        return int(setting)
    if n_params < MANY_PARAMS or cores() == 1:
        return 1
    return min(cores(), free_cores())


def adopt_earlier(setting, resolved: dict, run_dir) -> dict:
    """``resolved`` (a run's resolved configuration) with the thread count of the finished record or the resume state
    already in ``run_dir`` where ``setting`` is ``auto`` and only the count tells them apart: a cell is skipped, or
    resumes from its checkpoint, whatever the load at this start (``choose``)."""
    from bnnbench.run import results
    run_dir = Path(run_dir)
    if setting != "auto" or not run_dir.is_dir():
        return resolved
    rec = results.load_record(run_dir)
    known = {results.stored_config_hash(rec)} if rec is not None and "config" in rec else set()
    names = [p.name for p in results.ResumeFiles.in_dir(run_dir)]
    if not known and not names:
        return resolved
    counts = [(rec or {}).get("config", {}).get("threads"), *range(1, max(64, os.cpu_count() or 1) + 1)]
    for n in counts:
        if isinstance(n, int) and n >= 1:
            h = results.config_hash({**resolved, "threads": n})
            if h in known or any(h in name for name in names):
                return {**resolved, "threads": n}
    return resolved


def apply(n: int) -> None:
    """Set torch's intra-op threads (with MKL's and OpenMP's) to ``n``, and its inter-op threads where torch still
    allows it (once per process, before any inter-op work)."""
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # already set or started in this process (an earlier run of it)
        pass
