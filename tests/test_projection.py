"""bench/projection.py: the records' phases divided, cell by cell, by the step speed-ups measured for the cell's own
method, protocol and data set (falling back as its docstring says), on synthetic records and ratio rows."""

import json

import pytest

from datapaths import bench_module


sc = bench_module("suite_cost")
pj = bench_module("projection")


def _record(root, exp, label, data, method, protocol, hpo="fixed", compile=False, **times):
    d = root / exp / label / data.replace("/", "__")
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps({
        "status": "ok", "dataset": data, "device": "cpu", "method": method, "protocol": protocol,
        "config": {"workers": None, "compile": compile, "spec": {"hpo": {"kind": hpo}}}, **times}))


def _row(method, protocol, data, R, old, new, compile_s=10.0, when="2026-12-01 10:00", **kw):
    return {"method": method, "protocol": protocol, "data": data, "R": R, "old_ms": old, "new_ms": new,
            "compile_s": compile_s, "compiled": True, "base_compiled": False, "when": when, **kw}


def test_each_phase_is_divided_by_the_most_specific_speed_up(tmp_path):
    runs_root = tmp_path / "runs"
    # start-up 5 s (the unsearched records' median on boston), so bbb's selection is 3600 - 5 s
    _record(runs_root, "t", "bbb", "uci/kin8nm", "bbb", "vadam_uci", hpo="bo",
            wall_time_s=7300.0, hpo_time_s=3605.0, train_time_s=3600.0)
    _record(runs_root, "t", "bbb", "uci/boston", "bbb", "vadam_uci", wall_time_s=1010.0, hpo_time_s=5.0,
            train_time_s=1000.0)
    _record(runs_root, "t", "bbb", "uci/wine", "bbb", "vadam_uci", wall_time_s=805.0, hpo_time_s=5.0,
            train_time_s=800.0)
    _record(runs_root, "t", "slang", "libsvm/a1a", "slang", "slang_logreg", wall_time_s=305.0, hpo_time_s=5.0,
            train_time_s=300.0)
    _record(runs_root, "t", "pbp", "uci/boston", "pbp", "nng_uci", wall_time_s=505.0, hpo_time_s=5.0,
            train_time_s=500.0)
    _record(runs_root, "t", "noisy_adam", "uci/kin8nm", "noisy_adam", "nng_uci", wall_time_s=2005.0,
            hpo_time_s=5.0, train_time_s=2000.0)
    ratios = tmp_path / "ab.jsonl"
    rows = [_row("bbb", "vadam_uci", "uci/kin8nm", 100, 30.0, 10.0, compile_s=8.0),      # 3x
            _row("bbb", "vadam_uci", "uci/kin8nm", 20, 6.0, 3.0, compile_s=4.0),         # 2x
            _row("bbb", "vadam_uci", "uci/kin8nm", 20, 6.0, 6.0, when="2026-11-01 10:00"),   # older: not used
            _row("bbb", "slang_uci", "uci/boston", 20, 5.0, 1.0),                       # another protocol: not used
            _row("bbb", "vadam_uci", "uci/boston", 20, 8.0, 2.0, compile_s=2.0),         # 4x, protocol on Boston
            _row("noisy_adam", "nng_small", "uci/boston", 20, 2.5, 1.0, compile_s=1.0),  # 2.5x, Boston fallback
            _row("slang", "slang_logreg", "uci/boston", 20, 9.0, 1.0),                  # not for a LIBSVM set
            _row("vogn", "vadam_uci", "uci/kin8nm", 100, 9.0, 1.0, base_compiled=True)]  # compiled base: ignored
    ratios.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = sc.phase_seconds(sc.read_runs(runs_root))
    proj = pj.project(runs, pj.read_ratios(ratios)).set_index(["label", "dataset"])

    k = proj.loc[("bbb", "uci/kin8nm")]
    assert k["proj_selection"] == pytest.approx(3600.0 / 3) and k["proj_training"] == pytest.approx(3600.0 / 2)
    assert k["compile"] == pytest.approx(8.0 + 4.0)
    assert k["proj_total"] == pytest.approx(5.0 + 1200.0 + 1800.0 + 95.0 + 12.0)     # start-up, after kept
    assert k["selection_source"] == "own (R = 100)" and k["training_source"] == "own (R = 20)"

    b = proj.loc[("bbb", "uci/boston")]
    assert b["proj_training"] == pytest.approx(250.0) and b["training_source"] == "own (R = 20)"
    assert b["proj_selection"] == 0.0 and b["compile"] == pytest.approx(2.0)    # unsearched: no selection shape
    w = proj.loc[("bbb", "uci/wine")]   # no row on wine: the protocol's on Boston, not another protocol's on wine
    assert w["proj_training"] == pytest.approx(200.0) and w["training_source"] == "protocol on Boston (R = 20)"

    n = proj.loc[("noisy_adam", "uci/kin8nm")]   # measured under another protocol only: kept as recorded
    assert n["training_ratio"] == 1.0 and n["training_source"].startswith("unmeasured")

    assert proj.loc[("slang", "libsvm/a1a"), "training_source"].startswith("unmeasured")
    p = proj.loc[("pbp", "uci/boston")]   # no row for PBP: kept as recorded, no compilation
    assert p["proj_total"] == p["total"] == 505.0 and p["training_source"].startswith("unmeasured")


def test_the_nearest_measured_replica_count_is_used(tmp_path):
    ratios = tmp_path / "ab.jsonl"
    ratios.write_text("".join(json.dumps(r) + "\n" for r in [
        _row("bbb", "nng_uci", "uci/protein", 25, 10.0, 4.0), _row("bbb", "nng_uci", "uci/protein", 5, 3.0, 2.0)]))
    df = pj.read_ratios(ratios)
    assert pj.pick(df, "bbb", "nng_uci", "uci/protein", 100)[0] == pytest.approx(2.5)
    assert pj.pick(df, "bbb", "nng_uci", "uci/protein", 20)[0] == pytest.approx(2.5)   # 25 is nearer to 20 than 5
    assert pj.pick(df, "vadam", "nng_uci", "uci/protein", 20) is None


def _retimed(exp, label, data, wall, hpo, train, compile_, changed=(), when="2026-12-01 22:00", **extra):
    return {"experiment": exp, "label": label, "dataset": data, "wall_s": wall, "hpo_s": hpo, "train_s": train,
            "compile": compile_, "changed": list(changed), "when": when, **extra}


def test_re_runs_in_the_mkl_mode_count_only_for_the_modes_projection(tmp_path):
    """A re-run with ``BNNBENCH_MKL_ANY_VENDOR=1`` replaces its record only in ``--mkl-any-vendor``'s projection,
    where it wins over a later re-run without the mode (as the step rows); rows that say nothing of the mode ran
    without it."""
    log = tmp_path / "retime.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        _retimed("t", "bbb", "uci/boston", 90.0, 4.0, 80.0, True, when="2026-12-03 10:00", mkl_any_vendor=True),
        _retimed("t", "bbb", "uci/boston", 120.0, 4.0, 110.0, True, when="2026-12-03 11:00", mkl_any_vendor=False),
        _retimed("t", "bbb", "uci/wine", 300.0, 4.0, 290.0, True),
    ]))
    plain = pj.read_retimed(log).set_index(["label", "dataset"])["wall_s"]
    mode = pj.read_retimed(log, mkl_any_vendor=True).set_index(["label", "dataset"])["wall_s"]
    assert plain[("bbb", "uci/boston")] == 120.0 and mode[("bbb", "uci/boston")] == 90.0
    assert plain[("bbb", "uci/wine")] == mode[("bbb", "uci/wine")] == 300.0


def test_rows_and_re_runs_with_philox_draws_count_only_for_the_rng_projection(tmp_path):
    """Step rows and re-runs measured with ``rng=philox`` are used only by ``--rng philox``'s projection, where they win
    over later ones without it; with both modes asked for, a row in both wins over a row in one."""
    ratios = tmp_path / "ab.jsonl"
    ratios.write_text("".join(json.dumps(r) + "\n" for r in [
        _row("bbb", "slang_uci", "uci/boston", 100, 6.0, 2.0, rng="philox", when="2026-12-04 07:00"),
        _row("bbb", "slang_uci", "uci/boston", 100, 6.0, 3.0, when="2026-12-04 08:00"),
        _row("bbb", "slang_uci", "uci/boston", 100, 6.0, 1.5, rng="philox", mkl_any_vendor=True,
             when="2026-12-04 06:00")]))
    assert pj.pick(pj.read_ratios(ratios), "bbb", "slang_uci", "uci/boston", 100)[0] == pytest.approx(2.0)
    assert pj.pick(pj.read_ratios(ratios, rng="philox"), "bbb", "slang_uci", "uci/boston", 100)[0] == pytest.approx(3.0)
    both = pj.read_ratios(ratios, mkl_any_vendor=True, rng="philox")
    assert pj.pick(both, "bbb", "slang_uci", "uci/boston", 100)[0] == pytest.approx(4.0)
    log = tmp_path / "retime.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        _retimed("t", "bbb", "uci/boston", 90.0, 4.0, 80.0, True, when="2026-12-04 10:00", rng="philox"),
        _retimed("t", "bbb", "uci/boston", 120.0, 4.0, 110.0, True, when="2026-12-04 11:00", rng="torch")]))
    assert pj.read_retimed(log).set_index("label")["wall_s"]["bbb"] == 120.0
    assert pj.read_retimed(log, rng="philox").set_index("label")["wall_s"]["bbb"] == 90.0


def test_a_re_run_replaces_its_record(tmp_path):
    runs_root = tmp_path / "runs"
    _record(runs_root, "t", "bbb", "uci/boston", "bbb", "vadam_uci", wall_time_s=1010.0, hpo_time_s=5.0,
            train_time_s=1000.0)
    _record(runs_root, "t", "bbb", "uci/wine", "bbb", "vadam_uci", wall_time_s=805.0, hpo_time_s=5.0,
            train_time_s=800.0)
    _record(runs_root, "t", "pbp", "uci/boston", "pbp", "nng_uci", wall_time_s=505.0, hpo_time_s=5.0,
            train_time_s=500.0)
    _record(runs_root, "t", "vadam", "uci/boston", "vadam", "vadam_uci", wall_time_s=405.0, hpo_time_s=5.0,
            train_time_s=400.0)
    ratios = tmp_path / "ab.jsonl"
    ratios.write_text(json.dumps(_row("bbb", "vadam_uci", "uci/boston", 20, 8.0, 2.0, compile_s=2.0)) + "\n")
    log = tmp_path / "retime.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        _retimed("t", "bbb", "uci/boston", 300.0, 4.0, 290.0, True, when="2026-12-01 21:00"),   # older: not used
        _retimed("t", "bbb", "uci/boston", 120.0, 4.0, 110.0, True),                          # measured compiled
        _retimed("t", "bbb", "uci/wine", 410.0, 5.0, 400.0, False),                           # eager: still divided
        _retimed("t", "pbp", "uci/boston", 250.0, 5.0, 240.0, False),                         # not compilable
        _retimed("t", "vadam", "uci/boston", 50.0, 5.0, 40.0, True, changed=["spec.epochs"]),  # not the same cell
    ]))
    records = sc.read_runs(runs_root)
    runs = sc.phase_seconds(pj.with_retimed(records, pj.read_retimed(log)))
    proj = pj.project(runs, pj.read_ratios(ratios)).set_index(["label", "dataset"])

    b = proj.loc[("bbb", "uci/boston")]
    assert b["retimed_compiled"] and b["proj_total"] == pytest.approx(120.0) and b["compile"] == 0.0
    w = proj.loc[("bbb", "uci/wine")]   # its eager re-run's training at Boston's 4x, plus the compilation
    assert w["retimed"] and not w["retimed_compiled"]
    assert w["proj_training"] == pytest.approx(100.0) and w["proj_total"] == pytest.approx(5.0 + 100.0 + 5.0 + 2.0)
    assert proj.loc[("pbp", "uci/boston"), "proj_total"] == pytest.approx(250.0)
    v = proj.loc[("vadam", "uci/boston")]   # a re-run of another configuration is not this cell's
    assert not v["retimed"] and v["proj_total"] == pytest.approx(405.0)


def test_a_record_made_compiled_keeps_its_own_time(tmp_path):
    """A record made with ``compile=true`` is a measurement of the compiled code: no speed-up divides it again."""
    runs_root = tmp_path / "runs"
    for label, compiled in (("eager", False), ("compiled", True)):
        _record(runs_root, "t", label, "uci/boston", "bbb", "vadam_uci", compile=compiled, wall_time_s=1010.0,
                hpo_time_s=5.0, train_time_s=1000.0)
    ratios = tmp_path / "ab.jsonl"
    ratios.write_text(json.dumps(_row("bbb", "vadam_uci", "uci/boston", 20, 8.0, 2.0, compile_s=2.0)) + "\n")
    runs = sc.phase_seconds(sc.read_runs(runs_root))
    proj = pj.project(runs, pj.read_ratios(ratios)).set_index("label")
    assert proj.loc["eager", "proj_training"] == pytest.approx(250.0)
    c = proj.loc["compiled"]
    assert c["proj_total"] == pytest.approx(1010.0) and c["compile"] == 0.0
    assert c["training_source"] == "recorded compiled"


def test_a_re_run_of_a_replaced_record_does_not_count_for_its_successor(tmp_path):
    """A cell whose record was replaced (a new configuration of the column) keeps its new record's time: a re-run of
    the record before (another ``recorded_commit``) is not a measurement of it, even when it is the cell's latest."""
    runs_root = tmp_path / "runs"
    for label, commit in (("new", "b" * 40), ("kept", "c" * 40)):
        _record(runs_root, "t", label, "uci/naval", "slang", "slang_uci", compile=True, wall_time_s=7000.0,
                hpo_time_s=6900.0, train_time_s=100.0, git_commit=commit)
    log = tmp_path / "retime.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        _retimed("t", "new", "uci/naval", 2700.0, 2650.0, 30.0, True, recorded_commit="a" * 40),   # the old record's
        _retimed("t", "kept", "uci/naval", 3000.0, 2950.0, 30.0, True, recorded_commit="c" * 40, when="2026-12-01"),
        _retimed("t", "kept", "uci/naval", 2500.0, 2450.0, 30.0, True, recorded_commit="a" * 40),  # an older record's
    ]))
    runs = sc.phase_seconds(pj.with_retimed(sc.read_runs(runs_root), pj.read_retimed(log)))
    (tmp_path / "ab.jsonl").write_text("")
    proj = pj.project(runs, pj.read_ratios(tmp_path / "ab.jsonl")).set_index("label")
    assert not proj.loc["new", "retimed"] and proj.loc["new", "proj_total"] == pytest.approx(7000.0)
    assert proj.loc["new", "training_source"] == "recorded compiled"
    assert proj.loc["kept", "retimed_compiled"] and proj.loc["kept", "proj_total"] == pytest.approx(3000.0)


def test_the_sample_estimates_the_cells_not_re_run(tmp_path):
    runs_root = tmp_path / "runs"
    walls = {"a": 100.0, "b": 200.0, "c": 300.0, "d": 400.0, "e": 1000.0, "big": 9000.0}
    for label, wall in walls.items():
        _record(runs_root, "t", label, "uci/boston", "pbp", "nng_uci", wall_time_s=wall, hpo_time_s=0.0,
                train_time_s=wall)
    failed = runs_root / "t" / "f" / "uci__boston"   # a failed run: not in the frame, counted as recorded
    failed.mkdir(parents=True)
    (failed / "failed.json").write_text(json.dumps({"dataset": "uci/boston", "device": "cpu", "method": "pbp",
                                                    "protocol": "nng_uci", "config": {}, "wall_time_s": 500.0}))
    tag = {"seed": 3, "frame_hours": 1.0, "frame_cells": 5}   # the frame: a..e (big projects to 2.5 h)
    log = tmp_path / "retime.jsonl"
    rows = [_retimed("t", "a", "uci/boston", 50.0, 0.0, 50.0, True),
            _retimed("t", "c", "uci/boston", 90.0, 0.0, 90.0, True)]
    rows[0]["sample"] = rows[1]["sample"] = tag
    rows.append(_retimed("t", "e", "uci/boston", 200.0, 0.0, 200.0, True))   # re-run by hand: measured, not sampled
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = sc.read_runs(runs_root)
    (tmp_path / "ab.jsonl").write_text(json.dumps(_row("bbb", "nng_uci", "uci/boston", 20, 4.0, 2.0)) + "\n")
    ratios = pj.read_ratios(tmp_path / "ab.jsonl")   # none for PBP: each cell projects to its record
    retimed = pj.read_retimed(log)
    base = pj.project(sc.phase_seconds(records), ratios)
    proj = pj.project(sc.phase_seconds(pj.with_retimed(records, retimed)), ratios)
    est = pj.sample_estimate(base, proj, retimed)
    r = (50.0 + 90.0) / (100.0 + 300.0)
    assert est["n"] == 2 and est["N"] == 5 and est["ratio"] == pytest.approx(r)
    assert est["rest_cells"] == 2 and est["rest_projected_s"] == pytest.approx(600.0)     # b and d
    assert est["total_s"] == pytest.approx(50.0 + 90.0 + 200.0 + 9000.0 + 500.0 + r * 600.0)
    d = [50.0 - r * 100.0, 90.0 - r * 300.0]
    se_r = ((1 - 2 / 5) * (d[0] ** 2 + d[1] ** 2) / (1 * 2)) ** 0.5 / 200.0
    assert est["ratio_se"] == pytest.approx(se_r) and est["total_se_s"] == pytest.approx(600.0 * se_r)


def _sample_estimate(tmp_path, walls, rows, compiled=()):
    """``sample_estimate`` on PBP records of ``walls`` (label -> seconds; those in ``compiled`` made with
    ``compile=true``) and the re-run ``rows``, with every cell projecting to its record (no measured step for PBP);
    also the log as read."""
    runs_root = tmp_path / "runs"
    for label, wall in walls.items():
        _record(runs_root, "t", label, "uci/boston", "pbp", "nng_uci", compile=label in compiled, wall_time_s=wall,
                hpo_time_s=0.0, train_time_s=wall)
    log = tmp_path / "retime.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = sc.read_runs(runs_root)
    (tmp_path / "ab.jsonl").write_text(json.dumps(_row("bbb", "nng_uci", "uci/boston", 20, 4.0, 2.0)) + "\n")
    ratios = pj.read_ratios(tmp_path / "ab.jsonl")
    retimed = pj.read_retimed(log)
    base = pj.project(sc.phase_seconds(records), ratios)
    proj = pj.project(sc.phase_seconds(pj.with_retimed(records, retimed)), ratios)
    return pj.sample_estimate(base, proj, retimed), retimed


def test_a_sampled_cell_re_run_later_stays_in_the_sample(tmp_path):
    tag = {"seed": 3, "frame_hours": 1.0, "frame_cells": 4}
    rows = [_retimed("t", "a", "uci/boston", 50.0, 0.0, 50.0, True, when="2026-12-01 21:00"),
            _retimed("t", "c", "uci/boston", 90.0, 0.0, 90.0, True, when="2026-12-01 21:00"),
            _retimed("t", "a", "uci/boston", 30.0, 0.0, 30.0, True, when="2026-12-04 12:00")]   # later, by hand
    rows[0]["sample"] = rows[1]["sample"] = tag
    est, retimed = _sample_estimate(tmp_path, {"a": 100.0, "b": 200.0, "c": 300.0, "d": 400.0}, rows)
    assert len(retimed) == 2 and retimed.set_index("label").loc["a", "wall_s"] == 30.0
    r = (30.0 + 90.0) / (100.0 + 300.0)   # a counts with its latest re-run
    assert est["n"] == 2 and est["ratio"] == pytest.approx(r)
    assert est["rest_cells"] == 2 and est["total_s"] == pytest.approx(30.0 + 90.0 + r * 600.0)


def test_a_sampled_cell_without_a_record_leaves_the_sample(tmp_path):
    """A sampled cell whose record has gone (its column moved to another data set) leaves the sample and the frame;
    the estimate stays a number."""
    tag = {"seed": 3, "frame_hours": 1.0, "frame_cells": 5}
    rows = [_retimed("t", "a", "uci/boston", 50.0, 0.0, 50.0, True),
            _retimed("t", "c", "uci/boston", 90.0, 0.0, 90.0, True),
            _retimed("t", "gone", "uci/naval", 70.0, 0.0, 70.0, True)]   # its record moved to another data set
    for r in rows:
        r["sample"] = tag
    est, _ = _sample_estimate(tmp_path, {"a": 100.0, "b": 200.0, "c": 300.0, "d": 400.0}, rows)
    r = (50.0 + 90.0) / (100.0 + 300.0)
    assert est["n"] == 2 and est["N"] == 4 and est["dropped"] == 1 and est["ratio"] == pytest.approx(r)
    assert est["total_s"] == pytest.approx(50.0 + 90.0 + r * 600.0)
    d = [50.0 - r * 100.0, 90.0 - r * 300.0]
    assert est["ratio_se"] == pytest.approx(((1 - 2 / 4) * (d[0] ** 2 + d[1] ** 2) / 2) ** 0.5 / 200.0)


def test_a_failed_runs_re_run_replaces_its_time(tmp_path):
    """A run that failed (``failed.json``) counts its wall time whole; its failed re-run's time replaces it, a re-run
    that succeeded where the record failed does not (bench/retime.py logs it as changed), nor a record's re-run row
    for a cell whose committed run failed."""
    runs_root = tmp_path / "runs"
    for label in ("f", "g"):
        d = runs_root / "t" / label / "uci__boston"
        d.mkdir(parents=True)
        (d / "failed.json").write_text(json.dumps({"dataset": "uci/boston", "device": "cpu", "method": "pbp",
                                                   "protocol": "nng_uci", "config": {}, "wall_time_s": 500.0}))
    log = tmp_path / "retime.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        _retimed("t", "f", "uci/boston", 200.0, 0.0, 0.0, True, status="failed"),
        _retimed("t", "g", "uci/boston", 300.0, 0.0, 290.0, True),    # a record's row (no status: ok)
    ]))
    records = sc.read_runs(runs_root)
    (tmp_path / "ab.jsonl").write_text(json.dumps(_row("bbb", "nng_uci", "uci/boston", 20, 4.0, 2.0)) + "\n")
    runs = sc.phase_seconds(pj.with_retimed(records, pj.read_retimed(log)))
    proj = pj.project(runs, pj.read_ratios(tmp_path / "ab.jsonl")).set_index("label")
    assert proj.loc["f", "retimed_compiled"] and proj.loc["f", "failed"] == 200.0
    assert proj.loc["f", "proj_total"] == pytest.approx(200.0)
    assert not proj.loc["g", "retimed"] and proj.loc["g", "proj_total"] == pytest.approx(500.0)


def test_a_record_made_compiled_stays_out_of_the_samples_frame(tmp_path):
    """The estimate takes a record made compiled as measured: it is not scaled by the sample's ratio."""
    tag = {"seed": 3, "frame_hours": 1.0, "frame_cells": 4}
    rows = [_retimed("t", "a", "uci/boston", 50.0, 0.0, 50.0, True),
            _retimed("t", "c", "uci/boston", 90.0, 0.0, 90.0, True)]
    for r in rows:
        r["sample"] = tag
    est, _ = _sample_estimate(tmp_path, {"a": 100.0, "b": 200.0, "c": 300.0, "d": 400.0}, rows, compiled=("d",))
    r = (50.0 + 90.0) / (100.0 + 300.0)
    assert est["rest_cells"] == 1 and est["total_s"] == pytest.approx(50.0 + 90.0 + r * 200.0 + 400.0)   # d as made
