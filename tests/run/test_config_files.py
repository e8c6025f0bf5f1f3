"""Config files parsed once per process (``config.cache_config_files``): the same compositions as Hydra's own file
source, an edited file read again, and no load seeing another's changes."""

import os
import shutil

import pytest
from omegaconf import OmegaConf

from bnnbench.run import config


def _file_source():
    from hydra._internal.sources_registry import SourcesRegistry
    config.compose(["method=bbb"])   # the file source registered (Hydra's plugin scan), the cache installed
    return SourcesRegistry.instance().resolve("file")


def test_compositions_equal_those_of_hydras_own_file_source(monkeypatch):
    source = _file_source()
    cached = source.load_config
    assert cached.cached_parse
    cases = [["method=bbb", "data=uci/boston"], ["experiment=nng_table1", "method=noisy_kfac", "data=uci/yacht"],
             ["experiment=gi_tableG", "method=gi", "data=uci/energy", "label=gi_scale"],
             ["experiment=slang_table3", "method=slang", "method.rank=8", "protocol=slang_mnist_50k"]]
    with_cache = [OmegaConf.to_container(config._hydra_compose(config.check_overrides(c))) for c in cases]
    reads = []

    def hydras_own(self, config_path):
        reads.append(config_path)
        return cached.uncached(self, config_path)

    monkeypatch.setattr(source, "load_config", hydras_own)
    monkeypatch.setattr(config, "cache_config_files", lambda: None)   # compose would install the cache again
    plain = [OmegaConf.to_container(config._hydra_compose(config.check_overrides(c))) for c in cases]
    assert reads and with_cache == plain


def test_an_edited_file_is_read_again_and_a_changed_load_leaves_the_next_alone(tmp_path):
    source = _file_source()("bnnbench-test", str(tmp_path))
    f = tmp_path / "x.yaml"
    f.write_text("# @package _global_\na: 1\nb: [1, 2]\n")
    first = source.load_config("x.yaml")
    assert first.header["package"] == "_global_" and OmegaConf.to_container(first.config) == {"a": 1, "b": [1, 2]}
    first.config.a = 5
    first.config.b.append(3)
    assert OmegaConf.to_container(source.load_config("x").config) == {"a": 1, "b": [1, 2]}
    f.write_text("a: 2\n")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))   # a later mtime even on a coarse clock
    again = source.load_config("x.yaml")
    assert OmegaConf.to_container(again.config) == {"a": 2} and again.header["package"] is None


OVERRIDES = [
    ["method=bbb", "data=uci/boston"],
    ["method=slang", "data=uci/yacht", "method.rank=4", "protocol.epochs=3", "seed=7", "label=x", "hpo=grid"],
    ["experiment=slang_table3", "method=slang", "method.rank=8", "protocol=slang_mnist_50k"],
    ["experiment=slang_table3", "method=bbb", "protocol.stages=null", "protocol.splits=[train50k]",
     "protocol.epochs=2", "runs_root=/tmp/r"],
    ["experiment=gi_tableG", "method=gi", "data=uci/energy", "label=gi_scale_lr0.01", "method.prior=scale",
     "method.lr=0.01"],
    ["experiment=nng_table1", "method=bbb", "data=uci/wine", "hpo=grid", "+protocol.method_space.bbb.lr.fixed=0.003"],
    ["method=vogn", "data=uci/concrete", "~protocol.eval_every", "method.lr=0.5"],
]


def _hydra_whole(overrides):
    config.register_resolvers()
    return config._hydra_compose(config.check_overrides(list(overrides)))


def test_a_composition_from_the_kept_tree_equals_hydras_whole_composition():
    """``compose`` applies the key overrides to the pickled tree of the group choices; Hydra composes it all at once:
    the same tree, values, interpolations and struct flag (a key nothing declares still refused)."""
    from omegaconf.errors import ConfigAttributeError
    for ov in OVERRIDES:
        try:
            whole = _hydra_whole(ov)
        except Exception as e:   # an override that Hydra refuses is refused alike
            with pytest.raises(type(e)):
                config.compose(ov)
            continue
        ours = config.compose(ov)
        assert OmegaConf.to_container(ours) == OmegaConf.to_container(whole), ov
        assert OmegaConf.to_container(ours, resolve=True) == OmegaConf.to_container(whole, resolve=True), ov
        assert OmegaConf.is_struct(ours) and OmegaConf.is_struct(whole)
        with pytest.raises(ConfigAttributeError):
            ours.not_a_key = 1
    again = config.compose(OVERRIDES[1])
    again.method.rank = 99   # a composition's changes stay its own
    assert config.compose(OVERRIDES[1]).method.rank == 4


def test_a_wrong_value_is_refused_as_hydra_refuses_it():

    from bnnbench.core.errors import ConfigError
    for ov in (["method=slang", "method.rank=abc"], ["method=vogn", "~method.prec_init=7"]):
        with pytest.raises(Exception) as whole:
            _hydra_whole(ov)
        with pytest.raises(type(whole.value)) as ours:
            config.compose(ov)
        assert str(ours.value) == str(whole.value)
        with pytest.raises(ConfigError):
            config.compose_checked(ov)


def test_an_edited_config_file_is_seen_by_the_key_check(tmp_path, monkeypatch):
    """``check_overrides`` validates a key against what the group choices compose to; a file edited in the same
    process (a new top-level key) must be composed again, not answered from the first composition."""
    tree = tmp_path / "configs"
    shutil.copytree(config.config_dir(), tree)
    monkeypatch.setattr(config, "config_dir", lambda: str(tree))
    assert config.compose(["seed=3"]).seed == 3
    with pytest.raises(config.ConfigError, match="unknown key 'probe_key'"):
        config.compose(["probe_key=2"])
    top = tree / "config.yaml"
    top.write_text(top.read_text() + "\nprobe_key: 1\n")
    st = top.stat()
    os.utime(top, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert config.compose(["probe_key=2"]).probe_key == 2
