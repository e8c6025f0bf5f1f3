"""Typed schemas of the protocol and hyper-parameter-search config groups: every key a protocol or a search may set,
its type, and what an unset key means. Command-line values are checked against them before any work (a wrong
type or an unknown key is one clear error), and they make every key overridable whether or not a protocol file
sets it (``protocol.batch_size=32`` on a protocol that sets batch sizes per data set).

``None`` means "not set here": a protocol's per-size or per-data-set value, or the engine's behaviour without it.
"""

from dataclasses import dataclass, fields, make_dataclass
from typing import Any, Optional


@dataclass(kw_only=True)
class ProtocolSettings:
    """The keys of a protocol that reach a run (``protocol.RunSpec``) under their own names, declared once: their
    types, and what an unset key means."""
    task: str = "regression"                # regression | binary | multiclass
    splits: Any = "all"                     # all | <first n> | [names]
    split_scheme: Any = None                # {kind: random, n_splits, test_fraction, seed}: the protocol's own splits
    restarts: Optional[int] = None          # replicas per split with their own initialisation ("<split>/<k>")
    subset: Any = None                      # {train: n, test: m}: the first rows of each split (fast protocols)
    stages: Any = None                      # [{split, epochs}, ...]: train on each split in turn, state kept
    eval_samples_final: Optional[int] = None  # posterior samples of the final evaluation (None: eval_samples)
    normalize_x: bool = True
    normalize_y: bool = True
    noise_prec_units: str = "normalised"    # original | normalised: the units of tau in the search box
    bias_prior_prec: Optional[float] = None  # None: biases share the weights' prior precision
    prior_scaling: Optional[str] = None     # fan_in: each layer's prior precision times its fan-in + 1 (Neal's prior,
                                            # variance 1 / (d_in + 1) with the bias as an input)
    loglik: str = "joint"                   # the test log-likelihood convention the paper reports
    save_predictive: Optional[bool] = None  # regression: keep each split's predictive mean and variance at its test
                                            # rows (predictive.npz beside the record; figures, HMC comparisons)
    active_learning: Any = None             # {rounds: n, acquire: variance | random}: refit and acquire one pool row
                                            # per round (split_scheme kind subsample; bnnbench.run.active)
    augment: Any = None                     # {crop_pad: p, flip: bool}: each training image of a minibatch randomly
                                            # cropped from its zero-padded copy and flipped left-right (augment.py)
    last_batch: Optional[str] = None        # null / wrap: every minibatch has batch_size rows, the last one filled
                                            # from the epoch's start; short: the N mod B rows left, as a PyTorch
                                            # DataLoader gives them (training sets of one size only)
    batch_order: Optional[str] = None       # null / shuffled: the rows in a fresh random order every epoch; fixed:
                                            # in their split's order every epoch, as a DataLoader with shuffle=False
                                            # (the global inducing library's UCI loader)
    posterior_metrics: Optional[str] = None  # logreg: SLANG Table 1's metrics of a Gaussian q
    exact_gtol: Optional[float] = None      # gradient tolerance of the exact (L-BFGS) solutions
    lr_drop: Any = None                     # {at: fraction of the epochs, factor: f}


@dataclass(kw_only=True)
class ProtocolSchema(ProtocolSettings):
    """Every key a protocol file may set: ``ProtocolSettings`` and the keys resolved per size, data set and method."""
    name: str = "???"
    epochs: Optional[int] = None
    steps: Any = None                       # gradient steps instead of epochs (epochs = ceil(steps / batches per
                                            # epoch)): an int, or {default: n, <method>: n} per method
    batch_size: Optional[int] = None
    eval_samples: Optional[int] = None      # posterior samples per evaluation
    eval_every: Optional[int] = None        # epochs between evaluations kept for convergence plots
    hidden: Any = None                      # hidden widths, e.g. [50]; "meta:<key>" reads the data set's metadata
    hpo: Any = None                         # the search's settings under this protocol (default_kind, n_random, ...)
    method: Any = None                      # settings of every method under this protocol
    methods: Any = None                     # {<method>: settings of that method}
    sizes: Any = None                       # {small|large: settings}, chosen by a data set's ``size``; a value of
                                            # epochs, batch_size, ... there or in datasets may be {default: v,
                                            # <method>: v} per method
    datasets: Any = None                    # {<data set key>: size, space, fixed, length_scales, method(s) ...}
    method_space: Any = None                # {<method>: {<hyper-parameter>: range | null}}: a method's own axes in
                                            # place of (null: without) the data set's (one budget, own parameters)


@dataclass
class FixedSearch:
    """``hpo=fixed``: no selection; the protocol's fixed values (the centre of its search box in log space), or the
    ``hparams.<name>`` given."""
    kind: str = "fixed"


@dataclass
class RecordedSearch:
    """``hpo=recorded``: the per-split hyper-parameters stored in an earlier record (``hpo.record=<run dir>``)."""
    kind: str = "recorded"
    record: Optional[str] = None            # the run directory whose hyper-parameters are reused (required)


@dataclass
class CVSearch:
    """A search scored by K-fold cross-validation of each split's training rows (never its test rows)."""
    folds: int = 5                          # K
    use_folds: Optional[int] = None         # train only the first folds of the K (None: all)
    cv_seed: int = 123                      # KFold(shuffle, random_state=cv_seed), as the SLANG and Vadam code
    metric: str = "loglik_joint"            # the CV score maximised, original units
    failed_score: float = -5.0              # the score of a diverged candidate (the SLANG code)
    eval_samples: Optional[int] = None      # MC samples of the validation (None: the protocol's)


@dataclass
class GridSearch(CVSearch):
    """``hpo=grid``: every point of a grid over the search box, per split."""
    kind: str = "grid"
    grid_points: int = 5                    # points per log-range dimension (value lists are used as given)


@dataclass
class BoSearch(CVSearch):
    """``hpo=bo``: Bayesian optimisation per split, as bayes_opt 0.6.0 in the SLANG and Vadam code: random points,
    then expected-improvement proposals on a Matern-5/2 GP whose length-scales start at the protocol's values and
    are re-fitted every step."""
    kind: str = "bo"
    n_random: int = 5                       # random initial points per split
    n_iter: int = 25                        # proposals after them
    batch: int = 1                          # proposals per round per split (kriging believer when > 1)
    alpha: float = 1e-2                     # GP noise
    length_scales: Optional[list] = None    # initial GP length-scales (log space): per protocol data set, else 1 each
    fit_length_scales: bool = True          # re-fit them by marginal likelihood each step (bayes_opt 0.6.0)
    gp_restarts: int = 25                   # random restarts of that fit
    acq_candidates: int = 10000             # random points of the EI maximisation (bayes_opt 0.6.0: 100 000)
    acq_polish: int = 5                     # of those, polished by L-BFGS-B (bayes_opt 0.6.0: 250)


# hpo.kind -> its settings, each key with its type and default declared once (here)
SEARCHES = {"fixed": FixedSearch, "recorded": RecordedSearch, "grid": GridSearch, "bo": BoSearch}


def _any_search() -> type:
    """Every key a search of any kind may set, optional: what a command-line ``hpo.<key>=`` is checked against before
    the kind is known (``protocol.resolve`` then refuses a key the chosen kind has not)."""
    seen = {}
    for cls in SEARCHES.values():
        for f in fields(cls):
            seen.setdefault(f.name, Optional[f.type] if f.name != "kind" else str)
    return make_dataclass("HpoSchema", [(k, t, None if k != "kind" else "fixed") for k, t in seen.items()])


HpoSchema = _any_search()
SCHEMAS = {"protocol": ProtocolSchema, "hpo": HpoSchema}
