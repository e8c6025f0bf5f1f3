"""One run: a method on a data set under a protocol, all splits at once.

1. resolve the protocol (``bnnbench.protocol``) and load the data set (fetched on first use);
2. choose hyper-parameters per split without the test rows (``hpo``: fixed, grid or Bayesian
   optimisation on K-fold cross-validation inside each training split, all candidates x folds x
   splits trained as one batched program per round);
3. train the final model on every training split as one batched program and evaluate on the test rows;
4. write ``record.json`` (or ``failed.json`` with the reason when training diverges).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from bnnbench.data import Split, load_dataset
from bnnbench.engine import DivergenceError, ReplicaData, save_checkpoint, train
from bnnbench.hpo import GPBayesOpt, grid_points, kfold_indices
from bnnbench.methods import Problem, method_class
from bnnbench.methods.base import hyper_state
from bnnbench.metrics import STDERR_CONVENTION, summarise
from bnnbench.models import MLP
from bnnbench.protocol import ConfigError, RunSpec, resolve
from bnnbench import logreg, results, threads
from bnnbench.exact_vi import NotConvergedError


def _log(msg: str) -> None:
    print(msg, flush=True)


def random_splits(ds, n_splits: int, test_fraction: float, seed: int) -> list:
    """Seeded random train/test splits (the noisy-NG paper's own 90/10 scheme): split k permutes the
    rows with ``numpy.random.default_rng(seed + k)`` and holds out the first ``round(test_fraction N)``."""
    N = len(ds.y)
    n_test = int(round(test_fraction * N))
    out = []
    for k in range(n_splits):
        perm = np.random.default_rng(seed + k).permutation(N)
        out.append(Split(name=f"r{k}", train=np.sort(perm[n_test:]), test=np.sort(perm[:n_test])))
    return out


def select_splits(ds, which, scheme: dict | None = None) -> list:
    """The protocol's splits: ``all`` of the data set's (or of the protocol's random ``scheme``), the
    first ``which`` ones, or those named; a name may also be an extra split of the data set
    (MNIST's ``validation``: the first 50k training images against the last 10k)."""
    splits = list(ds.splits)
    if scheme and scheme.get("kind") == "random":
        n = int(scheme.get("n_splits_by_dataset", {}).get(ds.name.split("/")[-1], scheme.get("n_splits", 20)))
        splits = random_splits(ds, n, float(scheme.get("test_fraction", 0.1)), int(scheme.get("seed", 0)))
    if which in (None, "all"):
        return splits
    if isinstance(which, int):
        return splits[:which]
    names = [str(w) for w in which]
    by_name = {**{v.name: v for v in ds.meta.values() if isinstance(v, Split)}, **{s.name: s for s in splits}}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ConfigError(f"unknown split(s) {missing} of {ds.name}; valid: {list(by_name)}")
    return [by_name[n] for n in names]


def with_restarts(splits: list, restarts: int | None) -> list:
    """Each split ``restarts`` times, named ``<split>/<k>`` (random restarts on the same data)."""
    if not restarts:
        return splits
    return [Split(name=f"{s.name}/{k}", train=s.train, test=s.test) for s in splits for k in range(restarts)]


def validate(cfg: DictConfig) -> None:
    """Fail at start, with the valid values, on settings that cannot work."""
    def need(ok, msg):
        if not ok:
            raise ConfigError(msg)
    need(isinstance(cfg.seed, int) and cfg.seed >= 0, f"seed must be a non-negative integer, got {cfg.seed!r}")
    need(cfg.get("dtype", "float32") in ("float32", "float64"), f"dtype must be float32 or float64, got {cfg.dtype!r}")
    need(str(cfg.get("device", "cpu")).split(":")[0] in ("cpu", "cuda"), f"device must be cpu or cuda[:N], got {cfg.device!r}")
    w = cfg.get("workers")
    need(w is None or (isinstance(w, int) and w >= 1), f"workers must be null or an integer >= 1, got {w!r}")
    need(w in (None, 1) or str(cfg.get("device", "cpu")) == "cpu",
         "workers > 1 splits the replicas over CPU processes; with device=cuda use workers=null")
    m = cfg.method
    for k in ("lr", "eps", "length_scale", "init_prec", "init_std"):
        if m.get(k) is not None:
            need(isinstance(m[k], (int, float)) and m[k] > 0, f"method.{k} must be a positive number, got {m[k]!r}")
    if m.get("train_samples") is not None:
        need(isinstance(m.train_samples, int) and m.train_samples >= 1,
             f"method.train_samples must be an integer >= 1, got {m.train_samples!r}")
    if m.get("betas") is not None:
        need(len(m.betas) == 2 and all(0 <= b < 1 for b in m.betas), f"method.betas must be two numbers in [0, 1), got {list(m.betas)}")
    need(cfg.hpo.kind in ("fixed", "grid", "bo", "recorded"), f"hpo.kind must be fixed, grid, bo or recorded, got {cfg.hpo.kind!r}")
    threads.check(cfg.get("threads", "auto"))


def device_of(cfg) -> torch.device:
    dev = torch.device(cfg.get("device", "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda was asked for but torch.cuda.is_available() is False")
    return dev


def make_problem(spec: RunSpec, model: MLP, data: ReplicaData, hparams: list[dict]) -> Problem:
    """Per-replica hyper-parameters -> the ``Problem`` a method sees (training units)."""
    dev, dt = data.x_train.device, data.x_train.dtype
    R = data.n_replicas
    lam = torch.tensor([h.get("prior_prec", 1.0) for h in hparams], device=dev, dtype=dt)
    prior = lam[:, None].expand(R, model.n_params).clone()
    if spec.bias_prior_prec is not None:
        prior[:, model.bias_mask(dev)] = float(spec.bias_prior_prec)
    noise = y_scale = dropout = None
    if spec.likelihood == "gaussian":
        y_scale = data.replica("y_std")
        tau = torch.tensor([h["noise_prec"] for h in hparams], device=dev, dtype=dt)
        noise = tau * y_scale ** 2 if spec.noise_prec_units == "original" else tau
    if "dropout" in hparams[0]:
        dropout = torch.tensor([h["dropout"] for h in hparams], device=dev, dtype=dt)
    return Problem(likelihood=spec.likelihood, n_data=data.n_train[data.data_index], prior_prec=prior,
                   noise_prec=noise, y_scale=y_scale, dropout=dropout)


def build_method(spec: RunSpec, ds):
    """The network and the method object of ``spec`` for data set ``ds``."""
    out_dim = 1 if spec.task != "multiclass" else int(ds.n_classes)
    model = MLP([int(np.prod(ds.X.shape[1:])), *spec.model_hidden, out_dim], spec.activation)
    return method_class(spec.method.name)(spec.method, model, spec.likelihood)


def fit(spec: RunSpec, ds, pairs, data_index, hparams, generator, *, device, dtype, eval_every=None,
        stop_on_divergence=True, progress=False, desc="", eval_samples=None, checkpoint=None, checkpoint_every=10,
        epochs=None, init_state=None, eval_samples_final=None, workers=None, replica_offset=0):
    """Train one batched program: replica r trains on ``pairs[data_index[r]]`` with ``hparams[r]``.
    ``init_state`` continues a trained state (a later stage) with this data's sizes and priors. ``workers > 1``
    trains contiguous chunks of the replicas in that many processes (``replica_workers``)."""
    method = build_method(spec, ds)
    if workers is not None and int(workers) > 1 and len(data_index) > 1:
        from bnnbench.replica_workers import fit_in_workers
        return fit_in_workers(spec, ds, pairs, list(data_index), hparams, generator, workers=int(workers),
                              method=method, replica_offset=replica_offset, device=device, dtype=dtype,
                              eval_every=eval_every, stop_on_divergence=stop_on_divergence, progress=progress,
                              desc=desc, eval_samples=eval_samples, checkpoint=checkpoint,
                              checkpoint_every=checkpoint_every, epochs=epochs, init_state=init_state,
                              eval_samples_final=eval_samples_final)
    data = ReplicaData.build(ds.X, ds.y, pairs, data_index, spec.normalize_x,
                             spec.normalize_y and spec.task == "regression", device=device, dtype=dtype)
    problem = make_problem(spec, method.model, data, hparams)
    state = method.init(problem, generator) if init_state is None else {**init_state, **hyper_state(problem)}
    return train(method, state, data, epochs=epochs or spec.epochs, batch_size=spec.batch_size, lr_drop=spec.lr_drop,
                 eval_samples=eval_samples or spec.eval_samples, eval_samples_final=eval_samples_final,
                 generator=generator, task=spec.task,
                 eval_every=eval_every, stop_on_divergence=stop_on_divergence, progress=progress, desc=desc,
                 checkpoint=checkpoint, checkpoint_every=checkpoint_every, replica_offset=replica_offset)


def _hp_dict(names, spaces, x) -> dict:
    return {n: (math.exp(v) if "log_range" in spaces[n] else float(v)) for n, v in zip(names, x)}


def select_hparams(spec: RunSpec, ds, splits, seed: int, *, device, dtype, progress=False, log=_log,
                   resume: Path | None = None, workers: int | None = None):
    """Per-split hyper-parameters chosen on K-fold CV of the training rows (never the test rows).

    Returns ``(hparams per split, trace, replayed_s)``; the trace lists every evaluated candidate and its score.
    With ``resume`` (a file path), every finished Bayesian-optimisation round is saved there, and a
    restarted selection replays the saved rounds (same proposals, same scores, same generator state)
    instead of training them again; ``replayed_s`` is the time those rounds took when they ran.
    """
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
        res = fit(spec, ds, pairs, data_index, hps, gen, device=device, dtype=dtype, stop_on_divergence=False,
                  eval_samples=hpo.get("eval_samples"), progress=progress, desc=f"hpo {C} cand", workers=workers)
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
                       gp_restarts=int(hpo.get("gp_restarts", 25))) for i in range(n_s)]
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
                save_checkpoint(resume, rounds)
        record(cands, mean)
        for i, o in enumerate(opts):
            o.tell(cands[i], mean[i])
        done += n
        k += 1
        log(f"BO round: {done}/{total} evaluations per split ({n} candidates x {n_f} folds x {n_s} splits, "
            f"{wall:.1f}s{', replayed' if wall == 0.0 else ''}); best mean score {np.mean([o.best[1] for o in opts]):.3f}")
    return [_hp_dict(names, spec.space, o.best[0]) | _keep_fixed(spec, names) for o in opts], trace, replayed_s


def _keep_fixed(spec, names):
    return {k: v for k, v in spec.fixed.items() if k not in names}


def resolve_run(cfg: DictConfig, overrides: list[str]):
    """The data set, run spec and splits of ``cfg``, and the resolved configuration that a record stores and
    whose hash (``results.config_hash``) decides whether a finished record can be reused."""
    validate(cfg)
    ds = load_dataset(cfg.data.name)
    spec = resolve(cfg, overrides, meta=ds.meta)
    if ds.task != spec.task and not (spec.task == "binary" and ds.task == "binary"):
        raise ConfigError(f"protocol {cfg.protocol.name!r} is for {spec.task} but {ds.name} is a {ds.task} data set")
    splits = stage_splits(ds, spec, spec.stages[-1]["split"]) if spec.stages else \
        subset(with_restarts(select_splits(ds, spec.splits, spec.split_scheme), spec.restarts), spec.subset)
    resolved = {"method": cfg.method.name, "dataset": ds.name, "protocol": cfg.protocol.name,
                "seed": int(cfg.seed), "spec": spec.to_dict(), "splits": [s.name for s in splits],
                "dtype": cfg.get("dtype", "float32"), "workers": cfg.get("workers"),
                "threads": threads.choose(cfg.get("threads", "auto"), threads.network_params(spec, ds))}
    return ds, spec, splits, resolved


def execute(cfg: DictConfig, overrides: list[str], run_dir: Path, log=_log) -> dict:
    """Run ``cfg`` and write its record (or failure) into ``run_dir``; returns the record."""
    t0 = time.perf_counter()
    commit = results.git_commit()  # first call in the process: the code this process runs
    ds, spec, splits, resolved = resolve_run(cfg, overrides)
    threads.apply(resolved["threads"])  # before any torch work
    device = device_of(cfg)
    dtype = {"float32": torch.float32, "float64": torch.float64}[cfg.get("dtype", "float32")]
    torch.manual_seed(int(cfg.seed))
    chash = results.config_hash(resolved)
    base = {"status": "ok", "method": cfg.method.name, "dataset": ds.name, "protocol": cfg.protocol.name,
            "experiment": cfg.get("experiment", {}).get("name") if cfg.get("experiment") else None,
            "seed": int(cfg.seed), "config_hash": chash, "device": str(device),
            "config": {**resolved, "hydra_overrides": list(overrides)}}
    if cfg.get("skip_done", True) and results.is_done(run_dir, chash):
        log(f"skip: {run_dir} already holds a finished record of this configuration")
        return results.load_record(run_dir)

    ck_hpo, ck_fit = Path(run_dir) / f".hpo-{chash}.pt", Path(run_dir) / f".checkpoint-{chash}.pt"
    if cfg.method.name in logreg.EXACT_METHODS:
        return _execute_exact(spec, ds, splits, base, run_dir, t0, commit)
    if spec.hpo.get("kind") == "recorded":
        hparams = _recorded_hparams(spec, splits)
        trace, hpo_replayed_s = [], 0.0
    else:
        hparams, trace, hpo_replayed_s = select_hparams(
            spec, ds, splits, int(cfg.seed), device=device, dtype=dtype, progress=cfg.get("progress", False), log=log,
            resume=ck_hpo, workers=cfg.get("workers"))
    t_hpo = time.perf_counter() - t0 + hpo_replayed_s   # rounds replayed from a checkpoint count with their time
    gen = torch.Generator(device=device).manual_seed(int(cfg.seed))
    pairs = [(s.train, s.test) for s in splits]
    opts = dict(device=device, dtype=dtype, eval_every=spec.eval_every, stop_on_divergence=True,
                progress=cfg.get("progress", False), desc=f"{cfg.method.name} {ds.name}",
                checkpoint_every=int(cfg.get("checkpoint_every", 10)), workers=cfg.get("workers"))
    stage_files = [Path(run_dir) / f".stage{k}-{chash}.pt" for k in range(len(spec.stages or []))]
    try:
        if spec.stages:
            res, stages = fit_stages(spec, ds, hparams, gen, stage_files, ck_fit, **opts)
        else:
            res, stages = fit(spec, ds, pairs, list(range(len(pairs))), hparams, gen, checkpoint=ck_fit,
                              eval_samples_final=spec.eval_samples_final, **opts), None
    except DivergenceError as e:
        results.write_failure(run_dir, str(e), {**base, "hparams": hparams,
                                                 "wall_time_s": time.perf_counter() - t0})
        for f in (ck_fit, ck_hpo, *stage_files, *Path(run_dir).glob(f".checkpoint-{chash}-*.pt")):
            f.unlink(missing_ok=True)
        raise
    keys = [k for k in res.final if k != "train_objective"]
    per_split = [{"split": s.name, **{k: float(res.final[k][i]) for k in keys}} for i, s in enumerate(splits)]
    if spec.posterior_metrics == "logreg":
        rows = logreg.method_metrics(res.method, res.state, ds, splits, _logreg_priors(spec, ds, hparams),
                                     spec.exact_gtol or 1e-6, run_dir=run_dir)
        per_split = [{**p, **r} for p, r in zip(per_split, rows)]
        keys = [*keys, *rows[0]]
    record = {**base, "metrics": per_split,
              "summary": {k: summarise([m[k] for m in per_split]) for k in keys},
              "stderr_convention": STDERR_CONVENTION, "loglik_convention_of_paper": spec.loglik,
              "hparams": [{"split": s.name, **h} for s, h in zip(splits, hparams)], "hpo_trace": trace,
              "wall_time_s": time.perf_counter() - t0 + hpo_replayed_s + res.resumed_s, "hpo_time_s": t_hpo,
              "train_time_s": res.wall_time_s,
              "train_steps": res.steps, "versions": results.versions(), "git_commit": commit,
              **({"stages": stages} if stages else {})}
    results.write_record(run_dir, record, history={"epochs": res.history.epochs, "metrics": res.history.metrics,
                                                   "splits": [s.name for s in splits]})
    for f in (ck_fit, ck_hpo, *stage_files, *Path(run_dir).glob(f".checkpoint-{chash}-*.pt")):
        f.unlink(missing_ok=True)
    return record


def subset(splits: list, sub: dict | None) -> list:
    """The first ``sub["train"]`` training and ``sub["test"]`` evaluation rows of each split (fast protocols)."""
    if not sub:
        return splits
    n_tr, n_te = sub.get("train"), sub.get("test")
    return [Split(s.name, s.train[:n_tr] if n_tr else s.train, s.test[:n_te] if n_te else s.test) for s in splits]


def stage_splits(ds, spec: RunSpec, name: str) -> list:
    return subset(with_restarts(select_splits(ds, [name], spec.split_scheme), spec.restarts), spec.subset)


def fit_stages(spec: RunSpec, ds, hparams, gen, stage_files, checkpoint, **opts):
    """Train through ``spec.stages`` in turn, each on its own split, the method's state (step counter,
    momentum, curvature) carried over and only the data size and priors renewed: the MNIST schedule of
    SLANG's code (100 epochs on the first 50k images, then continued on all 60k). A finished stage is saved
    in ``stage_files[k]`` (state and generator), so an interrupted run resumes in the stage it was in.
    Returns the last stage's result, its history with every stage's evaluations (epochs counted on), and
    per stage its split, epochs and final metrics."""
    state, steps, wall, summary = None, 0, 0.0, []
    hist = {"epochs": [], "metrics": []}
    for k, st in enumerate(spec.stages):
        splits = stage_splits(ds, spec, st["split"])
        last = k == len(spec.stages) - 1
        if stage_files[k].exists() and not last:
            done = torch.load(stage_files[k], map_location=opts["device"], weights_only=False)
            gen.set_state(done["generator"])
            state, res_final, h, w, n = done["state"], done["final"], done["history"], done["wall"], done["steps"]
        else:
            pairs = [(s.train, s.test) for s in splits]
            ck = checkpoint.with_name(f"{checkpoint.stem}-stage{k}.pt")
            res = fit(spec, ds, pairs, list(range(len(pairs))), hparams, gen, epochs=st["epochs"], init_state=state,
                      checkpoint=ck, eval_samples_final=spec.eval_samples_final if last else None, **opts)
            state, res_final, h, w, n = (res.state, {k_: v.tolist() for k_, v in res.final.items()},
                                         res.history.to_dict(), res.wall_time_s, res.steps)
            if not last:
                save_checkpoint(stage_files[k], {"state": state, "final": res_final, "history": h, "wall": w,
                                                 "steps": n, "generator": gen.get_state()})
                ck.unlink(missing_ok=True)
        offset = sum(s["epochs"] for s in spec.stages[:k])
        hist["epochs"] += [e + offset for e in h["epochs"]]
        hist["metrics"] += h["metrics"]
        steps, wall = steps + n, wall + w
        summary.append({"split": st["split"], "epochs": st["epochs"], "n_train": len(splits[0].train),
                        "n_eval": len(splits[0].test), "final": res_final})
    res.history.epochs, res.history.metrics = hist["epochs"], hist["metrics"]
    res.steps, res.wall_time_s = steps, wall
    return res, summary


def _logreg_priors(spec, ds, hparams):
    if spec.model_hidden:
        raise ConfigError("posterior_metrics=logreg needs a linear model (protocol hidden: [])")
    D = int(np.prod(ds.X.shape[1:]))
    return [logreg.prior_vector(D, h.get("prior_prec", 1.0), spec.bias_prior_prec) for h in hparams]


def _execute_exact(spec, ds, splits, base, run_dir, t0, commit):
    """The exact Gaussian VI columns (``exact_full``, ``exact_mf``): L-BFGS per split, no training loop."""
    if spec.task != "binary":
        raise ConfigError(f"{base['method']} is exact VI for logistic regression; {ds.name} is a {spec.task} data set")
    if spec.hpo.get("kind") not in ("fixed", None):
        raise ConfigError(f"{base['method']} takes the protocol's fixed prior precision (hpo=fixed)")
    hparams = [dict(spec.fixed) for _ in splits]
    lams = _logreg_priors(spec, ds, hparams)
    family = logreg.EXACT_METHODS[base["method"]]
    gtol = spec.exact_gtol or 1e-6
    try:
        rows, info = logreg.exact_metrics(ds, splits, lams, family, gtol, run_dir=run_dir)
    except NotConvergedError as e:
        results.write_failure(run_dir, str(e), {**base, "hparams": hparams, "wall_time_s": time.perf_counter() - t0})
        raise
    per_split = [{"split": s.name, **r} for s, r in zip(splits, rows)]
    record = {**base, "metrics": per_split,
              "summary": {k: summarise([m[k] for m in per_split]) for k in rows[0]},
              "stderr_convention": STDERR_CONVENTION, "loglik_convention_of_paper": spec.loglik,
              "hparams": [{"split": s.name, **h} for s, h in zip(splits, hparams)], "hpo_trace": [],
              "exact": {"family": family, "gtol": gtol, **info},
              "wall_time_s": time.perf_counter() - t0, "hpo_time_s": 0.0, "train_time_s": time.perf_counter() - t0,
              "train_steps": info["lbfgs_iterations"], "versions": results.versions(), "git_commit": commit}
    results.write_record(run_dir, record)
    return record


def _recorded_hparams(spec, splits):
    path = Path(spec.hpo["record"])
    rec = results.load_record(path if path.is_dir() else path.parent)
    if rec is None:
        raise ConfigError(f"hpo=recorded: no record.json at {path}")
    by_split = {h["split"]: {k: v for k, v in h.items() if k != "split"} for h in rec["hparams"]}
    missing = [s.name for s in splits if s.name not in by_split]
    if missing:
        raise ConfigError(f"hpo=recorded: {path} has no hyper-parameters for split(s) {missing}")
    return [by_split[s.name] for s in splits]
