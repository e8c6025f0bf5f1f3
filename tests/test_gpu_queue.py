"""The GPU queue (bench/gpu_queue.py, `make gpu-queue`): its listing prices every entry, the budget skips what does not
fit, and (e2e) its commands run end to end on the CPU with tiny settings and write their records."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from datapaths import MIRROR, REPO

_spec = importlib.util.spec_from_file_location("gpu_queue", REPO / "bench" / "gpu_queue.py")
gq = importlib.util.module_from_spec(_spec)
sys.modules["gpu_queue"] = gq   # the dataclasses look their module up
_spec.loader.exec_module(gq)

def _ctx(tmp_path, tiny=False):
    return gq.Ctx(runs_root=tmp_path / "runs", tables=tmp_path / "tables", out=tmp_path / "out", tiny=tiny)


def _entry(name, resumable=True):
    return gq.Entry(name=name, what=name, argv=("python", f"bench/{name}.py"), tiny=("python", f"bench/{name}.py"),
                    cpu="1 s", cpu_cost="1 s", cpu_measured="-", gpu_how="fake", resumable=resumable)


def test_dry_run_lists_every_entry_with_its_gpu_estimate(tmp_path, capsys):
    ctx = _ctx(tmp_path)   # no records yet: every cell is left
    assert gq.main(["--dry-run", "--runs-root", str(ctx.runs_root), "--out", str(ctx.out)]) == 0
    out = capsys.readouterr().out
    table, _, details = out.partition("\n\n1. ")
    total = 0
    for e in gq.QUEUE:
        row = next(line for line in table.splitlines() if line.split()[1:2] == [e.name])
        assert e.cpu in row
        est = gq.estimate(e, ctx)
        assert est >= 10 and gq.fmt_s(est) in row, row
        total += est
        assert f"{e.name}: {e.what}" in "1. " + details and e.gpu_how in details and e.cpu_measured in details
    assert f"total expected GPU time of what is left: {gq.fmt_s(total)}" in out
    # the repository's records: App. F's finished cells are not counted
    assert gq.main(["--dry-run", "--only", "gi_mnist500", "--out", str(ctx.out)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("1  gi_mnist500"))
    done = len(list((REPO / "results" / "runs" / "gi_mnist500").glob("*/mnist/record.json")))
    assert f"{16 - done} of 16" in row
    names = [e.name for e in gq.QUEUE]   # the benchmarks first (they price the rest), then Table 3 by rank
    assert names[:6] == ["bench_step_ratios", "bench_mnist_epoch", "bench_cuda_graphs", "slang_L1", "slang_L8",
                         "slang_L32"]
    assert all(e.argv[-1] != "device=cpu" and ("device=cuda" in e.argv or "cuda" in e.argv) for e in gq.QUEUE)


def test_dry_run_with_a_budget_says_what_runs_and_what_is_skipped(tmp_path, capsys):
    """(In an empty --out and runs root: the repository's benchmark JSON would mark the benchmarks done.)"""
    assert gq.main(["--dry-run", "--budget", "600", "--only", "bench_step_ratios,bench_mnist_epoch,slang_L1",
                    "--out", str(tmp_path / "out"), "--runs-root", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "runs: expected 45 s of 10.0 min left" in out
    assert "skipped: expected 27.2 min does not fit the 8.8 min left" in out
    with pytest.raises(SystemExit, match="unknown queue entries nosuch"):
        gq.main(["--dry-run", "--only", "nosuch"])


def test_the_classification_boards_mnist_column_is_its_cells_on_mnist_priced_per_method(tmp_path):
    """--data keeps the column: the experiment's 12 methods on MNIST; each cell's GPU time is its method's step times
    the protocol's steps, the cells shared by the entry's processes in order."""
    e = next(e for e in gq.QUEUE if e.name == "cls_leaderboard_mnist")
    cells = gq.cells(e)
    assert len(cells) == 12 and {d for _, d in cells} == {"mnist"}
    assert {lab for lab, _ in cells} == set(gq.CLS_MNIST_MS)
    one = [gq.CLS_MNIST_STEPS * gq.CLS_MNIST_MS[lab] / 1e3 + gq.CLS_MNIST_OVERHEAD_S for lab, _ in cells]
    assert gq.estimate(e, _ctx(tmp_path)) == pytest.approx(gq.makespan(one, e.procs))
    assert gq.estimate(e, _ctx(tmp_path), ["map"]) == pytest.approx(one[0])
    assert gq.pending(e, _ctx(tmp_path)) == [lab for lab, _ in cells]


def test_budget_skips_what_does_not_fit_and_runs_what_does():
    a, b, c, d = (_entry(n) for n in "abcd")
    e = _entry("e", resumable=False)
    decided = gq.plan([(a, 10), (b, 100), (c, None), (d, 30)], budget=50)
    assert [(x.name, act) for x, act, _ in decided] == [("a", "run"), ("b", "skip"), ("c", "skip"), ("d", "run")]
    assert "does not fit the 40 s left" in decided[1][2] and "no GPU estimate" in decided[2][2]
    # no budget: everything runs, unknown estimates too
    assert [act for _, act, _ in gq.plan([(a, 10), (c, None)], budget=None)] == ["run", "run"]
    # --fill: the first skipped resumable entry with an estimate runs the time left, if there is enough of it
    decided = gq.plan([(e, 900), (a, 10), (b, 400), (d, 30)], budget=300, fill=True)
    assert [act for _, act, _ in decided] == ["skip", "run", "fill", "run"]
    assert [act for _, act, _ in gq.plan([(a, 10), (b, 400)], budget=100, fill=True)] == ["run", "skip"]  # < 120 s
    # exactly fitting runs
    assert [act for _, act, _ in gq.plan([(a, 50), (b, 1)], budget=50)] == ["run", "skip"]


def test_estimates_from_the_measured_numbers(tmp_path):
    ctx = _ctx(tmp_path)
    slang8 = next(e for e in gq.QUEUE if e.name == "slang_L8")
    assert gq.estimate(slang8, ctx) == pytest.approx(115_000 * 1.8 * 3.72 * 2 / 1e3 + gq.SLANG_OVERHEAD_S)
    # once bench_mnist_epoch has run on the GPU, its measured 4-sample step prices the cell (not a CPU run's)
    ctx.out.mkdir()
    rows = [{"method": "slang", "rank": 8, "samples": 4, "ms_step": 5.0}]
    (ctx.out / "bench_mnist_epoch.json").write_text(json.dumps({"device": "cpu", "rows": rows}))
    assert gq.estimate(slang8, ctx) == pytest.approx(115_000 * 1.8 * 3.72 * 2 / 1e3 + gq.SLANG_OVERHEAD_S)
    (ctx.out / "bench_mnist_epoch.json").write_text(json.dumps({"device": "cuda", "rows": rows}))
    assert gq.estimate(slang8, ctx) == pytest.approx(115_000 * 5.0 / 1e3 + gq.SLANG_OVERHEAD_S)
    assert gq.priced_by_bench(slang8, ctx)
    # resume state brought back from an earlier lease: the first stage finished, 30 000 steps into the second
    import torch
    d = ctx.runs_root / "slang_table3" / "slang_L8" / "mnist"
    d.mkdir(parents=True)
    (d / ".stage0-0123456789abcdef.pt").write_bytes(b"")
    torch.save({"steps": 30_000, "epoch": 100}, d / ".checkpoint-0123456789abcdef-stage1.pt")
    assert gq.resumed_fraction(ctx, "slang_table3", "slang_L8") == pytest.approx(55_000 / 115_000)
    assert gq.estimate(slang8, ctx) == pytest.approx(60_000 * 5.0 / 1e3 + gq.SLANG_OVERHEAD_S)
    # App. F: the cells left in the experiment's order on four processes (the first lease's cell times)
    gi = next(e for e in gq.QUEUE if e.name == "gi_mnist500")
    left = ["gi_spatial_iw", "li_spatial_iw", "gi_neal", "fac_neal", "li_neal", "gi_standard", "fac_gi_standard",
            "fac_standard", "li_standard"]
    # by hand: gi, li, gi, fac start; fac frees at 211 (li to 446), li at 235 (gi to 676), the gis at 441 (fac_gi to
    # 661, fac to 652), li at 446 (li to 681)
    assert gq.makespan([441, 235, 441, 211, 235, 441, 220, 211, 235], 4) == 681
    assert gq.estimate(gi, ctx, left) == 681 + gq.GI_START_S
    assert gq.estimate(gi, ctx, []) == 0
    assert gq.makespan([5, 5, 5], 1) == 15


def test_done_cells_are_skipped_and_the_budget_holds_at_run_time(tmp_path, capsys):
    """A cell with a finished record at the entry's protocol is done; one of another protocol is pending (and replaced
    by SLANG's entries); with a budget nothing runs whose estimate does not fit (here: nothing at all)."""
    ctx = _ctx(tmp_path, tiny=True)
    slang1 = next(e for e in gq.QUEUE if e.name == "slang_L1")
    d = ctx.runs_root / "slang_table3" / "slang_L1" / "mnist"
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps({"status": "ok", "protocol": "slang_mnist_50k"}))
    assert gq.pending(slang1, ctx) == ["slang_L1"]
    assert gq.other_protocol_records(slang1, ctx, ["slang_L1"]) == ["slang_L1 (slang_mnist_50k)"]
    assert "skip_done=false" in gq.command(slang1, ctx, replace=True)
    assert "skip_done=false" not in gq.command(slang1, ctx)
    (d / "record.json").write_text(json.dumps({"status": "ok", "protocol": "slang_mnist_fast"}))
    assert gq.pending(slang1, ctx) == []
    bench = next(e for e in gq.QUEUE if e.name == "bench_mnist_epoch")
    assert gq.command(bench, ctx)[-2:] == ["--json", str(ctx.out / "bench_mnist_epoch.json")]

    entries = [e for e in gq.QUEUE if e.name in ("bench_mnist_epoch", "slang_L1", "slang_L8")]
    assert gq.run_queue(ctx, entries, budget=5, fill=True) == 0
    out = capsys.readouterr().out
    assert "== slang_L1: done" in out
    assert "== bench_mnist_epoch: skipped: expected 30 s does not fit the" in out
    assert "== slang_L8: skipped: expected 27.2 min does not fit the" in out
    run, = json.loads((ctx.out / "queue.json").read_text())
    assert [(x["entry"], x["action"]) for x in run["entries"]] == [("bench_mnist_epoch", "skip"),
                                                                    ("slang_L1", "skip"), ("slang_L8", "skip")]
    assert not (ctx.runs_root / "slang_table3" / "slang_L8").exists() and not list(ctx.out.glob("*.log"))


def test_without_cuda_the_queue_refuses_at_once(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    assert gq.main(["--runs-root", str(tmp_path), "--only", "slang_L1"]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not list(tmp_path.iterdir())


def _finite(x):
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    if isinstance(x, list):
        return all(_finite(v) for v in x)
    return not isinstance(x, float) or math.isfinite(x)


@pytest.mark.e2e
@pytest.mark.skipif(not (MIRROR / "mnist").is_dir(), reason="needs the data mirror with MNIST")
def test_tiny_queue_runs_table3_and_the_benchmarks_on_the_cpu(tmp_path, module_env):
    """`make gpu-queue ARGS=--tiny`: every command of the queue with tiny settings on the CPU (about 60 s here). App. F
    is left out for time (its tiny command: `--tiny --only gi_mnist500`)."""
    names = ["bench_step_ratios", "bench_mnist_epoch", "slang_L1", "slang_L8", "slang_L32", "cls_leaderboard_mnist",
             "bench_conv_step_ratios", "nng_mnist_conv_long"]
    runs = tmp_path / "runs"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_queue.py"), "--tiny", "--runs-root", str(runs),
                        "--only", ",".join(names)], capture_output=True, text=True, cwd=REPO, timeout=400,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for L in (1, 8, 32):
        d = runs / "slang_table3" / f"slang_L{L}" / "mnist"
        rec = json.loads((d / "record.json").read_text())
        assert rec["status"] == "ok" and rec["protocol"] == "slang_mnist_fast" and rec["config"]["spec"]["method"][
            "rank"] == L
        assert (d / "history.json").exists() and not list(d.glob(".*.pt"))
        assert all(math.isfinite(m[k]) for m in rec["metrics"] for k in ("error", "nll", "ece"))
        assert 0 <= rec["summary"]["error"]["mean"] <= 1
    recs = sorted((runs / "cls_leaderboard").rglob("record.json"))   # the --data column only, of the --label cells
    assert [r.relative_to(runs).parts[1:3] for r in recs] == [("laplace_ll", "mnist"), ("map", "mnist")]
    assert all(0 <= json.loads(r.read_text())["summary"]["accuracy"]["mean"] <= 1 for r in recs)
    recs = list((runs / "nng_mnist_conv_long").rglob("record.json"))
    assert len(recs) == 5 and all(_finite(json.loads(r.read_text())["summary"]) for r in recs)
    out = tmp_path / "gpu_queue"
    conv = json.loads((out / "bench_conv_step_ratios.json").read_text())
    assert conv["device"] == "cpu" and conv["nets"]["mnist"]["ratio_to_sgd"]["sgd"] == 1 and _finite(conv)
    ratios = json.loads((out / "bench_step_ratios.json").read_text())
    assert ratios["device"] == "cpu" and ratios["mnist"]["SLANG L=32"]["ratio"] > 1 and _finite(ratios)
    epoch = json.loads((out / "bench_mnist_epoch.json").read_text())
    assert [r["label"] for r in epoch["rows"]] == ["Adam", "BBB", "SLANG L=1"] and _finite(epoch)
    assert all(r["ms_step"] > 0 for r in epoch["rows"])
    run, = json.loads((out / "queue.json").read_text())
    assert [(x["entry"], x["status"]) for x in run["entries"]] == [(n, "done") for n in names]
    assert (tmp_path / "tables" / "slang_table3.md").exists()
    # run again: everything is done, nothing runs
    p = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_queue.py"), "--tiny", "--runs-root", str(runs),
                        "--only", ",".join(names)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert p.returncode == 0 and p.stdout.count(": done (") == len(names) and "$ " not in p.stdout, p.stdout
