"""What a new user meets first on the command line (issue #32): help and version, refused filters and runs that leave
nothing behind, data that is not finite, an estimate before long work, empty tables and sites, and interruptions."""

import os
import subprocess
import sys

import pytest

from bnnbench import __version__
from bnnbench.cli import main

from datapaths import MIRROR, REPO

needs_mirror = pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file(), reason="needs the data mirror")
YACHT_DATA = "uci_gal/UCI_Datasets/yacht/data/data.txt"
TINY = ["method=bbb", "data=uci/yacht", "protocol.epochs=1", "protocol.splits=[0]", "progress=false"]


@pytest.fixture
def data_env(tmp_path, monkeypatch):
    """The data mirror, an empty cache of this test's own and no network."""
    monkeypatch.setenv("BNNBENCH_MIRROR", str(MIRROR))
    monkeypatch.setenv("BNNBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("BNNBENCH_OFFLINE", "1")
    return tmp_path / "cache"


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bnnbench.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_run_help_prints_the_override_syntax_and_exits_0(capsys, flag):
    assert main(["run", flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: bnnbench run") and "method=bbb data=uci/boston" in out
    assert "protocol.epochs=" in out and "bnnbench list" in out


def test_run_help_in_a_real_process_has_no_hydra_error():
    p = _cli("run", "--help")
    assert p.returncode == 0 and "usage: bnnbench run" in p.stdout and "error" not in p.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"bnnbench {__version__}"


@pytest.mark.parametrize("filters, said", [
    (["--data", "uci/bostn"], "data set 'uci/bostn' (did you mean uci/boston?); its data sets: uci/boston, "),
    (["--label", "foo"], "label 'foo'; its labels: bbb, mc_dropout, slang"),
    (["--data", "uci/boston", "--label", "slang,sl4ng"], "label 'sl4ng' (did you mean slang?)"),
])
def test_reproduce_refuses_a_filter_no_cell_has_and_writes_nothing(tmp_path, capsys, filters, said):
    argv = ["reproduce", "slang_table2", "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "tables"),
            "--figures", str(tmp_path / "figures"), *filters]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no cell of slang_table2 has the ") and said in err
    assert list(tmp_path.iterdir()) == []


def test_reproduce_refuses_filters_that_no_cell_meets_together(tmp_path, capsys):
    argv = ["reproduce", "vadam_fig2", "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "tables"),
            "--data", "usps/3vs5", "--label", "vadam_M32"]
    assert main(argv) == 2
    assert "no cell of vadam_fig2 has both a data set of --data usps/3vs5 and a label of --label vadam_M32" in \
        capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _refuse_missing_mirror(tmp_path, monkeypatch):
    monkeypatch.setenv("BNNBENCH_MIRROR", str(tmp_path / "no_mirror"))


def _refuse_checksum(tmp_path, monkeypatch):
    from bnnbench.core.data import registry
    monkeypatch.setitem(registry.file_entry(YACHT_DATA), "sha256", "0" * 64)


@needs_mirror
@pytest.mark.parametrize("override, refuse, said", [
    ("protocol.epochs=0", None, "protocol.epochs must be a positive integer"),
    ("device=cuda", None, "device=cuda"),
    ("seed=0", _refuse_missing_mirror, "is not available"),
    ("seed=0", _refuse_checksum, "Checksum mismatch"),
])
def test_a_refused_run_leaves_no_new_directories(data_env, tmp_path, monkeypatch, capsys, override, refuse, said):
    if override == "device=cuda":
        import torch
        if torch.cuda.is_available():
            pytest.skip("refused only without a GPU")
    if refuse:
        refuse(tmp_path, monkeypatch)
    runs = tmp_path / "runs"
    assert main(["run", *TINY, override, f"runs_root={runs}"]) == 2
    assert said in capsys.readouterr().err
    assert not runs.exists()


def test_a_claimed_run_directory_keeps_what_existed_before(tmp_path):
    from bnnbench.run.results import claimed
    (tmp_path / "runs" / "adhoc").mkdir(parents=True)
    with claimed(tmp_path / "runs" / "adhoc" / "bbb" / "uci__yacht") as d:
        assert (d / ".lock").exists()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["adhoc"]
    assert not any((tmp_path / "runs" / "adhoc").iterdir())


@pytest.mark.parametrize("experiment", ["slang_table2", "uci_leaderboard"])
def test_table_without_records_says_where_it_looked_and_writes_nothing(tmp_path, capsys, experiment):
    runs = tmp_path / "runs"
    assert main(["table", experiment, "--runs-root", str(runs), "--out", str(tmp_path / "tables")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: no run records of {experiment} under {runs}") and "not_run" not in err
    assert f"bnnbench reproduce {experiment}" in err and not (tmp_path / "tables").exists()


def test_report_of_no_records_has_no_empty_sections_or_notes(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    assert main(["report", "--results", str(results), "--out", str(tmp_path / "site")]) == 0
    index = (tmp_path / "site" / "index.html").read_text()
    assert "Figures" not in index and "Paper tables" not in index and "<ul>" not in index
    assert "No tables or figures yet" in index and "bnnbench reproduce" in index
    assert "notes.html" not in index and not (tmp_path / "site" / "notes.html").exists()


def test_report_lists_only_the_sections_it_has(tmp_path):
    import shutil
    from bnnbench.present.report import build_site
    results = tmp_path / "results"
    (results / "figures").mkdir(parents=True)
    shutil.copy(REPO / "results" / "figures" / "gi_fig1_predictive.png", results / "figures")
    (results / "README.md").write_text("# notes\n\n* **a deviation** of something\n")
    build_site(results, tmp_path / "site")
    index = (tmp_path / "site" / "index.html").read_text()
    assert "<h2>Figures</h2>" in index and "Paper tables" not in index and "No tables or figures" not in index
    assert "notes.html" in index and "a deviation" in (tmp_path / "site" / "notes.html").read_text()


@needs_mirror
def test_a_nan_in_the_cached_data_is_blamed_on_the_data_and_data_fetch_rebuilds_it(data_env, tmp_path, capsys):
    import numpy as np
    from bnnbench.core.data import load_dataset, store
    load_dataset("uci/yacht")
    path = store.canonical_path("uci/yacht")
    arrays = store.read_npz(path)
    arrays["X"][17, 2] = np.nan
    store.atomic_savez(path, arrays)
    assert main(["run", *TINY, f"runs_root={tmp_path / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: uci/yacht: the cached data file {path} holds NaN or infinite values in X "
                          "(1 row(s): 17); the data is broken, not the method.")
    assert "bnnbench data fetch uci/yacht" in err and "diverged" not in err
    assert main(["data", "fetch", "uci/yacht"]) == 0
    assert np.isfinite(load_dataset("uci/yacht").X).all()


def test_non_finite_values_from_the_source_name_it():
    import numpy as np
    from bnnbench.core.data import NonFiniteDataError, _check_finite
    y = np.array([0.0, np.inf, 1.0])
    with pytest.raises(NonFiniteDataError, match=r"^toy: its raw files a.txt holds NaN or infinite values in y "
                                                 r"\(1 row\(s\): 1\).*Check the raw files of toy"):
        _check_finite("toy", {"X": np.zeros((3, 2)), "y": y}, "its raw files a.txt", rebuild=False)
    _check_finite("toy", {"X": np.zeros((3, 2), dtype=np.uint8), "y": np.arange(3)}, "its raw files a.txt", False)


def test_the_estimate_of_a_long_training_is_said_only_when_long():
    from bnnbench.run.engine import eta_notice
    assert eta_notice(3.0, 3, 500) is None                               # 500 s left: under 10 minutes
    assert eta_notice(3.0, 3, 1000) == ("estimated 17 min for the final training: 1000 more epochs at 1 s each "
                                        "(measured on the first epochs; Ctrl-C stops the run)")
    assert eta_notice(0.015, 3, 100_000_000).startswith("estimated 5.8 days for the final training: 100000000 more")
    assert eta_notice(36.0, 3, 600).startswith("estimated 2.0 h ")
    assert eta_notice(0.0, 0, 10**9) is None


def test_the_estimate_of_a_compiled_run_leaves_out_its_first_epoch(monkeypatch, capsys):
    """A compiled step compiles during the first epoch (5-60 s): the pace is that of the epochs after it."""
    from bnnbench.run import engine
    clock = iter([0.0, 60.0, 61.0, 62.0])   # the first epoch 60 s (compiling), then 1 s each
    monkeypatch.setattr(engine.time, "perf_counter", lambda: next(clock))
    eta = engine.EtaNotice(True, skip_first=True)
    for done in range(1, 4):
        eta.epoch_done(done, 1000 - done)
    assert capsys.readouterr().out.startswith("estimated 17 min for the final training: 997 more epochs at 1 s each")


@needs_mirror
def test_a_run_prints_its_estimate_once_after_the_first_epochs(data_env, tmp_path, monkeypatch, capsys):
    import bnnbench.run.engine as engine
    ov = ["method=bbb", "data=uci/yacht", "protocol.epochs=5", "protocol.splits=[0]", "progress=false"]
    assert main(["run", *ov, f"runs_root={tmp_path / 'a'}"]) == 0
    assert "estimated" not in capsys.readouterr().out                   # a short run says nothing
    monkeypatch.setattr(engine, "ETA_NOTICE_S", 0.0)
    assert main(["run", *ov, f"runs_root={tmp_path / 'b'}"]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("estimated")]
    assert len(said) == 1 and said[0].startswith("estimated 0 min for the final training: 2 more epochs at ")


LONG = ["protocol.epochs=1000000", "protocol.splits=[0]", "progress=false", "checkpoint_every=2",
        "checkpoint_seconds=0"]


def _as_a_terminals_job():
    """In the child before it starts bnnbench: SIGINT and SIGTERM at their defaults and unblocked, as a shell starts a
    foreground command. A child inherits an ignored or blocked signal from this process, where a library used by an
    earlier test may have left one so (in the whole suite this test's Ctrl-C twice went unheeded: 120 s timeouts)."""
    import signal
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop_when_training(args, sig, trainings=1, group=False):
    """Start ``bnnbench <args>``, send ``sig`` once ``trainings`` final trainings have printed their estimate (after
    their first epochs, with a checkpoint written), to the process or, as a terminal's Ctrl-C, to its process group;
    returns the finished process's exit code, stdout and stderr."""
    import signal
    p = subprocess.Popen([sys.executable, "-m", "bnnbench.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=REPO, start_new_session=True, preexec_fn=_as_a_terminals_job)
    try:
        seen = []
        for line in p.stdout:
            seen += [line] if line.startswith("estimated") else []
            if len(seen) == trainings:
                break
        os.killpg(p.pid, sig) if group else p.send_signal(sig)
        out, err = p.communicate(timeout=120)
    finally:   # nothing of the run outlives the test, whatever it did (a worker whose parent died included)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    return p.returncode, "".join(seen) + out, err


def _left_behind(root):
    """Files a stopped run must not leave: its lock, a record, a temporary file of an unfinished write."""
    return [q for q in root.rglob("*") if q.name in (".lock", "record.json") or q.name.endswith(".tmp")]


@needs_mirror
@pytest.mark.e2e
def test_sigterm_stops_a_run_as_ctrl_c_does(data_env, tmp_path):
    import signal
    code, out, err = _stop_when_training(["run", "method=bbb", "data=uci/yacht", *LONG, f"runs_root={tmp_path}"],
                                         signal.SIGTERM)
    run_dir = tmp_path / "adhoc" / "bbb" / "uci__yacht"
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 143 and "Traceback" not in err and len(lines) == 1, err
    ck, = run_dir.glob(".checkpoint-*.pt")
    assert lines[0] == f"interrupted (SIGTERM): resume state kept in {run_dir} ({ck.name}); the same command resumes it"
    assert _left_behind(tmp_path) == []


@needs_mirror
@pytest.mark.e2e
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_to_a_run_with_workers_stops_its_workers_too(data_env, tmp_path, sig):
    """SIGTERM to the parent alone, as a scheduler may send it, stops a run whose replicas train in worker processes
    at once, not when the workers' chunks end (here: never); so does Ctrl-C, which a terminal sends to the workers as
    well: the exit code, the one line naming each chunk's checkpoint, nothing half-written, no process left."""
    import signal
    args = ["run", "method=bbb", "data=uci/yacht", *[a for a in LONG if not a.startswith("protocol.splits")],
            "protocol.splits=[0,1]", "workers=2", f"runs_root={tmp_path}"]
    code, out, err = _stop_when_training(args, getattr(signal, sig), group=sig == "SIGINT")
    run_dir = tmp_path / "adhoc" / "bbb" / "uci__yacht"
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == (143 if sig == "SIGTERM" else 130) and "Traceback" not in err and len(lines) == 1, err
    parts = sorted(p.name for p in run_dir.glob(".checkpoint-*-part*of2.pt"))
    how = "SIGTERM" if sig == "SIGTERM" else "Ctrl-C"
    assert parts and lines[0] == (f"interrupted ({how}): resume state kept in {run_dir} ({', '.join(parts)}); "
                                  "the same command resumes it")
    assert _left_behind(tmp_path) == []


@needs_mirror
@pytest.mark.e2e
@pytest.mark.parametrize("sig, jobs", [("SIGINT", 1), ("SIGTERM", 2)])
def test_an_interrupted_reproduce_says_what_each_cell_left(data_env, tmp_path, sig, jobs):
    """Ctrl-C (to the process group, as a terminal sends it) and SIGTERM (to the parent only, as a scheduler may):
    one line per interrupted cell with its resume state, no cell started after, no traceback, no table written."""
    import signal
    args = ["reproduce", "slang_table2", "--data", "uci/yacht", "--label", "bbb,slang,mc_dropout", "--jobs", str(jobs),
            "--runs-root", str(tmp_path / "runs"), "--out", str(tmp_path / "tables"), *LONG, "hpo=fixed"]
    code, out, err = _stop_when_training(args, getattr(signal, sig), trainings=jobs, group=sig == "SIGINT")
    how = "Ctrl-C" if sig == "SIGINT" else "SIGTERM"
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == (130 if sig == "SIGINT" else 143) and "Traceback" not in err, err
    assert len(lines) == jobs + 1 and lines[-1] == "slang_table2: stopped; tables and figures not rewritten", err
    for line, label in zip(lines[:jobs], ["bbb", "slang"]):
        run_dir = tmp_path / "runs" / "slang_table2" / label / "uci__yacht"
        ck, = run_dir.glob(".checkpoint-*.pt")
        assert line == f"interrupted ({how}): resume state kept in {run_dir} ({ck.name}); the same command resumes it"
    assert sorted(p.name for p in (tmp_path / "runs" / "slang_table2").iterdir()) == ["bbb", "slang"][:jobs]
    assert _left_behind(tmp_path) == [] and not (tmp_path / "tables").exists()


def test_ctrl_c_while_starting_up_is_one_line(monkeypatch, tmp_path, capsys):
    import bnnbench.run.config as config

    def interrupted(overrides):
        raise KeyboardInterrupt
    monkeypatch.setattr(config, "compose_checked", interrupted)
    assert main(["run", "method=bbb", f"runs_root={tmp_path}"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted (Ctrl-C) while no run was training: nothing to resume"
    assert list(tmp_path.iterdir()) == []


@needs_mirror
def test_ctrl_c_in_a_reproduce_cell_names_its_resume_state(data_env, tmp_path, monkeypatch, capsys):
    from interrupts import ctrl_c_at_evaluation
    ctrl_c_at_evaluation(monkeypatch, 3)   # epoch 3, after the checkpoint of epoch 2
    runs = tmp_path / "runs"
    argv = ["reproduce", "slang_table2", "--data", "uci/yacht", "--label", "bbb,slang", "--runs-root", str(runs),
            "--out", str(tmp_path / "tables"), "protocol.epochs=5", "protocol.eval_every=1", "protocol.splits=[0]",
            "checkpoint_every=2", "checkpoint_seconds=0", "progress=false", "hpo=fixed"]
    assert main(argv) == 130
    run_dir = runs / "slang_table2" / "bbb" / "uci__yacht"
    ck, = run_dir.glob(".checkpoint-*.pt")
    assert [line for line in capsys.readouterr().err.splitlines() if line] == [
        f"interrupted (Ctrl-C): resume state kept in {run_dir} ({ck.name}); the same command resumes it",
        "slang_table2: stopped; tables and figures not rewritten"]
    assert [p.name for p in (runs / "slang_table2").iterdir()] == ["bbb"] and _left_behind(tmp_path) == []


def test_main_runs_outside_the_main_thread(capsys):
    """Signal handlers can only be set in the main thread: main elsewhere (a caller's worker thread) leaves them."""
    import threading
    codes = []
    t = threading.Thread(target=lambda: codes.append(main(["list", "protocols"])))
    t.start()
    t.join()
    assert codes == [0] and "protocols:" in capsys.readouterr().out
