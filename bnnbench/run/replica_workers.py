"""The replica axis split over worker processes: ``workers=W`` trains W contiguous chunks of a run's replicas
(splits, folds x candidates) as W batched programs at once, one per core, and joins their results along the
replica axis.

A UCI step on 20 replicas is a few hundred small operations; a second thread makes it at most ~10% faster, while
two processes of 10 replicas each take half the time (noisy K-FAC on Boston: 4.6 ms per step for 20 replicas,
2.4 ms for 10, also with two such processes side by side). Each chunk draws its own random stream, seeded from
the run's generator, so ``workers`` is part of a run's configuration: the same command gives the same numbers;
another ``workers`` gives different, equally valid ones. CPU only.

Within a run (``run_pool``: ``execute`` holds one for a run's selection and final training) the worker processes
persist from one fit to the next, so a Bayesian optimisation's rounds do not each start W fresh interpreters, import
torch and load the compiled step again (about 10 s a round for SLANG on naval); each fit still seeds its chunks afresh,
so the numbers are those of workers spawned for it.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch

from bnnbench.methods.state import State, cat
from bnnbench.run.engine import History, TrainResult
from bnnbench.run.fit import FitOptions, build_method, fit


def chunks(n: int, workers: int) -> list[range]:
    """``min(workers, n)`` contiguous ranges covering ``range(n)``, sizes differing by at most one."""
    w = max(1, min(int(workers), n))
    bounds = [round(i * n / w) for i in range(w + 1)]
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def _off_axis(state: State, n: int) -> dict[str, tuple]:
    return {k: tuple(v.shape) for k, v in state.tensors().items() if v.dim() == 0 or v.shape[0] != n}


def split_state(state: State, idx: range, n: int) -> State:
    """Replica rows ``idx`` of every tensor in ``state`` (all lie on the replica axis, length ``n``)."""
    if bad := _off_axis(state, n):
        raise ValueError(f"state entries {bad} are not on the replica axis ({n})")
    return state[idx.start:idx.stop]


def join_states(states: list[State], sizes: list[int]) -> State:
    """Inverse of ``split_state``: tensors concatenated along the replica axis."""
    for part, m in zip(states, sizes):
        if bad := _off_axis(part, m):
            raise ValueError(f"state entries {bad} are not on the replica axis ({m})")
    return cat(states)


def join_histories(histories: list[History]) -> History:
    metrics = [{k: sum((h.metrics[e][k] for h in histories), []) for k in histories[0].metrics[e]}
               for e in range(len(histories[0].epochs))]
    return History(list(histories[0].epochs), metrics)


def part_path(checkpoint: Path | None, c: int, w: int) -> Path | None:
    return None if checkpoint is None else Path(checkpoint).with_name(f"{Path(checkpoint).stem}-part{c}of{w}.pt")


_RUN_POOL: dict = {"open": False, "pool": None, "size": 0}


@contextlib.contextmanager
def run_pool():
    """Keep ``fit_in_workers``' processes for the block (one run), shut down when it ends; outside such a block
    (or nested in one) each ``fit_in_workers`` call spawns its own."""
    if _RUN_POOL["open"]:
        yield
        return
    _RUN_POOL.update(open=True, pool=None, size=0)
    try:
        yield
    finally:
        pool = _RUN_POOL["pool"]
        _RUN_POOL.update(open=False, pool=None, size=0)
        if pool is not None:
            _shut(pool)


def _shut(pool: ProcessPoolExecutor) -> None:
    """Shut ``pool`` down once its workers' chunks end. Called while the run unwinds from an interruption (Ctrl-C, or
    SIGTERM, which ``signals`` raises as a ``KeyboardInterrupt``, sent to this process alone, as a scheduler may),
    each worker is first sent SIGINT, so that its chunk unwinds now (its checkpoint keeps what it had done; a write
    under way is removed) rather than running on to the end of its round or training: many minutes, past a
    scheduler's grace period."""
    if isinstance(sys.exc_info()[1], KeyboardInterrupt):
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
    pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _pool(size: int):
    """The run's pool of ``size`` spawned processes (started at its first use, restarted where a fit needs another
    size or a worker died), or, outside ``run_pool``, a pool for this call alone."""
    if not _RUN_POOL["open"]:
        pool = _spawn(size)
        try:
            yield pool
        finally:
            _shut(pool)
        return
    pool = _RUN_POOL["pool"]
    if pool is None or _RUN_POOL["size"] != size or getattr(pool, "_broken", False):
        if pool is not None:
            _shut(pool)
        pool = _spawn(size)
        _RUN_POOL.update(pool=pool, size=size)
    yield pool


def _spawn(size: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=size, mp_context=mp.get_context("spawn"))


def fit_replicas(spec, ds, pairs, data_index, hparams, generator, opts: FitOptions, *, workers: int | None = None,
                 init_state=None) -> TrainResult:
    """``fit.fit`` of the replicas ``data_index``, in this process or, with ``workers > 1``, as that many chunks in
    worker processes (``fit_in_workers``)."""
    if workers is not None and int(workers) > 1 and len(data_index) > 1:
        return fit_in_workers(spec, ds, pairs, list(data_index), hparams, generator, opts, workers=int(workers),
                              init_state=init_state)
    return fit(spec, ds, pairs, data_index, hparams, generator, opts, init_state=init_state)


def _fit_chunk(args):
    spec, ds, pairs, data_index, hparams, seed, threads, opts, init_state = args
    from bnnbench.run.threads import apply
    apply(threads)
    torch.manual_seed(seed)  # the global generator too, as ``execute`` seeds it (q(tau)'s samples draw from it)
    res = fit(spec, ds, pairs, data_index, hparams, torch.Generator().manual_seed(seed), opts, init_state=init_state)
    res.method = None
    res.state = res.state.map(torch.Tensor.detach)  # no autograd across
    return res


def fit_in_workers(spec, ds, pairs, data_index, hparams, generator, opts: FitOptions, *, workers: int,
                   init_state=None) -> TrainResult:
    """``fit.fit`` of the replicas ``data_index`` as ``chunks`` run in ``workers`` processes (the run's, ``run_pool``,
    else spawned for this call). Chunk c is seeded with the c-th of the integers drawn from ``generator``; its
    checkpoint is ``<checkpoint>-part<c>of<W>.pt``, removed once all chunks have finished. The joined result carries
    the method (for posterior metrics)."""
    if torch.device(opts.device).type != "cpu":
        raise ValueError("workers > 1 splits the replica axis over CPU processes; on a GPU use workers=null")
    R = len(data_index)
    parts = chunks(R, workers)
    seeds = torch.randint(0, 2 ** 62, (len(parts),), generator=generator).tolist()
    threads = max(1, torch.get_num_threads() // len(parts))  # the run's count (bnnbench.run.threads) shared out
    jobs = []
    for c, idx in enumerate(parts):
        used = sorted(set(data_index[idx.start:idx.stop]))
        where = {u: i for i, u in enumerate(used)}
        chunk_opts = replace(opts, checkpoint=part_path(opts.checkpoint, c, len(parts)),
                             replica_offset=opts.replica_offset + idx.start, progress=opts.progress and c == 0,
                             announce_eta=opts.announce_eta and c == 0)
        jobs.append((spec, ds, [pairs[u] for u in used], [where[d] for d in data_index[idx.start:idx.stop]],
                     hparams[idx.start:idx.stop], seeds[c], threads, chunk_opts,
                     None if init_state is None else split_state(init_state, idx, R)))
    t0 = time.perf_counter()
    with _pool(len(parts)) as pool:
        res = list(pool.map(_fit_chunk, jobs))
    wall = time.perf_counter() - t0
    for c in range(len(parts)):
        if opts.checkpoint is not None:
            part_path(opts.checkpoint, c, len(parts)).unlink(missing_ok=True)
    sizes = [len(idx) for idx in parts]
    return TrainResult(join_states([r.state for r in res], sizes), join_histories([r.history for r in res]),
                       {k: torch.cat([r.final[k] for r in res]) for k in res[0].final},
                       wall + max(r.resumed_s for r in res), res[0].steps,
                       torch.cat([r.diverged for r in res]), build_method(spec, ds),
                       resumed_s=max(r.resumed_s for r in res))
