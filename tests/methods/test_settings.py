"""A method's settings stay typed: its frozen ``Config`` is what it reads, numbers of their fields' types."""

import dataclasses

import pytest
from omegaconf import OmegaConf

from bnnbench.core.errors import ConfigError
from bnnbench.core.models.mlp import MLP
from bnnbench.methods import METHODS, method_class


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_keeps_its_frozen_config(name):
    cls = method_class(name)
    assert cls.Config.__dataclass_params__.frozen
    exact_logreg = name in ("exact_full", "exact_mf")
    method = cls({}, MLP([2, 1]) if exact_logreg else MLP([2, 3, 1]), "bernoulli" if exact_logreg else "gaussian")
    assert type(method.cfg) is cls.Config and method.cfg == cls.Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        method.cfg.name = "other"


def test_numbers_from_python_take_their_fields_types():
    cfg = method_class("slang").Config.of({"lr": 1, "rank": 2.0, "momentum": 0})
    assert type(cfg.lr) is float and cfg.lr == 1.0
    assert type(cfg.rank) is int and cfg.rank == 2
    assert type(cfg.momentum) is float
    assert method_class("hmc").Config.of({"chains": 2.5}).chains == 2.5   # not integral: left for the method to refuse
    assert method_class("bbb").Config.of({"init_std": 1}).init_std == 1.0 and \
        type(method_class("bbb").Config.of({"init_std": 1}).init_std) is float   # Optional[float]
    assert method_class("bbb").Config.of({"learn_noise": True}).learn_noise is True   # bool is not an int here


def test_a_composed_config_and_a_mapping_give_the_same_settings():
    cls = method_class("vogn")
    assert cls.Config.of(OmegaConf.create({"lr": 0.5, "beta": 0.9})) == cls.Config.of({"lr": 0.5, "beta": 0.9})


def test_an_unknown_setting_is_refused_with_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) betas of method 'vprop'; valid: beta, init_mean"):
        method_class("vprop")({"betas": [0.9, 0.99]}, MLP([2, 3, 1]), "gaussian")
