"""bench/cells_ab.py's comparison: wall times and metrics of the cells both codes recorded, summed only over cells whose
experiment did not change since the old commit (synthetic records here)."""

import json

import pytest

from datapaths import bench_module

bench_module("step_ab")
cab = bench_module("cells_ab")


def _record(root, side, label, wall, rmse, se, spec, compile_=False):
    d = root / side / "exp" / label / "uci__yacht"
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps({
        "wall_time_s": wall, "summary": {"rmse": {"mean": rmse, "stderr": se, "n": 20}},
        "config": {"config_schema": 2 if side == "old" else 3, "compile": compile_, "spec": spec}}))


def test_only_unchanged_experiments_are_summed(tmp_path):
    fixed = {"hpo": {"kind": "fixed"}, "fixed": {"noise_prec": 1.0}, "method": {"lr": 0.01}}
    _record(tmp_path, "old", "a", 100.0, 1.00, 0.1, fixed)
    _record(tmp_path, "new", "a", 40.0, 1.02, 0.1, {**fixed, "hpo": {"kind": "fixed", "folds": 5},   # schema's gain
                                                   "method": {"lr": 0.01, "momentum_type": "heavy_ball"}},
            compile_=True)
    grid = {"hpo": {"kind": "grid"}, "space": {"noise_prec": [1, 2]}, "method": {"lr": 0.01}}
    _record(tmp_path, "old", "b", 50.0, 2.0, 0.2, grid)
    _record(tmp_path, "new", "b", 10.0, 1.0, 0.2, {**grid, "space": {"noise_prec": [1, 2], "lr": {"values": [1]}}},
            compile_=True)                                                      # a search axis added: not summed
    _record(tmp_path, "old", "c", 30.0, 3.0, 0.3, {**fixed, "method": {"lr": 0.05}})
    _record(tmp_path, "new", "c", 20.0, 3.0, 0.3, fixed, compile_=True)        # its lr changed: not summed
    _record(tmp_path, "old", "d", 10.0, 1.0, 0.1, fixed)                       # no new record: not compared
    s = cab.compare(tmp_path)
    rows = {r["label"]: r for r in s["cells"]}
    assert set(rows) == {"a", "b", "c"}
    assert rows["a"]["changed"] == [] and rows["a"]["metrics"]["rmse"] == pytest.approx([1.00, 1.02, 0.2])
    assert rows["b"]["changed"] == ["spec.space.lr.values"]
    assert rows["c"]["changed"] == ["spec.method.lr"]
    assert s["total"] == {"old_s": 100.0, "new_s": 40.0, "cells": 1}
    assert "total over 1 cells of the same protocol: 100 s -> 40 s (2.50x)" in cab.show(s)
