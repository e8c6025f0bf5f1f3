"""Per-step profile of each UCI method's update at the replica counts its protocols use (issue 31, section 1).

Boston (13 inputs, one hidden layer of 50 ReLUs, P = 751), float32, one thread, each method under the protocol that
tunes or runs it (settings resolved from configs/protocol/*.yaml as a run resolves them):

    BBB          slang_uci  B = 10,  S = 4       SLANG L=1    slang_uci  B = 10,  S = 4
    VOGN, Vadam  vadam_uci  B = 32,  S = 10      noisy Adam   nng_uci    B = 10,  S = 10 (learned noise)
    MC dropout   gal_uci    B = 128, S = 1       noisy K-FAC  nng_uci    B = 10,  S = 10, T_stats = T_inv = 1

at R = 100 replicas (a Bayesian-optimisation round: 20 splits x 5 CV folds, 100 training sets of ~364 rows) and
R = 20 (a final run: the 20 splits), and at R = 1 (one replica: what a step costs when its kernels do almost no work).
The minibatches are the engine's (``epoch_batches``, ``make_batch``), made before the clock starts; the clock times
``method.update`` alone (noise draws included). Columns:

* ``ms/step``: median over interleaved repeats (every configuration timed once per round, so a change of load on this
  shared machine hits all alike);
* ``ops``: aten operators dispatched per step (a ``TorchDispatchMode`` count, backward included), and ``us/op`` =
  ms/step / ops: at ~5-10 us per op a step is bound by dispatch, not by its kernels' arithmetic;
* ``aten%``: the share of the step's wall time spent inside aten operators (``torch.profiler``: the self CPU time of the
  top-level operators, summed, over the profiled wall time; the rest is Python, argument parsing and the profiler's
  own per-op cost, so this is an upper bound on the kernels' share);
* ``R=1 %``: the step's time at R = 1 over its time at R (the fixed, size-independent cost: Python and dispatch, the
  other lower bound on the overhead share);
* ``MFLOP``: the matmul flops of one step (``torch.utils.flop_counter``: mm, bmm, addmm, baddbmm, forward and backward;
  the 50 -> 1 output layer, a multiply and a sum, is not counted, ~7 % of the weight flops) and ``floor ms`` = MFLOP /
  the single-thread SGEMM rate measured here (a 512 x 512 x 512 product), ``x floor`` = ms/step / floor ms.

    PYTHONPATH=. taskset -c 0 python bench/step_profile.py [--repeats 7] [--methods bbb,vogn] [--replicas 100,20,1]

(``PYTHONPATH=.``: a script's own folder, not the working directory, heads ``sys.path``; without it a worktree's
bench would import the package the environment installed.) Needs the data mirror (``BNNBENCH_MIRROR``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from bnnbench.run.config import CommandLine, compose
from bnnbench.core.data import load_dataset
from bnnbench.run.engine import epoch_batches, make_batch
from bnnbench.run.fit import FitOptions, program
from bnnbench.run.protocol import resolve

from step_ab import CASES as AB_CASES, Timed, cv_pairs  # bench/ is the script's folder, so it heads sys.path

CASES = [c for c in AB_CASES if c[2] != "gi_uci"]   # label, method, protocol (App. G's families apart)


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


class Case(Timed):
    """One (method, protocol, R): its method, state and a cycle of minibatches."""

    def __init__(self, label, name, proto, R, ds):
        ov = [f"method={name}", "data=uci/boston", f"protocol={proto}"] + (["hpo=grid"] if proto == "gal_uci" else [])
        self.spec = resolve(compose(ov), CommandLine.parse(ov), meta=ds.meta)
        self.label, self.proto, self.R = label, proto, R
        pairs = cv_pairs(ds, R)
        hp = [dict(self.spec.fixed)] * R
        opts = FitOptions(device=torch.device("cpu"), dtype=torch.float32)
        self.method, data, problem = program(self.spec, ds, pairs, list(range(R)), hp, opts)
        self.g = torch.Generator().manual_seed(0)
        self.state = self.method.init(problem, self.g)
        self.batches = [make_batch(data, rows) for rows in epoch_batches(data, self.spec.batch_size, self.g)]
        self.k, self.update = 0, self.method.update
        self.S = int(self.spec.method.get("train_samples", 1))
        self.step()  # warm-up

    def ops(self) -> int:
        with OpCount() as c:
            self.step()
        return c.n

    def mflop(self) -> float:
        with FlopCounterMode(display=False) as fc:
            self.step()
        return fc.get_total_flops() / 1e6

    def aten_share(self, n: int) -> float:
        """Self CPU time of the top-level aten operators over the wall time, ``n`` profiled steps."""
        from torch.profiler import ProfilerActivity, profile
        with quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            for _ in range(n):
                self.step()
            wall = time.perf_counter() - t
        # every aten op's self time, nested ones included: the time inside operators, whoever called them
        inside = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key.startswith("aten::")) / 1e6
        return inside / wall


@contextlib.contextmanager
def quiet_stderr():
    """The profiler's native start / stop lines on file descriptor 2, silenced."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def sgemm_gflops(n: int = 512, reps: int = 20) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--target-ms", type=float, default=150.0, help="time per configuration and repeat")
    ap.add_argument("--methods", help="comma-separated method names (default: all seven)")
    ap.add_argument("--replicas", default="100,20,1")
    args = ap.parse_args()
    torch.set_num_threads(1)
    Rs = [int(r) for r in args.replicas.split(",")]
    chosen = set(args.methods.split(",")) if args.methods else None
    ds = load_dataset("uci/boston")
    t0 = time.perf_counter()
    cases = [Case(label, name, proto, R, ds) for label, name, proto in CASES if chosen is None or name in chosen
             for R in Rs]
    gflops = statistics.median(sgemm_gflops() for _ in range(3))
    # steps per timing so that each takes about target_ms
    inner = {id(c): max(2, int(args.target_ms / max(0.05, c.time_ms(2)))) for c in cases}
    times: dict[int, list[float]] = {id(c): [] for c in cases}
    for _ in range(args.repeats):
        for c in cases:
            times[id(c)].append(c.time_ms(inner[id(c)]))
    ms = {id(c): statistics.median(times[id(c)]) for c in cases}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, float32; SGEMM 512^3: {gflops:.1f} GFLOP/s; "
          f"Boston 13-50-1 (P = 751); medians of {args.repeats} interleaved repeats")
    hdr = (f"{'method':<12s} {'protocol':<10s} {'B':>4s} {'S':>3s} {'R':>4s} {'ms/step':>8s} {'ops':>5s} "
           f"{'us/op':>6s} {'aten%':>6s} {'R=1 %':>6s} {'MFLOP':>8s} {'floor ms':>9s} {'x floor':>8s}")
    print(hdr)
    print("-" * len(hdr))
    one = {(c.label): ms[id(c)] for c in cases if c.R == 1}
    for c in cases:
        t = ms[id(c)]
        n_ops, mf = c.ops(), c.mflop()
        share = c.aten_share(max(2, inner[id(c)] // 2))
        floor = mf / gflops  # MFLOP / (GFLOP/s) = ms
        r1 = f"{100 * one[c.label] / t:5.0f}%" if c.label in one and c.R != 1 else "     -"
        print(f"{c.label:<12s} {c.proto:<10s} {c.spec.batch_size:4d} {c.S:3d} {c.R:4d} {t:8.2f} {n_ops:5d} "
              f"{1e3 * t / n_ops:6.1f} {100 * share:5.0f}% {r1:>6s} {mf:8.1f} {floor:9.3f} {t / floor:7.0f}x")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
