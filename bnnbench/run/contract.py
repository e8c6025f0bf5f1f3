"""The contract every method keeps, checked on a tiny problem before any long run (``bnnbench check-method <name>``).

A method of the suite or of another package (an entry point, ``bnnbench.methods``) must, in float64 on a 4-6-1 ReLU
network with three replicas:

* have a typed ``Config`` whose every setting has a default (Hydra composes ``method=<name>`` from it);
* declare its state as a typed ``State`` (a ``@state_class`` subclass of ``bnnbench.methods.State``), not a dict;
* keep its state finite through a few steps, with a finite objective (solved methods: a finite solution), its
  tensors values, not the step's autograd graph;
* not modify the state it is given (``step`` returns a new state: the engine keeps the old one for checkpoints);
* be replica-invariant: a replica's step equals its step alone, on the same minibatch and noise (every run trains
  all splits or candidates as one batched program, so a leak between replicas corrupts every table);
* predict finite outputs of shape [R, S, T, d_out] (S = 1 for a point estimate).

``check_compiled`` checks a ``compilable`` method's compiled step (the ``compile`` setting) against its eager step
(tests/run/test_contract.py; not part of ``check-method``: a compilation takes seconds to a minute), and
``compiled_graph_breaks`` counts where dynamo splits a step into several graphs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import MISSING, fields, is_dataclass

import numpy as np
import torch
from omegaconf import OmegaConf

from bnnbench.methods import Batch, Problem, State, method_class
from bnnbench.core.models import MLP

DT = torch.float64
R = 3


def slice_noise(noise, r):
    """Replica r's part of a step's draws (a tensor, or a list / tuple of them, or None), replica axis kept."""
    if noise is None:
        return None
    if isinstance(noise, (list, tuple)):
        return type(noise)(slice_noise(n, r) for n in noise)
    return noise[r:r + 1]


def _finite(state) -> list[str]:
    return [k for k, v in state.tensors().items() if v.is_floating_point() and not torch.isfinite(v).all()]


def _typed(state) -> str | None:
    return None if isinstance(state, State) else (
        f"the state is a {type(state).__name__}: declare a methods.State subclass with @state_class")


def _problem(likelihood: str, model: MLP, g: torch.Generator, dtype=DT, hparams: Mapping = (), R: int = R) -> Problem:
    """A tiny problem of R replicas with their own precisions and, for each per-replica hyper-parameter the method
    declares (``Method.replica_hparams``: name -> its range), R values drawn from that range."""
    prior = (torch.rand(R, 1, generator=g, dtype=dtype) + 0.5).expand(R, model.n_params).clone()
    gauss = likelihood == "gaussian"
    return Problem(likelihood, n_data=torch.tensor([40, 37, 40] * R)[:R], prior_prec=prior,
                   noise_prec=torch.rand(R, generator=g, dtype=dtype) + 0.5 if gauss else None,
                   y_scale=torch.rand(R, generator=g, dtype=dtype) + 0.5 if gauss else None,
                   hparams={k: lo + (hi - lo) * torch.rand(R, generator=g, dtype=dtype)
                            for k, (lo, hi) in dict(hparams).items()})


def check_method(name: str, steps: int = 3) -> list[tuple[str, str | None]]:
    """``[(check, None if it passed else why)]`` for the method ``name``."""
    cls = method_class(name)
    out: list[tuple[str, str | None]] = []
    cfg_ok = is_dataclass(cls.Config) and all(f.default is not MISSING or f.default_factory is not MISSING
                                              for f in fields(cls.Config))
    out.append(("typed Config with a default for every setting",
                None if cfg_ok else f"{cls.__name__}.Config must be a dataclass whose fields all have defaults"))
    if not cfg_ok:
        return out
    g = torch.Generator().manual_seed(0)
    model = MLP([4, 1] if cls.solved else [4, 6, 1])   # solved methods: Bayesian logistic regression
    cfg = OmegaConf.structured(cls.Config)
    method = likelihood = state = None
    why = ""
    for lik in ("bernoulli",) if cls.solved else ("gaussian", "bernoulli"):
        try:
            method = cls(cfg, model, lik)
            if cls.solved:
                break
            state = method.init(_problem(lik, model, g, hparams=cls.replica_hparams), g)
            likelihood = lik
            break
        except (ValueError, NotImplementedError) as e:
            why = f"{type(e).__name__}: {e}"
    if method is None or (state is None and not cls.solved):
        out.append(("init on a tiny regression or classification problem", why))
        return out
    if cls.solved:
        return out + _check_solved(method)
    out.append(("a typed state (a methods.State)", _typed(state)))
    if out[-1][1]:
        return out
    x = torch.randn(R, 5 if not method.full_batch else int(state.n_data.max()), 4, generator=g, dtype=DT)
    y = (torch.randn(R, x.shape[1], generator=g, dtype=DT) if likelihood == "gaussian"
         else (torch.rand(R, x.shape[1], generator=g) < 0.5).to(DT))
    batch = Batch(x, y, state.n_data)
    finite = unchanged = invariant = None
    for _ in range(steps):
        noise = method.noise(state, batch, g)
        before = state.map(torch.clone).tensors()
        new, stats = method.step(state, batch, noise)
        if unchanged is None:
            moved = [k for k, v in state.tensors().items() if not torch.equal(before[k], v)]
            unchanged = f"step modified the given state's {moved}" if moved else ""
        bad = _finite(new) + ([] if torch.isfinite(stats["objective"]).all() else ["objective"])
        finite = finite or (f"non-finite {bad} after a step" if bad else "")
        for r in range(R):
            alone, st = method.step(state[r], Batch(x[r:r + 1], y[r:r + 1], batch.n_data[r:r + 1]),
                                    slice_noise(noise, r))
            alone = alone.tensors()
            differ = [k for k, v in new.tensors().items() if not torch.allclose(
                v[r:r + 1], alone[k], rtol=1e-10, atol=1e-12, equal_nan=True)]
            if differ and not invariant:
                invariant = f"replica {r}'s step differs from its step alone in {differ}"
        state = new
    held = [k for k, v in state.tensors().items() if v.requires_grad]
    out.append(("the new state holds values, not the step's autograd graph",
                f"state entries {held} require grad (each step's graph would hang on the next)" if held else None))
    out.append(("finite state and objective through a few steps", finite or None))
    out.append(("the given state is not modified", unchanged or None))
    out.append(("replica invariance (a replica's step equals its step alone)", invariant or None))
    out.append(("finite predictions of shape [R, S, T, 1]", _check_predict(method, state, g)))
    return out


# a compiled step against the eager one: relative to each state tensor's largest entry
COMPILED_RTOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def check_compiled(name: str, dtype: torch.dtype = DT, steps: int = 3, settings: dict | None = None, R: int = R,
                   rows: int = 5, sizes: tuple = (4, 6, 1)) -> str | None:
    """None where ``name``'s compiled step (the ``compile`` setting: ``bnnbench.run.compiled``) equals its eager step
    to float rounding (``COMPILED_RTOL`` of each new state tensor's largest entry, a ``sign_free`` factor F through
    F F^T; integer tensors exactly) from the same state, minibatch and draws, at each of ``steps`` steps on the
    4-6-1 problem of ``check_method`` (or an MLP of other ``sizes``; ``R`` replicas, minibatches of ``rows``), with the
    method's default settings updated by ``settings``; else why. Also None for a method that is not ``compilable``
    (the setting leaves its step eager) or is solved."""
    from bnnbench.run.compiled import compiled_step, compiles
    cls = method_class(name)
    if cls.solved or not compiles(cls, True):
        return None
    g = torch.Generator().manual_seed(0)
    method, state, batch = _tiny_step(cls, dtype, settings, g, R, rows, sizes)
    if method is None:
        return "no tiny regression or classification problem to compare on"
    step, rtol = compiled_step(method), COMPILED_RTOL[dtype]
    for k in range(steps):
        with contextlib.nullcontext() if method.needs_autograd else torch.inference_mode():
            noise = method.noise(state, batch, g)
            eager, _ = method.step(state, batch, noise)
            try:
                comp, _ = step(state, batch, noise)
            except Exception as e:   # a user's method: any failure is reported, not raised
                return f"the compiled step raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        worst = {}
        comp = comp.tensors()
        for key, v in eager.tensors().items():
            c = comp[key]
            if key in method.sign_free:   # eigenvector columns: equal up to sign, so compare F F^T
                c, v = c @ c.transpose(-1, -2), v @ v.transpose(-1, -2)
            if not v.is_floating_point():
                if not torch.equal(c, v):
                    worst[key] = float("inf")
                continue
            both = torch.isnan(c) & torch.isnan(v)   # unfilled entries (NaN) must be NaN in both
            d, v = torch.where(both, 0, c - v), torch.where(both, 0, v)
            err = float(d.abs().max() / v.abs().max().clamp_min(torch.finfo(v.dtype).tiny)) if v.numel() else 0.0
            if not err <= rtol:
                worst[key] = err
        if worst:
            return (f"step {k + 1}: the compiled step differs from the eager one (max relative difference "
                    + ", ".join(f"{key} {e:.1e}" for key, e in worst.items()) + f"; tolerance {rtol:.0e})")
        state = eager
    return None


def _tiny_step(cls, dtype, settings, g, R: int = R, rows: int = 5, sizes: tuple = (4, 6, 1)):
    """``cls`` with its default settings updated by ``settings``, its initial state and a minibatch of ``rows`` of the
    4-6-1 problem of ``check_method`` (an MLP of ``sizes``; regression, else classification) for ``R`` replicas;
    (None, None, None) where it takes neither."""
    model = MLP(list(sizes))
    for lik in ("gaussian", "bernoulli"):
        try:
            method = cls(OmegaConf.merge(OmegaConf.structured(cls.Config), settings or {}), model, lik)
            state = method.init(_problem(lik, model, g, dtype, cls.replica_hparams, R), g)
            break
        except (ValueError, NotImplementedError):
            continue
    else:
        return None, None, None
    x = torch.randn(R, rows if not method.full_batch else int(state.n_data.max()), sizes[0], generator=g, dtype=dtype)
    y = (torch.randn(R, x.shape[1], generator=g, dtype=dtype) if lik == "gaussian"
         else (torch.rand(R, x.shape[1], generator=g) < 0.5).to(dtype))
    return method, state, Batch(x, y, state.n_data)


def compiled_graph_breaks(name: str, dtype: torch.dtype = torch.float32, settings: dict | None = None,
                          rows: int = 5) -> int:
    """How often dynamo breaks ``name``'s step (``Method.compiled_step``, as the ``compile`` setting traces it) on the
    problem of ``check_compiled`` (minibatches of ``rows``): 0 where the step compiles into one graph. A break runs the
    code around it eagerly and splits the compiled kernels (a ``functools.cached_property`` read in ``MLP.layers`` once
    made BBB's compiled step 1.4-5x slower), so a method meant to compile whole is checked for none
    (tests/run/test_contract.py)."""
    import torch._dynamo
    from bnnbench.run.compiled import graph_lr_scale
    g = torch.Generator().manual_seed(0)
    method, state, batch = _tiny_step(method_class(name), dtype, settings, g, rows=rows)
    if method is None:
        raise ValueError(f"{name}: no tiny regression or classification problem to trace its step on")
    with contextlib.nullcontext() if method.needs_autograd else torch.inference_mode():
        noise = method.noise(state, batch, g)
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            step = method.compiled_step(lambda f: f)   # what the setting hands to torch.compile
            return torch._dynamo.explain(step)(state, batch, noise, graph_lr_scale(1.0)).graph_break_count


def _check_predict(method, state, g) -> str | None:
    xt = torch.randn(R, 7, 4, generator=g, dtype=DT)
    try:
        f = method.predict(state, xt, 2, g).f
    except Exception as e:   # a user's method: any failure is reported, not raised
        return f"predict raised {type(e).__name__}: {e}"
    if f.dim() != 4 or f.shape[0] != R or f.shape[1] not in (1, 2) or tuple(f.shape[2:]) != (7, 1):
        return f"predict gave f of shape {tuple(f.shape)}, expected {(R, 2, 7, 1)} (S = 1 for a point estimate)"
    return None if torch.isfinite(f).all() else "predict gave non-finite outputs"


def _check_solved(method) -> list[tuple[str, str | None]]:
    from bnnbench.run.engine import ReplicaData
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 4))
    y = (rng.random(50) < 1 / (1 + np.exp(-X @ [1.0, -2.0, 0.5, 0.0]))).astype(float)
    data = ReplicaData.build(X, y, [(np.arange(0, 30), np.arange(30, 50))], data_index=[0] * R, normalize_x=False,
                             normalize_y=False, dtype=DT)
    prior = torch.tensor([[0.5], [1.0], [3.0]], dtype=DT).expand(R, method.model.n_params).clone()
    try:
        state, _ = method.solve(Problem("bernoulli", data.n_train[data.data_index], prior), data, gtol=1e-8)
    except Exception as e:   # a user's method: any failure is reported, not raised
        return [("solve a tiny logistic regression", f"{type(e).__name__}: {e}")]
    if typed := _typed(state):
        return [("solve a tiny logistic regression", typed)]
    bad = _finite(state)
    predicted = _check_predict(method, state, torch.Generator().manual_seed(1))
    return [("solve a tiny logistic regression", f"non-finite {bad}" if bad else None),
            ("finite predictions of shape [R, S, T, 1]", predicted)]
