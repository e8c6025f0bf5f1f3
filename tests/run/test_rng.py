"""The ``rng`` setting (bnnbench/core/prng.py): checked before any work, recorded, hashed only when not torch's (the
records made before it keep their hash), and a philox run repeats itself and draws other numbers than torch's."""

import json

import pytest

from bnnbench.cli import main
from bnnbench.run import results
from bnnbench.run.config import compose
from bnnbench.run.execute import resolve_run

from datapaths import MIRROR

pytestmark = pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file(), reason="needs the data mirror")

TINY = ["data=uci/yacht", "protocol.epochs=2", "protocol.splits=[0,1]", "progress=false"]


@pytest.fixture(autouse=True)
def env(module_env, monkeypatch):
    monkeypatch.setattr("sys.argv", ["bnnbench"])


def _resolved(*overrides):
    overrides = list(overrides)
    return resolve_run(compose(overrides), overrides)[3]


def test_rng_is_recorded_and_hashed_only_when_philox():
    off, on = _resolved("method=bbb", "data=uci/yacht"), _resolved("method=bbb", "data=uci/yacht", "rng=philox")
    assert off["rng"] == "torch" and on["rng"] == "philox"
    before = {k: v for k, v in off.items() if k != "rng"}   # a record from before the setting
    assert results.config_hash(off) == results.config_hash(before) != results.config_hash(on)


def test_a_bad_rng_value_is_an_error_before_any_work(tmp_path, capsys):
    assert main(["run", "method=bbb", *TINY, "rng=mt", f"runs_root={tmp_path}"]) == 2
    assert "error: rng must be one of torch, philox, got 'mt'" in capsys.readouterr().err
    assert not list(tmp_path.rglob("record.json"))


@pytest.mark.parametrize("method", ["bbb", "mc_dropout hparams.dropout=0.05"])   # normal draws; uniform (the masks)
def test_a_philox_run_repeats_its_numbers_and_differs_from_torchs(tmp_path, method):
    method, *more = method.split()
    recs = {}
    for name, rng in (("torch", "torch"), ("philox", "philox"), ("again", "philox")):
        assert main(["run", f"method={method}", *more, *TINY, f"rng={rng}", f"runs_root={tmp_path / name}"]) == 0
        recs[name] = json.loads(next((tmp_path / name).rglob("record.json")).read_text())
    assert recs["philox"]["config"]["rng"] == "philox" and recs["torch"]["config"]["rng"] == "torch"
    assert recs["philox"]["metrics"] == recs["again"]["metrics"]
    assert recs["philox"]["metrics"] != recs["torch"]["metrics"]
    assert all(abs(v["mean"]) < 1e3 for v in recs["philox"]["summary"].values())
