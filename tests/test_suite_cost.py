"""bench/suite_cost.py: process-hours per table and per phase from run records (synthetic ones here), summed exactly."""

import importlib.util
import json
import sys

from datapaths import REPO

_spec = importlib.util.spec_from_file_location("suite_cost", REPO / "bench" / "suite_cost.py")
sc = importlib.util.module_from_spec(_spec)
sys.modules["suite_cost"] = sc
_spec.loader.exec_module(sc)


def _write(root, exp, label, data, name="record.json", hpo="fixed", workers=None, device="cpu", **times):
    d = root / exp / label / data.replace("/", "__")
    d.mkdir(parents=True)
    rec = {"status": "ok" if name == "record.json" else "failed", "dataset": data, "device": device,
           "config": {"workers": workers, "spec": {"hpo": {"kind": hpo}}}, **times}
    (d / name).write_text(json.dumps(rec))


def _records(root):
    # exp_a: two unsearched runs on boston (start-up 2 and 4 s: median 3), one searched on boston, one on yacht
    _write(root, "exp_a", "bbb", "uci/boston", wall_time_s=30.0, hpo_time_s=2.0, train_time_s=25.0)
    _write(root, "exp_a", "map", "uci/boston", wall_time_s=50.0, hpo_time_s=4.0, train_time_s=46.0)
    _write(root, "exp_a", "vadam", "uci/boston", hpo="bo", wall_time_s=1000.0, hpo_time_s=900.0, train_time_s=90.0)
    _write(root, "exp_a", "vadam", "uci/yacht", hpo="grid", workers=2,
           wall_time_s=400.0, hpo_time_s=300.0, train_time_s=100.0)
    # exp_b: a failed run, an old resumed record whose wall is below hpo + train, an active-learning run, a GPU run
    _write(root, "exp_b", "bbb", "uci/wine", name="failed.json", wall_time_s=70.0)
    _write(root, "exp_b", "slang", "uci/wine", wall_time_s=10.0, hpo_time_s=1.0, train_time_s=20.0)
    _write(root, "exp_b", "hmc", "uci/wine", wall_time_s=60.0, hpo_time_s=1.0, train_time_s=5.0,
           active_learning={"rounds": 10})
    _write(root, "exp_b", "gi", "mnist", device="cuda", wall_time_s=3600.0, hpo_time_s=1.0, train_time_s=3500.0)


def test_phases_and_their_sums_are_exact(tmp_path):
    _records(tmp_path)
    df = sc.phase_seconds(sc.read_runs(tmp_path)).set_index(["experiment", "label", "dataset"])
    row = lambda *k: df.loc[k, [*sc.PHASES, "total"]].tolist()  # noqa: E731
    #                                               start-up  selection  training  after  failed  total
    assert row("exp_a", "bbb", "uci/boston") == [2.0, 0.0, 25.0, 3.0, 0.0, 30.0]
    assert row("exp_a", "map", "uci/boston") == [4.0, 0.0, 46.0, 0.0, 0.0, 50.0]
    assert row("exp_a", "vadam", "uci/boston") == [3.0, 897.0, 90.0, 10.0, 0.0, 1000.0]   # boston's median start-up
    # no unsearched run on yacht: the median over all unsearched CPU and GPU runs (1, 1, 1, 2, 4 -> 1; failed ones
    # have none); two worker processes double the selection and the training
    assert row("exp_a", "vadam", "uci/yacht") == [1.0, 598.0, 200.0, 0.0, 0.0, 799.0]
    assert row("exp_b", "bbb", "uci/wine") == [0.0, 0.0, 0.0, 0.0, 70.0, 70.0]
    assert row("exp_b", "slang", "uci/wine") == [1.0, 0.0, 20.0, 0.0, 0.0, 21.0]   # wall < hpo + train: after is 0
    assert row("exp_b", "hmc", "uci/wine") == [1.0, 0.0, 59.0, 0.0, 0.0, 60.0]     # every round counts as training

    per_exp = sc.by(df.reset_index(), "experiment")
    assert per_exp.loc["exp_a"].tolist() == [4, 10.0, 1495.0, 361.0, 13.0, 0.0, 1879.0]
    assert per_exp.loc["exp_b"].tolist() == [4, 3.0, 0.0, 3579.0, 99.0, 70.0, 3751.0]
    per_label = sc.by(df.loc["exp_a"].reset_index(), "label")
    assert per_label.loc["vadam"].tolist() == [2, 4.0, 1495.0, 290.0, 10.0, 0.0, 1799.0]


def test_the_report_prints_a_table_per_experiment_a_total_and_leaves_gpu_runs_out(tmp_path):
    _records(tmp_path)
    text = sc.report(tmp_path, ["exp_a", "exp_b"], markdown=True, measure=False)
    assert "### exp_a: process-hours" in text and "### exp_b: process-hours" in text
    total = next(line for line in text.splitlines() if line.startswith("| total |"))
    # CPU runs only: 1879 + 151 s (the GPU run's 3600 s is listed apart)
    assert total == "| total | 7 | <0.01 | 0.42 | 0.12 | <0.01 | 0.02 | 0.56 |"
    assert "### Records made on a GPU" in text and "| exp_b | 1 | <0.01 | 0 | 0.97 | 0.03 | 0 | 1.00 |" in text
