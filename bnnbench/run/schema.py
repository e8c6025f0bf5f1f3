"""Typed schemas of the protocol and hyper-parameter-search config groups: every key a protocol or a search may set,
its type, and what an unset key means. Command-line values are checked against them before any work (a wrong
type or an unknown key is one clear error), and they make every key overridable whether or not a protocol file
sets it (``protocol.batch_size=32`` on a protocol that sets batch sizes per data set).

``None`` means "not set here": a protocol's per-size or per-data-set value, or the engine's behaviour without it.
"""

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class ProtocolSchema:
    name: str = "???"
    task: str = "regression"                # regression | binary | multiclass
    splits: Any = "all"                     # all | <first n> | [names]
    split_scheme: Any = None                # {kind: random, n_splits, test_fraction, seed}: the protocol's own splits
    restarts: Optional[int] = None          # replicas per split with their own initialisation ("<split>/<k>")
    subset: Any = None                      # {train: n, test: m}: the first rows of each split (fast protocols)
    stages: Any = None                      # [{split, epochs}, ...]: train on each split in turn, state kept
    epochs: Optional[int] = None
    steps: Any = None                       # gradient steps instead of epochs (epochs = ceil(steps / batches per
                                            # epoch)): an int, or {default: n, <method>: n} per method
    batch_size: Optional[int] = None
    eval_samples: Optional[int] = None      # posterior samples per evaluation
    eval_samples_final: Optional[int] = None
    eval_every: Optional[int] = None        # epochs between evaluations kept for convergence plots
    hidden: Any = None                      # hidden widths, e.g. [50]; "meta:<key>" reads the data set's metadata
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
    posterior_metrics: Optional[str] = None  # logreg: SLANG Table 1's metrics of a Gaussian q
    exact_gtol: Optional[float] = None      # gradient tolerance of the exact (L-BFGS) solutions
    lr_drop: Any = None                     # {at: fraction of the epochs, factor: f}
    hpo: Any = None                         # the search's settings under this protocol (default_kind, n_random, ...)
    method: Any = None                      # settings of every method under this protocol
    methods: Any = None                     # {<method>: settings of that method}
    sizes: Any = None                       # {small|large: settings}, chosen by a data set's ``size``
    datasets: Any = None                    # {<data set key>: size, space, fixed, length_scales, method(s) ...}


@dataclass
class HpoSchema:
    kind: str = "fixed"                     # fixed | grid | bo | recorded
    folds: Optional[int] = None             # K of the K-fold cross-validation inside each training split
    use_folds: Optional[int] = None         # train only the first folds of the K
    cv_seed: Optional[int] = None
    metric: Optional[str] = None            # the CV score maximised (default loglik_joint)
    failed_score: Optional[float] = None    # the score of a diverged candidate
    eval_samples: Optional[int] = None
    grid_points: Optional[int] = None       # grid: points per log-range dimension
    n_random: Optional[int] = None          # bo: random initial points per split
    n_iter: Optional[int] = None            # bo: proposals after them
    batch: Optional[int] = None             # bo: proposals per round
    alpha: Optional[float] = None           # bo: GP noise
    length_scales: Optional[list] = None    # bo: initial GP length-scales (log space)
    fit_length_scales: Optional[bool] = None
    gp_restarts: Optional[int] = None
    acq_candidates: Optional[int] = None    # bo: random points of the EI maximisation (None: 10 000)
    acq_polish: Optional[int] = None        # bo: of those, polished by L-BFGS-B (None: 5)
    record: Optional[str] = None            # recorded: the run directory whose hyper-parameters are reused


SCHEMAS = {"protocol": ProtocolSchema, "hpo": HpoSchema}
