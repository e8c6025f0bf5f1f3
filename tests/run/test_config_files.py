"""Config files parsed once per process (``config.cache_config_files``): the same compositions as Hydra's own file
source, an edited file read again, and no load seeing another's changes."""

import os

from omegaconf import OmegaConf

from bnnbench.run import config


def _file_source():
    from hydra._internal.sources_registry import SourcesRegistry
    config.compose(["method=bbb"])   # the file source registered (Hydra's plugin scan), the cache installed
    return SourcesRegistry.instance().resolve("file")


def test_compositions_equal_those_of_hydras_own_file_source():
    source = _file_source()
    cached = source.load_config
    assert cached.cached_parse
    cases = [["method=bbb", "data=uci/boston"], ["experiment=nng_table1", "method=noisy_kfac", "data=uci/yacht"],
             ["experiment=gi_tableG", "method=gi", "data=uci/energy", "label=gi_scale"],
             ["experiment=slang_table3", "method=slang", "method.rank=8", "protocol=slang_mnist_50k"]]
    with_cache = [OmegaConf.to_container(config.compose(c)) for c in cases]
    try:
        source.load_config = cached.uncached
        config._composed.cache_clear()
        plain = [OmegaConf.to_container(config.compose(c)) for c in cases]
    finally:
        source.load_config = cached
        config._composed.cache_clear()
    assert with_cache == plain


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
