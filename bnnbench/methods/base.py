"""The one method interface (docs/design.md): ``init``, ``update`` (= ``noise`` then ``step``), ``predict``.

A method is bound to a model and a likelihood, like an optimiser is bound to parameters. Its state is
a plain ``dict`` of tensors that all carry the replica axis first, so any replica (split, seed, fold,
hyper-parameter candidate) can be sliced out and stepped alone. Hyper-parameters that differ between
replicas (prior and noise precisions, dropout rates) live in the state too.

``step`` is a pure function of (state, batch, noise): the random draws of an update are made by
``noise`` from a generator, so tests can replay exactly the same update on one replica alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf

from bnnbench.likelihoods import Bernoulli, Categorical, Gaussian

State = dict  # str -> Tensor with leading replica axis


@dataclass
class Batch:
    x: torch.Tensor       # [R, B, D] (inputs normalised as the protocol says)
    y: torch.Tensor       # [R, B]
    n_data: torch.Tensor  # [R] training-set size N of each replica


@dataclass
class Predictive:
    f: torch.Tensor                        # [R, S, T, d_out] per-sample network outputs
    noise_prec: torch.Tensor | None = None  # [R] or [R, S] Gaussian noise precision (regression)


@dataclass
class Problem:
    """What a method needs to know about the data: the likelihood and per-replica hyper-parameters."""
    likelihood: str                 # "gaussian" | "bernoulli" | "categorical"
    n_data: torch.Tensor            # [R]
    prior_prec: torch.Tensor        # [R, P] per-parameter prior precision lambda
    noise_prec: torch.Tensor | None = None  # [R] Gaussian noise precision in the training (normalised) units
    y_scale: torch.Tensor | None = None     # [R] std of the training targets (regression): tau_orig = tau / y_scale^2
    dropout: torch.Tensor | None = None     # [R] (MC dropout only)

    @property
    def n_replicas(self) -> int:
        return int(self.n_data.shape[0])


def likelihood_of(state: State, kind: str):
    if kind == "gaussian":
        return Gaussian(state["noise_prec"])
    if kind == "bernoulli":
        return Bernoulli()
    if kind == "categorical":
        return Categorical()
    raise ValueError(f"unknown likelihood {kind!r}; valid: gaussian, bernoulli, categorical")


def hyper_state(problem: Problem) -> State:
    state = {"n_data": problem.n_data, "prior_prec": problem.prior_prec}
    if problem.noise_prec is not None:
        state["noise_prec"] = problem.noise_prec
    if problem.y_scale is not None:
        state["y_scale"] = problem.y_scale
    if problem.dropout is not None:
        state["dropout"] = problem.dropout
    return state


class Settings(dict):
    """A method's hyper-parameters as a plain mapping read by attribute (``cfg.lr``, ``cfg.get("momentum", 0)``).
    Reading an OmegaConf node costs several microseconds, and a step at UCI scale reads dozens of settings in about
    2 ms."""

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"method setting {key!r} is not configured") from None


class Method:
    """Base class: subclasses define ``init``, ``noise``, ``step`` and ``predict``."""

    name = "method"
    lr_scale = 1.0  # set by the engine's learning-rate schedule
    # False where ``step`` builds no autograd graph: ``update`` then runs in inference mode (~10% less per-op
    # overhead at UCI scale), and the state it returns holds inference tensors
    needs_autograd = True

    def __init__(self, cfg, model, likelihood: str):
        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
        self.cfg = Settings(cfg) if isinstance(cfg, Mapping) else cfg
        self.model = model
        self.likelihood = likelihood

    def init(self, problem: Problem, generator: torch.Generator) -> State:
        raise NotImplementedError

    def noise(self, state: State, batch: Batch, generator: torch.Generator):
        raise NotImplementedError

    def step(self, state: State, batch: Batch, noise) -> tuple[State, dict]:
        raise NotImplementedError

    def update(self, state: State, batch: Batch, generator: torch.Generator) -> tuple[State, dict]:
        if self.needs_autograd:
            return self.step(state, batch, self.noise(state, batch, generator))
        with torch.inference_mode():
            return self.step(state, batch, self.noise(state, batch, generator))

    def predict(self, state: State, x: torch.Tensor, n_samples: int,
                generator: torch.Generator) -> Predictive:
        raise NotImplementedError

    def kl(self, state: State) -> torch.Tensor | None:
        """KL(q || p) per replica ``[R]`` for methods whose step objective is the data term only (the
        engine then records ``mean NLL over the epoch + KL / N`` as the training objective when it
        evaluates); ``None`` where the step's objective already is the full one."""
        return None

    def gaussian(self, state: State) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian q(theta) = N(mean, cov) per replica as dense ``(mean [R, P], cov [R, P, P])``,
        for methods whose posterior is Gaussian (small models: logistic regression, SLANG Table 1)."""
        raise NotImplementedError(f"{self.name} has no Gaussian posterior to report")

    def _predictive(self, state: State, f: torch.Tensor) -> Predictive:
        return Predictive(f=f, noise_prec=state.get("noise_prec"))

    def nll(self, state: State, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``-(1/S) sum_s mean_b log p(y_b | f_s)``, per replica ``[R]``."""
        return -likelihood_of(state, self.likelihood).log_prob(f, y).mean(dim=(1, 2))


def slice_state(state: State, index) -> State:
    """The replicas ``index`` (an int keeps the axis) of every tensor in ``state``."""
    if isinstance(index, int):
        index = slice(index, index + 1)
    return {k: v[index] for k, v in state.items()}


def adam(param, grad, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8):
    """One Adam step (Kingma & Ba 2015) with bias correction; ``t`` is the step count ``[R]`` after
    increment. Elementwise, so each replica's step is exactly its own Adam step."""
    b1, b2 = betas
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    tt = t.to(param.dtype).reshape(-1, *([1] * (param.dim() - 1)))
    m_hat = m / (1 - b1 ** tt)
    v_hat = v / (1 - b2 ** tt)
    return param - lr * m_hat / (v_hat.sqrt() + eps), m, v
