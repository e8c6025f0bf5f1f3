"""The command line and run records: required fields, determinism, skip-if-done, divergence,
atomic writes and the error messages a user sees."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bnnbench.run import results
from bnnbench.cli import main
from bnnbench.run.config import compose
from bnnbench.run.engine import DivergenceError
from bnnbench.run.config import ConfigError
from bnnbench.run.execute import execute

from datapaths import MIRROR, REPO

pytestmark = pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file(), reason="needs the data mirror")

TINY = ["protocol.epochs=2", "protocol.splits=[0,1,2]", "protocol.eval_every=1", "progress=false"]


@pytest.fixture(scope="module", autouse=True)
def env(module_env):
    yield


def _run(tmp_path, *overrides):
    ov = ["method=bbb", "data=uci/yacht", *TINY, *overrides]
    return execute(compose(ov), ov, tmp_path / "run", log=lambda m: None)


def test_record_has_required_fields(tmp_path):
    rec = _run(tmp_path)
    on_disk = json.loads((tmp_path / "run" / "record.json").read_text())
    assert on_disk == json.loads(json.dumps(rec))
    for k in ("method", "dataset", "protocol", "seed", "metrics", "summary", "wall_time_s", "versions",
              "git_commit", "hparams", "stderr_convention", "config"):
        assert k in on_disk, k
    assert on_disk["method"] == "bbb" and on_disk["dataset"] == "uci/yacht" and on_disk["protocol"] == "slang_uci"
    assert [m["split"] for m in on_disk["metrics"]] == ["0", "1", "2"]
    assert on_disk["versions"]["torch_threads"] == torch.get_num_threads()
    from bnnbench.run.numerics import numerics_class
    assert on_disk["versions"]["numerics"] == numerics_class()   # the class of CPU whose rounding it holds
    for key in ("rmse", "loglik_joint", "loglik_pointwise"):
        s = on_disk["summary"][key]
        assert set(s) == {"mean", "stderr", "n"} and s["n"] == 3
        vals = [m[key] for m in on_disk["metrics"]]
        assert s["mean"] == pytest.approx(sum(vals) / 3)
    hist = json.loads((tmp_path / "run" / "history.json").read_text())
    assert hist["epochs"] == [1, 2] and len(hist["metrics"][0]["rmse"]) == 3


def test_same_command_same_numbers(tmp_path):
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b")
    assert a["metrics"] == b["metrics"]
    c = _run(tmp_path / "c", "seed=1")
    assert c["metrics"] != a["metrics"]


def test_finished_cell_is_skipped(tmp_path):
    a = _run(tmp_path)
    mtime = (tmp_path / "run" / "record.json").stat().st_mtime_ns
    b = _run(tmp_path)
    assert b == json.loads(json.dumps(a)) and (tmp_path / "run" / "record.json").stat().st_mtime_ns == mtime
    refused = r"another configuration \(it differs in spec.epochs\).*label=.*skip_done=false"
    with pytest.raises(ConfigError, match=refused):
        _run(tmp_path, "protocol.epochs=3")  # never replaces the record of another configuration silently
    assert (tmp_path / "run" / "record.json").stat().st_mtime_ns == mtime
    c = _run(tmp_path, "protocol.epochs=3", "skip_done=false")  # unless asked to
    on_disk = json.loads((tmp_path / "run" / "record.json").read_text())
    assert on_disk["config_hash"] == c["config_hash"] != a["config_hash"]


def test_divergence_writes_failure_and_no_record(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(DivergenceError, match="diverged at epoch"):
        _run(tmp_path, "method.lr=1e30")
    assert not (tmp_path / "run" / "record.json").exists()
    failed = json.loads((tmp_path / "run" / "failed.json").read_text())
    assert failed["status"] == "failed" and "non-finite" in failed["reason"]
    assert failed["git_commit"] == results.git_commit() and "torch" in failed["versions"]   # the code that failed


def test_a_recorded_failure_is_not_rerun_unless_asked(tmp_path, monkeypatch):
    """The same configuration again fails at once with the recorded reason, training nothing; ``retry_failed=true``
    (or ``skip_done=false``) trains it again; another configuration in the directory is not held back by it."""
    import bnnbench.run.execute as ex
    (tmp_path / "run").mkdir()
    with pytest.raises(DivergenceError):
        _run(tmp_path, "method.lr=1e30")
    failed = tmp_path / "run" / "failed.json"
    reason, mtime = json.loads(failed.read_text())["reason"], failed.stat().st_mtime_ns
    trained = []
    real_train = ex._train
    monkeypatch.setattr(ex, "_train", lambda *a, **k: trained.append(1) or real_train(*a, **k))
    with pytest.raises(ex.RecordedFailure, match=r"non-finite.*an earlier run of this config.*retry_failed=true"):
        _run(tmp_path, "method.lr=1e30")
    assert trained == [] and failed.stat().st_mtime_ns == mtime and reason in json.loads(failed.read_text())["reason"]
    for again in ("retry_failed=true", "skip_done=false"):
        with pytest.raises(DivergenceError) as e:
            _run(tmp_path, "method.lr=1e30", again)
        assert not isinstance(e.value, ex.RecordedFailure)
    assert trained == [1, 1] and failed.stat().st_mtime_ns != mtime
    rec = _run(tmp_path)   # another configuration runs, and its record replaces the failure
    assert rec["status"] == "ok" and not failed.exists()


def test_a_precision_that_is_not_positive_definite_is_recorded_as_a_failure(tmp_path):
    """full_gaussian's float32 precision on an MLP loses positive definiteness in its first epoch: the run stops, and
    failed.json names the Cholesky failure (no crash, no record)."""
    (tmp_path / "run").mkdir()
    with pytest.raises(DivergenceError, match="diverged at epoch 1: .*not positive-definite"):
        _run(tmp_path, "method=full_gaussian", "data=uci/boston")
    assert not (tmp_path / "run" / "record.json").exists()
    assert "positive-definite" in json.loads((tmp_path / "run" / "failed.json").read_text())["reason"]


def test_interrupted_write_leaves_no_partial_record(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "fsync", boom)  # killed while the bytes are being written
    with pytest.raises(KeyboardInterrupt):
        results.atomic_write_json(tmp_path / "record.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("override, match", [("dtype=float16", "dtype"), ("method.lr=-1", "method.lr"),
                                              ("method.train_samples=0", "train_samples"), ("device=tpu", "device"),
                                              ("protocol.epochs=0", "protocol.epochs")])
def test_wrong_values_fail_at_start(tmp_path, override, match):
    with pytest.raises(ConfigError, match=match):
        _run(tmp_path, override)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("data", ["uci/protein", "mnist"])
def test_protocol_without_the_dataset_lists_valid_ones(tmp_path, data):
    with pytest.raises(ConfigError, match=r"does not define data set .*it defines: boston, .*protocol=<name>") as e:
        _run(tmp_path, f"data={data}", "protocol=slang_uci")
    assert "mnist/" not in str(e.value)


def test_recorded_hparams_are_reused(tmp_path):
    rec = _run(tmp_path, "hparams.noise_prec=0.5", "hparams.prior_prec=2.0")
    assert all(h["noise_prec"] == 0.5 and h["prior_prec"] == 2.0 for h in rec["hparams"])
    again = _run(tmp_path / "b", "hpo=recorded", f"hpo.record={tmp_path / 'run'}")
    assert again["metrics"] == rec["metrics"]


def test_a_searched_cell_with_a_learned_noise_repeats_with_its_recorded_hparams(tmp_path):
    """q(tau)'s draws at evaluation come from torch's global generator, which a search's held-out scoring draws from
    too: the search leaves it as it found it, so the final training after a grid search gives the numbers that a
    re-run with the record's hyper-parameters (hpo=recorded, CI's regression) gives."""
    base = ["experiment=nng_table1", "method=bbb", "data=uci/yacht", "protocol.epochs=2", "protocol.splits=[r0,r1,r2]",
            "progress=false", "protocol.method_space={bbb: {lr: {values: [0.01, 0.001]}}}"]
    ov = [*base, "hpo=grid", "hpo.folds=5", "hpo.use_folds=1", "hpo.metric=loglik_pointwise"]
    rec = execute(compose(ov), ov, tmp_path / "grid", log=lambda m: None)
    assert rec["hpo_trace"] and rec["config"]["spec"]["method"]["learn_noise"]
    again = [*base, "hpo=recorded", f"hpo.record={tmp_path / 'grid'}"]
    assert execute(compose(again), again, tmp_path / "recorded", log=lambda m: None)["metrics"] == rec["metrics"]


def test_bo_selection_is_recorded(tmp_path):
    rec = _run(tmp_path, "hpo=bo", "hpo.n_random=2", "hpo.n_iter=1", "hpo.folds=2", "protocol.epochs=1")
    assert len(rec["hpo_trace"]) == 3 and all(len(t) == 3 for t in rec["hpo_trace"])
    lo, hi = -1.6, -0.6  # the yacht box of slang_uci (log noise precision)
    import math
    for h, trace in zip(rec["hparams"], rec["hpo_trace"]):
        best = max(trace, key=lambda t: t["score"])
        assert h["noise_prec"] == pytest.approx(best["noise_prec"])
        assert math.exp(lo) <= h["noise_prec"] <= math.exp(hi)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bnnbench.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300, env=os.environ.copy())


@pytest.mark.e2e
def test_cli_run_prints_summary(tmp_path):
    p = _cli("run", "method=map", "data=uci/yacht", *TINY, f"runs_root={tmp_path}")
    assert p.returncode == 0, p.stderr
    assert "rmse" in p.stdout and "loglik_joint" in p.stdout and "+-" in p.stdout
    assert (tmp_path / "adhoc" / "map" / "uci__yacht" / "record.json").exists()


@pytest.mark.e2e
def test_cli_sweep_checks_and_applies_overrides_as_a_single_run_does(tmp_path):
    p = _cli("run", "-m", "method=map,bbb", "data=uci/yacht", *TINY, "protocol.batch_size=16", f"runs_root={tmp_path}")
    assert p.returncode == 0, p.stderr
    for m in ("map", "bbb"):
        rec = json.loads((tmp_path / "adhoc" / m / "uci__yacht" / "record.json").read_text())
        assert rec["config"]["spec"]["batch_size"] == 16
        assert sorted(q.name for q in (tmp_path / "adhoc" / m / "uci__yacht").iterdir()) == ["history.json",
                                                                                          "record.json"]
    p = _cli("run", "-m", "method=map,bbb", "method.nosuch=1", f"runs_root={tmp_path}")
    assert p.returncode == 2 and "unknown key 'method.nosuch'" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.e2e   # two real processes, about 5 s each
def test_cli_unknown_names_list_valid_ones(tmp_path):
    p = _cli("run", "method=slang_typo", f"runs_root={tmp_path}")
    assert p.returncode != 0 and "bbb" in p.stderr and "mc_dropout" in p.stderr
    p = _cli("run", "data=uci/bostn", f"runs_root={tmp_path}")
    assert p.returncode != 0 and "uci/boston" in p.stderr


@pytest.mark.e2e
def test_cli_divergence_exit_code(tmp_path):
    p = _cli("run", "method=bbb", "data=uci/yacht", *TINY, "method.lr=1e30", f"runs_root={tmp_path}")
    assert p.returncode == 3 and "diverged" in p.stderr
    assert not (tmp_path / "adhoc" / "bbb" / "uci__yacht" / "record.json").exists()


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "uci/boston" in out and "bbb" in out and "slang_table2" in out and "vadam_uci" in out
    assert "exact_full" in out and "slang_table1" in out and "slang_logreg" in out


def test_grid_selection_is_recorded(tmp_path):
    rec = _run(tmp_path, "hpo=grid", "hpo.grid_points=2", "hpo.folds=2", "protocol.epochs=1")
    for h, trace in zip(rec["hparams"], rec["hpo_trace"]):
        assert len(trace) == 4  # 2 x 2 grid over (log noise precision, log prior precision)
        best = max(trace, key=lambda t: t["score"])
        assert h["noise_prec"] == pytest.approx(best["noise_prec"])
        assert h["prior_prec"] == pytest.approx(best["prior_prec"])


def test_config_hash_ignores_unset_entries():
    a = {"spec": {"epochs": 3, "lr_drop": None, "method": {"lr": 0.1, "init_std": None}}}
    b = {"spec": {"epochs": 3, "method": {"lr": 0.1}}}
    assert results.config_hash(a) == results.config_hash(b)
    assert results.config_hash(a) != results.config_hash({"spec": {"epochs": 4, "method": {"lr": 0.1}}})


class _Interrupt(Exception):
    pass


def test_interrupted_final_training_resumes_to_the_same_result(tmp_path, monkeypatch):
    import bnnbench.run.engine as engine
    ov = ["protocol.epochs=6", "checkpoint_every=2", "checkpoint_seconds=0"]
    ref = _run(tmp_path / "ref", *ov)
    real = engine.evaluate
    calls = {"n": 0}

    def flaky(*a, **k):  # dies in the evaluation of epoch 4, before its checkpoint: resumes from epoch 2
        calls["n"] += 1
        if calls["n"] == 4:
            raise _Interrupt
        return real(*a, **k)

    monkeypatch.setattr(engine, "evaluate", flaky)
    with pytest.raises(_Interrupt):
        _run(tmp_path / "cut", *ov)
    assert not (tmp_path / "cut" / "run" / "record.json").exists()
    ck_file, = (tmp_path / "cut" / "run").glob(".checkpoint-*.pt")  # the epoch-2 checkpoint
    ck = torch.load(ck_file, weights_only=False)
    torch.save({**ck, "elapsed": 1000.0}, ck_file)   # as if the first two epochs had taken 1000 s
    monkeypatch.setattr(engine, "evaluate", real)
    resumed = _run(tmp_path / "cut", *ov)
    assert resumed["metrics"] == ref["metrics"]
    assert resumed["wall_time_s"] >= resumed["train_time_s"] >= 1000  # the time before the interruption counts
    assert not list((tmp_path / "cut" / "run").glob(".*.pt"))  # checkpoints are removed once the record exists


def test_checkpoints_are_at_least_checkpoint_seconds_apart(tmp_path, monkeypatch):
    """A checkpoint is written at every ``checkpoint_every``-th epoch once ``checkpoint_seconds`` of training have
    passed since the last one (or the start): with each epoch taking 25 s on the training's clock, 12 epochs, every
    2nd and 60 s, the epochs 4 (100 s), 8 (200 s); with 0 s every 2nd epoch but the last (2, 4, ..., 10)."""
    import bnnbench.run.engine as engine
    saved = []
    real_save = results.save_checkpoint
    monkeypatch.setattr(results, "save_checkpoint", lambda path, payload: saved.append(payload["epoch"])
                        or real_save(path, payload))
    clock = {"t": 0.0}
    real_batches = engine.epoch_batches

    def slow_epochs(*a, **k):   # each epoch advances the clock by 25 s
        clock["t"] += 25.0
        return real_batches(*a, **k)
    monkeypatch.setattr(engine, "epoch_batches", slow_epochs)
    monkeypatch.setattr(engine.time, "perf_counter", lambda: clock["t"])
    _run(tmp_path / "a", "protocol.epochs=12", "checkpoint_every=2", "checkpoint_seconds=60")
    assert saved == [4, 8]
    saved.clear()
    _run(tmp_path / "b", "protocol.epochs=12", "checkpoint_every=2", "checkpoint_seconds=0")
    assert saved == [2, 4, 6, 8, 10]


def test_a_grid_search_interrupted_part_way_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """The grid's one round checkpoints while it trains: cut after its epoch-2 checkpoint, the same command says so,
    trains the round's last two epochs only, and chooses and scores exactly as an uninterrupted run."""
    import bnnbench.run.engine as engine
    ov = ["hpo=grid", "hpo.grid_points=2", "hpo.folds=2", "protocol.epochs=4", "checkpoint_every=2",
          "checkpoint_seconds=0"]
    ref = _run(tmp_path / "ref", *ov)
    real_save = results.save_checkpoint

    def cut(path, payload):
        real_save(path, payload)
        if "-round0" in Path(path).name:
            raise _Interrupt

    monkeypatch.setattr(results, "save_checkpoint", cut)
    with pytest.raises(_Interrupt):
        _run(tmp_path / "cut", *ov)
    monkeypatch.setattr(results, "save_checkpoint", real_save)
    run_dir = tmp_path / "cut" / "run"
    assert not (run_dir / "record.json").exists() and len(list(run_dir.glob(".hpo-*-round0.pt"))) == 1
    ck_file, = run_dir.glob(".hpo-*-round0.pt")
    torch.save({**torch.load(ck_file, weights_only=False), "elapsed": 1000.0}, ck_file)   # 2 epochs took 1000 s
    epochs = []
    real_step = engine.epoch_batches
    monkeypatch.setattr(engine, "epoch_batches", lambda *a, **k: epochs.append(1) or real_step(*a, **k))
    said = []
    ov_cut = ["method=bbb", "data=uci/yacht", *TINY, *ov]
    resumed = execute(compose(ov_cut), ov_cut, run_dir, log=said.append)
    assert "resuming from epoch 2 of search round 1" in said[0]
    assert len(epochs) == 2 + 4   # the round's epochs 3 and 4, then the final training's 4
    assert resumed["hparams"] == ref["hparams"] and resumed["hpo_trace"] == ref["hpo_trace"]
    assert resumed["metrics"] == ref["metrics"]
    assert resumed["wall_time_s"] >= resumed["hpo_time_s"] >= 1000   # the search's time before the cut counts
    assert not list(run_dir.glob(".*.pt"))   # every resume file removed once the record exists


@pytest.mark.e2e
def test_interrupted_bayesian_optimisation_resumes_to_the_same_choice(tmp_path, monkeypatch):
    import bnnbench.run.execute as execute_mod
    import bnnbench.run.selection as selection_mod

    def patch(f):  # the search rounds (selection) and the final training (execute)
        for mod in (selection_mod, execute_mod):
            monkeypatch.setattr(mod, "fit_replicas", f)
    ov = ["hpo=bo", "hpo.n_random=2", "hpo.n_iter=2", "hpo.folds=2", "protocol.epochs=1"]
    ref = _run(tmp_path / "ref", *ov)
    real = selection_mod.fit_replicas
    calls = {"n": 0}

    def flaky(*a, **k):  # round 1 (2 random points) and round 2 finish, round 3 dies
        calls["n"] += 1
        if calls["n"] == 3:
            raise _Interrupt
        return real(*a, **k)

    patch(flaky)
    with pytest.raises(_Interrupt):
        _run(tmp_path / "cut", *ov)
    patch(real)
    ck_file, = (tmp_path / "cut" / "run").glob(".hpo-*.pt")
    rounds = torch.load(ck_file, weights_only=False)
    torch.save([{**r, "wall": 500.0} for r in rounds], ck_file)   # as if each finished round had taken 500 s
    calls["n"] = 0
    counting = lambda *a, **k: (calls.__setitem__("n", calls["n"] + 1), real(*a, **k))[1]  # noqa: E731
    patch(counting)
    resumed = _run(tmp_path / "cut", *ov)
    assert calls["n"] == 2  # the last BO round and the final training; the first two rounds were replayed
    assert resumed["hparams"] == ref["hparams"] and resumed["hpo_trace"] == ref["hpo_trace"]
    assert resumed["metrics"] == ref["metrics"]
    assert resumed["wall_time_s"] >= resumed["hpo_time_s"] >= 1000  # the replayed rounds' time counts


def test_reproduce_refuses_an_unknown_option(capsys):
    with pytest.raises(SystemExit):
        main(["reproduce", "slang_fig4", "--method", "bbb"])
    assert "unrecognized arguments: --method" in capsys.readouterr().err


@pytest.mark.e2e
def test_reproduce_runs_every_cell_in_worker_processes(tmp_path, capsys):
    runs = tmp_path / "runs"
    argv = ["reproduce", "slang_fig4", "protocol.epochs=1", "protocol.eval_every=1", "progress=false",
            "--runs-root", str(runs), "--figures", str(tmp_path / "fig"), "--jobs", "2",
            "--data", "libsvm/breast_cancer", "--label", "mf_hessian,slang_L5", "protocol.restarts=2"]
    assert main(argv) == 0
    records = sorted(runs.glob("slang_fig4/*/*/record.json"))
    assert [(p.parent.parent.name, p.parent.name) for p in records] == [
        ("mf_hessian", "libsvm__breast_cancer"), ("slang_L5", "libsvm__breast_cancer")]
    assert all(len(json.loads(p.read_text())["metrics"]) == 2 for p in records)  # the trailing override applied
    assert (tmp_path / "fig" / "slang_fig4_convergence.png").exists()
    before = {p: p.stat().st_mtime_ns for p in records}
    assert main(argv) == 0                            # finished cells are skipped, records untouched
    assert {p: p.stat().st_mtime_ns for p in records} == before


@pytest.mark.e2e
def test_reproduce_puts_figures_beside_its_tables(tmp_path):
    """Without --figures, a reproduction into another --out does not overwrite results/figures."""
    runs = tmp_path / "runs"
    argv = ["reproduce", "slang_fig4", "protocol.epochs=1", "protocol.eval_every=1", "protocol.restarts=1",
            "progress=false", "--runs-root", str(runs), "--out", str(tmp_path / "res" / "tables"),
            "--data", "libsvm/breast_cancer", "--label", "mf_hessian"]
    assert main(argv) == 0
    assert (tmp_path / "res" / "figures" / "slang_fig4_convergence.png").exists()


def test_table_reads_the_committed_records_by_default(tmp_path, monkeypatch):
    """``bnnbench table X`` in a checkout renders results/runs (what results/tables come from), not an empty ./runs."""
    monkeypatch.chdir(REPO)
    assert main(["table", "slang_table2", "--out", str(tmp_path)]) == 0
    rows = [r for r in (tmp_path / "slang_table2.md").read_text().splitlines() if r.startswith("| yacht")]
    assert rows and "not run" not in rows[0]      # BBB's yacht cells are committed
