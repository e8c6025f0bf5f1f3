"""What an epoch costs beside its steps (issue 31, section 2: "cut whatever else the profile shows"), in one run.

``engine.train`` does per epoch, besides ``update`` on each minibatch: one permutation per training set
(``epoch_batches``), one ``make_batch`` per step, the divergence check of the whole state (``engine._finite_state``)
and, every ``checkpoint_every`` epochs (at least ``checkpoint_seconds`` apart since 2026-12-04), a checkpoint of the
state (``results.save_checkpoint``: ``torch.save`` and ``fsync``). Protocols with short epochs pay these at almost
every step: App. G's 5000 epochs of 5 steps (Boston, minibatch 100), SLANG Table 1's 10 000 epochs of about 11 steps,
NNG Tables 3 and 4's 20-row trials.

Each part is timed on the case's own state, data and minibatches (``bench/step_ab.py``'s ``Stepper``: the engine's
minibatches, the compiled step as ``compile=true`` runs it), medians of ``--repeats``, one thread; the divergence
check as it was before 2026-12-04 (``State.tensors`` and one ``isfinite`` per tensor) beside today's, which must agree.
Printed: ms per step, per epoch of steps, and each overhead in ms and as a share of the epoch.

    PYTHONPATH=. taskset -c 0 python bench/epoch_overhead.py [--method fac] [--protocol gi_uci] [--data uci/boston]
        [--replicas 20]

Needs the data mirror (``BNNBENCH_MIRROR``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from step_ab import Stepper   # bench/ is the script's folder, so it heads sys.path


def old_finite_state(state) -> torch.Tensor:
    """The divergence check before 2026-12-04: the state's tensors by path, one ``isfinite`` each."""
    ok = None
    for v in state.tensors().values():
        if v.is_floating_point() and v.numel():
            f = torch.isfinite(v.reshape(v.shape[0], -1).abs().amax(1))
            ok = f if ok is None else ok & f
    return ok


def median_ms(f, n: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            f()
        times.append((time.perf_counter() - t) / n * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="fac")
    ap.add_argument("--protocol", default="gi_uci")
    ap.add_argument("--data", default="uci/boston")
    ap.add_argument("--replicas", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    from bnnbench.run import engine, results

    torch.set_num_threads(1)
    s = Stepper(args.method, args.protocol, args.replicas, True, args.data)
    for _ in range(10):
        s.step()
    state, data, steps = s.state, s.replica_data, len(s.batches)
    if not torch.equal(old_finite_state(state), engine._finite_state(state)):
        raise SystemExit("the two divergence checks disagree")
    step = median_ms(s.step, 50, args.repeats)
    epoch = step * steps
    ck = Path(tempfile.mkdtemp()) / "checkpoint.pt"
    payload = {"state": state, "epoch": 1, "generator": s.g.get_state()}
    rows = next(iter(engine.epoch_batches(data, s.batches[0].x.shape[1], s.g)))
    parts = {
        "epoch_batches (the epoch's permutations)": median_ms(
            lambda: list(engine.epoch_batches(data, rows.shape[1], s.g)), 100, args.repeats),
        f"make_batch x {steps}": steps * median_ms(lambda: engine.make_batch(data, rows), 500, args.repeats),
        "divergence check, before": median_ms(lambda: old_finite_state(state), 200, args.repeats),
        "divergence check, now": median_ms(lambda: engine._finite_state(state), 200, args.repeats),
        "checkpoint (one)": median_ms(lambda: results.save_checkpoint(ck, payload), 20, args.repeats),
    }
    n_el = sum(v.numel() for v in state.tensors().values() if v.is_floating_point())
    print(f"{args.method} ({args.protocol}, {args.data}, R = {args.replicas}): {step:.3f} ms a step, {steps} steps an "
          f"epoch ({epoch:.2f} ms); state {n_el} floats ({math.ceil(n_el * 4 / 2 ** 20)} MiB)")
    for name, ms in parts.items():
        print(f"  {name:<42s} {ms:8.3f} ms  {100 * ms / epoch:5.1f}% of an epoch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
