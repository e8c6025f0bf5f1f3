"""bench/retime.py's comparison of a re-run cell with its committed record: times, metrics side by side and whether
the configuration is the record's (synthetic records here)."""

import json

import pytest

from datapaths import bench_module

bench_module("step_ab")
bench_module("cells_ab")
bench_module("suite_cost")
rt = bench_module("retime")


def _record(root, label, wall, rmse, spec, compile_=False, ll=-1.5, train=None, numerics="torch 2.13.0+cpu; aten AVX2"):
    d = root / "exp" / label / "uci__yacht"
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps({
        "dataset": "uci/yacht", "wall_time_s": wall, "hpo_time_s": 1.0,
        "train_time_s": wall - 2.0 if train is None else train,
        "summary": {"rmse": {"mean": rmse, "stderr": 0.1, "n": 20}, "loglik_pointwise": ll, "note": "text"},
        "config": {"compile": compile_, "spec": spec}, "git_commit": "abc", "versions": {"numerics": numerics}}))


def test_re_runs_are_paired_with_their_records(tmp_path):
    runs, root = tmp_path / "runs", tmp_path / "re"
    fixed = {"hpo": {"kind": "fixed"}, "method": {"lr": 0.01}}
    _record(runs, "same", 100.0, 1.0, fixed)
    _record(root, "same", 40.0, 1.0, fixed)                                  # eager, the same numbers
    _record(runs, "compiled", 100.0, 1.0, fixed)
    _record(root, "compiled", 50.0, 1.02, fixed, compile_=True, ll=-1.5)      # compiled: rounding differs
    _record(runs, "resumed", 5.0, 1.0, fixed, train=30.0)   # resumed: its last process 5 s, its phases 1 + 30 s
    _record(root, "resumed", 50.0, 1.0, fixed)
    _record(runs, "lr", 100.0, 1.0, fixed)
    _record(root, "lr", 10.0, 1.0, {**fixed, "method": {"lr": 0.05}})       # another experiment
    _record(root, "new_cell", 10.0, 1.0, fixed)                               # no record to compare with
    _record(runs, "mode", 100.0, 1.0, fixed)
    _record(root, "mode", 30.0, 1.0, fixed, compile_=True, numerics="torch 2.13.0+cpu; aten AVX2; mkl any vendor")
    rows = {r["label"]: r for r in rt.compare(root, runs)}
    assert set(rows) == {"same", "compiled", "resumed", "lr", "mode"}
    assert rows["mode"]["mkl_any_vendor"] and not rows["compiled"]["mkl_any_vendor"]
    assert rows["mode"]["numerics"].endswith("; mkl any vendor") and rows["compiled"]["numerics"].endswith("AVX2")
    del rows["mode"]
    s = rows["same"]
    assert s["identical"] and s["max_rel_diff"] == 0.0 and not s["compile"] and s["changed"] == []
    assert (s["recorded_s"], s["wall_s"], s["train_s"]) == (100.0, 40.0, 38.0)
    c = rows["compiled"]
    assert not c["identical"] and c["compile"] and c["changed"] == []
    assert c["metrics"]["rmse"] == pytest.approx([1.0, 1.02, 0.2]) and c["max_rel_diff"] == pytest.approx(0.02)
    assert c["metrics"]["loglik_pointwise"] == [-1.5, -1.5, None] and "note" not in c["metrics"]
    assert rows["lr"]["changed"] == ["spec.method.lr"]
    out = rt.show(list(rows.values()))
    assert "3 cells of their records' configuration: 231 s recorded, 140 s re-run (1.65x); 2 with identical" in out


def test_shards_split_the_draw_by_cost():
    cells = [{"label": c, "proj_s": s} for c, s in zip("abcdef", [10.0, 50.0, 20.0, 40.0, 30.0, 5.0])]
    parts = [rt.shard(cells, i, 2) for i in range(2)]
    assert sorted(c["label"] for p in parts for c in p) == list("abcdef")
    assert [sum(c["proj_s"] for c in p) for p in parts] == [80.0, 75.0]   # b c a | d e f


def test_repeated_cells_flags_accumulate():
    """``--cells a --cells b`` (as a shell loop builds it) re-runs both cells; before, the last flag alone counted."""
    args = rt.parser().parse_args(["--cells", "nng_table3 uci/yacht hmc_R", "nng_table3 uci/wine hmc_A",
                                   "--cells", "nng_table4 uci/boston hmc"])
    assert args.cells == ["nng_table3 uci/yacht hmc_R", "nng_table3 uci/wine hmc_A", "nng_table4 uci/boston hmc"]
    assert rt.parser().parse_args([]).cells == []


def _failed(root, label, wall, spec, reason="bbb diverged at epoch 3: non-finite objective or state in replica(s) [7]"):
    d = root / "exp" / label / "uci__yacht"
    d.mkdir(parents=True)
    (d / "failed.json").write_text(json.dumps({"status": "failed", "dataset": "uci/yacht", "wall_time_s": wall,
                                               "reason": reason, "config": {"compile": True, "spec": spec}}))


def test_failed_runs_are_paired_with_failed_records(tmp_path):
    """A cell whose record is a failure (a diverged run) costs its wall time again: a failed re-run is its row; a
    re-run whose outcome differs from its record's is logged as changed (not used by the projection)."""
    runs, root = tmp_path / "runs", tmp_path / "re"
    fixed = {"hpo": {"kind": "grid"}, "method": {"lr": 0.01}}
    _failed(runs, "both", 1000.0, fixed)
    _failed(root, "both", 400.0, fixed)
    _failed(runs, "now_ok", 1000.0, fixed)
    _record(root, "now_ok", 900.0, 1.0, fixed, compile_=True)
    _record(runs, "now_failed", 100.0, 1.0, fixed)
    _failed(root, "now_failed", 30.0, fixed)
    _failed(root, "no_record", 30.0, fixed)
    rows = {r["label"]: r for r in rt.compare(root, runs)}
    assert set(rows) == {"both", "now_ok", "now_failed"}
    b = rows["both"]
    assert b["status"] == "failed" and b["changed"] == [] and (b["recorded_s"], b["wall_s"]) == (1000.0, 400.0)
    assert b["reason"].startswith("bbb diverged at epoch 3") and b["metrics"] == {} and not b["identical"]
    assert rows["now_ok"]["status"] == "ok" and rows["now_ok"]["changed"] == ["outcome failed -> ok"]
    assert rows["now_failed"]["changed"] == ["outcome ok -> failed"]
    out = rt.show([b])
    assert "no metrics" in out and "[failed: bbb diverged at epoch 3" in out and "2.50x" in out


def test_the_draws_frame_leaves_out_cells_re_run_in_the_committed_log_or_the_given_one(tmp_path, monkeypatch):
    """A scratch ``--log`` must not bring the committed log's re-run cells back into the frame (2026-12-04's draw held
    them: 708 cells instead of the not-re-run ones)."""
    import sys
    import pandas as pd
    pj = sys.modules["projection"] if "projection" in sys.modules else bench_module("projection")
    frame = pd.DataFrame({"experiment": ["e"] * 4, "label": ["a", "b", "c", "d"], "dataset": ["uci/yacht"] * 4,
                          "status": ["ok"] * 4, "proj_total": [100.0, 200.0, 300.0, 5000.0]})
    monkeypatch.setattr(pj, "from_records", lambda runs, ratios: (None, frame))
    monkeypatch.setattr(pj, "read_ratios", lambda path: None)

    def row(label):
        return json.dumps({"experiment": "e", "label": label, "dataset": "uci/yacht", "wall_s": 1.0, "hpo_s": 0.0,
                           "train_s": 1.0, "compile": True, "changed": [], "when": "2026-12-04 10:00"}) + "\n"
    committed, scratch = tmp_path / "retime.jsonl", tmp_path / "scratch.jsonl"
    committed.write_text(row("a"))
    scratch.write_text(row("b"))
    monkeypatch.setattr(rt, "LOG", committed)
    s = rt.draw(1, 0, 0.5, scratch)
    assert s["frame_cells"] == 1 and s["cells"][0]["label"] == "c"   # a, b re-run; d projected above 0.5 h
    assert rt.draw(2, 0, 0.5, None)["frame_cells"] == 2              # without --log: only the committed log's


def test_a_cell_of_several_workers_is_not_pinned_to_fewer_cores(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    for label, workers in (("one", None), ("two", 2)):
        d = runs / "exp" / label / "uci__naval"
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps({"config": {"workers": workers}}))
    assert rt.recorded_workers(["exp", "uci/naval", "one"], runs) == 1
    assert rt.recorded_workers(["exp", "uci/naval", "all"], runs) == 2
    assert [rt.cores_in(s) for s in ("1", "0,1", "0-3,6")] == [1, 2, 5]
    monkeypatch.setattr(rt.shutil, "which", lambda name: "/usr/bin/taskset")
    ran = []
    monkeypatch.setattr(rt.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or type("P", (), {"returncode": 0}))
    with pytest.raises(SystemExit, match="exp uci/naval two"):
        rt.run_cells([["exp", "uci/naval", "one"], ["exp", "uci/naval", "two"]], tmp_path / "re", False, "1",
                     runs=runs)
    assert ran == []
    assert rt.run_cells([["exp", "uci/naval", "two"]], tmp_path / "re", False, "0,1", runs=runs) == 0
    assert ran[0][:3] == ["taskset", "-c", "0,1"]
