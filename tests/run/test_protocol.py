"""Protocol precedence (``protocol.resolve``): method config < protocol ``method`` < ``methods[m]`` < per size < per
data set < command line, for method settings, protocol keys, the search and the network; what the command line set comes
from Hydra's parser (``config.CommandLine``), not from splitting strings."""

import pytest
from omegaconf import OmegaConf, open_dict

from bnnbench.run.config import CommandLine, ConfigError, compose
from bnnbench.methods import METHODS
from bnnbench.run.protocol import resolve


def _spec(*overrides):
    ov = ["protocol=slang_uci", *overrides]
    return resolve(compose(ov), CommandLine.parse(ov))


def test_command_line_is_read_by_hydras_parser():
    given = CommandLine.parse(["hpo=bo", "method=slang", "method.lr=0.1", "+protocol.epochs=3", "++hpo.folds=2",
                               "model.hidden=[7,7]", "method.betas=[0.9,0.99]", "seed=1", "~method.momentum"])
    assert given.chosen == {"hpo", "method", "seed"}
    assert given.sets("method") == {"lr", "betas"} and given.sets("protocol") == {"epochs"}
    assert given.sets("hpo") == {"folds"} and given.sets("model") == {"hidden"} and given.sets("data") == set()


def test_layers_apply_from_the_least_to_the_most_specific():
    yacht = _spec("method=slang", "data=uci/yacht")
    assert METHODS["slang"].Config().train_samples == 1 and yacht.method.train_samples == 4  # sizes.small.method
    assert METHODS["slang"].Config().lr == 0.01 and yacht.method.lr == 0.08               # datasets.yacht.methods.slang
    assert yacht.batch_size == 10 and yacht.epochs == 120                                  # sizes.small, protocol
    power = _spec("method=slang", "data=uci/power")
    assert power.method.train_samples == 2 and power.batch_size == 10 and power.method.eig == "nystrom"


def test_a_size_may_give_a_protocol_value_per_method():
    # SLANG Table 2's large sets as the authors' code ran them (slang_uci): minibatch 10 for SLANG, 100 for BBB
    assert _spec("method=slang", "data=uci/power").batch_size == 10
    assert _spec("method=bbb", "data=uci/power").batch_size == 100
    assert _spec("method=slang", "data=uci/yacht").batch_size == 10               # a small set: sizes.small's
    assert _spec("method=slang", "data=uci/power", "protocol.batch_size=32").batch_size == 32
    assert _spec("method=slang", "data=uci/power", "protocol.sizes.large.batch_size=100").batch_size == 100
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        _spec("method=bbb", "data=uci/power", "~protocol.sizes.large.batch_size.default")   # no value for BBB


def test_the_command_line_wins_over_every_layer():
    s = _spec("method=slang", "data=uci/yacht", "method.lr=0.5", "method.train_samples=3", "protocol.batch_size=32",
              "protocol.epochs=7", "model.hidden=[7]", "hpo=bo", "hpo.n_random=2")
    assert s.method.lr == 0.5 and s.method.train_samples == 3
    assert s.batch_size == 32 and s.epochs == 7 and s.model_hidden == [7] and s.hpo["n_random"] == 2
    assert _spec("method=slang", "data=uci/yacht", "hpo=bo").hpo["n_random"] == 5  # the protocol's, when not given


def test_a_protocol_method_block_for_every_method_skips_settings_a_method_lacks():
    s = _spec("method=map", "data=uci/yacht")   # sizes.small.method sets train_samples; MAP has none
    assert "train_samples" not in s.method and s.method.betas == [0.9, 0.99]


def test_a_protocol_setting_a_method_lacks_is_an_error_naming_the_protocol():
    cfg = compose(["protocol=slang_uci", "method=slang", "data=uci/yacht"])
    OmegaConf.update(cfg, "protocol.methods.slang.rnak", 2, force_add=True)
    with pytest.raises(ConfigError, match="protocol 'slang_uci' sets 'rnak' for method slang.*valid: .*rank"):
        resolve(cfg, CommandLine())
    cfg = compose(["protocol=slang_uci", "method=slang", "data=uci/yacht"])
    OmegaConf.update(cfg, "protocol.methods.slang.rank", "two", force_add=True)
    with pytest.raises(ConfigError, match="protocol 'slang_uci'.*rank"):
        resolve(cfg, CommandLine())


def test_the_protocol_chooses_the_search_unless_the_command_line_does():
    ov = ["protocol=gal_uci", "method=mc_dropout", "data=uci/yacht"]   # gal_uci: hpo.default_kind grid
    meta = {"tau_values": [0.25, 0.5, 1.0], "dropout_rates": [0.005, 0.01], "n_hidden": 50}  # from the data set
    with pytest.raises(ConfigError, match="hpo=grid"):
        resolve(compose(ov), CommandLine.parse(ov), meta)
    for kind in ("fixed", "grid"):
        spec = resolve(compose([*ov, f"hpo={kind}"]), CommandLine.parse([*ov, f"hpo={kind}"]), meta)
        assert spec.hpo["kind"] == kind


def test_last_batch_and_the_acquisition_settings_reach_the_run(monkeypatch):
    """``protocol.last_batch`` reaches the RunSpec (None unless set, so earlier records keep their hash) and
    ``hpo.acq_candidates`` / ``hpo.acq_polish`` reach every split's ``GPBayesOpt`` (defaults: 10 000 and 5)."""
    import types

    import numpy as np

    from bnnbench.run import selection

    assert _spec("method=bbb", "data=uci/yacht").last_batch is None
    assert _spec("method=bbb", "data=uci/yacht", "protocol.last_batch=short").last_batch == "short"
    made = []

    class Stop(Exception):
        pass

    def fake(*args, **kw):
        made.append(kw)
        if len(made) == 2:
            raise Stop

    monkeypatch.setattr(selection, "GPBayesOpt", fake)
    splits = [types.SimpleNamespace(train=np.arange(20)) for _ in range(2)]
    for extra, want in ([], (10000, 5)), (["hpo.acq_candidates=100000", "hpo.acq_polish=250"], (100000, 250)):
        made.clear()
        spec = _spec("method=bbb", "data=uci/yacht", "hpo=bo", *extra)
        with pytest.raises(Stop):
            selection.select_hparams(spec, None, splits, 0, device="cpu", dtype=None)
        assert [(k["n_candidates"], k["n_polish"]) for k in made] == [want, want]


def test_a_search_holds_the_settings_of_its_kind_with_their_declared_defaults():
    """Each kind of search declares its keys, types and defaults once (``schema.SEARCHES``); the hpo files only choose
    the kind, and the protocol's ``hpo:`` keys of another kind are not the run's (nothing reads them)."""
    from dataclasses import asdict
    from pathlib import Path

    from bnnbench.run.config import config_dir
    from bnnbench.run.schema import SEARCHES, BoSearch
    for f in Path(config_dir(), "hpo").glob("*.yaml"):
        assert set(OmegaConf.load(f)) == {"kind"}, f"{f}: settings belong in schema.SEARCHES, not in the file"
    assert _spec("method=slang", "data=uci/yacht").hpo == {"kind": "fixed"}   # slang_uci's hpo: block is bo's
    bo = _spec("method=slang", "data=uci/yacht", "hpo=bo").hpo
    assert set(bo) == set(asdict(BoSearch())) and bo["acq_candidates"] == 10000 and bo["folds"] == 5
    assert set(SEARCHES) == {"fixed", "recorded", "grid", "bo"}


def test_a_search_ignores_settings_of_another_kind_and_refuses_a_recorded_search_without_its_record():
    # reproduce gives its overrides (hpo.n_random=...) to every cell, also to those that reuse a selection or have none
    assert "n_random" not in _spec("method=slang", "data=uci/yacht", "hpo=grid", "hpo.n_random=3").hpo
    assert _spec("method=slang", "data=uci/yacht", "hpo=recorded", "hpo.record=x", "hpo.n_iter=2").hpo == {
        "kind": "recorded", "record": "x"}
    with pytest.raises(ConfigError, match=r"hpo=recorded needs hpo.record="):
        _spec("method=slang", "data=uci/yacht", "hpo=recorded")
    cfg = compose(["protocol=slang_uci", "method=slang", "data=uci/yacht", "hpo=bo"])
    OmegaConf.update(cfg, "protocol.hpo.n_iter", "many", force_add=True)
    with pytest.raises(ConfigError, match="protocol 'slang_uci', hpo.n_iter"):
        resolve(cfg, CommandLine.parse(["hpo=bo"]))


def test_a_methods_own_search_axes_replace_the_data_sets_and_a_list_is_a_box_or_an_error():
    """leaderboard_uci: MC dropout searches its dropout rate where the others search the prior precision, the same
    10 configurations; a list of more than two values in a space is refused (version 1's five-element list was read
    as the box of its first two)."""
    def spec(method):
        ov = ["experiment=uci_leaderboard", f"method={method}", "data=uci/yacht"]
        return resolve(compose(ov), CommandLine.parse(ov))
    drop, lap = spec("mc_dropout"), spec("laplace")
    assert drop.space == {"noise_prec": {"log_range": [1.0986, 8.0064]}, "dropout": {"values": [0.01, 0.05]}}
    assert lap.space == {"noise_prec": {"log_range": [1.0986, 8.0064]}, "prior_prec": {"values": [0.1, 1.0]}}
    assert lap.method.lr == 0.01 and drop.hpo["grid_points"] == 5
    cfg = compose(["protocol=leaderboard_uci", "method=map", "data=uci/yacht", "hpo=grid"])
    OmegaConf.update(cfg, "protocol.datasets.yacht.space.noise_prec", [3, 10, 30], merge=False)
    with pytest.raises(ConfigError, match=r"\[3, 10, 30\] is neither a box \[lo, hi\].*\{values: \[3, 10, 30\]\}"):
        resolve(cfg, CommandLine.parse([]))



def test_an_axis_names_what_a_fixed_search_uses_else_the_grids_median():
    """A grid axis ``{values: [...], fixed: v}``: ``hpo=fixed`` uses v (a stated default, say noisy Adam's step size
    for BBB), the search the values; without ``fixed``, the grid's median; ``hparams.<name>`` wins over both."""
    def spec(axis, *more):
        ov = ["protocol=leaderboard_uci", "method=bbb", "data=uci/yacht", "hpo=fixed", *more]
        cfg = compose(ov)
        with open_dict(cfg):
            OmegaConf.update(cfg, "protocol.method_space.bbb", {"lr": axis}, merge=False)
        return resolve(cfg, CommandLine.parse(ov))
    stated = spec({"values": [0.01, 0.003, 0.001], "fixed": 0.01})
    assert stated.space["lr"] == {"values": [0.01, 0.003, 0.001]} and stated.fixed["lr"] == 0.01
    assert spec({"values": [0.01, 0.003, 0.001]}).fixed["lr"] == 0.003
    assert spec({"values": [0.01, 0.003, 0.001], "fixed": 0.01}, "hparams.lr=0.001").fixed["lr"] == 0.001


def test_nng_table1_selects_bbbs_step_size_and_an_axis_names_what_a_fixed_search_uses():
    """nng_uci: BBB's alpha is a grid axis of its own (the paper states none), searched on one 80/20 split of the
    training rows by the per-point LL in NNG Table 1's BBB cells; ``hpo=fixed`` uses the axis' ``fixed`` (noisy Adam's
    0.01), not the grid's median; the other methods of the protocol have no axis."""
    def spec(method, *more):
        ov = ["experiment=nng_table1", f"method={method}", "data=uci/yacht", *more]
        return resolve(compose(ov), CommandLine.parse(ov))
    grid = spec("bbb", "hpo=grid")
    assert grid.space == {"lr": {"values": [0.01, 0.003, 0.001]}}
    assert (grid.hpo["kind"], grid.hpo["use_folds"], grid.hpo["metric"]) == ("grid", 1, "loglik_pointwise")
    assert spec("bbb").fixed["lr"] == 0.01 and spec("bbb", "hparams.lr=0.001").fixed["lr"] == 0.001
    assert spec("noisy_adam").space == {} and "lr" not in spec("noisy_adam").fixed
    cfg = compose(["experiment=nng_table1", "method=bbb", "data=uci/yacht"])
    OmegaConf.update(cfg, "protocol.method_space.bbb.lr", {"values": [0.01, 0.003, 0.001]}, merge=False)
    assert resolve(cfg, CommandLine.parse([])).fixed["lr"] == 0.003   # no ``fixed``: the grid's median
