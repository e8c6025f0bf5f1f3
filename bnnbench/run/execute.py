"""One run: a method on a data set under a protocol, all splits at once.

1. resolve the protocol (``bnnbench.run.protocol``) and load the data set (fetched on first use);
2. choose hyper-parameters per split without the test rows (``selection``);
3. train the final model on every training split as one batched program (``fit``, ``replica_workers``,
   ``stages``) and evaluate on the test rows, or, for a solved method (exact VI), solve it once
   (``fit.solve_replicas``); a Gaussian posterior's metrics follow (``posterior_metrics``);
4. write ``record.json`` (or ``failed.json`` with the reason when training diverges) through ``results``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from bnnbench.run import active, results, threads
from bnnbench.methods.exact import logreg
from bnnbench.run.compiled import compiles, new_run
from bnnbench.run.config import CONFIG_SCHEMA, CommandLine, ConfigError
from bnnbench.core import prng
from bnnbench.core.data import load_dataset
from bnnbench.run.engine import DivergenceError
from bnnbench.methods.exact.exact_vi import NotConvergedError
from bnnbench.run.fit import FitOptions, build_method, data_dtype, predictive, replica_data, solve_replicas
from bnnbench.methods import method_class
from bnnbench.core.metrics import STDERR_CONVENTION, summarise
from bnnbench.run.protocol import resolve
from bnnbench.run.replica_workers import fit_replicas, run_pool
from bnnbench.run.selection import recorded_hparams, select_hparams
from bnnbench.run.splits import run_splits
from bnnbench.run.stages import fit_stages


def _log(msg: str) -> None:
    print(msg, flush=True)


def validate(cfg: DictConfig) -> None:
    """Fail at start, with the valid values, on settings that cannot work."""
    def need(ok, msg):
        if not ok:
            raise ConfigError(msg)
    need(isinstance(cfg.seed, int) and cfg.seed >= 0, f"seed must be a non-negative integer, got {cfg.seed!r}")
    need(cfg.get("dtype", "float32") in ("float32", "float64"), f"dtype must be float32 or float64, got {cfg.dtype!r}")
    need(str(cfg.get("device", "cpu")).split(":")[0] in ("cpu", "cuda"),
         f"device must be cpu or cuda[:N], got {cfg.device!r}")
    w = cfg.get("workers")
    need(w is None or (isinstance(w, int) and w >= 1), f"workers must be null or an integer >= 1, got {w!r}")
    need(w in (None, 1) or str(cfg.get("device", "cpu")) == "cpu",
         "workers > 1 splits the replicas over CPU processes; with device=cuda use workers=null")
    need(isinstance(cfg.get("compile", False), bool), f"compile must be true or false, got {cfg.get('compile')!r}")
    need(cfg.get("rng", "torch") in prng.MODES,
         f"rng must be one of {', '.join(prng.MODES)}, got {cfg.get('rng')!r}")
    m = cfg.method
    for k in ("lr", "eps", "length_scale", "init_prec", "init_std"):
        if m.get(k) is not None:
            need(isinstance(m[k], (int, float)) and m[k] > 0, f"method.{k} must be a positive number, got {m[k]!r}")
    if m.get("train_samples") is not None:
        need(isinstance(m.train_samples, int) and m.train_samples >= 1,
             f"method.train_samples must be an integer >= 1, got {m.train_samples!r}")
    if m.get("betas") is not None:
        need(len(m.betas) == 2 and all(0 <= b < 1 for b in m.betas),
             f"method.betas must be two numbers in [0, 1), got {list(m.betas)}")
    try:
        cls = method_class(m.name)
        cls.check_settings(cls.Config.of(m))
    except ValueError as e:
        raise ConfigError(f"method {m.name}: {e}") from None
    if cfg.get("model") is not None and cfg.model.get("name") == "convnet" and not method_class(m.name).conv:
        from bnnbench.methods import METHODS
        need(False, f"method {m.name} does not run on a convolutional network;"
                    f" methods that do: {', '.join(sorted(k for k, c in METHODS.items() if c.conv))}")
    need(cfg.hpo.kind in ("fixed", "grid", "bo", "recorded"),
         f"hpo.kind must be fixed, grid, bo or recorded, got {cfg.hpo.kind!r}")
    threads.check(cfg.get("threads", "auto"))


def device_of(cfg) -> torch.device:
    dev = torch.device(cfg.get("device", "cpu"))
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda was asked for but torch.cuda.is_available() is False")
    if dev.type == "cuda":
        full_float32()
    return dev


def full_float32() -> None:
    """float32 products on CUDA at full precision, as on the CPU: torch lets cuDNN's convolutions use TF32 (10-bit
    mantissas) by default, which the inducing-point families' Gram matrices and Cholesky factors do not tolerate."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def resolve_run(cfg: DictConfig, overrides: list[str], run_dir: Path | None = None):
    """The data set, run spec and splits of ``cfg``, and the resolved configuration that a record stores and
    whose hash (``results.config_hash``) decides whether a finished record can be reused. With ``run_dir``, a
    ``threads=auto`` count is the one its record or resume state already has (``threads.adopt_earlier``)."""
    ds = load_dataset(cfg.data.name)
    spec = resolve(cfg, CommandLine.parse(overrides), meta=ds.meta)
    if ds.task != spec.task and not (spec.task == "multiclass" and ds.task == "binary"):   # binary: K = 2 logits
        raise ConfigError(f"protocol {cfg.protocol.name!r} is for {spec.task} but {ds.name} is a {ds.task} data set")
    splits = run_splits(ds, spec)
    if spec.active_learning:
        active.check(spec)
    resolved = {"config_schema": CONFIG_SCHEMA, "method": cfg.method.name, "dataset": ds.name,
                "protocol": cfg.protocol.name,
                "seed": int(cfg.seed), "spec": spec.to_dict(), "splits": [s.name for s in splits],
                "dtype": cfg.get("dtype", "float32"), "workers": cfg.get("workers"),
                "threads": threads.choose(cfg.get("threads", "auto"), threads.network_params(spec, ds)),
                # what the run does: a method that is not compilable (or a convolutional network on a CPU) steps eagerly
                "compile": compiles(method_class(cfg.method.name), cfg.get("compile", False), conv=bool(spec.conv),
                                    device=str(cfg.get("device", "cpu")), settings=spec.method),
                "rng": cfg.get("rng", "torch")}
    if run_dir is not None:
        resolved = threads.adopt_earlier(cfg.get("threads", "auto"), resolved, run_dir)
    return ds, spec, splits, resolved


def execute(cfg: DictConfig, overrides: list[str], run_dir: Path, log=_log) -> dict:
    """Run ``cfg`` and write its record (or failure) into ``run_dir``; returns the record.

    Settings are checked before anything is created; the run directory is then held by this process
    (``results.claimed``) until the record is written. A finished record of the same configuration is reused
    (``skip_done``); one of another configuration is never replaced silently."""
    validate(cfg)
    with results.claimed(run_dir), run_pool():   # workers > 1: one set of worker processes for the whole run
        return _execute(cfg, overrides, Path(run_dir), log)


@dataclass
class Trained:
    """What every kind of training returns to ``_execute``: the fit (``TrainResult``: method, state, final metrics,
    history, times), the (train, test) rows it was scored on (active learning's last round's), a staged run's stages
    and an active-learning run's per-round entry."""
    res: object
    pairs: list
    stages: list | None = None
    active_learning: dict | None = None


class RecordedFailure(DivergenceError):
    """The run directory's ``failed.json`` records a failure of this very configuration, which on a CPU repeats: it is
    not run again unless ``retry_failed=true`` (or ``skip_done=false``)."""


def _reuse_or_refuse(run_dir: Path, chash: str, resolved: dict, cfg, log) -> dict | None:
    """A finished record of this configuration in ``run_dir`` (reused), else None; ``ConfigError`` where the
    directory holds a record of another configuration (unless ``skip_done=false``); ``RecordedFailure`` where it
    records this configuration's failure (unless ``retry_failed=true``)."""
    reason = results.recorded_failure(run_dir, chash) if cfg.get("skip_done", True) else None
    if reason is not None and not cfg.get("retry_failed", False):
        raise RecordedFailure(f"{reason} (an earlier run of this configuration; retry_failed=true runs it again)")
    existing = results.load_record(run_dir)
    if existing is None or not cfg.get("skip_done", True):
        return None
    if results.is_done(run_dir, chash):
        log(f"skip: {run_dir} already holds a finished record of this configuration")
        return existing
    differ = results.config_diff(existing.get("config", {}), resolved)
    raise ConfigError(f"{run_dir} holds a record of another configuration (it differs in "
                      f"{', '.join(differ) or 'its status'}); add label=<name> to keep both, "
                      "or skip_done=false to replace it")


def _train(spec, ds, splits, hparams, method, cfg, opts: FitOptions, resume, log) -> Trained:
    """The training (or solve) of every replica: active-learning rounds, a solve, a staged fit or one fit."""
    gen = torch.Generator(device=opts.device).manual_seed(int(cfg.seed))
    pairs = [(s.train, s.test) for s in splits]
    index = list(range(len(pairs)))
    workers = cfg.get("workers")
    if spec.active_learning:
        res, pairs, entry = active.run_rounds(spec, ds, splits, hparams, gen, opts, workers=workers, log=log)
        return Trained(res, pairs, active_learning=entry)
    if method.solved:
        return Trained(solve_replicas(spec, ds, pairs, index, hparams, opts), pairs)
    if spec.stages:
        res, stages = fit_stages(spec, ds, hparams, gen, resume.stages, opts, workers=workers)
        return Trained(res, pairs, stages=stages)
    return Trained(fit_replicas(spec, ds, pairs, index, hparams, gen,
                                replace(opts, eval_samples_final=spec.eval_samples_final), workers=workers), pairs)


def _per_split_metrics(spec, ds, splits, hparams, trained: Trained, run_dir: Path) -> tuple[list[dict], list[str]]:
    """Each split's final metrics (and the ELBO, active learning's mean RMSE over rounds, logistic regression's
    posterior metrics), and the keys the record summarises."""
    res = trained.res
    keys = [k for k in res.final if k != "train_objective"]
    if res.method.objective_is_elbo and "train_objective" in res.final:
        res.final["elbo"] = -res.final["train_objective"]
        keys.append("elbo")
    per_split = [{"split": s.name, **{k: float(res.final[k][i]) for k in keys}} for i, s in enumerate(splits)]
    if trained.active_learning is not None:   # the test RMSE averaged over the rounds, beside the last round's
        for row, curve in zip(per_split, trained.active_learning["rmse"]):
            row["rmse_mean_over_rounds"] = float(np.mean(curve))
        keys.append("rmse_mean_over_rounds")
    if spec.posterior_metrics == "logreg":
        mean, cov = logreg.gaussian_q(res.method, res.state)
        if run_dir is not None:
            results.save_posterior(run_dir, mean[0], cov[0])
        rows = logreg.method_metrics(mean, cov, ds, splits, _logreg_priors(spec, ds, hparams), spec.exact_gtol or 1e-6)
        per_split = [{**p, **r} for p, r in zip(per_split, rows)]
        keys = [*keys, *rows[0]]
    return per_split, keys


def _execute(cfg: DictConfig, overrides: list[str], run_dir: Path, log) -> dict:
    t0 = time.perf_counter()
    commit = results.git_commit()  # first call in the process: the code this process runs
    ds, spec, splits, resolved = resolve_run(cfg, overrides, run_dir)
    threads.apply(resolved["threads"])  # before any torch work
    device = device_of(cfg)
    dtype = {"float32": torch.float32, "float64": torch.float64}[cfg.get("dtype", "float32")]
    torch.manual_seed(int(cfg.seed))
    chash = results.config_hash(resolved)
    base = {"status": "ok", "method": cfg.method.name, "dataset": ds.name, "protocol": cfg.protocol.name,
            "experiment": cfg.get("experiment", {}).get("name") if cfg.get("experiment") else None,
            "seed": int(cfg.seed), "config_hash": chash, "device": str(device),
            "config": {**resolved, "hydra_overrides": list(overrides)}}
    existing = _reuse_or_refuse(run_dir, chash, resolved, cfg, log)
    if existing is not None:
        return existing

    if resolved["compile"]:
        new_run()
    resume = results.ResumeFiles(run_dir, chash, len(spec.stages or []))
    resumed_from = resume.describe()
    if resumed_from:
        log(f"resuming from {resumed_from} (saved in {run_dir})")
    try:
        method = build_method(spec, ds)   # the method's own requirements (task, model) are checked here
    except ValueError as e:
        raise ConfigError(f"method {spec.method.name} on {ds.name}: {e}") from None
    if method.solved:
        _check_solved(spec, cfg)
    if method.full_batch:
        _check_full_batch(spec, cfg, splits)
    checkpoints = dict(checkpoint_every=int(cfg.get("checkpoint_every", 10)),
                       checkpoint_seconds=float(cfg.get("checkpoint_seconds", 60)))
    if spec.hpo.get("kind") == "recorded":
        hparams = recorded_hparams(spec, splits)
        trace, hpo_replayed_s = [], 0.0
    else:
        # torch's global generator (q(tau)'s draws at evaluation, gamma_noise.sample_prec) leaves the search as it
        # entered it: the final training draws as a re-run of it with hpo=recorded does (CI's regression)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            hparams, trace, hpo_replayed_s = select_hparams(
                spec, ds, splits, int(cfg.seed), device=device, dtype=dtype, progress=cfg.get("progress", False),
                log=log, resume=resume.hpo, workers=cfg.get("workers"), compile=resolved["compile"],
                rng=resolved["rng"], **checkpoints)
    t_hpo = time.perf_counter() - t0 + hpo_replayed_s   # rounds replayed from a checkpoint count with their time
    opts = FitOptions(device=device, dtype=dtype, eval_every=spec.eval_every, stop_on_divergence=True,
                      progress=cfg.get("progress", False), desc=f"{cfg.method.name} {ds.name}",
                      checkpoint=resume.fit, **checkpoints, announce_eta=True,
                      compile=resolved["compile"], rng=resolved["rng"])
    try:
        trained = _train(spec, ds, splits, hparams, method, cfg, opts, resume, log)
    except (DivergenceError, NotConvergedError) as e:
        results.write_failure(run_dir, str(e), {**base, "hparams": hparams,
                                                 "wall_time_s": time.perf_counter() - t0,
                                                 "versions": results.versions(), "git_commit": commit})
        resume.remove()
        raise
    res, pairs = trained.res, trained.pairs
    diagnostics = None
    if res.method.diagnostics is not None and not trained.stages:
        diagnostics = res.method.diagnostics(res.state, replica_data(spec, ds, pairs, list(range(len(pairs))),
                                                                     device, data_dtype(res.method, dtype)))
        log(f"{cfg.method.name} diagnostics{' (FLAGGED)' if diagnostics.get('flagged') else ''}: "
            f"{diagnostics.get('summary', '')}")
    if spec.save_predictive and spec.task == "regression":
        results.save_predictive(run_dir, predictive(spec, ds, pairs, res, opts,
                                                    torch.Generator(device=device).manual_seed(int(cfg.seed) + 1)))
    per_split, keys = _per_split_metrics(spec, ds, splits, hparams, trained, run_dir)
    record = {**base, "metrics": per_split,
              "summary": {k: summarise([m[k] for m in per_split]) for k in keys},
              "stderr_convention": STDERR_CONVENTION, "loglik_convention_of_paper": spec.loglik,
              "hparams": [{"split": s.name, **h} for s, h in zip(splits, hparams)], "hpo_trace": trace,
              "wall_time_s": time.perf_counter() - t0 + hpo_replayed_s + res.resumed_s, "hpo_time_s": t_hpo,
              "train_time_s": res.wall_time_s,
              "train_steps": res.steps, "versions": results.versions(), "git_commit": commit,
              **({"stages": trained.stages} if trained.stages else {}),
              **({"exact": res.solve_info} if res.solve_info is not None else {}),
              **({"diagnostics": diagnostics} if diagnostics is not None else {}),
              **({"active_learning": trained.active_learning} if trained.active_learning is not None else {})}
    history = {"epochs": res.history.epochs, "metrics": res.history.metrics, "splits": [s.name for s in splits]}
    results.write_record(run_dir, record, history=history if res.history.epochs else None)
    resume.remove()
    return record


def _check_solved(spec, cfg) -> None:
    """A solved method fits the protocol's fixed hyper-parameters once per split and is not evaluated by sampling:
    its metrics are those of its posterior (``posterior_metrics``)."""
    name = cfg.method.name
    if spec.hpo.get("kind") != "fixed":
        raise ConfigError(f"{name} is solved, not trained: it takes the protocol's fixed hyper-parameters (hpo=fixed), "
                          f"not hpo={spec.hpo.get('kind')}")
    if spec.posterior_metrics is None:
        raise ConfigError(f"{name} is solved, not trained: its metrics are its posterior's, and protocol "
                          f"{cfg.protocol.name!r} sets no posterior_metrics (valid: logreg)")


def _check_full_batch(spec, cfg, splits) -> None:
    """A full-batch method (HMC) needs every training row of a split in its one batch per epoch."""
    n = max(len(s.train) for s in splits)
    if spec.batch_size < n:
        raise ConfigError(f"{cfg.method.name} needs full-batch gradients, but protocol {cfg.protocol.name!r} has "
                          f"batch_size {spec.batch_size} < {n} training rows: use protocol=hmc_uci "
                          f"(or protocol.batch_size={n})")


def _logreg_priors(spec, ds, hparams):
    if spec.model_hidden:
        raise ConfigError("posterior_metrics=logreg needs a linear model (protocol hidden: [])")
    D = int(np.prod(ds.X.shape[1:]))
    return [logreg.prior_vector(D, h.get("prior_prec", 1.0), spec.bias_prior_prec) for h in hparams]
