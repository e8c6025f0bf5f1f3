"""``bnnbench reproduce --launcher``: cells as jobs through Hydra's launcher plugins (bnnbench/run/launchers.py). The
jobs a reproduction makes (cells sharing a selection together), records equal to a plain ``reproduce``'s through joblib
and submitit, a failed job reported by its cell and log, and a job killed as a scheduler kills one (SIGTERM, then
SIGKILL) resumed from its checkpoint by the same command, to the numbers of an uninterrupted run."""

import json
import os
import re
import signal
import threading
import time

import pytest

from bnnbench.cli import main
from bnnbench.run.launchers import jobs_of

from datapaths import MIRROR

needs_data = pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file(), reason="needs the data mirror")
# Vadam then Vprop with Vadam's per-split selection, on two splits of yacht, a tiny Bayesian optimisation, one epoch
TINY = ["--data", "uci/yacht", "--label", "vadam,vprop", "protocol.epochs=1", "protocol.splits=[0,1]",
        "hpo.n_random=2", "hpo.n_iter=1", "hpo.folds=2", "progress=false"]


def test_cells_that_share_a_selection_go_into_one_job_the_selecting_cell_first():
    cells = [({"method": "bbb", "data": "uci/yacht"}, ["a"]),
             ({"method": "vprop", "data": "uci/yacht", "overrides": ["hpo.record={runs_root}/e/vadam/uci__yacht"]},
              ["b"]),
             ({"method": "vadam", "data": "uci/yacht"}, ["c"]),
             ({"method": "vadam", "data": "uci/boston"}, ["d"]),
             ({"method": "vprop", "data": "uci/wine", "overrides": ["hpo.record={runs_root}/other/vadam/uci__wine"]},
              ["e"])]   # a record outside these cells: its own job, nothing to wait for
    jobs = jobs_of("e", cells)
    assert [(j.name, j.cells, j.titles) for j in jobs] == [
        ("000-bbb-uci__yacht", (("a",),), ("bbb on uci/yacht",)),
        ("001-vadam+vprop-uci__yacht", (("c",), ("b",)), ("vadam on uci/yacht", "vprop on uci/yacht")),
        ("002-vadam-uci__boston", (("d",),), ("vadam on uci/boston",)),
        ("003-vprop-uci__wine", (("e",),), ("vprop on uci/wine",))]


def test_an_unknown_launcher_or_a_setting_it_lacks_is_one_error_line(tmp_path, capsys):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    argv = ["reproduce", "vadam_table1", *TINY, "--runs-root", str(tmp_path)]
    assert main([*argv, "--launcher", "no_such_launcher"]) == 2
    assert "error: unknown launcher 'no_such_launcher'" in capsys.readouterr().err
    assert main([*argv, "--launcher", "joblib", "--partition", "gpu"]) == 2
    assert "error: launcher joblib has no setting for --partition (its settings: n_jobs" in capsys.readouterr().err
    assert main([*argv, "--time", "60"]) == 2
    assert "need --launcher <name>" in capsys.readouterr().err
    assert not list(tmp_path.rglob("record.json"))


def _records(root):
    return {p.parent.parent.name: json.loads(p.read_text()) for p in sorted(root.rglob("record.json"))}


@pytest.fixture(scope="module")
def plain(tmp_path_factory, module_env):
    """The records of a plain ``reproduce`` of the tiny cells."""
    root = tmp_path_factory.mktemp("plain")
    assert main(["reproduce", "vadam_table1", *TINY, "--runs-root", str(root / "runs"),
                 "--out", str(root / "tables")]) == 0
    return _records(root / "runs")


def test_a_job_that_failed_before_its_cells_is_reported_by_the_last_line_of_its_trace():
    """submitit's error for a job whose process raised before any cell ran (unpickling, imports): its message holds
    the job's traceback between two rules; the report gives the exception, not submitit's heading."""
    from submitit.core.utils import FailedJobError

    from bnnbench.run.launchers import _why_no_result
    trace = "Traceback (most recent call last):\n  File ...\nModuleNotFoundError: No module named 'test_contract'"
    err = FailedJobError(f"Job (task=0) failed during processing with trace:\n{'-' * 22}\n{trace}\n{'-' * 22}\n"
                         "You can check full logs with 'job.stderr(0)'")
    assert _why_no_result(None, err).endswith(
        "the launcher said FailedJobError: ModuleNotFoundError: No module named 'test_contract')")
    assert _why_no_result(None, RuntimeError("worker died\nmore")).endswith(
        "the launcher said RuntimeError: worker died)")


@needs_data
@pytest.mark.e2e
@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_jobs_through_a_launcher_make_the_records_of_a_plain_reproduce(launcher, plain, tmp_path, capsys):
    pytest.importorskip(f"hydra_plugins.hydra_{launcher.split('_')[0]}_launcher")
    argv = ["reproduce", "vadam_table1", *TINY, "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "tab"),
            "--launcher", launcher, "--log-dir", str(tmp_path / "logs"), "--jobs", "2"]
    if launcher == "submitit_local":
        argv = [a for a in argv if a not in ("--jobs", "2")] + ["--time", "5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "1 job(s) through hydra/launcher=" in out and "000-vadam+vprop-uci__yacht" in out
    got = _records(tmp_path / "runs")
    assert sorted(got) == ["vadam", "vprop"]
    for label, rec in got.items():
        assert rec["metrics"] == plain[label]["metrics"] and rec["summary"] == plain[label]["summary"], label
        assert rec["hparams"] == plain[label]["hparams"]        # Vprop read Vadam's selection, in the same job
    assert "vprop on uci/yacht" in (tmp_path / "logs" / "000-vadam+vprop-uci__yacht" / "job.log").read_text()
    assert (tmp_path / "tab" / "vadam_table1.md").is_file()     # the tables, rendered once the jobs ended


@needs_data
@pytest.mark.e2e
def test_a_failed_job_is_reported_by_its_cell_and_log(tmp_path, capsys, monkeypatch, module_env):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    empty = tmp_path / "empty"
    empty.mkdir()
    for k in ("BNNBENCH_MIRROR", "BNNBENCH_CACHE"):   # the job's process finds no data set
        monkeypatch.setenv(k, str(empty))
    monkeypatch.setenv("BNNBENCH_OFFLINE", "1")
    logs = tmp_path / "logs"
    assert main(["reproduce", "vadam_table1", "--data", "uci/yacht", "--label", "bbb", "progress=false",
                 "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "tab"), "--launcher", "submitit_local",
                 "--log-dir", str(logs)]) == 3
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("FAILED job"))
    log = logs / "000-bbb-uci__yacht" / "job.log"
    assert re.fullmatch(r"FAILED job 000-bbb-uci__yacht: cell bbb on uci/yacht: Data\w*Error: .*; log: "
                        + re.escape(str(log)), line), line
    assert "Traceback" in log.read_text() and "DataMissingError" in log.read_text()
    assert "1 of 1 job(s) failed" in out


KILL = ["--data", "uci/yacht", "--label", "bbb", "hpo=fixed", "protocol.epochs=80", "protocol.splits=[0,1]",
        "checkpoint_every=5", "checkpoint_seconds=0", "progress=false"]


@needs_data
@pytest.mark.e2e
def test_a_job_killed_by_the_scheduler_resumes_from_its_checkpoint_when_resubmitted(tmp_path, capsys, module_env):
    """submitit ignores SIGTERM in a job (so that SLURM can requeue it); SIGKILL follows, as a scheduler sends it."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    assert main(["reproduce", "vadam_table1", *KILL, "--runs-root", str(tmp_path / "plain"),
                 "--out", str(tmp_path / "tab")]) == 0
    ref = _records(tmp_path / "plain")["bbb"]
    runs, logs = tmp_path / "runs", tmp_path / "logs"
    argv = ["reproduce", "vadam_table1", *KILL, "--runs-root", str(runs), "--out", str(tmp_path / "tab"),
            "--launcher", "submitit_local", "--time", "5"]
    codes = []   # the first submission waits for its job in a thread of this process, while this one kills the job
    first = threading.Thread(target=lambda: codes.append(main([*argv, "--log-dir", str(logs / "first")])))
    first.start()
    cell = runs / "vadam_table1" / "bbb" / "uci__yacht"
    deadline = time.monotonic() + 120
    while not list(cell.glob(".checkpoint-*.pt")):   # the first checkpoint (epoch 5 of 80)
        assert first.is_alive() and time.monotonic() < deadline, capsys.readouterr().out
        time.sleep(0.02)
    pid = json.loads((logs / "first" / "000-bbb-uci__yacht" / "job.pid").read_text())["pid"]
    os.kill(pid, signal.SIGTERM)
    time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    first.join(timeout=120)
    out = capsys.readouterr().out
    assert codes == [3], out
    log = logs / "first" / "000-bbb-uci__yacht" / "job.log"
    assert "FAILED job 000-bbb-uci__yacht: cell bbb on uci/yacht: it ended without a result" in out
    assert f"; log: {log}" in out
    assert not (cell / "record.json").exists() and list(cell.glob(".checkpoint-*.pt"))

    assert main([*argv, "--log-dir", str(logs / "again")]) == 0, capsys.readouterr().out   # the same command again
    assert "resuming from epoch" in (logs / "again" / "000-bbb-uci__yacht" / "job.log").read_text()
    rec = _records(runs)["bbb"]
    assert rec["metrics"] == ref["metrics"] and rec["summary"] == ref["summary"]
    assert not list(cell.glob(".checkpoint-*.pt"))
