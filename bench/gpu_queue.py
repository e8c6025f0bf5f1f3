"""The GPU queue: the cells that only a GPU can run here, most valuable first, each resumable (issue 21).

    python bench/gpu_queue.py --dry-run [--budget S]     # the queue, each entry's CPU cost and expected GPU time
    python bench/gpu_queue.py [--budget S] [--fill]      # run it (device=cuda), in order
    python bench/gpu_queue.py --only slang_L1,bench_mnist_epoch
    python bench/gpu_queue.py --tiny                     # every command with tiny settings on the CPU (seconds)
    make gpu-queue ARGS=--dry-run                        # the same through make; bench/gpu_session.sh queue on a lease

The queue is data (``QUEUE``): each entry says what it is, its command (``bnnbench reproduce <experiment> ...
device=cuda`` or a bench script), what it cost on this 2-core CPU and how that was measured, and its expected time on
one NVIDIA H100/H200 with how that was estimated. Running it:

* an entry whose cells all hold a finished record at the entry's protocol is skipped (``done``); ``bnnbench
  reproduce`` itself skips finished cells and resumes an interrupted one from its checkpoint in the runs root, so
  the queue can be stopped and run again at any point. A benchmark is done when its JSON is in ``--out``;
* ``--budget S``: an entry whose expected GPU time does not fit the seconds left is skipped, saying so, and the next
  one is tried; an entry that runs gets the seconds left as its limit (then SIGINT: its checkpoint stays).
  ``--fill``: when the queue has been through, the first skipped resumable entry runs until the budget ends (the
  next one if it finishes early); a later run continues it from its checkpoint (where the checkpoint travels:
  bench/gpu_session.sh), and the expected time of a SLANG cell counts the steps its resume state holds;
* records go to ``--runs-root`` (default results/runs, where the tables read them), tables to ``--tables``, the
  benchmarks' JSON, each entry's log and ``queue.json`` (what ran, how long, on what) to ``--out``
  (default results/gpu_queue);
* the SLANG Table 3 cells replace the CPU's ``slang_mnist_50k`` records in their run directories (``skip_done=false``
  is added only where such a record of another protocol is there; it stays in git history), as BBB's did.

Expected GPU times come from numbers measured on a lent H200 (results/README.md, Speed and Global inducing points);
once ``bench_mnist_epoch`` has run on the GPU (its JSON in ``--out``), SLANG's cells are priced from its measured
4-sample steps instead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import heapq
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# --- measured numbers the estimates are built from (results/README.md) ------------------------------------------
# H200, 2026-11-26, `python bench/step_ratios.py --device cuda --steps 50` (torch 2.11.0+cu130): an Adam step of the
# 784-400-400-10 MLP at minibatch 200, one sample, and SLANG's step relative to it (L = 1 was not timed: L = 8's ratio,
# the step being bound by kernel launches, not flops: L = 8 and L = 32 differ by 5%)
H200_ADAM_MS = 1.8
H200_SLANG_RATIO = {1: 3.72, 8: 3.72, 32: 3.89}
# the protocol draws 4 samples a step, the ratios above 1: x2 (this CPU: 4-sample / 1-sample steps 1.2-1.4x at 1
# thread on 2026-11-26 06:20, 1.8-2.4x at 2 threads on 2026-11-25 03:25; the GPU step, launch-bound, is at most that)
SAMPLES_4_OVER_1 = 2.0
SLANG_STEPS = 100 * (50000 // 200) + 300 * (60000 // 200)   # slang_mnist: 115 000 steps
SLANG_OVERHEAD_S = 90   # start-up, CUDA and MNIST load, 80 evaluations (10 samples, 10k images), the final one (1000)
# H200, 2026-11-26, `bench/gpu_session.sh appf`: wall time of App. F cells with four cells sharing the GPU (the seven
# records in results/runs/gi_mnist500, device cuda): the largest per family
GI_CELL_S = {"fac": 211, "fac_gi": 220, "li": 235, "gi": 441}
GI_PROCS = 4
GI_START_S = 30

# The classification board's MNIST column (protocol leaderboard_cls: 784-50-10, minibatch 32, 100 epochs): a search of
# 10 configurations trained together on the replica axis on 48 000 rows, then the final training on 60 000, so
# 100 x 1500 + 100 x 1875 steps a cell. Per step on the H200: bench_step_ratios' and bench_mnist_epoch's (2026-11-26)
# launch-bound steps of the larger 784-400-400-10 net, the nearest measured (Adam 2.1 ms; the 4-sample steps BBB 3.3,
# SLANG L = 1 12.0 ms; noisy K-FAC at T_inv = 1 as its UCI step, 4.0 ms; the ensemble's members and the 10 replicas
# ride the same kernels)
CLS_MNIST_STEPS = 100 * 1500 + 100 * 1875
CLS_MNIST_MS = {"map": 2.1, "deep_ensemble": 2.1, "swag": 2.1, "laplace": 2.1, "laplace_ll": 2.1, "bbb": 3.3,
                "vogn": 3.3, "vadam": 3.3, "vprop": 3.3, "noisy_adam": 3.3, "noisy_kfac": 4.0, "slang": 12.0}
CLS_MNIST_OVERHEAD_S = 60   # start-up, MNIST load, the search's scoring, the Laplace fit, 100-sample evaluation
CLS_PROCS = 6


@dataclass(frozen=True)
class Entry:
    """One item of the queue. ``argv`` is the GPU command: ``bnnbench reproduce ...`` (the runner adds
    ``--runs-root``, ``--out`` and, where needed, ``skip_done=false``) or ``python bench/<script> ...`` (the runner
    adds ``--json <out>/<name>.json``); ``tiny`` is the same command with settings that run on a CPU in seconds."""
    name: str
    what: str
    argv: tuple[str, ...]
    tiny: tuple[str, ...]
    cpu: str                       # its cost on this 2-core CPU, short (the listing's column)
    cpu_cost: str                  # the same, how it adds up
    cpu_measured: str              # the command and date that measured it
    gpu_how: str                   # how the expected GPU time was estimated
    gpu_s: float | None = None     # expected seconds on one H100/H200 (reproduce entries: ``estimate``)
    protocol: str | None = None    # reproduce entries: a cell is done when its record is at this protocol
    tiny_protocol: str | None = None
    procs: int = 1                 # processes sharing the GPU and the experiment's cells
    replace: bool = False          # a record of another protocol in a cell's run directory is replaced
    resumable: bool = True

    @property
    def kind(self) -> str:
        return "reproduce" if self.argv[:2] == ("bnnbench", "reproduce") else "bench"

    @property
    def experiment(self) -> str | None:
        return self.argv[2] if self.kind == "reproduce" else None

    def labels(self, tiny: bool = False) -> list[str] | None:
        return self._option("--label", tiny)

    def datasets(self, tiny: bool = False) -> list[str] | None:
        return self._option("--data", tiny)

    def _option(self, flag: str, tiny: bool) -> list[str] | None:
        argv = self.tiny if tiny else self.argv
        return argv[argv.index(flag) + 1].split(",") if flag in argv else None


def _slang(L: int) -> Entry:
    h = 115_000 * {1: 85.0, 8: 171.1, 32: 548.4}[L] / 3.6e6
    rec = {1: (6094, "991f0de"), 8: (8497, "d4a1146"), 32: (17766, "9f6c6c6")}[L]
    return Entry(
        name=f"slang_L{L}",
        what=f"SLANG Table 3, SLANG L = {L} at the paper's whole protocol slang_mnist (100 epochs on 50k, 300 on 60k; "
             f"replaces the CPU's slang_mnist_50k record)",
        argv=("bnnbench", "reproduce", "slang_table3", "--label", f"slang_L{L}", "device=cuda", "progress=false"),
        tiny=("bnnbench", "reproduce", "slang_table3", "--label", f"slang_L{L}", "device=cpu", "progress=false",
              *TINY_SLANG),
        protocol="slang_mnist", tiny_protocol="slang_mnist_fast", replace=True,
        cpu=f"{h:.1f}-{rec[0] * 4.6 / 3600:.1f} h",
        cpu_cost=f"{h:.1f} h of steps at 1 thread (115 000 x {h * 3.6e6 / 115_000:.1f} ms); the first 100 epochs "
                 f"took {rec[0] / 3600:.1f} h beside other jobs (x4.6: {rec[0] * 4.6 / 3600:.1f} h)",
        cpu_measured=f"python bench/mnist_epoch.py --ranks 1,8,32 --steps 20 --threads 1 (2026-11-26 06:21, load "
                     f"2.3); the slang_mnist_50k record's train_time_s (2026-11-25, code of {rec[1]})",
        gpu_how=f"115 000 steps x 1.8 ms (H200 Adam step) x {H200_SLANG_RATIO[L]} (H200 SLANG L = "
                f"{L if L != 1 else 8} / Adam{', L = 1 untimed' if L == 1 else ''}) x {SAMPLES_4_OVER_1:g} (4 samples "
                f"against 1) + {SLANG_OVERHEAD_S} s start-up and evaluations; replaced by bench_mnist_epoch's "
                f"measured 4-sample step once it has run on the GPU",
    )


# tiny settings: a 16-unit network on 400 images, two 2-step stages, a handful of samples (tests/run/test_mnist.py's)
TINY_SLANG = ("protocol=slang_mnist_fast", "model.hidden=[16]", "protocol.subset.train=400", "protocol.subset.test=200",
              "protocol.stages=[{split: validation, epochs: 1}, {split: official, epochs: 1}]",
              "protocol.eval_samples=2", "protocol.eval_samples_final=4", "protocol.eval_every=1")

QUEUE: list[Entry] = [
    Entry(
        name="bench_step_ratios",
        what="GPU timing: each method's step against Adam's at MNIST and UCI scale (bench/step_ratios.py; the "
             "Speed table's H200 row, SLANG L = 8 / 32 against their 3x / 5x targets)",
        argv=("python", "bench/step_ratios.py", "--device", "cuda", "--steps", "50"),
        tiny=("python", "bench/step_ratios.py", "--device", "cpu", "--steps", "1", "--kfac-steps", "2"),
        gpu_s=45,
        cpu="83 s",
        cpu_cost="83 s (the same command with --device cpu, 1 thread)",
        cpu_measured="python bench/step_ratios.py --steps 50 (1 thread, 2026-11-26 06:20, load 0.7-2.5)",
        gpu_how="the first lease's `check` ran it with the 80 CUDA tests and two gi benchmarks in 83 s (H200, "
                "2026-11-26); about 10 s of steps (at most 7 ms each) and 15-30 s of CUDA start-up and warm-up",
        resumable=False,
    ),
    Entry(
        name="bench_mnist_epoch",
        what="GPU timing: SLANG Table 3's per-cell cost, BBB and SLANG L = 1, 8, 32 with 4 samples a step "
             "(bench/mnist_epoch.py; prices the SLANG entries below)",
        argv=("python", "bench/mnist_epoch.py", "--device", "cuda", "--ranks", "1,8,32", "--steps", "20"),
        tiny=("python", "bench/mnist_epoch.py", "--device", "cpu", "--ranks", "1", "--steps", "1"),
        gpu_s=30,
        cpu="22 s",
        cpu_cost="22 s (the same command with --device cpu, 1 thread)",
        cpu_measured="python bench/mnist_epoch.py --ranks 1,8,32 --steps 20 --threads 1 (2026-11-26 06:21, load 2.3)",
        gpu_how="about 120 steps of at most 30 ms and 15-30 s of CUDA start-up and warm-up",
        resumable=False,
    ),
    Entry(
        name="bench_cuda_graphs",
        what="GPU timing: Adam's, BBB's and SLANG L = 1, 8, 32's MNIST steps as compile=true steps them on a GPU, "
             "CUDA graphs (issue 31, section 3; bench/mnist_epoch.py --compile, beside the eager rows)",
        argv=("python", "bench/mnist_epoch.py", "--device", "cuda", "--ranks", "1,8,32", "--steps", "20", "--compile"),
        tiny=("python", "bench/mnist_epoch.py", "--device", "cpu", "--ranks", "1", "--steps", "1", "--compile"),
        gpu_s=90,
        cpu="about 3 min",
        cpu_cost="about 3 min (the same command with --device cpu --ranks 1, 1 thread: three compilations of 15-30 s "
                 "and the steps; compiled Adam 0.34x, BBB 0.84x and SLANG L = 1 0.65x their eager steps)",
        cpu_measured="python bench/mnist_epoch.py --ranks 1 --steps 1 --compile --threads 1 (2026-11-27 22:03)",
        gpu_how="measured: the fifth lease's `bash bench/gpu_session.sh graphs` ran it with seven CUDA tests in 105 s "
                "(H200, 2026-11-27; results/gpu_queue/bench_cuda_graphs.log)",
        resumable=False,
    ),
    _slang(1),
    _slang(8),
    _slang(32),
    Entry(
        name="gi_mnist500",
        what="Global inducing points App. F (Fig. 7): the cells of gi_mnist500 without a record (all 16 ran in three "
             "leases, 2026-11-26), four processes sharing the GPU and the experiment's cells",
        argv=("bnnbench", "reproduce", "gi_mnist500", "device=cuda", "threads=3", "progress=false"),
        tiny=("bnnbench", "reproduce", "gi_mnist500", "--label", "fac_scale", "device=cpu", "threads=1",
              "progress=false", "protocol=gi_mnist500_short", "protocol.epochs=2", "protocol.eval_every=1",
              "protocol.subset.train=50", "protocol.subset.test=50", "protocol.eval_samples=2"),
        protocol="gi_mnist500", tiny_protocol="gi_mnist500_short", procs=GI_PROCS,
        cpu="about 35 h",
        cpu_cost="about 35 h for 9 cells on one thread (1000 full-batch steps each: fac 1.8, li 23.0, fac_gi "
                 "6.3, gi 15.8 s a step; evaluations not counted)",
        cpu_measured="python bench/gi_step_ratios.py --rounds 3 --steps 2 --threads 1 (2026-11-25, code of ce6623a; "
                     "results/README.md Speed)",
        gpu_how="the cells left, in the experiment's order, on 4 processes: each cell's wall time with four sharing "
                "an H200 (first lease, 2026-11-26: fac 211, fac_gi 220, li 235, gi 441 s, the largest of each family) "
                f"+ {GI_START_S} s start-up; results/README: 12-15 min for the 9",
    ),
    Entry(
        name="cls_leaderboard_mnist",
        what="The classification board's MNIST column (issue 33): the 12 methods of cls_leaderboard under protocol "
             f"leaderboard_cls, {CLS_PROCS} processes sharing the GPU and the column's cells",
        argv=("bnnbench", "reproduce", "cls_leaderboard", "--data", "mnist", "device=cuda", "threads=2",
              "progress=false"),
        tiny=("bnnbench", "reproduce", "cls_leaderboard", "--data", "mnist", "--label", "map,laplace_ll",
              "device=cpu", "threads=1", "progress=false", "protocol.epochs=1", "protocol.subset={train: 256, "
              "test: 128}", "protocol.eval_samples=4", "protocol.hpo.eval_samples=2", "protocol.hpo.grid_points=2"),
        protocol="leaderboard_cls", tiny_protocol="leaderboard_cls", procs=CLS_PROCS,
        cpu="about 12 h",
        cpu_cost="about an hour of one core a cell, 12 cells (MAP 4.8 s, BBB 9.8 s an epoch at one replica; the "
                 "search trains 10 at once for 100 epochs, then the final 100)",
        cpu_measured="bnnbench run experiment=cls_leaderboard method=map data=mnist protocol.epochs=1 hpo=fixed "
                     "(and method=bbb; 1 thread, 2026-11-27)",
        gpu_how=f"{CLS_MNIST_STEPS} steps a cell (the search's 100 x 1500 and the final 100 x 1875) x the H200 step "
                f"of its method (bench_step_ratios / bench_mnist_epoch on the 784-400-400-10 net, launch-bound: "
                f"Adam 2.1, 4-sample 3.3, SLANG L = 1 12.0 ms) + {CLS_MNIST_OVERHEAD_S} s, the cells taken in order "
                f"by {CLS_PROCS} processes (not measured on the GPU: the first lease's log gives the real time)",
    ),
    Entry(
        name="bench_conv_step_ratios",
        what="GPU timing: the convolutional methods' steps against SGD's on the MNIST VGG-style network and on "
             "noisy natural gradient's halved VGG16 at CIFAR-10's image size, with the flop floors "
             "(bench/conv_step_ratios.py; prices nng_table2)",
        argv=("python", "bench/conv_step_ratios.py", "--device", "cuda", "--steps", "20"),
        tiny=("python", "bench/conv_step_ratios.py", "--device", "cpu", "--steps", "1", "--nets", "mnist"),
        gpu_s=60,
        cpu="about 2 min",
        cpu_cost="MNIST net 3 steps a method in 9 s; the VGG16 net's steps 2-20 s each on one thread",
        cpu_measured="python bench/conv_step_ratios.py --steps 3 --nets mnist (1 thread, 2026-11-26 06:50, load 4)",
        gpu_how="about 250 steps of at most 100 ms (K-FAC on the VGG16: 2305 x 2305 factors) and 15-30 s of CUDA "
                "start-up",
        resumable=False,
    ),
    Entry(
        name="nng_mnist_conv_long",
        what="The MNIST conv table (noisy K-FAC, noisy Adam, K-FAC, SGD, BBB on model=vgg_mnist) at 30 epochs, 3x the "
             "CPU protocol (experiment nng_mnist_conv_long), five processes sharing the GPU",
        argv=("bnnbench", "reproduce", "nng_mnist_conv_long", "device=cuda", "threads=2", "progress=false"),
        tiny=("bnnbench", "reproduce", "nng_mnist_conv_long", "device=cpu", "threads=1", "progress=false",
              "protocol=nng_mnist_conv", "protocol.epochs=1", "protocol.subset={train: 128, test: 64}",
              "protocol.eval_samples=2", "protocol.eval_every=1"),
        protocol="nng_mnist_conv_long", tiny_protocol="nng_mnist_conv", procs=5,
        gpu_s=360,
        cpu="about 5.5 h",
        cpu_cost="14 070 steps a cell (30 epochs of 469) on one thread: SGD 57, BBB 68, noisy Adam 234, K-FAC 301, "
                 "noisy K-FAC 246 ms a step (about 5.5 h for the five; evaluations not counted)",
        cpu_measured="python bench/conv_step_ratios.py --steps 3 --nets mnist (1 thread, 2026-11-26 06:50, load 4)",
        gpu_how="untimed on a GPU before this lease: 14 070 steps at about 25 ms (a launch-bound step of some 300 "
                "kernels, two autograd passes for the K-FAC family) with five cells sharing the GPU, plus six "
                "evaluations; bench_conv_step_ratios's JSON gives the measured step",
    ),
]


# --- state of an entry -------------------------------------------------------------------------------------------

@dataclass
class Ctx:
    runs_root: Path
    tables: Path
    out: Path
    tiny: bool = False


def missing(entry: Entry, tiny: bool = False) -> list[str]:
    """The configuration files a reproduce entry needs that are not there: its experiment and its protocol (with
    ``tiny``, the tiny protocol)."""
    if entry.kind != "reproduce":
        return []
    need = [f"configs/experiment/{entry.experiment}.yaml",
            f"configs/protocol/{entry.tiny_protocol if tiny else entry.protocol}.yaml"]
    return [r for r in need if not (REPO / r).exists()]


@functools.lru_cache(maxsize=None)
def cells(entry: Entry, tiny: bool = False) -> list[tuple[str, str]]:
    """(label, data set) of each cell the entry runs (the experiment's cells, those of ``--label`` only)."""
    from bnnbench.run.config import cell_label, experiment_spec
    spec = experiment_spec(entry.experiment)
    keep, data = entry.labels(tiny), entry.datasets(tiny)
    return [(cell_label(c), c["data"]) for c in spec["runs"]
            if (keep is None or cell_label(c) in keep) and (data is None or c["data"] in data)]


def record_at(runs_root: Path, experiment: str, label: str, data: str) -> dict | None:
    from bnnbench.run.results import load_record, run_dir
    return load_record(run_dir(runs_root, experiment, label, data))


def pending(entry: Entry, ctx: Ctx) -> list[str]:
    """The labels of the entry's cells without a finished record at its protocol ([] when it is done); a benchmark
    is pending until its JSON is in ``ctx.out``."""
    if entry.kind == "bench":
        return [] if bench_json(entry, ctx) is not None else [entry.name]
    protocol = entry.tiny_protocol if ctx.tiny else entry.protocol
    left = []
    for label, data in cells(entry, ctx.tiny):
        rec = record_at(ctx.runs_root, entry.experiment, label, data)
        if not (rec and rec.get("status") == "ok" and rec.get("protocol") == protocol):
            left.append(label)
    return left


def bench_json(entry: Entry, ctx: Ctx) -> dict | None:
    """The benchmark's JSON in ``ctx.out`` when it ran on the device the entry asks for."""
    try:
        out = json.loads((ctx.out / f"{entry.name}.json").read_text())
    except (OSError, ValueError):
        return None
    want = "cpu" if ctx.tiny else "cuda"
    return out if str(out.get("device", "")).startswith(want) else None


def makespan(durations: list[float], procs: int) -> float:
    """Wall time of cells taken in order by ``procs`` processes, each taking the next cell when it is free."""
    free = [0.0] * max(1, procs)
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return max(free)


def estimate(entry: Entry, ctx: Ctx, left: list[str] | None = None) -> float | None:
    """Expected GPU seconds of what is left of ``entry`` (``left``: its pending cells; None: all of them)."""
    if entry.kind == "bench" or entry.gpu_s is not None:
        return entry.gpu_s
    if entry.experiment == "slang_table3":
        labels = left if left is not None else entry.labels() or []
        total = 0.0
        for label in labels:
            L = int(label.rsplit("L", 1)[1])
            ms = measured_slang_ms(ctx, L)
            if ms is None:
                ms = H200_ADAM_MS * H200_SLANG_RATIO[L] * SAMPLES_4_OVER_1
            total += SLANG_STEPS * (1 - resumed_fraction(ctx, entry.experiment, label)) * ms / 1e3 + SLANG_OVERHEAD_S
        return total
    if entry.experiment == "cls_leaderboard":
        labels = left if left is not None else [label for label, _ in cells(entry)]
        return makespan([CLS_MNIST_STEPS * CLS_MNIST_MS[label] / 1e3 + CLS_MNIST_OVERHEAD_S for label in labels],
                        entry.procs) if labels else 0.0
    if entry.experiment == "gi_mnist500":
        labels = left if left is not None else [label for label, _ in cells(entry)]
        if not labels:
            return 0.0
        fam = [label.rsplit("_", 1)[0] if not label.endswith("spatial_iw") else label[: -len("_spatial_iw")]
               for label in labels]
        return makespan([GI_CELL_S[f] for f in fam], entry.procs) + GI_START_S
    return None


def resumed_fraction(ctx: Ctx, experiment: str, label: str, data: str = "mnist") -> float:
    """The part of slang_mnist's 115 000 steps that a cell's resume state in the runs root holds (an earlier lease's
    checkpoint, brought back): 25 000 for a finished first stage, and the steps of the newest checkpoint."""
    from bnnbench.run.results import run_dir
    d = run_dir(ctx.runs_root, experiment, label, data)
    steps = 25_000 if any(d.glob(".stage0-*.pt")) else 0
    cks = sorted(d.glob(".checkpoint-*.pt"), key=lambda f: f.stat().st_mtime)
    if cks:
        import torch
        try:
            steps += int(torch.load(cks[-1], map_location="cpu", weights_only=False).get("steps", 0))
        except Exception:   # unreadable: count nothing
            pass
    return min(1.0, steps / SLANG_STEPS)


def priced_by_bench(entry: Entry, ctx: Ctx) -> bool:
    return entry.experiment == "slang_table3" and all(
        measured_slang_ms(ctx, int(label.rsplit("L", 1)[1])) is not None for label in entry.labels() or [])


def measured_slang_ms(ctx: Ctx, L: int) -> float | None:
    """SLANG L's 4-sample step in ms from bench_mnist_epoch's JSON on the GPU, where it has run."""
    bench = next(e for e in QUEUE if e.name == "bench_mnist_epoch")
    out = None if ctx.tiny else bench_json(bench, ctx)
    for row in (out or {}).get("rows", []):
        if row.get("method") == "slang" and row.get("rank") == L:
            return float(row["ms_step"])
    return None


# --- selection under a budget ------------------------------------------------------------------------------------

def plan(entries: list[tuple[Entry, float | None]], budget: float | None, fill: bool = False) -> list[tuple]:
    """The decisions a run of the queue makes, in order, when every entry that runs takes its estimate:
    ``(entry, action, reason)`` with action ``run``, ``skip`` or ``fill`` (the first skipped resumable entry, which
    takes the rest; a run fills on with the next one if it finishes early). ``entries`` holds the pending entries
    with their expected GPU seconds (None: no estimate). Without a budget everything runs."""
    out, left, skipped = [], budget, []
    for entry, est in entries:
        ok, why = fits(est, left)
        if ok:
            out.append((entry, "run", why))
            if left is not None:
                left -= est
        else:
            out.append((entry, "skip", why))
            skipped.append((entry, est))
    if fill and left is not None and left >= MIN_FILL_S:
        for entry, est in skipped:
            if entry.resumable and est is not None:
                out = [(e, "fill", f"the first resumable entry skipped: runs the {fmt_s(left)} left, its "
                        f"checkpoint continues it later") if e is entry else (e, a, w) for e, a, w in out]
                break
    return out


GRACE_S = 20       # from SIGINT to SIGKILL when the budget is spent (bench/gpu_session.sh keeps 45 s to pack)
MIN_FILL_S = 120   # a fill shorter than this would not reach a checkpoint (every 10 epochs)


def fits(est: float | None, left: float | None) -> tuple[bool, str]:
    if left is None:
        return True, "no budget"
    if est is None:
        return False, "no GPU estimate yet (to be measured): run it alone, --only NAME without --budget"
    if est > left:
        return False, f"expected {fmt_s(est)} does not fit the {fmt_s(max(left, 0))} left"
    return True, f"expected {fmt_s(est)} of {fmt_s(left)} left"


def fmt_s(s: float | None) -> str:
    if s is None:
        return "?"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


# --- commands ----------------------------------------------------------------------------------------------------

def command(entry: Entry, ctx: Ctx, replace: bool = False) -> list[str]:
    """The argv that runs ``entry`` here: ``bnnbench`` as ``python -m bnnbench.cli`` of this interpreter, the runs
    root, the tables and the benchmark JSON added."""
    argv = list(entry.tiny if ctx.tiny else entry.argv)
    if entry.kind == "reproduce":
        return [sys.executable, "-m", "bnnbench.cli", "reproduce", argv[2], "--runs-root", str(ctx.runs_root),
                "--out", str(ctx.tables), *argv[3:], *(["skip_done=false"] if replace else [])]
    return [sys.executable, str(REPO / argv[1]), *argv[2:], "--json", str(ctx.out / f"{entry.name}.json")]


def other_protocol_records(entry: Entry, ctx: Ctx, labels: list[str]) -> list[str]:
    """Pending cells whose run directory holds a record of another protocol (``replace`` entries replace it)."""
    data = dict(cells(entry, ctx.tiny))
    found = []
    for label in labels:
        rec = record_at(ctx.runs_root, entry.experiment, label, data[label])
        if rec is not None:
            found.append(f"{label} ({rec.get('protocol')})")
    return found


def blocked(entry: Entry, ctx: Ctx, left: list[str]) -> list[str]:
    """Pending cells that reproduce will refuse: a record of another protocol where the entry does not replace it."""
    return [] if entry.replace or entry.kind != "reproduce" else other_protocol_records(entry, ctx, left)


def run_entry(entry: Entry, ctx: Ctx, left: list[str], limit: float | None) -> dict:
    """Run one entry (``procs`` processes for a reproduce entry) with its output in ``<out>/<name>[.k].log``; at
    ``limit`` seconds each process gets SIGINT (a run keeps its checkpoint), ``GRACE_S`` later SIGKILL."""
    replace = False
    if entry.kind == "reproduce":
        older = other_protocol_records(entry, ctx, left)
        if older and entry.replace:
            replace = True
            print(f"   replaces the records of another protocol: {', '.join(older)}", flush=True)
    argv = command(entry, ctx, replace)
    env = dict(os.environ)
    if entry.kind == "bench":
        env.pop("PYTHONSAFEPATH", None)   # the script imports its neighbours (step_ratios) from bench/
    procs = 1 if ctx.tiny else entry.procs
    print(f"   $ {' '.join(argv)}" + (f"   (x{procs} processes)" if procs > 1 else ""), flush=True)
    ctx.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    running = []
    for k in range(procs):
        log = ctx.out / (f"{entry.name}.{k + 1}.log" if procs > 1 else f"{entry.name}.log")
        f = open(log, "a")
        f.write(f"# {dt.datetime.now().isoformat(timespec='seconds')} {' '.join(argv)}\n")
        f.flush()
        running.append((subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                                         start_new_session=True), f, log))
        if k + 1 < procs:
            time.sleep(2)   # one claims the first cell before the next looks
    interrupted = False
    for p, _, _ in running:
        wait = None if limit is None else max(0.1, limit - (time.monotonic() - t0))
        try:
            p.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            interrupted = True
            break
    if interrupted:   # the budget is spent: SIGINT (a run keeps its last checkpoint), then SIGKILL after the grace
        for p, _, _ in running:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
        grace = time.monotonic() + GRACE_S
        for p, _, _ in running:
            try:
                p.wait(timeout=max(0.1, grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for _, f, log in running:
        f.close()
        tail = log.read_text().splitlines()[-12:]
        print("\n".join(f"   | {line}" for line in tail), flush=True)
    codes = [p.returncode for p, _, _ in running]
    return {"seconds": round(time.monotonic() - t0, 1), "returncodes": codes, "interrupted": interrupted}


# --- the listing ---------------------------------------------------------------------------------------------------

def listing(ctx: Ctx, budget: float | None, fill: bool, entries: list[Entry]) -> str:
    rows, total, unknown = [], 0.0, []
    states = []
    for e in entries:
        miss = missing(e, ctx.tiny)
        left = None if miss else pending(e, ctx)
        est = None if miss else estimate(e, ctx, left)
        states.append((e, miss, left, est))
    todo = [(e, est) for e, miss, left, est in states if not miss and left]
    decisions = {id(e): (a, w) for e, a, w in plan(todo, budget, fill)} if budget is not None else {}
    head = ["#", "entry", "cells left", "CPU here (measured)", "GPU, H100/H200 (expected)", "under the budget"]
    for i, (e, miss, left, est) in enumerate(states, 1):
        if miss:
            state, cells_left = f"cannot run yet: {', '.join(miss)} missing", "-"
        elif not left:
            state, cells_left = "done", "0"
        else:
            a, why = decisions.get(id(e), ("run", ""))
            state = {"run": "runs", "skip": "skipped", "fill": "fills"}[a] + (f": {why}" if why else "")
            cells_left = str(len(left)) if e.kind == "reproduce" else "1"
        n_all = "1" if e.kind == "bench" else "?" if miss else str(len(cells(e, ctx.tiny)))
        if left and est is not None:
            total += est
        elif left or miss:
            unknown.append(e.name)
        rows.append([str(i), e.name, "-" if miss else f"{cells_left} of {n_all}", e.cpu,
                     "done" if left == [] else fmt_s(est) if est is not None else "to be measured",
                     state if budget is not None else ("done" if left == [] else "-")])
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(4)]
    lines = [f"GPU queue ({'tiny settings on the CPU' if ctx.tiny else 'device=cuda'}; runs root {ctx.runs_root})",
             ""]
    lines.append("  ".join(h.ljust(w) for h, w in zip(head[:4], widths)) + "  " + head[4]
                 + (f"  {head[5]}" if budget is not None else ""))
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4].ljust(len(head[4]))
                     + (f"  {r[5]}" if budget is not None else ""))
    lines.append("")
    lines.append(f"total expected GPU time of what is left: {fmt_s(total)}"
                 + (f" (+ {', '.join(unknown)}: to be measured)" if unknown else "")
                 + ("" if budget is None else f"; budget {fmt_s(budget)}"))
    lines.append("")
    for i, (e, miss, left, est) in enumerate(states, 1):
        lines.append(f"{i}. {e.name}: {e.what}")
        lines.append(f"   command:  {' '.join(e.tiny if ctx.tiny else e.argv)}")
        lines.append(f"   CPU:      {e.cpu_cost} [{e.cpu_measured}]")
        lines.append(f"   GPU:      {fmt_s(est) if est is not None else 'to be measured'}"
                     + (", from bench_mnist_epoch's measured steps" if priced_by_bench(e, ctx) else "")
                     + f"; {e.gpu_how}")
        if left and e.kind == "reproduce" and len(left) < len(cells(e, ctx.tiny)):
            lines.append(f"   left:     {', '.join(left)}")
        stuck = blocked(e, ctx, left) if left and e.kind == "reproduce" else []
        if stuck:
            lines.append(f"   blocked:  {', '.join(stuck)} hold a record of another protocol, which this entry does "
                         f"not replace (reproduce skips them): another --runs-root, or remove them")
    return "\n".join(line.rstrip() for line in lines)


# --- main ----------------------------------------------------------------------------------------------------------

def select(only: str | None) -> list[Entry]:
    if not only:
        return list(QUEUE)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {e.name for e in QUEUE}
    bad = [n for n in names if n not in known]
    if bad:
        raise SystemExit(f"error: unknown queue entries {', '.join(bad)}; "
                         f"the queue: {', '.join(e.name for e in QUEUE)}")
    return [e for e in QUEUE if e.name in names]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="list the queue with CPU costs and expected GPU times")
    ap.add_argument("--budget", type=float, help="seconds: skip an entry whose expected GPU time does not fit")
    ap.add_argument("--fill", action="store_true", help="with --budget: at the end, the first skipped resumable "
                    "entry runs until the budget ends")
    ap.add_argument("--only", help="comma list of entry names")
    ap.add_argument("--tiny", action="store_true", help="tiny settings on the CPU (seconds an entry)")
    ap.add_argument("--runs-root", help="the run records (default results/runs; --tiny: a new temporary folder)")
    ap.add_argument("--tables", help="where reproduce writes tables (default results/tables; --tiny: in the runs root)")
    ap.add_argument("--out", help="benchmark JSON, logs and queue.json (default results/gpu_queue; --tiny: in the "
                    "runs root)")
    args = ap.parse_args(argv)
    entries = select(args.only)
    if args.tiny and not args.runs_root:
        args.runs_root = tempfile.mkdtemp(prefix="gpu_queue_tiny_")
    runs_root = Path(args.runs_root).resolve() if args.runs_root else REPO / "results" / "runs"
    default_side = runs_root.parent if args.tiny else REPO / "results"
    ctx = Ctx(runs_root=runs_root,
              tables=Path(args.tables).resolve() if args.tables else default_side / "tables",
              out=Path(args.out).resolve() if args.out else default_side / "gpu_queue", tiny=args.tiny)
    if args.dry_run:
        print(listing(ctx, args.budget, args.fill, entries))
        return 0
    if not args.tiny:
        import torch
        if not torch.cuda.is_available():
            print("error: no CUDA device here: the queue is GPU work (--dry-run lists it, --tiny runs it on a CPU "
                  "with tiny settings)", file=sys.stderr)
            return 2
    return run_queue(ctx, entries, args.budget, args.fill)


def run_queue(ctx: Ctx, entries: list[Entry], budget: float | None, fill: bool) -> int:
    t0 = time.monotonic()
    left_s = (lambda: None) if budget is None else (lambda: budget - (time.monotonic() - t0))
    report, skipped, failed = [], [], 0
    device = "cpu" if ctx.tiny else _device_name()
    print(f"GPU queue on {device}: runs root {ctx.runs_root}, logs and benchmarks {ctx.out}"
          + (f", budget {fmt_s(budget)}" if budget is not None else ""), flush=True)

    def one(entry, action, left, est):
        nonlocal failed
        print(f"== {entry.name} ({action}; expected {fmt_s(est)}"
              + (f", {fmt_s(left_s())} left" if budget is not None else "") + ")", flush=True)
        res = run_entry(entry, ctx, left, left_s())
        after = pending(entry, ctx)
        status = ("done" if not after else "interrupted" if res["interrupted"]
                  else "failed" if any(res["returncodes"]) else "unfinished")
        failed += status in ("failed", "unfinished")
        print(f"== {entry.name}: {status} in {fmt_s(res['seconds'])} (expected {fmt_s(est)})"
              + (f"; cells left: {', '.join(after)}" if after and entry.kind == "reproduce" else ""), flush=True)
        report.append({"entry": entry.name, "action": action, "status": status, "expected_s": est,
                       "cells_left_before": left, "cells_left_after": after, **res})

    for entry in entries:
        miss = missing(entry, ctx.tiny)
        if miss:
            print(f"== {entry.name}: skipped, cannot run yet: {', '.join(miss)} missing", flush=True)
            report.append({"entry": entry.name, "action": "skip", "status": "missing " + ", ".join(miss)})
            continue
        left = pending(entry, ctx)
        if not left:
            print(f"== {entry.name}: done (every cell has a record at its protocol)", flush=True)
            report.append({"entry": entry.name, "action": "skip", "status": "done"})
            continue
        stuck = blocked(entry, ctx, left)
        if stuck and len(stuck) == len(left):
            why = f"blocked: every cell left holds a record of another protocol ({', '.join(stuck)})"
            print(f"== {entry.name}: skipped, {why}", flush=True)
            report.append({"entry": entry.name, "action": "skip", "status": why})
            continue
        est = estimate(entry, ctx, left)
        ok, why = fits(est, left_s())
        if not ok:
            print(f"== {entry.name}: skipped: {why}", flush=True)
            report.append({"entry": entry.name, "action": "skip", "status": why, "expected_s": est})
            skipped.append((entry, left, est))
            continue
        one(entry, "run", left, est)
    for entry, left, est in skipped:   # --fill: the skipped resumable entries in order, while time is left
        if fill and budget is not None and left_s() >= MIN_FILL_S and entry.resumable and est is not None:
            one(entry, "fill", left, est)
    write_report(ctx, device, budget, report, time.monotonic() - t0)
    print(f"GPU queue: {time.monotonic() - t0:.0f} s; {ctx.out / 'queue.json'}", flush=True)
    return 1 if failed else 0


def _device_name() -> str:
    import torch
    return torch.cuda.get_device_name(0)


def write_report(ctx: Ctx, device: str, budget: float | None, report: list, seconds: float) -> None:
    """Append this run to ``<out>/queue.json`` (a list of runs: when, on what, each entry's outcome)."""
    path = ctx.out / "queue.json"
    ctx.out.mkdir(parents=True, exist_ok=True)
    try:
        runs = json.loads(path.read_text())
    except (OSError, ValueError):
        runs = []
    git = os.environ.get("BNNBENCH_GIT_COMMIT")
    if git is None:
        try:
            git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                 timeout=10).stdout.strip() or None
        except OSError:
            git = None
    runs.append({"started": dt.datetime.now().isoformat(timespec="seconds"), "device": device, "tiny": ctx.tiny,
                 "budget_s": budget, "seconds": round(seconds, 1), "git_commit": git, "entries": report})
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(runs, indent=1) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
