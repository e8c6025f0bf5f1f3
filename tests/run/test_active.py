"""Pool-based active learning (bnnbench.run.active; the noisy natural gradient paper's Table 3 in PBP's protocol)."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from bnnbench.run import active
from bnnbench.run.config import CommandLine, ConfigError, compose
from bnnbench.core.data import Dataset, Split
from bnnbench.run.fit import FitOptions
from bnnbench.run.protocol import resolve
from bnnbench.run.splits import pool_rows, select_splits

OUTLIER = 123


def toy(n=160):
    """y = sin(3x) + noise on x in [-1, 1], except one row far out at x = 40 (in every trial's pool or split)."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(n, 1))
    X[OUTLIER] = 40.0
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.normal(size=n)
    return Dataset("uci/toy", "regression", X, y, (Split("0", np.arange(n), np.arange(0)),), None)


def spec_for(acquire, method="pbp", rounds=3):
    ov = [f"method={method}", "data=uci/yacht", "protocol=nng_small"]
    spec = resolve(compose(ov), CommandLine.parse(ov))
    return replace(spec, epochs=5, eval_samples=200,
                   split_scheme={"kind": "subsample", "n_splits": 6, "n_train": 20, "n_test": 20, "seed": 0},
                   active_learning={"rounds": rounds, "acquire": acquire})


def run(spec, ds):
    splits = select_splits(ds, "all", spec.split_scheme)
    hp = [dict(spec.fixed) for _ in splits]
    opts = FitOptions(device=torch.device("cpu"), dtype=torch.float64)
    res, pairs, entry = active.run_rounds(spec, ds, splits, hp, torch.Generator().manual_seed(0), opts,
                                          log=lambda *_: None)
    return splits, res, pairs, entry


def test_random_acquisition_takes_each_trials_pool_in_its_seeded_order():
    ds, spec = toy(), spec_for("random")
    splits, res, pairs, entry = run(spec, ds)
    for k, s in enumerate(splits):
        want = pool_rows(ds, spec.split_scheme, k)[:2].tolist()
        assert entry["acquired"][k] == want
        assert sorted(pairs[k][0].tolist()) == sorted(s.train.tolist() + want)
        assert np.array_equal(pairs[k][1], s.test)
    rmse = np.asarray(entry["rmse"])
    assert rmse.shape == (6, 3)
    assert rmse[:, -1] == pytest.approx(res.final["rmse"].numpy())    # the record's metrics are the last round's


def test_variance_acquisition_takes_the_pool_row_of_largest_predictive_variance_first():
    ds, spec = toy(), spec_for("variance")
    splits, _, _, entry = run(spec, ds)
    in_pool = [k for k in range(len(splits)) if OUTLIER in pool_rows(ds, spec.split_scheme, k)]
    assert len(in_pool) >= 3
    for k in in_pool:     # far from every training input, its predictive variance is the largest by far
        assert entry["acquired"][k][0] == OUTLIER
    for k, acq in enumerate(entry["acquired"]):
        assert len(set(acq)) == 2 and not set(acq) & (set(splits[k].train) | set(splits[k].test))


def test_bad_settings_are_refused_before_any_work():
    spec = spec_for("variance")
    with pytest.raises(ConfigError, match="acquire must be one of variance, random"):
        active.check(replace(spec, active_learning={"rounds": 3, "acquire": "bald"}))
    with pytest.raises(ConfigError, match="rounds must be an integer >= 1"):
        active.check(replace(spec, active_learning={"rounds": 0, "acquire": "random"}))
    with pytest.raises(ConfigError, match="split_scheme kind subsample"):
        active.check(replace(spec, split_scheme=None))
    with pytest.raises(ConfigError, match="warm_start must be true or false"):
        active.check(replace(spec, active_learning={"rounds": 3, "acquire": "random", "warm_start": "yes"}))


@pytest.mark.parametrize("warm", [False, True])
def test_warm_start_continues_each_round_from_the_previous_rounds_fitted_state(warm, monkeypatch):
    """From scratch (the paper's protocol) every round's fit starts from ``method.init``; with ``warm_start`` each
    round after the first starts from the state the previous round's fit returned, and the record says so."""
    calls = []
    real = active.fit_replicas

    def spy(*args, init_state=None, **kw):
        res = real(*args, init_state=init_state, **kw)
        calls.append((init_state, res.state))
        return res
    monkeypatch.setattr(active, "fit_replicas", spy)
    spec = spec_for("random", method="noisy_adam")
    spec = replace(spec, active_learning={**spec.active_learning, "warm_start": warm})
    _, _, _, entry = run(spec, toy())
    assert len(calls) == 3 and calls[0][0] is None
    for (init, _), (_, before) in zip(calls[1:], calls[:-1]):
        assert (init is before) if warm else init is None
    assert entry.get("warm_start", False) is warm


@pytest.mark.parametrize("method", ["noisy_adam", "noisy_kfac"])
def test_table3s_nng_cells_choose_lambda_per_trial_by_cross_validating_its_initial_rows(method):
    """NNG Table 3's NNG cells (``hpo=grid``): lambda from {1, 0.3, 0.1} by 5-fold cross-validation of each trial's
    training rows, by the per-point LL; ``hpo=fixed`` keeps lambda = 1; the other methods have no lambda axis."""
    def spec(*extra):
        ov = ["experiment=nng_table3", f"method={method}", "data=uci/concrete", *extra]
        return resolve(compose(ov), CommandLine.parse(ov))

    grid = spec("hpo=grid")
    assert grid.space == {"kl_weight": {"values": [1.0, 0.3, 0.1]}}
    assert (grid.hpo["kind"], grid.hpo["folds"], grid.hpo["use_folds"], grid.hpo["metric"]) == (
        "grid", 5, 5, "loglik_pointwise")
    assert spec("hpo=fixed").fixed["kl_weight"] == 1.0
    ov = ["experiment=nng_table3", "method=pbp", "data=uci/concrete", "hpo=grid"]
    assert "kl_weight" not in resolve(compose(ov), CommandLine.parse(ov)).space
