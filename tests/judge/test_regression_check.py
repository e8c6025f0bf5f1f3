"""The regression check compares numbers: a re-run cell must repeat its record's means and standard errors exactly,
and the rebuilt table its committed ``ours``, ``ours_se`` and verdicts; a moved number fails it, named with its cell."""

import json
import re
import shutil
from argparse import Namespace
from pathlib import Path

import pandas as pd
import pytest

from bnnbench.judge.baselines import BASELINES
from bnnbench.judge.regression_check import Moved, record_moves, rerun_cost, table_moves

from datapaths import MIRROR, REPO


def _record(mean, se, splits=(1.0, 2.0)):
    return {"summary": {"rmse": {"mean": mean, "stderr": se, "n": len(splits)}},
            "metrics": [{"split": str(i), "rmse": v} for i, v in enumerate(splits)]}


def test_record_moves_lists_each_moved_number_with_its_cell():
    assert record_moves("t", "bbb on uci/yacht", _record(1.5, 0.5), _record(1.5, 0.5)) == []
    moved = record_moves("t", "bbb on uci/yacht", _record(1.5, 0.5), _record(1.5 + 1e-12, 0.5, (1.0, 2.0 + 2e-12)))
    assert Moved("t", "bbb on uci/yacht", "rmse.mean", 1.5, 1.5 + 1e-12) in moved
    assert Moved("t", "bbb on uci/yacht", "split 1 rmse", 2.0, 2.0 + 2e-12) in moved
    assert not any(m.what == "rmse.stderr" for m in moved)
    assert "rmse.mean recorded 1.5, now 1.500000000001" in str(moved[0])
    # a tolerance only where one is stated
    assert record_moves("t", "c", _record(1.5, 0.5), _record(1.5 * (1 + 1e-9), 0.5), rtol=1e-8) == []
    # a metric the re-run no longer has counts as moved
    assert record_moves("t", "c", _record(1.5, 0.5), {"summary": {}, "metrics": []})[0].what == "rmse.mean"


def test_across_numerics_classes_a_number_may_move_within_its_records_standard_errors_only():
    """A cell recorded in another class, with no baseline of this one: each summary mean and standard error within
    ``se_tol`` of the record's standard error passes, one beyond fails, a number of a single run is unchecked."""
    from bnnbench.judge.regression_check import se_moves
    recorded = _record(1.5, 0.1)
    assert record_moves("t", "c", recorded, _record(1.5 + 0.49, 0.1 + 0.3), se_tol=5.0) == []
    moved = record_moves("t", "c", recorded, _record(1.5 + 0.51, 0.1), se_tol=5.0)
    assert [m.what for m in moved] == ["rmse.mean"]          # the splits behind it are not listed: not compared
    assert [m.what for m in record_moves("t", "c", recorded, _record(1.5, 0.62), se_tol=5.0)] == ["rmse.stderr"]
    assert record_moves("t", "c", recorded, {"summary": {}, "metrics": []}, se_tol=5.0)[0].what == "rmse.mean"
    single = _record(1.5, 0.0, splits=(1.5,))
    assert record_moves("t", "c", single, _record(9.0, 0.0, splits=(9.0,)), se_tol=5.0) == []
    assert record_moves("t", "c", single, _record(9.0, 0.0, splits=(9.0,)))[0].what == "rmse.mean"   # exact: moved
    gone = record_moves("t", "c", single, {"summary": {}, "metrics": []}, se_tol=5.0)   # a lost metric: moved
    assert [m.what for m in gone] == ["rmse.mean", "rmse.stderr"]
    assert record_moves("t", "c", _record(float("nan"), 0.1), _record(float("nan"), 0.1), se_tol=5.0) == []
    z = se_moves(recorded, _record(1.5 + 0.2, 0.1 + 0.05))
    assert [w for _, w in z] == ["rmse.mean", "rmse.stderr"] and z[0][0] == pytest.approx(2.0)
    assert z[1][0] == pytest.approx(0.5) and se_moves(single, single) == []
    zero = _record(-4e-17, 4e-17, splits=(0.0, -8e-17))                   # zero up to float rounding
    assert record_moves("t", "c", zero, _record(-1.8e-16, 8e-17), se_tol=5.0) == [] == se_moves(zero, zero)
    assert [m.what for m in record_moves("t", "c", zero, _record(2e-9, 4e-17), se_tol=5.0)] == ["rmse.mean"]


def test_table_moves_across_classes_allow_se_tol_committed_standard_errors_and_no_verdict_change():
    old = _table(1.0, 0.1, "reproduced")
    assert table_moves("t", old, _table(1.0 + 0.29, 0.1 + 0.2, "reproduced"), se_tol=3.0) == []
    assert [m.what for m in table_moves("t", old, _table(1.31, 0.1, "reproduced"), se_tol=3.0)] == ["table ours"]
    assert [m.what for m in table_moves("t", old, _table(1.0, 0.1, "worse"), se_tol=3.0)] == \
        ["verdict reproduced -> worse"]
    assert table_moves("t", _table(1.0, float("nan"), "worse"), _table(7.0, float("nan"), "worse"), se_tol=3.0) == []


def _table(ours, se, verdict):
    return pd.DataFrame([{"dataset": "yacht", "method": "BBB", "setting": "", "metric": "test_rmse",
                          "ours": ours, "ours_se": se, "verdict": verdict, "paper": 1.0}])


def test_table_moves_checks_numbers_and_verdicts():
    assert table_moves("t", _table(1.0, 0.1, "reproduced"), _table(1.0, 0.1, "reproduced")) == []
    moved = table_moves("t", _table(1.0, 0.1, "reproduced"), _table(1.0, 0.1 + 1e-15, "reproduced"))
    assert [m.what for m in moved] == ["table ours_se"]
    moved = table_moves("t", _table(1.0, 0.1, "worse"), _table(3.0, 0.1, "better"))
    assert {m.what for m in moved} == {"table ours", "verdict worse -> better"}
    assert table_moves("t", _table(float("nan"), float("nan"), "not_run"),
                       _table(float("nan"), float("nan"), "not_run")) == []
    gone = table_moves("t", _table(1.0, 0.1, "reproduced"), _table(1.0, 0.1, "reproduced").iloc[:0])
    assert gone[0].what.startswith("table cell (missing")


def test_rerun_cost_is_the_final_training_of_a_searched_cell():
    searched = {"config": {"spec": {"hpo": {"kind": "bo"}}}, "train_time_s": 3.0, "wall_time_s": 900.0}
    fixed = {"config": {"spec": {"hpo": {"kind": "fixed"}}}, "train_time_s": 3.0, "wall_time_s": 4.0}
    resumed = {"config": {"spec": {"hpo": {"kind": "fixed"}}}, "train_time_s": 390.0, "wall_time_s": 14.0}
    assert rerun_cost(searched) == 3.0 and rerun_cost(fixed) == 4.0 and rerun_cost(resumed) == 390.0


def test_rerun_cost_of_a_searched_active_learning_cell_is_its_rounds_not_its_last_round():
    """NNG Table 3's searched cells: ``train_time_s`` is the last of 10 rounds; a re-run trains all of them."""
    rounds = {"config": {"spec": {"hpo": {"kind": "grid"}}}, "train_time_s": 14.0, "hpo_time_s": 61.0,
              "wall_time_s": 448.0}
    assert rerun_cost(rounds) == 387.0


def test_an_experiment_may_narrow_the_cells_beyond_its_subset_and_the_command_line_widens_them(tmp_path):
    """A cell outside the experiment's own subset is re-run when its record's cost is within the limit: 30 s by
    default, the experiment's ``regression_max_cell_s`` where it states one (0: its subset only), the command line's
    ``--max-cell-s`` over both."""
    from bnnbench.judge.regression_check import MAX_CELL_S, cell_limit, selected_cells
    from bnnbench.run.results import run_dir
    runs = [{"method": "bbb", "data": "uci/yacht"}, {"method": "bbb", "data": "uci/kin8nm"},
            {"method": "bbb", "data": "uci/protein"}]
    for cell, wall in zip(runs, (5.0, 20.0, 400.0)):
        d = run_dir(tmp_path / "runs", "board", "bbb", cell["data"])
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps({"status": "ok", "wall_time_s": wall, "train_time_s": wall,
                                                   "config": {"spec": {"hpo": {"kind": "fixed"}}}}))
    spec = {"methods": {"bbb": {}}, "runs": runs}

    def chosen(spec, max_cell_s):
        return [c["data"] for c in selected_cells("board", spec, tmp_path, max_cell_s, [])]

    assert cell_limit(spec, None) == MAX_CELL_S
    assert chosen(spec, None) == ["uci/yacht", "uci/kin8nm"]          # yacht: the subset; kin8nm: 20 s <= 30 s
    narrowed = {**spec, "regression_max_cell_s": 0}
    assert cell_limit(narrowed, None) == 0.0 and chosen(narrowed, None) == ["uci/yacht"]
    assert chosen(narrowed, 1e9) == ["uci/yacht", "uci/kin8nm", "uci/protein"]
    assert chosen({**narrowed, "regression_datasets": ["uci/protein"]}, None) == ["uci/protein"]


@pytest.fixture
def results_copy(tmp_path, module_env):
    """A copy of the committed NNG Table 4 records and table (PBP re-runs in seconds; HMC's record stands in)."""
    res = tmp_path / "results"
    (res / "tables").mkdir(parents=True)
    shutil.copy(REPO / "results" / "tables" / "nng_table4.csv", res / "tables")
    shutil.copytree(REPO / "results" / "runs" / "nng_table4", res / "runs" / "nng_table4")
    _copy_baselines(res)
    return res


def _copy_baselines(res):
    """The committed numerics classes' baselines (the check on a machine of another class than the records')."""
    if (REPO / "results" / BASELINES).is_dir():
        shutil.copytree(REPO / "results" / BASELINES, res / BASELINES)


def _args(res, tmp_path, **kw):
    return Namespace(**{"results": str(res), "runs_root": str(tmp_path / "rerun"), "only": ["nng_table4/pbp/uci/yacht"],
                        "max_cell_s": 0.0, "rerecord": False, "baseline": False, "reuse_runs": False, "reason": None,
                        **kw})


@pytest.mark.e2e
@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the data mirror")
def test_a_perturbed_record_fails_the_check_naming_the_number(results_copy, tmp_path, capsys):
    """A record of this machine's numerics class is checked exactly: a mean moved by 1e-12 relative fails. (PBP on
    yacht, float64, re-runs to its record's numbers on every class seen: Intel with AMX, AMD with AVX2 and with
    AVX-512; marked as made in this machine's class, it is checked exactly, not across classes.)"""
    from bnnbench.judge.regression_check import main
    from bnnbench.run.numerics import numerics_class
    path = results_copy / "runs" / "nng_table4" / "pbp" / "uci__yacht" / "record.json"
    rec = json.loads(path.read_text())
    rec["versions"]["numerics"] = numerics_class()
    path.write_text(json.dumps(rec))
    assert main(_args(results_copy, tmp_path)) == 0
    assert "1 re-run cell(s) repeat their records' numbers exactly" in capsys.readouterr().out

    true_mean = rec["summary"]["rmse"]["mean"]
    rec["summary"]["rmse"]["mean"] = true_mean * (1 + 1e-12)
    path.write_text(json.dumps(rec))
    assert main(_args(results_copy, tmp_path)) == 1
    out = capsys.readouterr().out
    assert f"nng_table4 pbp on uci/yacht: rmse.mean recorded {true_mean * (1 + 1e-12)!r}, now {true_mean!r}" in out

    # a deliberate change: re-recording writes the re-run's numbers back, with the reason, and the check passes
    assert main(_args(results_copy, tmp_path, rerecord=True, reason="a test")) == 0
    rec = json.loads(path.read_text())
    assert rec["summary"]["rmse"]["mean"] == true_mean
    assert rec["rerecorded"][-1]["reason"] == "a test" and rec["rerecorded"][-1]["rerun"] == "whole run"
    assert main(_args(results_copy, tmp_path)) == 0


@pytest.mark.e2e
@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the data mirror")
def test_a_machine_of_another_numerics_class_is_checked_exactly_against_its_own_baseline(results_copy, tmp_path,
                                                                                         capsys):
    """A record made on a CPU that rounds differently (its class says so) and moved by that rounding: with no
    baseline of this machine's class the check compares across classes (within CROSS_CLASS_SE of the record's
    standard error: it passes, saying it is not exact and how to make it so; a number moved further fails, naming
    this machine's class); ``--baseline`` writes this class's numbers, after which the check passes exactly; a moved
    record of this machine's own class is a regression that ``--baseline`` refuses; a baseline written on another
    processor model of the class is not used, nor overwritten."""
    from bnnbench.judge.regression_check import CROSS_CLASS_SE, main
    from bnnbench.run.numerics import class_id, cpu_model, numerics_class
    shutil.rmtree(results_copy / BASELINES, ignore_errors=True)
    path = results_copy / "runs" / "nng_table4" / "pbp" / "uci__yacht" / "record.json"
    rec = json.loads(path.read_text())
    true_mean, se = rec["summary"]["rmse"]["mean"], rec["summary"]["rmse"]["stderr"]
    rec["versions"]["numerics"] = "torch 2.13.0+cpu; aten AVX2; x86_64 AuthenticAMD: sse4_2 fma avx2"
    rec["summary"]["rmse"]["mean"] = true_mean + 1.01 * CROSS_CLASS_SE * se
    path.write_text(json.dumps(rec))
    assert main(_args(results_copy, tmp_path)) == 1
    out = capsys.readouterr().out
    assert "rmse.mean recorded" in out and "(1 checked across classes, within 5 SE)" in out
    assert f"recorded in another numerics class than this machine's ({numerics_class()})" in out
    rec["summary"]["rmse"]["mean"] = true_mean * (1 + 1e-12)
    path.write_text(json.dumps(rec))
    assert main(_args(results_copy, tmp_path, reuse_runs=True)) == 0
    out = capsys.readouterr().out
    assert "0 re-run cell(s) repeat their records' numbers exactly" in out
    assert "NOT EXACT: 1 re-run cell(s) were recorded in another numerics class" in out
    assert re.search(r"largest move [0-9.e+-]+ SE: nng_table4/pbp/uci/yacht ", out)
    assert main(_args(results_copy, tmp_path, baseline=True)) == 2     # a baseline says why
    # the failed check's re-run, taken as it is (--reuse-runs), not trained again
    assert main(_args(results_copy, tmp_path, baseline=True, reuse_runs=True, reason="a test")) == 0
    out = capsys.readouterr().out
    assert "baseline of this numerics class written" in out and "skip: " in out
    base = json.loads((results_copy / BASELINES / f"{class_id(numerics_class())}.json").read_text())
    assert base["cells"]["nng_table4/pbp/uci/yacht"]["summary"]["rmse"]["mean"] == true_mean
    assert main(_args(results_copy, tmp_path)) == 0
    assert "(those of this numerics class's baseline where it has them)" in capsys.readouterr().out
    assert base["cpu"] == cpu_model()

    # written on another processor model of this class: not used (checked across classes), and not overwritten
    base_path = results_copy / BASELINES / f"{class_id(numerics_class())}.json"
    base_path.write_text(json.dumps({**base, "cpu": "GenuineIntel family 6 model 1"}))
    assert main(_args(results_copy, tmp_path, reuse_runs=True)) == 0
    out = capsys.readouterr().out
    assert "not used: " in out and "NOT EXACT: 1 re-run cell(s)" in out and "another processor model" in out
    assert main(_args(results_copy, tmp_path, baseline=True, reuse_runs=True, reason="a test")) == 2
    assert "nothing written" in capsys.readouterr().out
    assert json.loads(base_path.read_text())["cpu"] == "GenuineIntel family 6 model 1"
    base_path.write_text(json.dumps(base))

    rec["versions"]["numerics"] = numerics_class()
    rec["summary"]["rmse"]["mean"] = true_mean * (1 + 2e-12)
    path.write_text(json.dumps(rec))
    assert main(_args(results_copy, tmp_path, baseline=True, reason="a test")) == 1
    assert "not a baseline: 1 cell(s) recorded in this numerics class moved" in capsys.readouterr().out
    assert json.loads((results_copy / BASELINES / f"{class_id(numerics_class())}.json").read_text()) == base


@pytest.mark.e2e
@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the data mirror")
def test_workers_share_the_reruns_and_the_check_compares_them_without_training(results_copy, tmp_path, capsys):
    """``--train-only`` workers over one runs root: a worker skips the cell another holds (its run directory's lock)
    and re-runs the rest; a later worker skips what is finished and re-runs what was skipped; the check with
    ``--reuse-runs`` then trains nothing and compares every cell."""
    from bnnbench.judge.regression_check import main
    from bnnbench.run.results import claimed, run_dir
    cells = ["nng_table4/pbp/uci/yacht", "nng_table4/pbp/uci/boston"]   # boston: by --max-cell-s
    rerun = tmp_path / "rerun"
    assert main(_args(results_copy, tmp_path, only=cells, max_cell_s=1e9, train_only=True, list=True)) == 2
    with claimed(run_dir(rerun, "nng_table4", "pbp", "uci/yacht")):   # another worker re-runs yacht
        assert main(_args(results_copy, tmp_path, only=cells, max_cell_s=1e9, train_only=True)) == 0
    out = capsys.readouterr().out
    assert "is in use by another bnnbench process" in out
    assert "re-ran 1 cell(s)" in out and "0 found finished, 1 taken" in out
    assert (run_dir(rerun, "nng_table4", "pbp", "uci/boston") / "record.json").exists()
    assert not (run_dir(rerun, "nng_table4", "pbp", "uci/yacht") / "record.json").exists()
    assert main(_args(results_copy, tmp_path, only=cells, max_cell_s=1e9, train_only=True)) == 0
    out = capsys.readouterr().out
    assert out.count("skip: ") == 1 and "re-ran 1 cell(s)" in out and "(1 found finished, 0 taken" in out
    assert main(_args(results_copy, tmp_path, only=cells, max_cell_s=1e9, reuse_runs=True)) == 0
    out = capsys.readouterr().out
    assert out.count("skip: ") == 2 and "2 re-run cell(s) repeat their records' numbers exactly" in out


def test_a_rerun_without_its_data_set_is_one_error_line(results_copy, tmp_path, capsys, monkeypatch):
    """No mirror, no cache, no network: ``bnnbench regression`` says how to fetch the data set, without a traceback."""
    from bnnbench.cli import main
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.delenv("BNNBENCH_MIRROR", raising=False)
    monkeypatch.setenv("BNNBENCH_CACHE", str(empty))
    monkeypatch.setenv("BNNBENCH_OFFLINE", "1")
    assert main(["regression", "--results", str(results_copy), "--runs-root", str(tmp_path / "rerun"),
                 "--only", "nng_table4/pbp/uci/yacht", "--max-cell-s", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Raw data file") and "bnnbench data fetch uci/yacht" in err
    assert "Traceback" not in err


def test_rerecord_needs_a_reason(tmp_path, capsys):
    from bnnbench.judge.regression_check import main
    assert main(Namespace(results=str(tmp_path), runs_root=str(tmp_path), only=[], max_cell_s=0.0, rerecord=True,
                          reason=None)) == 2
    assert "--reason" in capsys.readouterr().out


@pytest.mark.e2e
@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the data mirror")
@pytest.mark.parametrize("method,search", [("slang", ["hpo.n_random=2", "hpo.n_iter=1", "hpo.gp_restarts=2"]),
                                           ("bbb", ["hpo.n_random=2", "hpo.n_iter=1", "hpo.gp_restarts=2"]),
                                           ("mc_dropout", [])])
def test_a_searched_runs_final_training_repeats_with_its_recorded_hyper_parameters(method, search, tmp_path,
                                                                                     module_env):
    """What the check relies on: the final training after a search draws nothing from the search's stream, so
    re-running it with the hyper-parameters the record holds (``hpo=recorded``) gives the record's numbers."""
    from bnnbench.run.config import cell_overrides, cells_in, compose
    from bnnbench.run.execute import execute
    from bnnbench.run.results import run_dir
    cell, = cells_in("slang_table2", method, "uci__yacht")
    base = [*cell_overrides("slang_table2", cell, REPO / "results" / "runs"), "protocol.epochs=2", "threads=1",
            "progress=false", "protocol.splits=[0,1,2]"]
    full_ov = [*base, *search, f"runs_root={tmp_path / 'full'}"]
    full = execute(compose(full_ov), full_ov, run_dir(tmp_path / "full", "slang_table2", method, "uci/yacht"))
    assert full["hpo_trace"], "the search ran"
    rec_ov = [*base, "hpo=recorded", f"hpo.record={run_dir(tmp_path / 'full', 'slang_table2', method, 'uci/yacht')}",
              f"runs_root={tmp_path / 'rec'}"]
    rerun = execute(compose(rec_ov), rec_ov, run_dir(tmp_path / "rec", "slang_table2", method, "uci/yacht"))
    assert rerun["metrics"] == full["metrics"] and rerun["summary"] == full["summary"]


@pytest.mark.e2e
@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the data mirror")
def test_a_leaderboard_cell_is_checked_by_its_records_numbers(tmp_path, module_env, capsys):
    """The leaderboard has no published table: a short cell (Laplace through laplace-torch on yacht, its final
    training with the recorded hyper-parameters) re-runs to its record's numbers (its baseline's on a machine of
    another numerics class), and a moved one fails: by 1e-9 where the check is exact (a record of this machine's
    class), by more than CROSS_CLASS_SE standard errors across classes."""
    from bnnbench.judge.regression_check import CROSS_CLASS_SE, main
    from bnnbench.run.numerics import numerics_class
    res = tmp_path / "results"
    (res / "tables").mkdir(parents=True)
    shutil.copy(REPO / "results" / "tables" / "uci_leaderboard.csv", res / "tables")
    cell = Path("uci_leaderboard") / "laplace" / "uci__yacht"
    shutil.copytree(REPO / "results" / "runs" / cell, res / "runs" / cell)
    _copy_baselines(res)
    args = dict(only=["uci_leaderboard/laplace/uci/yacht"])
    assert main(_args(res, tmp_path, **args)) == 0
    capsys.readouterr()
    # the record as this machine makes it (the re-run's numbers, this class): the check is exact on any machine
    path = res / "runs" / cell / "record.json"
    rerun = json.loads((tmp_path / "rerun" / cell / "record.json").read_text())
    rec = {**json.loads(path.read_text()), "summary": rerun["summary"], "metrics": rerun["metrics"]}
    rec["versions"]["numerics"] = numerics_class()
    path.write_text(json.dumps(rec))
    assert main(_args(res, tmp_path, reuse_runs=True, **args)) == 0
    assert "1 re-run cell(s) repeat their records' numbers exactly" in capsys.readouterr().out
    rec["summary"]["coverage_90"]["mean"] += 1e-9
    path.write_text(json.dumps(rec))
    assert main(_args(res, tmp_path, reuse_runs=True, **args)) == 1
    assert "uci_leaderboard laplace on uci/yacht: coverage_90.mean recorded" in capsys.readouterr().out
    # made in another class, with no baseline of this one: the 1e-9 passes across classes, 1.01 CROSS_CLASS_SE fails
    rec["versions"]["numerics"] = "torch 2.13.0+cpu; aten AVX2; x86_64 AuthenticAMD: sse4_2 fma"
    path.write_text(json.dumps(rec))
    assert main(_args(res, tmp_path, reuse_runs=True, **args)) == 0
    assert "NOT EXACT: 1 re-run cell(s)" in capsys.readouterr().out
    rec["summary"]["coverage_90"]["mean"] += 1.01 * CROSS_CLASS_SE * rec["summary"]["coverage_90"]["stderr"]
    path.write_text(json.dumps(rec))
    assert main(_args(res, tmp_path, reuse_runs=True, **args)) == 1
    assert "uci_leaderboard laplace on uci/yacht: coverage_90.mean recorded" in capsys.readouterr().out
