"""``torch.compile`` (inductor, CPU) of a method's whole update step against the eager step, in one run (issue 31,
section 2).

The step compiled is ``Method.step(state, batch, noise)``, already a pure function of the state's tensors, the
minibatch and the draws (``Method.noise`` stays eager: it reads a ``torch.Generator``); both sides time the whole
update, draws included. ``torch._dynamo.config.trace_autograd_ops = True`` lets dynamo trace the
``torch.autograd.grad`` inside BBB's and VOGN's steps into one graph (without it every step breaks into 3-5 graphs).
Settings, data and minibatches as ``bench/step_profile.py`` (Boston, each method's protocol), at R = 100 and R = 20,
float32, one thread.

Printed per case: the compile time (the first compiled calls, until the graph is built; with a warm inductor cache
``TORCHINDUCTOR_CACHE_DIR`` a second process pays less), the graph count and breaks, the largest relative difference
of the new state between the compiled and the eager step from the same state, minibatch and draws, the eager and
compiled ms per step (medians of interleaved repeats) and their ratio.

    PYTHONPATH=. taskset -c 0 python bench/compile_step.py [--methods bbb,vogn] [--replicas 100,20] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch._dynamo

from bnnbench.core.data import load_dataset

from step_ab import Timed
from step_profile import CASES, Case  # bench/ is the script's folder, so it heads sys.path


def rel_diff(a, b) -> float:
    """max over the states' float tensors of max |a - b| / max |a|."""
    out = 0.0
    b = b.tensors()
    for k, v in a.tensors().items():
        if v.is_floating_point():
            w = b[k]
            out = max(out, float((v - w).abs().max() / v.abs().max().clamp_min(1e-30)))
    return out


class Compiled(Timed):
    """A case's update with ``torch.compile`` of its step, on its own copy of the state."""

    def __init__(self, case: Case, **kw):
        self.c = case
        self.state = case.state
        self.fn = torch.compile(case.method.step, dynamic=False, **kw)
        self.k = 0

    def step(self):
        c = self.c
        batch = c.batches[self.k % len(c.batches)]
        noise = c.method.noise(self.state, batch, c.g)
        if c.method.needs_autograd:
            self.state, _ = self.fn(self.state, batch, noise)
        else:
            with torch.inference_mode():
                self.state, _ = self.fn(self.state, batch, noise)
        self.k += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="bbb,vogn")
    ap.add_argument("--replicas", default="100,20")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--target-ms", type=float, default=150.0, help="time per configuration and repeat")
    ap.add_argument("--mode", default=None, help="torch.compile mode (default: inductor's default)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.trace_autograd_ops = True
    torch._dynamo.config.cache_size_limit = 64
    names = args.methods.split(",")
    Rs = [int(r) for r in args.replicas.split(",")]
    ds = load_dataset("uci/boston")
    rows = []
    for label, name, proto in CASES:
        if name not in names:
            continue
        for R in Rs:
            c = Case(label, name, proto, R, ds)
            batch = c.batches[0]
            noise = c.method.noise(c.state, batch, c.g)
            ex = torch._dynamo.explain(c.method.step)(c.state, batch, noise)
            torch._dynamo.reset()
            comp = Compiled(c, mode=args.mode)
            t = time.perf_counter()
            ctx = torch.inference_mode() if not c.method.needs_autograd else torch.enable_grad()
            try:
                with ctx:
                    new_c, _ = comp.fn(c.state, batch, noise)
                t_compile = time.perf_counter() - t
                with ctx:
                    new_e, _ = c.method.step(c.state, batch, noise)
                diff = rel_diff(new_e, new_c)
                comp.step()  # a second call: any recompilation happens here, outside the clock
            except Exception as e:
                print(f"{c.label} R = {R}: the compiled step raised {type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            rows.append(dict(case=c, comp=comp, compile_s=t_compile, graphs=ex.graph_count,
                             breaks=ex.graph_break_count, diff=diff, eager=[], compiled=[]))
    for r in rows:
        r["inner"] = max(2, int(args.target_ms / max(0.05, r["case"].time_ms(2))))
    for _ in range(args.repeats):  # interleaved: eager and compiled of every case each round
        for r in rows:
            r["eager"].append(r["case"].time_ms(r["inner"]))
            r["compiled"].append(r["comp"].time_ms(r["inner"]))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread, float32, inductor (mode {args.mode}); "
          f"medians of {args.repeats} interleaved repeats")
    hdr = (f"{'method':<12s} {'protocol':<10s} {'R':>4s} {'compile s':>9s} {'graphs':>6s} {'breaks':>6s} "
           f"{'max rel diff':>12s} {'eager ms':>9s} {'compiled ms':>11s} {'speed-up':>8s}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        c = r["case"]
        e, k = statistics.median(r["eager"]), statistics.median(r["compiled"])
        ratio = statistics.median(a / b for a, b in zip(r["eager"], r["compiled"]))
        print(f"{c.label:<12s} {c.proto:<10s} {c.R:4d} {r['compile_s']:9.1f} {r['graphs']:6d} {r['breaks']:6d} "
              f"{r['diff']:12.1e} {e:9.2f} {k:11.2f} {ratio:7.2f}x")


if __name__ == "__main__":
    main()
