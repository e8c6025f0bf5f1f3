"""Training over a replica axis: every split, seed, CV fold and hyper-parameter candidate of one
dataset trains as ONE batched program (docs/design.md, "Replica axis").

Replicas may differ in training-set size; data sets are padded to the largest, and each replica
draws its minibatches from its own per-epoch permutation of its own ``n_r`` rows. Replicas that share
a training set (the hyper-parameter candidates of one fold) point to one copy through
``data_index`` and share its permutation (common random numbers for a fair comparison); their
Monte Carlo noise is independent.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils import _pytree as pytree
from tqdm.auto import tqdm

from bnnbench.run import results
from bnnbench.core.augment import crop_flip
from bnnbench.run.compiled import compiled_update
from bnnbench.run.config import ConfigError
from bnnbench.methods.base import Batch, Method, State
from bnnbench.core.metrics import classification_metrics, regression_metrics


ETA_NOTICE_S = 600.0   # a training whose rest is estimated to take longer is announced with its estimate
ETA_AFTER_EPOCHS, ETA_AFTER_S = 3, 2.0   # its pace is measured over this many epochs, or this many seconds


def eta_notice(elapsed_s: float, done: int, left: int, threshold_s: float = ETA_NOTICE_S) -> str | None:
    """What to print when ``left`` more epochs at the pace of the ``done`` ones so far (``elapsed_s`` seconds) would
    take longer than ``threshold_s``; ``None`` when they would not. A mistyped epoch count (100000000) otherwise
    starts silently."""
    if done <= 0:
        return None
    per_epoch = elapsed_s / done
    rest = per_epoch * left
    if rest <= threshold_s:
        return None
    return (f"estimated {_duration(rest)} for the final training: {left} more epochs at {per_epoch:.3g} s each "
            "(measured on the first epochs; Ctrl-C stops the run)")


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    if minutes < 120:
        return f"{minutes:.0f} min"
    return f"{minutes / 60:.1f} h" if minutes < 48 * 60 else f"{minutes / 1440:.1f} days"


class EtaNotice:
    """Prints ``eta_notice`` once, after the first epochs of a training (``ETA_AFTER_EPOCHS`` or ``ETA_AFTER_S``),
    when ``enabled``: a long final training says so before it goes on. With ``skip_first`` (a compiled step: its
    first epoch compiles it, 5-60 s) the pace is measured from the second epoch on."""

    def __init__(self, enabled: bool, skip_first: bool = False):
        self.pending, self.t0, self.skip, self.base = enabled, time.perf_counter(), skip_first, 0

    def epoch_done(self, done: int, left: int) -> None:
        if not self.pending:
            return
        if self.skip:
            self.skip, self.t0, self.base = False, time.perf_counter(), done
            return
        elapsed, done = time.perf_counter() - self.t0, done - self.base
        if done < ETA_AFTER_EPOCHS and elapsed < ETA_AFTER_S and left > 0:
            return
        self.pending = False
        msg = eta_notice(elapsed, done, left, ETA_NOTICE_S)
        if msg:
            print(msg, flush=True)


class DivergenceError(RuntimeError):
    """Training produced a non-finite objective or state."""


@dataclass
class Standardiser:
    """x -> (x - mean) / std with training statistics; std from ``ddof=1`` (``torch.std``) and
    constant columns (std = 0, e.g. naval column 8) mapped to std 1."""
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, a: np.ndarray, enabled: bool = True) -> Standardiser:
        if not enabled:
            shape = a.shape[1:]
            return cls(np.zeros(shape), np.ones(shape))
        std = a.std(axis=0, ddof=1) if a.shape[0] > 1 else np.ones(a.shape[1:])
        std = np.where(std > 1e-12, std, 1.0)
        return cls(a.mean(axis=0), std)

    def __call__(self, a: np.ndarray) -> np.ndarray:
        return (a - self.mean) / self.std


@dataclass
class ReplicaData:
    """Padded, per-replica standardised training and evaluation sets.

    ``x_train [U, N_max, D]`` holds U distinct training sets; replica r uses ``data_index[r]``.
    Evaluation targets stay in original units (``y_eval``); regression predictions are mapped back
    with ``y_mean + y_std * f`` and the noise precision with ``tau / y_std^2``.
    """
    x_train: torch.Tensor
    y_train: torch.Tensor
    n_train: torch.Tensor      # [U]
    x_eval: torch.Tensor       # [U, T_max, D]
    y_eval: torch.Tensor       # [U, T_max] original units
    eval_mask: torch.Tensor    # [U, T_max] bool
    y_mean: torch.Tensor       # [U]
    y_std: torch.Tensor        # [U]
    data_index: torch.Tensor   # [R] long

    @property
    def n_replicas(self) -> int:
        return int(self.data_index.shape[0])

    @classmethod
    def build(cls, X: np.ndarray, y: np.ndarray, pairs: list[tuple[np.ndarray, np.ndarray]],
              data_index: list[int] | None = None, normalize_x: bool = True, normalize_y: bool = True,
              device="cpu", dtype=torch.float32) -> ReplicaData:
        """``pairs[u] = (train_rows, eval_rows)`` into ``X, y``; ``data_index[r]`` picks a pair."""
        U = len(pairs)
        n_max = max(len(tr) for tr, _ in pairs)
        t_max = max(len(te) for _, te in pairs)
        feat = X.shape[1:]
        xt, yt = np.zeros((U, n_max, *feat)), np.zeros((U, n_max))
        xe, ye, me = np.zeros((U, t_max, *feat)), np.zeros((U, t_max)), np.zeros((U, t_max), bool)
        ym, ys = np.zeros(U), np.ones(U)
        for u, (tr, te) in enumerate(pairs):
            sx = Standardiser.fit(X[tr], normalize_x)
            xt[u, :len(tr)], xe[u, :len(te)] = sx(X[tr]), sx(X[te])
            if normalize_y:
                sy = Standardiser.fit(y[tr])
                ym[u], ys[u] = sy.mean, sy.std
            yt[u, :len(tr)] = (y[tr] - ym[u]) / ys[u]
            ye[u, :len(te)], me[u, :len(te)] = y[te], True
        t = lambda a: torch.as_tensor(a, dtype=dtype, device=device)  # noqa: E731
        di = list(range(U)) if data_index is None else data_index
        return cls(t(xt), t(yt), torch.tensor([len(tr) for tr, _ in pairs], device=device), t(xe), t(ye),
                   torch.as_tensor(me, device=device), t(ym), t(ys), torch.tensor(di, device=device))

    def replica(self, name: str) -> torch.Tensor:
        """A per-data-set field expanded to the replica axis."""
        return getattr(self, name)[self.data_index]


@dataclass
class History:
    """Per-evaluation records for convergence plots: ``epoch`` plus metric vectors over replicas."""
    epochs: list[int] = field(default_factory=list)
    metrics: list[dict[str, list[float]]] = field(default_factory=list)

    def append(self, epoch: int, metrics: dict[str, torch.Tensor]):
        self.epochs.append(epoch)
        self.metrics.append({k: v.detach().cpu().tolist() for k, v in metrics.items()})

    def to_dict(self) -> dict:
        return {"epochs": self.epochs, "metrics": self.metrics}


@dataclass
class TrainResult:
    state: State
    history: History
    final: dict[str, torch.Tensor]  # metrics [R] at the end of training
    wall_time_s: float
    steps: int
    diverged: torch.Tensor  # [R] bool
    method: Method | None = None
    resumed_s: float = 0.0  # training time spent before the checkpoint this run resumed from (in wall_time_s)
    solve_info: dict | None = None  # a solved method's report of its solve (``Method.solve``)


def epoch_batches(data: ReplicaData, batch_size: int, generator: torch.Generator, last_batch: str | None = None,
                  batch_order: str | None = None):
    """Yield minibatch row indices ``[R, B]``: one permutation per distinct training set and epoch,
    ``ceil(N_max / B)`` steps. ``last_batch`` None ("wrap"): every batch has B rows, the last one filled from the
    start of its own permutation (as does a smaller set); "short": the last batch holds the N mod B rows left, as a
    PyTorch ``DataLoader`` (``drop_last=False``) gives them, so every row is seen once per epoch (all training sets
    must then have the same size N). ``batch_order`` None ("shuffled"): a random permutation; "fixed": the identity
    every epoch (``shuffle=False``), drawing nothing from ``generator``."""
    U, n_max = data.x_train.shape[:2]
    if last_batch not in (None, "wrap", "short"):
        raise ConfigError(f"protocol.last_batch={last_batch!r}; valid: wrap, short")
    if batch_order not in (None, "shuffled", "fixed"):
        raise ConfigError(f"protocol.batch_order={batch_order!r}; valid: shuffled, fixed")
    if last_batch == "short" and bool((data.n_train != n_max).any()):
        raise ConfigError(f"protocol.last_batch=short needs training sets of one size; these have "
                          f"{sorted(set(data.n_train.tolist()))} rows (cross-validation folds differ by a row: "
                          f"use it with hpo=fixed or hpo=recorded)")
    if batch_order == "fixed":
        perm = torch.arange(n_max, device=data.x_train.device).expand(U, n_max)   # a replica's pad rows stay last
    else:
        keys = torch.rand(U, n_max, generator=generator, device=data.x_train.device)
        pad = torch.arange(n_max, device=keys.device)[None, :] >= data.n_train[:, None]
        perm = torch.where(pad, torch.full_like(keys, 2.0), keys).argsort(dim=1)
    n_steps = math.ceil(n_max / batch_size)
    pos = torch.arange(n_steps * batch_size, device=perm.device)[None, :] % data.n_train[:, None]
    rows = perm.gather(1, pos)[data.data_index]   # the epoch's rows at once: fewer small ops per step
    end = n_max if last_batch == "short" else n_steps * batch_size
    for k in range(n_steps):
        yield rows[:, k * batch_size:min((k + 1) * batch_size, end)]


def make_batch(data: ReplicaData, rows: torch.Tensor) -> Batch:
    """Rows ``[R, B]`` of each replica's training set, gathered with one ``index_select`` over the flattened sets
    (CPU advanced indexing ``x[u, rows]`` is ~4x slower for wide inputs)."""
    U, n_max = data.x_train.shape[:2]
    flat = (data.data_index[:, None] * n_max + rows).reshape(-1)
    x = data.x_train.reshape(U * n_max, *data.x_train.shape[2:]).index_select(0, flat)
    return Batch(x=x.reshape(*rows.shape, *data.x_train.shape[2:]),
                 y=data.y_train.reshape(-1)[flat].reshape(rows.shape), n_data=data.n_train[data.data_index])


def _predictions(method: Method, state: State, data: ReplicaData, n_samples: int, generator: torch.Generator,
                 task: str, max_elems: int = 2 ** 24, predict=None):
    """Yield ``(u, f, tau, mask)`` per chunk of replicas: their data indices, the sampled outputs ``[r, S, T]``
    (regression: in original target units) or ``[r, S, T, K]``, the noise precisions (original units) and the mask
    of the evaluation rows.

    Replicas are predicted in chunks, and a replica's ``n_samples`` posterior samples too when one
    replica's activations for all of them exceed ``max_elems`` (MNIST's 1000 samples x 10k test
    images): the chunks draw independent samples in turn and are concatenated along the sample axis."""
    predict = method.predict if predict is None else predict
    R = data.n_replicas
    t_max = data.x_eval.shape[1]
    width = getattr(method, "activation_width", lambda: max(method.model.sizes))()  # Method's; duck-typed: the MLP's
    per_sample = t_max * width                                      # largest activation of one sample
    chunk = max(1, max_elems // max(1, n_samples * per_sample))
    s_chunk = n_samples if chunk > 1 else max(1, min(n_samples, max_elems // max(1, per_sample)))
    with torch.no_grad():
        for lo in range(0, R, chunk):
            idx = torch.arange(lo, min(R, lo + chunk), device=data.data_index.device)
            u = data.data_index[idx]
            sub = state[idx]
            parts = [predict(sub, data.x_eval[u], min(s_chunk, n_samples - s), generator)
                     for s in range(0, n_samples, s_chunk)]
            f = torch.cat([p.f for p in parts], dim=1)
            tau = parts[0].noise_prec
            if tau is not None and tau.dim() == 2:
                tau = torch.cat([p.noise_prec for p in parts], dim=1)
            if task == "regression":
                ys, ym = data.y_std[u], data.y_mean[u]
                f = ym[:, None, None] + ys[:, None, None] * f[..., 0]
                tau = tau / (ys ** 2 if tau.dim() == 1 else ys[:, None] ** 2)
            yield u, f, tau, data.eval_mask[u]


def evaluate(method: Method, state: State, data: ReplicaData, n_samples: int, generator: torch.Generator,
             task: str, max_elems: int = 2 ** 24, predict=None) -> dict[str, torch.Tensor]:
    """Metrics ``[R]`` on each replica's evaluation set, in original target units (``_predictions``), from
    ``predict`` (``method.predict``, or as the ``compile`` setting runs it: ``method.compiled_predict()``)."""
    out: dict[str, list[torch.Tensor]] = {}
    for u, f, tau, mask in _predictions(method, state, data, n_samples, generator, task, max_elems, predict):
        if task == "regression":
            m = regression_metrics(f, tau, data.y_eval[u], mask)
        else:
            m = classification_metrics(f, data.y_eval[u], mask)
        for k, v in m.items():
            out.setdefault(k, []).append(v)
    return {k: torch.cat(v) for k, v in out.items()}


def predictive_moments(method: Method, state: State, data: ReplicaData, n_samples: int,
                       generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The regression predictive at each replica's evaluation rows, original units, ``[R, T]`` each: the mean
    E[f] = (1/S) sum_s f_s, the function's variance (1/S) sum_s (f_s - E[f])^2 and the noise variance
    (1/S) sum_s 1 / tau_s; Var[y*] is the sum of the two."""
    means, f_vars, noise_vars = [], [], []
    for _, f, tau, _ in _predictions(method, state, data, n_samples, generator, "regression"):
        noise_var = (1 / tau)[:, None] if tau.dim() == 1 else (1 / tau).mean(1)[:, None]
        means.append(f.mean(1))
        f_vars.append(f.var(1, unbiased=False))
        noise_vars.append(noise_var.expand(-1, f.shape[2]))
    return torch.cat(means), torch.cat(f_vars), torch.cat(noise_vars)


def _finite_state(state: State) -> torch.Tensor:
    """``[R]``: whether every floating-point entry of each replica's state is finite, by the largest magnitude of each
    tensor's replica (a NaN or an infinity makes it non-finite: ``amax`` propagates NaN), one pass over the state
    without a boolean tensor per entry (3x faster than ``isfinite(v).all``: 2.6 -> 0.9 ms for App. G's state, every
    epoch), the tensors by ``tree_leaves`` (``State.tensors``, which names them by path for messages, took a third
    of the check's time) and their maxima checked at once: 0.55 -> 0.34 ms (bench/epoch_overhead.py)."""
    amax = [v.reshape(v.shape[0], -1).abs().amax(1) for v in pytree.tree_leaves(state)
            if torch.is_tensor(v) and v.is_floating_point() and v.numel()]
    dtype = functools.reduce(torch.promote_types, (a.dtype for a in amax))
    return torch.isfinite(torch.stack([a.to(dtype) for a in amax])).all(0)


def train(method: Method, state: State, data: ReplicaData, *, epochs: int, batch_size: int,
          eval_samples: int, generator: torch.Generator, task: str, eval_every: int | None = None,
          stop_on_divergence: bool = True, progress: bool = False, desc: str = "",
          lr_drop: dict | None = None, checkpoint: Path | None = None,
          checkpoint_every: int = 10, checkpoint_seconds: float = 0.0, eval_samples_final: int | None = None,
          replica_offset: int = 0, augment: dict | None = None, last_batch: str | None = None,
          batch_order: str | None = None, announce_eta: bool = False, compile: bool = False) -> TrainResult:
    """Run ``epochs`` passes of ``method.update`` over every replica at once.

    After the last epoch's steps the state is ``method.posthoc``'s (Laplace: its curvature at the MAP estimate), checked
    for divergence like every epoch's. Evaluates
    every ``eval_every`` epochs (and at the end), recording the evaluation metrics and the
    mean training objective of the epoch; evaluation draws its samples from the same generator, so
    the evaluation schedule is part of a run's configuration; the last evaluation draws
    ``eval_samples_final`` samples when given (MNIST: 10 during training, 1000 at the end).
    ``lr_drop = {"at": a, "factor": f}``
    multiplies the method's step sizes by f from epoch ``a * epochs`` on (``update``'s ``lr_scale``). A
    replica whose objective or state becomes non-finite is marked diverged; with
    ``stop_on_divergence`` training stops with ``DivergenceError`` naming the replicas and the epoch.

    With ``checkpoint`` (a file path), the state, the generator's state, the history and the epoch
    are saved every ``checkpoint_every`` epochs once ``checkpoint_seconds`` have passed since the last save (or the
    start), and a run that finds the file resumes from it: the result is the same as without the interruption. The
    caller removes the file when done.
    ``replica_offset`` numbers the replicas in messages (a chunk of a larger run, ``replica_workers``).
    ``augment = {"image_shape", "crop_pad", "flip"}`` crops and flips every training minibatch (``augment.crop_flip``,
    from the same generator). ``last_batch``, ``batch_order``: ``epoch_batches``. ``announce_eta``: print an estimate of
    the time left after the first epochs when it is long (``EtaNotice``). ``compile``: each step through
    ``torch.compile`` (``bnnbench.run.compiled.compiled_update``: a ``compilable`` method's; the compilation counts in
    the wall time).
    """
    history = History()
    R = data.n_replicas
    diverged = torch.zeros(R, dtype=torch.bool, device=data.data_index.device)
    steps, start, elapsed = 0, 0, 0.0
    if checkpoint is not None and Path(checkpoint).exists():
        ck = torch.load(checkpoint, map_location=data.x_train.device, weights_only=False)
        state, start, steps, elapsed = ck["state"], ck["epoch"], ck["steps"], ck["elapsed"]
        history = History(ck["history"]["epochs"], ck["history"]["metrics"])
        diverged = ck["diverged"]
        generator.set_state(ck["generator"].cpu())   # map_location moved it; a generator's state is a CPU tensor
    t0 = time.perf_counter() - elapsed
    saved = time.perf_counter()   # the last checkpoint's time (``checkpoint_seconds``)
    bar = tqdm(range(start, epochs), desc=desc or method.name, disable=None if progress else True, leave=False,
               initial=start, total=epochs)
    lr_scale = 1.0
    update = compiled_update(method, data.x_train.device) if compile else method.update
    predict = method.compiled_predict() if compile else method.predict
    eta = EtaNotice(announce_eta, skip_first=update != method.update)   # a bound method: == compares its function
    for epoch in bar:
        if lr_drop and epoch >= float(lr_drop["at"]) * epochs:
            lr_scale = float(lr_drop["factor"])
        obj_sum = torch.zeros(R, device=data.data_index.device, dtype=data.x_train.dtype)
        n_batches = 0
        for rows in epoch_batches(data, batch_size, generator, last_batch, batch_order):
            batch = make_batch(data, rows)
            if augment:
                batch.x = crop_flip(batch.x, augment["image_shape"], augment["crop_pad"], augment["flip"], generator)
            try:
                state, stats = update(state, batch, generator, lr_scale)
            except torch.linalg.LinAlgError as e:   # a precision that lost positive definiteness
                if not stop_on_divergence:
                    raise
                raise DivergenceError(f"{method.name} diverged at epoch {epoch + 1}: {e}") from e
            obj_sum += stats["objective"]
            n_batches += 1
            steps += 1
        last = epoch == epochs - 1
        if last:
            state = method.posthoc(state, data)
        bad = ~torch.isfinite(obj_sum) | ~_finite_state(state)
        if bad.any():
            newly = bad & ~diverged
            diverged |= bad
            if stop_on_divergence:
                raise DivergenceError(
                    f"{method.name} diverged at epoch {epoch + 1}: non-finite objective or state in "
                    f"replica(s) {(newly.nonzero().flatten() + replica_offset).tolist()}")
        eta.epoch_done(epoch + 1 - start, epochs - epoch - 1)
        if last or (eval_every and (epoch + 1) % eval_every == 0):
            m = evaluate(method, state, data, eval_samples_final if last and eval_samples_final else eval_samples,
                         generator, task, predict=predict)
            m["train_objective"] = obj_sum / max(1, n_batches)
            kl = method.kl(state)
            if kl is not None:  # negative ELBO per data point: the epoch's mean NLL + KL(q || p) / N
                m["train_objective"] = m["train_objective"] + kl / data.n_train[data.data_index].to(kl.dtype)
            history.append(epoch + 1, m)
        if (checkpoint is not None and not last and (epoch + 1) % checkpoint_every == 0
                and time.perf_counter() - saved >= checkpoint_seconds):
            saved = time.perf_counter()
            results.save_checkpoint(checkpoint, {"state": state, "epoch": epoch + 1, "steps": steps,
                                         "elapsed": time.perf_counter() - t0, "history": history.to_dict(),
                                         "diverged": diverged, "generator": generator.get_state()})
    final = {k: torch.tensor(v) for k, v in history.metrics[-1].items()} if history.metrics else {}
    return TrainResult(state, history, final, time.perf_counter() - t0, steps, diverged, method,
                       resumed_s=elapsed)
