"""One batched program: a method fitted on many replicas at once, each with its own rows and hyper-parameters.

``program`` builds the network and the method for a run's settings, the per-replica data (``engine.ReplicaData``)
and the ``Problem`` a method sees; ``fit`` hands them to ``engine.train`` (a stepped method), ``solve_replicas`` to
``Method.solve`` (a solved one). Both run in this process; ``replica_workers`` splits the replica axis over
processes around ``fit``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bnnbench.core import prng
from bnnbench.run.engine import History, ReplicaData, TrainResult, predictive_moments, train
from bnnbench.methods import Method, Problem, method_class
from bnnbench.methods.base import hyper_state
from bnnbench.core.models import MLP
from bnnbench.core.models.convnet import ConvNet
from bnnbench.run.protocol import RunSpec


@dataclass(frozen=True)
class FitOptions:
    """How one program trains, beyond the protocol's settings (``None``: the protocol's value)."""
    device: torch.device
    dtype: torch.dtype
    epochs: int | None = None
    eval_every: int | None = None          # epochs between evaluations kept in the history
    eval_samples: int | None = None
    eval_samples_final: int | None = None  # posterior samples of the last evaluation
    stop_on_divergence: bool = True        # False: mark diverged replicas and go on (hyper-parameter search)
    checkpoint: Path | None = None         # resume file of this program
    checkpoint_every: int = 10             # epochs between checkpoints,
    checkpoint_seconds: float = 60.0       # and seconds at least (engine.train)
    progress: bool = False
    desc: str = ""
    replica_offset: int = 0                # the first replica's number in messages (a chunk of a larger program)
    announce_eta: bool = False             # print the estimated time of a long training after its first epochs
    compile: bool = False                  # the step through torch.compile (bnnbench.run.compiled; compilable methods)
    rng: str = "torch"                     # the draws' generator (bnnbench.core.prng: torch or philox)


def build_method(spec: RunSpec, ds):
    """The network and the method object of ``spec`` for data set ``ds``."""
    out_dim = 1 if spec.task != "multiclass" else int(ds.n_classes)
    if spec.conv:
        model = ConvNet(image_shape(ds), spec.conv["arch"], out_dim, fc=spec.conv["fc"],
                        batch_norm=spec.conv["batch_norm"], kernel=spec.conv["kernel"])
    else:
        model = MLP([int(np.prod(ds.X.shape[1:])), *spec.model_hidden, out_dim], spec.activation,
                    input_shape=image_shape(ds))
    return method_class(spec.method.name)(spec.method, model, spec.likelihood)


def image_shape(ds) -> list[int]:
    """(C, H, W) of an image data set's inputs (MNIST's (28, 28) as one channel); empty for tabular data."""
    shape = list(ds.X.shape[1:]) if ds.X.ndim == 4 else list((getattr(ds, "meta", None) or {}).get("image_shape", []))
    return [1, *shape] if len(shape) == 2 else [int(s) for s in shape]


def make_problem(spec: RunSpec, model: MLP, data: ReplicaData, hparams: list[dict]) -> Problem:
    """Per-replica hyper-parameters -> the ``Problem`` a method sees (training units)."""
    dev, dt = data.x_train.device, data.x_train.dtype
    R = data.n_replicas
    lam = torch.tensor([h.get("prior_prec", 1.0) for h in hparams], device=dev, dtype=dt)
    prior = lam[:, None].expand(R, model.n_params).clone()
    if spec.bias_prior_prec is not None:
        prior[:, model.bias_mask(dev)] = float(spec.bias_prior_prec)
    if spec.prior_scaling == "fan_in":
        prior = prior * (model.fan_in(dev, dt) + 1)
    noise = y_scale = None
    if spec.likelihood == "gaussian":
        y_scale = data.replica("y_std")
        tau = torch.tensor([h["noise_prec"] for h in hparams], device=dev, dtype=dt)
        noise = tau * y_scale ** 2 if spec.noise_prec_units == "original" else tau
    own = {k: torch.tensor([h[k] for h in hparams], device=dev, dtype=dt)
           for k in method_class(spec.method.name).replica_hparams if k in hparams[0]}
    return Problem(likelihood=spec.likelihood, n_data=data.n_train[data.data_index], prior_prec=prior,
                   noise_prec=noise, y_scale=y_scale, hparams=own)


def program(spec: RunSpec, ds, pairs, data_index, hparams, opts: FitOptions) -> tuple[Method, ReplicaData, Problem]:
    """The method, data and problem of one batched program: replica r fits ``pairs[data_index[r]]`` with
    ``hparams[r]``. A solved method's data are float64 whatever ``opts.dtype``: its solutions are fitted, cached
    and compared in float64; so are those of a method that asks for it (``Method.float64``: PBP)."""
    method = build_method(spec, ds)
    data = replica_data(spec, ds, pairs, data_index, opts.device, data_dtype(method, opts.dtype))
    return method, data, make_problem(spec, method.model, data, hparams)


def data_dtype(method: Method, dtype: torch.dtype) -> torch.dtype:
    """float64 for a solved method and one that asks for it (``Method.float64``), else the run's ``dtype``."""
    return torch.float64 if method.solved or method.float64 else dtype


def replica_data(spec: RunSpec, ds, pairs, data_index, device, dtype) -> ReplicaData:
    """The per-replica training and evaluation sets of ``pairs`` under the protocol's standardisation."""
    return ReplicaData.build(ds.X, ds.y, pairs, data_index, spec.normalize_x,
                             spec.normalize_y and spec.task == "regression", device=device, dtype=dtype)


def fit(spec: RunSpec, ds, pairs, data_index, hparams, generator, opts: FitOptions,
        init_state=None) -> TrainResult:
    """Train one batched program (``program``) in this process. ``init_state`` continues a trained state (a later
    stage) with this data's sizes and priors."""
    method, data, problem = program(spec, ds, pairs, data_index, hparams, opts)
    epochs = opts.epochs or spec.epochs_for(int(data.n_train.max()))
    # a full-batch method (HMC) takes each training set whole: a protocol batch at least that large is one batch
    batch_size = min(spec.batch_size, int(data.n_train.max())) if method.full_batch else spec.batch_size
    with prng.mode(opts.rng):
        state = method.init(problem, generator) if init_state is None else init_state.replace(**hyper_state(problem))
        return train(method, state, data, epochs=epochs, batch_size=batch_size,
                     lr_drop=spec.lr_drop, eval_samples=opts.eval_samples or spec.eval_samples,
                     eval_samples_final=opts.eval_samples_final, generator=generator, task=spec.task,
                     eval_every=opts.eval_every, stop_on_divergence=opts.stop_on_divergence, progress=opts.progress,
                     desc=opts.desc, checkpoint=opts.checkpoint, checkpoint_every=opts.checkpoint_every,
                     checkpoint_seconds=opts.checkpoint_seconds,
                     replica_offset=opts.replica_offset,
                     augment={"image_shape": image_shape(ds), **spec.augment} if spec.augment else None,
                     last_batch=spec.last_batch, batch_order=spec.batch_order, announce_eta=opts.announce_eta,
                     compile=opts.compile)


def solve_replicas(spec: RunSpec, ds, pairs, data_index, hparams, opts: FitOptions) -> TrainResult:
    """Solve one batched program (``program``) of a solved method once, to the protocol's ``exact_gtol``: no
    training loop and no evaluation, so the result holds the fitted state, no history or metrics, no steps, and
    the solver's report (``solve_info``)."""
    method, data, problem = program(spec, ds, pairs, data_index, hparams, opts)
    t0 = time.perf_counter()
    state, info = method.solve(problem, data, gtol=spec.exact_gtol or 1e-6)
    return TrainResult(state, History(), {}, time.perf_counter() - t0, 0,
                       torch.zeros(data.n_replicas, dtype=torch.bool, device=data.data_index.device), method,
                       solve_info=info)


def predictive(spec: RunSpec, ds, pairs, res: TrainResult, opts: FitOptions, generator) -> dict:
    """Each split's regression predictive at its test rows (``engine.predictive_moments``, original units) with the
    rows' inputs and targets: arrays ``mean, var_f, noise_var, y [R, T]``, ``x [R, T, D]`` and ``n_test [R]`` (rows
    past a split's ``n_test`` are padding)."""
    data = replica_data(spec, ds, pairs, list(range(len(pairs))), opts.device, data_dtype(res.method, opts.dtype))
    with prng.mode(opts.rng):
        mean, var_f, noise_var = predictive_moments(res.method, res.state, data,
                                                    spec.eval_samples_final or spec.eval_samples, generator)
    x = torch.nn.utils.rnn.pad_sequence([torch.as_tensor(ds.X[te]) for _, te in pairs], batch_first=True)
    y = torch.nn.utils.rnn.pad_sequence([torch.as_tensor(ds.y[te]) for _, te in pairs], batch_first=True)
    return {"mean": mean.cpu().numpy(), "var_f": var_f.cpu().numpy(), "noise_var": noise_var.cpu().numpy(),
            "x": x.numpy(), "y": y.numpy(),
            "n_test": np.array([len(te) for _, te in pairs])}
