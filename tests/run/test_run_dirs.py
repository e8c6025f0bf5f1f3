"""What a user meets at the command line: overrides and their errors, run directories that hold one record and
what describes it, one process per run directory, and interruptions that say how to resume."""

import json

import pytest

from bnnbench.run import results
from bnnbench.cli import main
from bnnbench.run.config import ConfigError, compose

from datapaths import MIRROR
from interrupts import ctrl_c_at_evaluation

needs_mirror = pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file(), reason="needs the data mirror")
TINY = ["method=bbb", "data=uci/yacht", "protocol.epochs=2", "protocol.splits=[0,1]", "progress=false"]


@pytest.fixture(scope="module", autouse=True)
def env(module_env):
    yield


def _listing(d):
    """Every path under ``d`` with its file's modification time."""
    return sorted((str(p.relative_to(d)), p.stat().st_mtime_ns if p.is_file() else 0) for p in d.rglob("*"))


def test_every_protocol_key_is_overridable_without_plus():
    cfg = compose(["protocol=slang_uci", "protocol.batch_size=32", "+protocol.eval_every=5", "hpo.folds=3"])
    assert cfg.protocol.batch_size == 32 and cfg.protocol.eval_every == 5 and cfg.hpo.folds == 3


@pytest.mark.parametrize("override, valid", [
    ("method.nosuch=3", "train_samples"), ("+method.nosuch=3", "local_reparam"),
    ("protocol.batch_sise=3", "batch_size"), ("hpo.fold=2", "use_folds"), ("nosuch=1", "skip_done"),
    ("model.width=3", "activation")])
def test_an_unknown_key_is_an_error_listing_the_valid_ones(override, valid):
    with pytest.raises(ConfigError, match=rf"unknown key .*valid keys of .*{valid}"):
        compose(["method=bbb", override])


@pytest.mark.parametrize("override", ["protocol.epochs=abc", "protocol.batch_size=1.5", "protocol.eval_samples=x",
                                      "hpo.folds=many"])
def test_a_wrong_type_is_an_error_before_any_work(override, capsys, tmp_path):
    assert main(["run", *TINY, override, f"runs_root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and override.split("=")[0] in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing created


@needs_mirror
def test_run_directory_holds_only_the_record_and_what_describes_it(tmp_path, capsys):
    assert main(["run", *TINY, f"runs_root={tmp_path}"]) == 0
    d = results.run_dir(tmp_path, None, "bbb", "uci/yacht")
    assert sorted(p.name for p in d.iterdir()) == ["history.json", "record.json"]  # no .hydra/, no cli.log, no lock
    before = _listing(tmp_path)
    for bad in ("seed=1.5", "protocol.epochs=0", "method.lr=-1"):  # refused invocations change nothing
        assert main(["run", *TINY, bad, f"runs_root={tmp_path}"]) == 2
    assert _listing(tmp_path) == before
    assert main(["run", *TINY, "protocol.epochs=3", f"runs_root={tmp_path}"]) == 2  # another configuration
    err = capsys.readouterr().err
    assert "another configuration" in err and "label=" in err and "skip_done=false" in err
    assert _listing(tmp_path) == before


@needs_mirror
def test_a_run_directory_in_use_is_refused(tmp_path):
    d = tmp_path / "run"
    ov = TINY
    with results.claimed(d):  # as if another process were training this configuration
        with pytest.raises(results.RunDirError, match="in use by another bnnbench process"):
            from bnnbench.run.execute import execute
            execute(compose(ov), ov, d, log=lambda m: None)
    assert not (d / "record.json").exists()


def test_an_unwritable_results_directory_is_one_clear_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["run", *TINY, f"runs_root={blocker}/runs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write the run directory") and "runs_root=" in err and "Traceback" not in err


@needs_mirror
def test_ctrl_c_says_where_the_checkpoint_is_and_the_same_command_resumes(tmp_path, capsys, monkeypatch):
    ov = [*TINY, "protocol.epochs=4", "checkpoint_every=2", "checkpoint_seconds=0", f"runs_root={tmp_path}"]
    restore = ctrl_c_at_evaluation(monkeypatch, 3)   # epoch 3, after the epoch-2 checkpoint
    assert main(["run", *ov, "protocol.eval_every=1"]) == 130
    err = capsys.readouterr().err
    assert "interrupted (Ctrl-C): resume state kept in" in err and "the same command resumes it" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    restore()
    assert main(["run", *ov, "protocol.eval_every=1"]) == 0
    out = capsys.readouterr().out
    assert "resuming from epoch 2 of the final training" in out
    d = results.run_dir(tmp_path, None, "bbb", "uci/yacht")
    assert json.loads((d / "record.json").read_text())["train_steps"] > 0 and not results.ResumeFiles.in_dir(d)
