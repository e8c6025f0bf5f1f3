"""Training time of the main job beside CPU-bound competitors, at torch's default thread count and at ``threads=auto``.

The main job (``bnnbench run method=bbb data=uci/boston protocol.epochs=3``, a fresh process through the real
command line, no record reused) is timed without competitors, then with ``--competitors`` busy-loop processes
(started before the runs and killed after them; each also ends by itself after ``--limit`` seconds). It runs at
(a) ``threads=<torch's default in a fresh process>``, what every run did before ``threads`` existed (2 on a
2-core host), and (b) ``threads=auto`` (1 for this network). Printed: the record's ``train_time_s`` of each, its
ratio to the time of the same setting without competitors, and the load average after each run. Requirement: (b)
beside six competitors within 8x of its time without them (its fair share of 2 cores among 7 busy processes:
3.5x). Other users of the host are not paused: the load average says how idle the first phase was.

    python bench/threads_contention.py [--competitors 6] [--limit 600] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = ["method=bbb", "data=uci/boston", "protocol.epochs=3", "progress=false"]
TARGET = 8.0


def default_threads() -> int:
    """torch's intra-op thread count in a fresh process (what a run used before the ``threads`` setting)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def train_time(threads: str, limit: float) -> float | None:
    """``train_time_s`` of the main job at ``threads=<threads>``; None if it ran past ``limit`` seconds."""
    with tempfile.TemporaryDirectory() as root:
        cmd = [str(Path(sys.executable).with_name("bnnbench")), "run", *JOB, f"threads={threads}", f"runs_root={root}"]
        try:
            subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return None
        rec = json.loads(next(Path(root).rglob("record.json")).read_text())
    return rec["train_time_s"]


def start_competitors(n: int, limit: float) -> list[subprocess.Popen]:
    """``n`` busy-loop processes, each ending by itself after ``limit`` seconds."""
    loop = f"import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--competitors", type=int, default=6)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds a run (and each competitor) may take")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    settings = {"default": str(default_threads()), "auto": "auto"}
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores; main job: bnnbench run {' '.join(JOB)}")
    idle, busy = {k: [] for k in settings}, {k: [] for k in settings}
    for _ in range(args.repeats):
        print(f"no competitors added ({load()}: other users' jobs)", flush=True)
        for k, t in settings.items():
            idle[k].append(train_time(t, args.limit))
            print(f"  threads={t:<5s} {idle[k][-1]:7.2f} s training  (then {load()})", flush=True)
        procs = start_competitors(args.competitors, args.limit)
        try:
            time.sleep(2.0)
            print(f"{args.competitors} busy-loop competitors ({load()})", flush=True)
            for k, t in settings.items():
                busy[k].append(train_time(t, args.limit))
                s = busy[k][-1]
                print(f"  threads={t:<5s} " + (f"{s:7.2f} s training" if s is not None else f"over {args.limit:.0f} s")
                      + f"  (then {load()})", flush=True)
        finally:
            stop(procs)
    print("summary (median over repeats): training time without -> with the competitors, ratio")
    for k, t in settings.items():
        i = sorted(idle[k])[len(idle[k]) // 2]
        b = sorted(busy[k], key=lambda v: float("inf") if v is None else v)[len(busy[k]) // 2]
        ratio = None if b is None else b / i
        verdict = "" if k != "auto" else ("  ok (<= 8x)" if ratio is not None and ratio <= TARGET else "  OVER 8x")
        print(f"  {k:<7s} threads={t:<5s} {i:6.2f} s -> " + (f"{b:6.2f} s  {ratio:6.1f}x" if b is not None
                                                            else f"over {args.limit:.0f} s") + verdict)


if __name__ == "__main__":
    main()
