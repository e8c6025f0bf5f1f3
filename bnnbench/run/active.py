"""Pool-based active learning on the replica axis (PBP's protocol, Hernandez-Lobato & Adams 2015, Sec. 5.3; the noisy
natural gradient paper's Table 3, Zhang et al. 2018, Sec. 5.3 and App. C.3).

Every trial of a ``subsample`` split scheme starts from its 20 training rows, its 100 test rows and the rest of the
data as its pool. Each of ``rounds`` rounds refits the method from scratch on the current training rows (all trials as
one batched program; the paper's App. C.3), evaluates it on the test rows and, except after the last round, moves one
pool row into the training rows:

    acquire = variance:  x* = argmax_{x in pool} Var[y | x, D]   (MacKay's information gain under i.i.d. Gaussian
                                                                  noise: the largest predictive variance),
    acquire = random:    the next pool row in the trial's seeded random order (the control, Table 3's "_R").

With ``warm_start: true`` each round after the first continues from the previous round's fitted state instead (its
posterior, optimiser moments and step count; the data sizes and priors of the new training rows), for the measurement
of that reading; it is not the paper's protocol. A run's record holds each trial's test RMSE after every round and the
rows it acquired; its metrics are those of the last round's fit (trained on 20 + rounds - 1 rows).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from bnnbench.run.config import ConfigError
from bnnbench.run.engine import predictive_moments
from bnnbench.run.fit import data_dtype, replica_data
from bnnbench.run.replica_workers import fit_replicas
from bnnbench.run.splits import pool_rows

ACQUIRE = ("variance", "random")


def check(spec) -> dict:
    """The protocol's ``active_learning`` settings, checked: ``rounds`` >= 1, ``acquire`` one of :data:`ACQUIRE` and
    ``warm_start`` a bool (kept only when true, so records without it keep their entry), on a ``subsample`` split
    scheme (which defines the pools)."""
    al = dict(spec.active_learning)
    rounds, acquire = al.get("rounds"), al.get("acquire")
    if not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"protocol.active_learning.rounds must be an integer >= 1, got {rounds!r}")
    if acquire not in ACQUIRE:
        raise ConfigError(f"protocol.active_learning.acquire must be one of {', '.join(ACQUIRE)}, got {acquire!r}")
    if not spec.split_scheme or spec.split_scheme.get("kind") != "subsample":
        raise ConfigError("protocol.active_learning needs split_scheme kind subsample (it defines each trial's pool)")
    if spec.task != "regression":
        raise ConfigError("protocol.active_learning acquires by predictive variance: regression only")
    warm = al.get("warm_start", False)
    if not isinstance(warm, bool):
        raise ConfigError(f"protocol.active_learning.warm_start must be true or false, got {warm!r}")
    return {"rounds": rounds, "acquire": acquire, **({"warm_start": True} if warm else {})}


def run_rounds(spec, ds, splits, hparams, generator: torch.Generator, opts, workers=None, log=print):
    """The active-learning loop; returns the last round's ``TrainResult``, its (train, test) row pairs and the
    record's ``active_learning`` entry (per trial: ``rmse`` after each round, the ``acquired`` rows)."""
    al = check(spec)
    trials = [int(s.name.lstrip("s").split("/")[0]) for s in splits]
    train = [list(s.train) for s in splits]
    pool = [list(pool_rows(ds, spec.split_scheme, k)) for k in trials]
    rmse, acquired = [], [[] for _ in splits]
    idx = list(range(len(splits)))
    res = None
    for r in range(al["rounds"]):
        pairs = [(np.asarray(tr, dtype=np.int64), s.test) for tr, s in zip(train, splits)]
        init = res.state if res is not None and al.get("warm_start") else None
        res = fit_replicas(spec, ds, pairs, idx, hparams, generator, replace(opts, checkpoint=None),
                           workers=workers, init_state=init)
        rmse.append(res.final["rmse"].double().cpu().numpy())
        log(f"active learning round {r + 1}/{al['rounds']} ({al['acquire']}): test RMSE "
            f"{float(rmse[-1].mean()):.4f} on {len(train[0])} training rows")
        if r == al["rounds"] - 1:
            break
        if al["acquire"] == "random":
            picks = [0] * len(splits)
        else:
            data = replica_data(spec, ds, [(p[0], np.asarray(q, dtype=np.int64)) for p, q in zip(pairs, pool)], idx,
                                opts.device, data_dtype(res.method, opts.dtype))
            with torch.no_grad():
                _, var_f, noise_var = predictive_moments(res.method, res.state, data,
                                                         spec.eval_samples_final or spec.eval_samples, generator)
            var = (var_f + noise_var).masked_fill(~data.eval_mask[data.data_index], -np.inf)
            picks = var.argmax(1).tolist()
        for k, j in enumerate(picks):
            row = pool[k].pop(j)
            train[k].append(row)
            acquired[k].append(int(row))
    entry = {**al, "rmse": np.stack(rmse, 1).tolist(), "acquired": acquired}
    return res, pairs, entry
