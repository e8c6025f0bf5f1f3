"""What a compiled step's call costs beside its kernels (issue 31, section 2): dynamo's guard check and its frame.

Each call of a ``torch.compile``d step first checks the guards dynamo installed while tracing (about 1300 lines of
them for App. G's states: their pytree nodes, dataclass fields, module identities, each input's dtype, shape and
strides), then enters the compiled region, whose wrapper calls the graph. ``torch.profiler`` names these parts:
``TorchDynamo Cache Lookup`` (the guards), ``Torch-Compiled Region`` (its own time: the frame's entry and exit) and
``## Call CompiledFxGraph`` (the graph: with inductor's C++ wrapper, its kernels are inside it). Their per-step self
times beside the step's wall time bound what any calling scheme that skips dynamo at run time could gain.

Cases as ``bench/step_ab.py``'s (its ``Stepper``: the method's protocol, Boston, the engine's minibatches, the compiled
update as ``compile=true`` runs it, draws included), one thread:

    PYTHONPATH=. taskset -c 0 python bench/call_overhead.py [--methods bbb,fac] [--replicas 20] [--steps 200]

Needs the data mirror (``BNNBENCH_MIRROR``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_ab import CASES, Stepper  # noqa: E402


def per_step_ms(prof, steps: int) -> dict[str, float]:
    """Self CPU ms per step of the profiled events, by name prefix."""
    out = {"lookup": 0.0, "region": 0.0, "graph": 0.0}
    for e in prof.key_averages():
        ms = e.self_cpu_time_total / steps / 1e3
        if e.key == "TorchDynamo Cache Lookup":
            out["lookup"] += ms
        elif e.key.startswith("Torch-Compiled Region"):
            out["region"] += ms
        elif e.key.startswith("## Call CompiledFxGraph"):
            out["graph"] += ms
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default=",".join(name for _, name, _ in CASES))
    ap.add_argument("--replicas", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from torch.profiler import ProfilerActivity, profile
    want = args.methods.split(",")
    print(f"R = {args.replicas}, ms a step (lookup + region: dynamo's share)")
    for _, name, proto in CASES:
        if name not in want:
            continue
        s = Stepper(name, proto, args.replicas, compiled=True)
        for _ in range(30):
            s.step()
        ms = min(s.time_ms(args.steps) for _ in range(3))
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                s.step()
        p = per_step_ms(prof, args.steps)
        dyn = p["lookup"] + p["region"]
        print(f"{name:12s} {proto:10s} step {ms:7.3f}  guards {p['lookup']:6.3f}  region {p['region']:6.3f}  "
              f"graph {p['graph']:7.3f}  draws {s.draws_ms(args.steps):6.3f}  dynamo {100 * dyn / ms:4.1f}%",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
