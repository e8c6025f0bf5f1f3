"""The one method interface (docs/design.md): ``init``, ``update`` (= ``noise`` then ``step``), ``predict``, and
``posthoc`` after the last step where a method builds something once (Laplace); or, for a method that is solved rather
than stepped (``solved = True``), ``solve`` in place of ``init`` and ``update``.

A method is bound to a model and a likelihood, like an optimiser is bound to parameters. Its state is a typed
``State`` (``methods/state.py``: a frozen dataclass of tensors that all carry the replica axis first), so any replica
(split, seed, fold, hyper-parameter candidate) can be sliced out (``state[r]``) and stepped alone. Hyper-parameters
that differ between replicas (prior and noise precisions, and those a method declares in ``replica_hparams``, e.g. MC
dropout's rates, as fields of its state class) live in the state too.

``step`` is a pure function of (state, batch, noise, lr_scale): the random draws of an update are made by
``noise`` from a generator, so tests can replay exactly the same update on one replica alone; ``lr_scale``
multiplies the step sizes (the engine's learning-rate schedule). ``solve`` fits every replica on its own training
rows at once (exact VI: L-BFGS on the exact ELBO), so a replica's solution is its solve alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from bnnbench.core import prng
from bnnbench.core.likelihoods import Bernoulli, Categorical, Gaussian
from bnnbench.methods import gamma_noise
from bnnbench.methods.settings import MethodConfig
from bnnbench.methods.state import State


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
    hparams: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [R]: the method's ``replica_hparams``

    @property
    def n_replicas(self) -> int:
        return int(self.n_data.shape[0])


def likelihood_of(state: State, kind: str):
    if kind == "gaussian":
        return Gaussian(state.noise_prec)
    if kind == "bernoulli":
        return Bernoulli()
    if kind == "categorical":
        return Categorical()
    raise ValueError(f"unknown likelihood {kind!r}; valid: gaussian, bernoulli, categorical")


def hyper_state(problem: Problem) -> dict[str, torch.Tensor]:
    """The fields of ``State`` (and a method's ``replica_hparams`` fields) that ``problem`` sets: a method's ``init``
    builds its state class from them and its own tensors, ``MyState(**hyper_state(problem), mean=...)``; a trained
    state continues on a new problem as ``state.replace(**hyper_state(problem))``."""
    fields = {"n_data": problem.n_data, "prior_prec": problem.prior_prec, "noise_prec": problem.noise_prec,
              "y_scale": problem.y_scale, **problem.hparams}
    return {k: v for k, v in fields.items() if v is not None}


class Method:
    """Base class: subclasses define ``init``, ``noise``, ``step`` and ``predict`` (solved methods: ``solve``
    and ``predict``)."""

    name = "method"
    label: str | None = None   # how tables and figures name it where an experiment does not (None: ``name``)
    Config = MethodConfig
    # per-replica hyper-parameters the method reads from its state besides the prior and noise precisions, with the
    # range of their valid values: each a ``Problem.hparams`` entry ``[R]`` (``fit.make_problem`` builds them from
    # the replicas' hyper-parameters; the contract checks draw them from the range)
    replica_hparams: Mapping[str, tuple[float, float]] = MappingProxyType({})
    solved = False  # True: the harness calls ``solve`` once instead of ``update`` in a training loop
    # True: the run's data and state are float64 whatever its ``dtype`` (solved methods are, always)
    float64 = False
    # False where ``step`` builds no autograd graph: ``update`` then runs in inference mode (~10% less per-op
    # overhead at UCI scale), and the state it returns holds inference tensors
    needs_autograd = True
    # True where the step's ``objective`` is the negative ELBO per data point: the record then keeps each split's
    # final ELBO (``elbo``, the last epoch's mean estimate, normalised units), by which a paper may select settings
    objective_is_elbo = False
    # True where ``step`` needs each replica's whole training set in one batch (HMC's full-batch gradients): the run
    # then checks that protocol.batch_size covers the largest training set
    full_batch = False
    # True where the method runs on a convolutional network (``models/convnet.py``: the MLP's flat layout, the
    # positions of a convolution as extra rows of its ``forward_cache``); the others are refused on one
    conv = False
    # True where ``step`` (or what ``compiled_step`` compiles) compiles with ``torch.compile`` to the eager step's
    # numbers up to float rounding (``bnnbench.run.compiled``, the run's ``compile`` setting; tests/run/test_contract.py
    # checks it): no data-dependent branch, and a host library call only in a function the compiler is told to skip
    compilable = False
    # True where the compiled step, on a CPU, runs its kernels from a C++ wrapper (inductor's ``cpp_wrapper``: the same
    # kernels, so the same numbers) instead of a Python one: pays where a compiled graph launches many tiny kernels,
    # as HMC's trajectory of L leapfrog steps does (1.5x at NNG Table 4's net, bench/hmc_numpyro.py), at a few seconds
    # more of compiling
    compile_cpp_wrapper = False
    # ``torch.compile``'s ``dynamic`` for this method's step: False (one graph per shape, static kernels) by default;
    # None (dynamo's automatic dynamic shapes) for a full-batch step whose training set grows a row per fit in one
    # process (HMC under active learning, NNG Table 3): it then compiles twice in all, not once per round
    compile_dynamic: bool | None = False
    # state fields whose columns are eigenvectors, defined up to sign (SLANG's U): compared through F F^T wherever two
    # computations of one state are compared (a compiled step against the eager one)
    sign_free = ()
    # optional ``diagnostics(state, data: engine.ReplicaData) -> dict``: what the method reports about its final
    # state (HMC: acceptance, R-hat, ESS), stored under the record's "diagnostics"
    diagnostics = None

    def __init__(self, cfg, model, likelihood: str):
        self.cfg = self.Config.of(cfg)
        self.model = model
        self.likelihood = likelihood

    @classmethod
    def check_settings(cls, cfg: MethodConfig) -> None:
        """Raise ``ValueError`` naming the valid values when a setting of the typed ``cfg`` (``Config.of``) cannot work
        (called before any work, beside the typed config's type checks)."""

    def init(self, problem: Problem, generator: torch.Generator) -> State:
        raise NotImplementedError

    def activation_width(self) -> int:
        """The largest activation of one input (features): what evaluation chunks its samples by."""
        return max(self.model.sizes)

    def noise(self, state: State, batch: Batch, generator: torch.Generator):
        raise NotImplementedError

    def step(self, state: State, batch: Batch, noise, lr_scale: float = 1.0) -> tuple[State, dict]:
        """One update from the draws ``noise``; ``lr_scale`` multiplies the step sizes (the engine's schedule)."""
        raise NotImplementedError

    @classmethod
    def compiles_with(cls, cfg: MethodConfig) -> bool:
        """Whether ``step`` compiles with the settings ``cfg`` (``Config.of``): ``compilable`` unless a method says
        otherwise for some settings (the inducing-point families: on their MLP only)."""
        return cls.compilable

    def compiled_step(self, compile):
        """``step`` through ``compile`` (``torch.compile`` with the run's options: ``bnnbench.run.compiled``), for a
        ``compilable`` method: the whole step by default; a method whose step reads a tensor on the host between its
        parts (HMC's transition count) compiles its pure part and returns a step that calls it."""
        return compile(self.step)

    def update(self, state: State, batch: Batch, generator: torch.Generator,
               lr_scale: float = 1.0) -> tuple[State, dict]:
        if self.needs_autograd:
            return self.step(state, batch, self.noise(state, batch, generator), lr_scale)
        with torch.inference_mode():
            return self.step(state, batch, self.noise(state, batch, generator), lr_scale)

    def posthoc(self, state: State, data) -> State:
        """The state after the last training step, given the replicas' data (``engine.ReplicaData``): what a method
        builds once training has ended (Laplace: the curvature at the MAP estimate); the state unchanged by default."""
        return state

    def solve(self, problem: Problem, data, *, gtol: float) -> tuple[State, dict]:
        """The fitted state of every replica, replica r on the training rows ``data.x_train[data.data_index[r]]``
        of ``data`` (``engine.ReplicaData``), to the solver's gradient tolerance ``gtol``; and the solver's report
        (kept in the run's record)."""
        raise NotImplementedError(f"{self.name} is stepped (update), not solved")

    def predict(self, state: State, x: torch.Tensor, n_samples: int,
                generator: torch.Generator) -> Predictive:
        raise NotImplementedError

    def compiled_predict(self):
        """``predict`` as a run with the ``compile`` setting evaluates (``engine.evaluate``): the same draws and the
        same predictive to float rounding, faster where a method says how; by default ``predict`` itself."""
        return self.predict

    def kl(self, state: State) -> torch.Tensor | None:
        """KL(q || p) per replica ``[R]`` for methods whose step objective is the data term only (the
        engine then records ``mean NLL over the epoch + KL / N`` as the training objective when it
        evaluates); ``None`` where the step's objective already is the full one."""
        return None

    def gaussian(self, state: State) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussian q(theta) = N(mean, cov) per replica as dense ``(mean [R, P], cov [R, P, P])``,
        for methods whose posterior is Gaussian (small models: logistic regression, SLANG Table 1)."""
        raise NotImplementedError(f"{self.name} has no Gaussian posterior to report")

    def init_params(self, problem: Problem, generator: torch.Generator) -> torch.Tensor:
        """theta_0 ``[R, P]`` by the scheme ``cfg.init_mean`` (``MLP.init``), on the problem's device and dtype."""
        lam = problem.prior_prec
        return self.model.init(problem.n_replicas, generator, self.cfg.init_mean, device=lam.device, dtype=lam.dtype)

    def _predictive(self, state: State, f: torch.Tensor) -> Predictive:
        """The outputs ``f [R, S, T, d_out]`` with the state's Gaussian noise precision or, where it is learned
        (``gamma_noise``), tau_s ~ q(tau) per sample, as the noisy natural gradient authors' evaluation."""
        if state.noise_q is not None:
            return Predictive(f=f, noise_prec=gamma_noise.sample_prec(state.noise_q, f.shape[1]))
        return Predictive(f=f, noise_prec=state.noise_prec)

    def nll(self, state: State, f: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``-(1/S) sum_s mean_b log p(y_b | f_s)``, per replica ``[R]``."""
        return -likelihood_of(state, self.likelihood).log_prob(f, y).mean(dim=(1, 2))


def standard_normal(mean: torch.Tensor, n_samples: int, generator: torch.Generator) -> torch.Tensor:
    """eps ~ N(0, I) ``[R, n_samples, P]`` on the device and in the dtype of ``mean [R, P]``: the draws of weight
    samples theta_s = mean + (a square root of the covariance) eps_s."""
    R, P = mean.shape
    return prng.randn(R, n_samples, P, generator=generator, device=mean.device, dtype=mean.dtype)
