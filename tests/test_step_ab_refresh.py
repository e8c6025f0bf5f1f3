"""bench/step_ab_refresh.py: which step rows it re-measures (the latest row of each case that bench/projection.py
reads, against the base, measured before the cut) and how it groups and shards them (synthetic rows here)."""

import json

from datapaths import bench_module

bench_module("step_ab")
bench_module("suite_cost")
bench_module("projection")
bench_module("cells_ab")
bench_module("retime")
rf = bench_module("step_ab_refresh")


def _row(method, protocol, data, R, when, base="5c21305", **extra):
    return {"method": method, "protocol": protocol, "data": data, "R": R, "base": base, "base_compiled": False,
            "compiled": True, "rounds": 5, "when": when, "mkl_any_vendor": False, "rng": "torch", "old_ms": 2.0,
            "new_ms": 1.0, **extra}


def test_the_latest_projected_row_of_each_case_is_grouped(tmp_path):
    rows = [
        _row("bbb", "slang_uci", "uci/boston", 100, "2026-12-01 10:00"),
        _row("bbb", "slang_uci", "uci/boston", 20, "2026-12-01 10:00"),
        _row("slang", "slang_uci", "uci/boston", 100, "2026-12-01 10:00", rounds=7),
        _row("slang", "slang_uci", "uci/boston", 20, "2026-12-01 10:00", rounds=7),
        _row("vadam", "vadam_uci", "uci/boston", 100, "2026-12-01 10:00"),
        _row("vadam", "vadam_uci", "uci/boston", 100, "2026-12-05 10:00"),          # re-measured after the cut
        _row("vadam", "vadam_uci", "uci/boston", 20, "2026-12-05 10:00", mkl_any_vendor=True),   # another mode
        _row("vogn", "vadam_uci", "uci/boston", 100, "2026-12-01 10:00", rng="philox"),          # another mode
        _row("map", "leaderboard_uci", "uci/boston", 100, "2026-12-01 10:00", base="HEAD"),      # another base
        _row("bbb", "nng_uci", "uci/protein", 25, "2026-12-01 10:00"),
        _row("bbb", "nng_uci", "uci/protein", 5, "2026-12-01 10:00"),
        _row("noisy_adam", "nng_uci", "uci/protein", 25, "2026-12-01 10:00", compiled=False)]    # not compiled
    path = tmp_path / "step_ab.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    groups = rf.stale_groups(path, "2026-12-04 19:26", "5c21305")
    assert groups == [
        {"protocol": "slang_uci", "data": "uci/boston", "replicas": "100,20", "methods": ["bbb", "slang"], "rounds": 7},
        {"protocol": "nng_uci", "data": "uci/protein", "replicas": "25,5", "methods": ["bbb"], "rounds": 5}]
    assert len(rf.stale_groups(path, None, "5c21305")) == 3      # without a cut: Vadam's latest row too
    cmd = rf.command(groups[0], "5c21305", path, None)
    assert cmd[cmd.index("--methods"):] == ["--methods", "bbb,slang", "--protocol", "slang_uci", "--data",
                                            "uci/boston", "--replicas", "100,20", "--rounds", "7", "--json", str(path)]


def test_shards_cover_every_group_once_balanced_by_cases():
    groups = [{"methods": ["m"] * n, "replicas": "100,20", "id": i} for i, n in enumerate([7, 1, 3, 3, 1])]
    parts = [rf.shard(groups, i, 2, rf.cases) for i in range(2)]
    assert sorted(g["id"] for p in parts for g in p) == [0, 1, 2, 3, 4]
    assert sorted(sum(len(g["methods"]) for g in p) for p in parts) == [7, 8]
