"""The replica axis split over worker processes: ``workers=W`` trains W contiguous chunks of a run's replicas
(splits, folds x candidates) as W batched programs at once, one per core, and joins their results along the
replica axis.

A UCI step on 20 replicas is a few hundred small operations; a second thread makes it at most ~10% faster, while
two processes of 10 replicas each take half the time (noisy K-FAC on Boston: 4.6 ms per step for 20 replicas,
2.4 ms for 10, also with two such processes side by side). Each chunk draws its own random stream, seeded from
the run's generator, so ``workers`` is part of a run's configuration: the same command gives the same numbers;
another ``workers`` gives different, equally valid ones. CPU only.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from bnnbench.engine import History, TrainResult


def chunks(n: int, workers: int) -> list[range]:
    """``min(workers, n)`` contiguous ranges covering ``range(n)``, sizes differing by at most one."""
    w = max(1, min(int(workers), n))
    bounds = [round(i * n / w) for i in range(w + 1)]
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def split_state(state: dict, idx: range, n: int) -> dict:
    """Replica rows ``idx`` of every tensor in ``state`` (all lie on the replica axis, length ``n``)."""
    out = {}
    for k, v in state.items():
        if torch.is_tensor(v):
            if v.dim() == 0 or v.shape[0] != n:
                raise ValueError(f"state entry {k!r} of shape {tuple(v.shape)} is not on the replica axis ({n})")
            v = v[idx.start:idx.stop]
        out[k] = v
    return out


def join_states(states: list[dict], sizes: list[int]) -> dict:
    """Inverse of ``split_state``: tensors concatenated along the replica axis, other entries from the first."""
    out = {}
    for k, v in states[0].items():
        if torch.is_tensor(v):
            parts = [s[k] for s in states]
            if any(p.dim() == 0 or p.shape[0] != m for p, m in zip(parts, sizes)):
                raise ValueError(f"state entry {k!r} is not on the replica axis")
            v = torch.cat(parts, 0)
        out[k] = v
    return out


def join_histories(histories: list[History]) -> History:
    metrics = [{k: sum((h.metrics[e][k] for h in histories), []) for k in histories[0].metrics[e]}
               for e in range(len(histories[0].epochs))]
    return History(list(histories[0].epochs), metrics)


def part_path(checkpoint: Path | None, c: int, w: int) -> Path | None:
    return None if checkpoint is None else Path(checkpoint).with_name(f"{Path(checkpoint).stem}-part{c}of{w}.pt")


def _fit_chunk(args):
    spec, ds, pairs, data_index, hparams, seed, threads, kw = args
    from bnnbench.threads import apply
    apply(threads)
    torch.manual_seed(seed)  # the global generator too, as ``run.execute`` seeds it (q(tau)'s samples draw from it)
    from bnnbench.run import fit
    res = fit(spec, ds, pairs, data_index, hparams, torch.Generator().manual_seed(seed), **kw)
    res.method = None
    res.state = {k: v.detach() if torch.is_tensor(v) else v for k, v in res.state.items()}  # no autograd across
    return res


def fit_in_workers(spec, ds, pairs, data_index, hparams, generator, *, workers: int, method, **kw) -> TrainResult:
    """``run.fit`` of the replicas ``data_index`` as ``chunks`` run in ``workers`` spawned processes. Chunk c is seeded
    with the c-th of the integers drawn from ``generator``; its checkpoint is ``<checkpoint>-part<c>of<W>.pt``, removed
    once all chunks have finished. The joined result carries ``method`` (built by the caller) for posterior metrics."""
    if kw.get("device") is not None and torch.device(kw["device"]).type != "cpu":
        raise ValueError("workers > 1 splits the replica axis over CPU processes; on a GPU use workers=null")
    R = len(data_index)
    parts = chunks(R, workers)
    seeds = torch.randint(0, 2 ** 62, (len(parts),), generator=generator).tolist()
    threads = max(1, torch.get_num_threads() // len(parts))  # the run's count (bnnbench.threads) shared out
    init_state, checkpoint = kw.pop("init_state", None), kw.pop("checkpoint", None)
    offset = kw.pop("replica_offset", 0)
    jobs = []
    for c, idx in enumerate(parts):
        used = sorted(set(data_index[idx.start:idx.stop]))
        where = {u: i for i, u in enumerate(used)}
        jobs.append((spec, ds, [pairs[u] for u in used], [where[d] for d in data_index[idx.start:idx.stop]],
                     hparams[idx.start:idx.stop], seeds[c], threads,
                     {**kw, "init_state": None if init_state is None else split_state(init_state, idx, R),
                      "checkpoint": part_path(checkpoint, c, len(parts)), "replica_offset": offset + idx.start,
                      "progress": kw.get("progress", False) and c == 0}))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=len(parts), mp_context=mp.get_context("spawn")) as pool:
        res = list(pool.map(_fit_chunk, jobs))
    wall = time.perf_counter() - t0
    for c in range(len(parts)):
        if checkpoint is not None:
            part_path(checkpoint, c, len(parts)).unlink(missing_ok=True)
    sizes = [len(idx) for idx in parts]
    return TrainResult(join_states([r.state for r in res], sizes), join_histories([r.history for r in res]),
                       {k: torch.cat([r.final[k] for r in res]) for k in res[0].final},
                       wall + max(r.resumed_s for r in res), res[0].steps,
                       torch.cat([r.diverged for r in res]), method, resumed_s=max(r.resumed_s for r in res))
