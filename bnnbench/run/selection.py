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


class _FoldScores:
    """Candidates scored on K-fold CV of each split's training rows (never its test rows): every candidate x fold x
    split of a round one batched program (``fit_replicas``), scored by the mean over folds of ``hpo.metric`` (a
    diverged or non-finite fit scores ``hpo.failed_score``); ``trace`` keeps every evaluated candidate per split."""

    def __init__(self, spec: RunSpec, ds, splits, seed: int, *, device, dtype, progress, workers, compile,
                 rng: str = "torch", checkpoint_every: int = 10, checkpoint_seconds: float = 60.0):
        hpo = spec.hpo
        self.spec, self.ds, self.names = spec, ds, list(spec.space)
        K = hpo["folds"]
        self.n_folds = hpo["use_folds"] or K
        self.n_splits = len(splits)
        self.metric = hpo["metric"]
        self.failed = hpo["failed_score"]
        self.pairs = []
        for s in splits:
            for a, b in kfold_indices(len(s.train), K, hpo["cv_seed"])[:self.n_folds]:
                self.pairs.append((s.train[a], s.train[b]))
        self.gen = torch.Generator(device=device).manual_seed(seed + 1)
        self.trace = [[] for _ in splits]
        self.fit_options = dict(device=device, dtype=dtype, stop_on_divergence=False,
                                eval_samples=hpo["eval_samples"], progress=progress, compile=compile, rng=rng,
                                checkpoint_every=checkpoint_every, checkpoint_seconds=checkpoint_seconds)
        self.workers = workers

    def hparams(self, point) -> dict:
        return _hp_dict(self.names, self.spec.space, point)

    def __call__(self, cands, checkpoint: Path | None = None) -> tuple[np.ndarray, float, float]:
        """``cands[i]``: the ``[C, d]`` candidate points of split i -> (mean score ``[n_splits, C]``, seconds, the
        part of them spent before the checkpoint it resumed from). With ``checkpoint``, the round's training saves
        itself there every ``checkpoint_every`` epochs (at least ``checkpoint_seconds`` apart) and resumes from it
        (``engine.train``).
        """
        C, n_s, n_f = len(cands[0]), self.n_splits, self.n_folds
        data_index, hps = [], []
        for i in range(n_s):
            for f in range(n_f):
                for c in range(C):
                    data_index.append(i * n_f + f)
                    hps.append({**self.spec.fixed, **self.hparams(cands[i][c])})
        opts = FitOptions(desc=f"hpo {C} cand", checkpoint=checkpoint, **self.fit_options)
        res = fit_replicas(self.spec, self.ds, self.pairs, data_index, hps, self.gen, opts, workers=self.workers)
        score = res.final[self.metric].reshape(n_s, n_f, C)
        score = torch.where(torch.isfinite(score), score, torch.full_like(score, self.failed))
        score = torch.where(res.diverged.cpu().reshape(n_s, n_f, C), torch.full_like(score, self.failed), score)
        return score.mean(1).numpy(), res.wall_time_s, res.resumed_s

    def record(self, cands, mean) -> None:
        for i in range(self.n_splits):
            for c in range(len(cands[i])):
                self.trace[i].append({**self.hparams(cands[i][c]), "score": float(mean[i, c])})


def select_hparams(spec: RunSpec, ds, splits, seed: int, *, device, dtype, progress=False, log=None,
                   resume: Path | None = None, workers: int | None = None, compile: bool = False,
                   rng: str = "torch", checkpoint_every: int = 10, checkpoint_seconds: float = 60.0):
    """Per-split hyper-parameters chosen on K-fold CV of the training rows (never the test rows).

    Returns ``(hparams per split, trace, replayed_s)``; the trace lists every evaluated candidate and its score.
    With ``resume`` (a file path), every finished round (Bayesian optimisation's, or the grid's one) is saved there,
    and a restarted selection replays the saved rounds (same proposals, same scores, same generator state)
    instead of training them again, and resumes a round interrupted part-way from its last checkpoint
    (``round_checkpoint``); ``replayed_s`` is the search's time spent in earlier processes: the replayed rounds'
    when they ran, and a resumed round's training before its checkpoint. ``compile``: the
    rounds' steps through ``torch.compile`` (``FitOptions.compile``); ``rng``: their draws' generator
    (``FitOptions.rng``).
    """
    log = log or _log
    kind = spec.hpo["kind"]
    if kind == "fixed" or not spec.space:
        return [dict(spec.fixed) for _ in splits], [], 0.0
    scores = _FoldScores(spec, ds, splits, seed, device=device, dtype=dtype, progress=progress, workers=workers,
                         compile=compile, rng=rng, checkpoint_every=checkpoint_every,
                         checkpoint_seconds=checkpoint_seconds)
    if kind == "grid":
        return _grid_search(spec, scores, resume, log)
    if kind != "bo":
        raise ConfigError(f"unknown hpo.kind {kind!r}; valid: fixed, grid, bo")
    return _bayes_opt(spec, scores, seed, resume, log)


def round_checkpoint(resume: Path | None, k: int) -> Path | None:
    """Where the training of search round ``k`` checkpoints (``.hpo-<hash>-round<k>.pt`` beside ``resume``): a round
    interrupted part-way resumes from its last saved epoch. One file per round, so a later round never starts from an
    earlier round's state; ``results.ResumeFiles`` removes them with the run's other resume files."""
    return None if resume is None else Path(resume).with_name(f"{Path(resume).stem}-round{k}.pt")


def _scored_round(scores: _FoldScores, cands, rounds: list, k: int, resume: Path | None):
    """Round ``k``'s mean scores, the seconds it took in this process and those it took in earlier ones: replayed
    from ``rounds`` (finished before an interruption: 0 s now, its recorded seconds before), or trained (resuming
    from its round checkpoint: the training before it counted third) and appended to ``rounds``, saved to
    ``resume``."""
    if k < len(rounds):
        if not all(np.allclose(a, b) for a, b in zip(cands, rounds[k]["cands"])):
            raise ConfigError(f"{resume} does not belong to this configuration; delete it to start afresh")
        scores.gen.set_state(rounds[k]["generator"])
        return rounds[k]["mean"], 0.0, rounds[k].get("wall", 0.0)
    mean, wall, earlier = scores(cands, checkpoint=round_checkpoint(resume, k))
    rounds.append({"cands": cands, "mean": mean, "generator": scores.gen.get_state(), "wall": wall})
    if resume is not None:
        results.save_checkpoint(resume, rounds)
    return mean, wall - earlier, earlier


def _grid_search(spec: RunSpec, scores: _FoldScores, resume: Path | None, log):
    """Every point of the grid (``hpo.grid_points`` per log-range axis, or the axis' values) for every split, as one
    round: saved to ``resume`` when it finishes and checkpointed while it trains, like a round of ``_bayes_opt``."""
    names, n_s = scores.names, scores.n_splits
    axes = [np.linspace(*spec.space[n]["log_range"], spec.hpo["grid_points"])
            if "log_range" in spec.space[n] else spec.space[n]["values"] for n in names]
    grid = grid_points(axes)
    rounds = torch.load(resume, weights_only=False) if resume is not None and Path(resume).exists() else []
    mean, wall, replayed_s = _scored_round(scores, [grid] * n_s, rounds, 0, resume)
    scores.record([grid] * n_s, mean)
    log(f"grid search: {len(grid)} candidates x {scores.n_folds} folds x {n_s} splits in "
        f"{wall if wall else replayed_s:.1f}s{', replayed' if not wall else ''}")
    best = mean.argmax(1)
    return ([scores.hparams(grid[best[i]]) | _keep_fixed(spec, names) for i in range(n_s)], scores.trace, replayed_s)


def _bayes_opt(spec: RunSpec, scores: _FoldScores, seed: int, resume: Path | None, log):
    """GP Bayesian optimisation per split (``GPBayesOpt``): ``hpo.n_random`` random points, then ``hpo.n_iter``
    proposals ``hpo.batch`` at a time, each round saved to ``resume`` and replayed from it after an interruption."""
    hpo, names, n_s = spec.hpo, scores.names, scores.n_splits
    if any("log_range" not in spec.space[n] for n in names):
        raise ConfigError("hpo=bo needs a log_range for every searched hyper-parameter")
    bounds = np.array([spec.space[n]["log_range"] for n in names])
    ls = hpo["length_scales"] or [1.0] * len(names)
    opts = [GPBayesOpt(bounds, ls, n_random=hpo["n_random"], alpha=hpo["alpha"],
                       seed=seed * 1000 + i, fit_length_scales=hpo["fit_length_scales"],
                       gp_restarts=hpo["gp_restarts"],
                       n_candidates=hpo["acq_candidates"],
                       n_polish=hpo["acq_polish"]) for i in range(n_s)]
    total = hpo["n_random"] + hpo["n_iter"]
    q = hpo["batch"]
    rounds = torch.load(resume, weights_only=False) if resume is not None and Path(resume).exists() else []
    done, k, replayed_s = 0, 0, 0.0
    while done < total:
        n = min(q if done >= int(hpo["n_random"]) else int(hpo["n_random"]) - done, total - done)
        cands = [o.ask(n) for o in opts]
        mean, wall, replayed = _scored_round(scores, cands, rounds, k, resume)
        replayed_s += replayed
        scores.record(cands, mean)
        for i, o in enumerate(opts):
            o.tell(cands[i], mean[i])
        done += n
        k += 1
        log(f"BO round: {done}/{total} evaluations per split ({n} candidates x {scores.n_folds} folds x {n_s} splits, "
            f"{wall:.1f}s{', replayed' if wall == 0.0 else ''}); "
            f"best mean score {np.mean([o.best[1] for o in opts]):.3f}")
    return [scores.hparams(o.best[0]) | _keep_fixed(spec, names) for o in opts], scores.trace, replayed_s


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
