"""Replica axis vs a loop of single-split runs: BBB, SLANG-protocol settings, 20 Boston splits.

Runs the same number of training steps (``--epochs`` over Boston's training rows, minibatch 10,
4 MC samples) once as one batched program over 20 replicas and once as 20 separate single-replica
programs of the same code, and prints the time per replica-step of each and their ratio.

    python bench/replica_axis.py [--epochs 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import time

import torch

from bnnbench.core.data import load_dataset
from bnnbench.run.fit import FitOptions, fit
from bnnbench.run.protocol import resolve


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    from bnnbench.run.config import CommandLine, compose
    ov = ["method=bbb", "data=uci/boston", "protocol=slang_uci", f"protocol.epochs={args.epochs}",
          "protocol.eval_every=null"]
    cfg = compose(ov)
    ds = load_dataset("uci/boston")
    spec = resolve(cfg, CommandLine.parse(ov), meta=ds.meta)
    pairs = [(s.train, s.test) for s in ds.splits]
    hp = [dict(spec.fixed)] * len(pairs)
    kw = FitOptions(device=torch.device(args.device), dtype=torch.float32)

    fit(spec, ds, pairs[:2], [0, 1], hp[:2], torch.Generator(args.device).manual_seed(0), kw)  # warm-up
    t = time.perf_counter()
    batched = fit(spec, ds, pairs, list(range(len(pairs))), hp, torch.Generator(args.device).manual_seed(0), kw)
    t_batched = time.perf_counter() - t
    t = time.perf_counter()
    steps_loop = 0
    for i, p in enumerate(pairs):
        r = fit(spec, ds, [p], [0], hp[:1], torch.Generator(args.device).manual_seed(i), kw)
        steps_loop += r.steps
    t_loop = time.perf_counter() - t
    R = len(pairs)
    per_b = t_batched / (batched.steps * R) * 1e3
    per_l = t_loop / steps_loop * 1e3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}")
    print(f"replica axis : {R} replicas x {batched.steps} steps in {t_batched:.2f}s -> {per_b:.4f} ms per replica-step")
    print(f"loop of runs : {R} runs x {steps_loop // R} steps in {t_loop:.2f}s -> {per_l:.4f} ms per replica-step")
    print(f"speed-up (loop / replica axis, per replica-step): {per_l / per_b:.1f}x  (target >= 10x)")


if __name__ == "__main__":
    main()
