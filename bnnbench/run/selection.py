"""Hyper-parameters per split, chosen without the test rows: fixed, a grid, or Bayesian optimisation on K-fold
cross-validation inside each training split (every candidate x fold x split trained as one batched program per
round), or read from another run's record."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from bnnbench.run import results
from bnnbench.run.config import ConfigError
from bnnbench.run.fit import FitOptions
from bnnbench.run.hpo import GPBayesOpt, grid_points, kfold_indices
from bnnbench.run.protocol import RunSpec
from bnnbench.run.replica_workers import fit_replicas


def _log(msg: str) -> None:
    print(msg, flush=True)


def _hp_dict(names, spaces, x) -> dict:
    return {n: (math.exp(v) if "log_range" in spaces[n] else float(v)) for n, v in zip(names, x)}


def select_hparams(spec: RunSpec, ds, splits, seed: int, *, device, dtype, progress=False, log=None,
                   resume: Path | None = None, workers: int | None = None, compile: bool = False):
    """Per-split hyper-parameters chosen on K-fold CV of the training rows (never the test rows).

    Returns ``(hparams per split, trace, replayed_s)``; the trace lists every evaluated candidate and its score.
    With ``resume`` (a file path), every finished Bayesian-optimisation round is saved there, and a
    restarted selection replays the saved rounds (same proposals, same scores, same generator state)
    instead of training them again; ``replayed_s`` is the time those rounds took when they ran. ``compile``: the
    rounds' steps through ``torch.compile`` (``FitOptions.compile``).
    """
    log = log or _log
    hpo = spec.hpo
    names = list(spec.space)
    if hpo["kind"] == "fixed" or not names:
        return [dict(spec.fixed) for _ in splits], [], 0.0
    K = int(hpo.get("folds", 5))
    use = int(hpo.get("use_folds") or K)
    metric = hpo.get("metric", "loglik_joint")
    failed = float(hpo.get("failed_score", -5.0))
    pairs = []
    for s in splits:
        for a, b in kfold_indices(len(s.train), K, int(hpo.get("cv_seed", 123)))[:use]:
            pairs.append((s.train[a], s.train[b]))
    n_s, n_f = len(splits), use
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    trace = [[] for _ in splits]

    def evaluate(cands):  # cands[i] : [C, d] candidate points of split i; returns (mean score [n_s, C], s)
        C = len(cands[0])
        data_index, hps = [], []
        for i in range(n_s):
            for f in range(n_f):
                for c in range(C):
                    data_index.append(i * n_f + f)
                    hps.append({**spec.fixed, **_hp_dict(names, spec.space, cands[i][c])})
        opts = FitOptions(device=device, dtype=dtype, stop_on_divergence=False, eval_samples=hpo.get("eval_samples"),
                          progress=progress, desc=f"hpo {C} cand", compile=compile)
        res = fit_replicas(spec, ds, pairs, data_index, hps, gen, opts, workers=workers)
        score = res.final[metric].reshape(n_s, n_f, C)
        score = torch.where(torch.isfinite(score), score, torch.full_like(score, failed))
        score = torch.where(res.diverged.cpu().reshape(n_s, n_f, C), torch.full_like(score, failed), score)
        return score.mean(1).numpy(), res.wall_time_s

    def record(cands, mean):
        for i in range(n_s):
            for c in range(len(cands[i])):
                trace[i].append({**_hp_dict(names, spec.space, cands[i][c]), "score": float(mean[i, c])})

    if hpo["kind"] == "grid":
        axes = [np.linspace(*spec.space[n]["log_range"], int(hpo.get("grid_points", 5)))
                if "log_range" in spec.space[n] else spec.space[n]["values"] for n in names]
        grid = grid_points(axes)
        mean, wall = evaluate([grid] * n_s)
        record([grid] * n_s, mean)
        log(f"grid search: {len(grid)} candidates x {n_f} folds x {n_s} splits in {wall:.1f}s")
        best = mean.argmax(1)
        return [_hp_dict(names, spec.space, grid[best[i]]) | _keep_fixed(spec, names) for i in range(n_s)], trace, 0.0

    if hpo["kind"] != "bo":
        raise ConfigError(f"unknown hpo.kind {hpo['kind']!r}; valid: fixed, grid, bo")
    if any("log_range" not in spec.space[n] for n in names):
        raise ConfigError("hpo=bo needs a log_range for every searched hyper-parameter")
    bounds = np.array([spec.space[n]["log_range"] for n in names])
    ls = hpo.get("length_scales") or [1.0] * len(names)
    opts = [GPBayesOpt(bounds, ls, n_random=int(hpo["n_random"]), alpha=float(hpo.get("alpha", 1e-2)),
                       seed=seed * 1000 + i, fit_length_scales=bool(hpo.get("fit_length_scales", True)),
                       gp_restarts=int(hpo.get("gp_restarts", 25)),
                       n_candidates=int(hpo.get("acq_candidates") or 10000),
                       n_polish=int(hpo.get("acq_polish") or 5)) for i in range(n_s)]
    total = int(hpo["n_random"]) + int(hpo["n_iter"])
    q = int(hpo.get("batch", 1))
    rounds = torch.load(resume, weights_only=False) if resume is not None and Path(resume).exists() else []
    done, k, replayed_s = 0, 0, 0.0
    while done < total:
        n = min(q if done >= int(hpo["n_random"]) else int(hpo["n_random"]) - done, total - done)
        cands = [o.ask(n) for o in opts]
        if k < len(rounds):  # replay a round finished before an interruption
            if not all(np.allclose(a, b) for a, b in zip(cands, rounds[k]["cands"])):
                raise ConfigError(f"{resume} does not belong to this configuration; delete it to start afresh")
            mean, wall = rounds[k]["mean"], 0.0
            replayed_s += rounds[k].get("wall", 0.0)
            gen.set_state(rounds[k]["generator"])
        else:
            mean, wall = evaluate(cands)
            rounds.append({"cands": cands, "mean": mean, "generator": gen.get_state(), "wall": wall})
            if resume is not None:
                results.save_checkpoint(resume, rounds)
        record(cands, mean)
        for i, o in enumerate(opts):
            o.tell(cands[i], mean[i])
        done += n
        k += 1
        log(f"BO round: {done}/{total} evaluations per split ({n} candidates x {n_f} folds x {n_s} splits, "
            f"{wall:.1f}s{', replayed' if wall == 0.0 else ''}); "
            f"best mean score {np.mean([o.best[1] for o in opts]):.3f}")
    return [_hp_dict(names, spec.space, o.best[0]) | _keep_fixed(spec, names) for o in opts], trace, replayed_s


def _keep_fixed(spec, names):
    return {k: v for k, v in spec.fixed.items() if k not in names}


def recorded_hparams(spec: RunSpec, splits) -> list[dict]:
    """Per-split hyper-parameters read from another run's record (``hpo=recorded``, ``hpo.record=<run dir>``)."""
    path = Path(spec.hpo["record"])
    rec = results.load_record(path if path.is_dir() else path.parent)
    if rec is None:
        raise ConfigError(f"hpo=recorded: no record.json at {path}")
    by_split = {h["split"]: {k: v for k, v in h.items() if k != "split"} for h in rec["hparams"]}
    missing = [s.name for s in splits if s.name not in by_split]
    if missing:
        raise ConfigError(f"hpo=recorded: {path} has no hyper-parameters for split(s) {missing}")
    return [by_split[s.name] for s in splits]
