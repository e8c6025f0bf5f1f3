"""Wall time of ``bnnbench run`` on Boston, all 20 splits, for each natural-gradient method at its paper's protocol
(issue 3: each under 2 minutes on this machine), as a new user runs it: a fresh process, start-up included, the
protocol's fixed hyper-parameters, no record reused.

    python bench/uci_run_times.py [--workers 2] [--methods slang,vogn,...]

``--workers`` is passed as ``workers=`` to every run (the replicas in that many processes; 0 = one process).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = {   # method -> the protocol of the paper it comes from
    "slang": "slang_uci", "vogn": "slang_uci", "vadam": "vadam_uci", "vprop": "vadam_uci",
    "noisy_adam": "nng_uci", "noisy_kfac": "nng_uci",
}
TARGET_S = 120.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--methods", default=",".join(RUNS))
    args = ap.parse_args()
    workers = args.workers or "null"
    print(f"bnnbench run method=M data=uci/boston protocol=P workers={workers}  [target < {TARGET_S:.0f} s]")
    for method in args.methods.split(","):
        with tempfile.TemporaryDirectory() as root:
            cmd = [str(Path(sys.executable).with_name("bnnbench")), "run", f"method={method}", "data=uci/boston",
                   f"protocol={RUNS[method]}", f"runs_root={root}", "progress=false",
                   f"workers={workers}"]
            t = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t
        if p.returncode != 0:
            print(f"  {method:<11s} failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
            continue
        rmse = next((line.split("=")[1].split("(")[0].strip() for line in p.stdout.splitlines()
                     if line.strip().startswith("rmse")), "?")
        print(f"  {method:<11s} {RUNS[method]:<10s} {wall:7.1f} s  {'ok' if wall < TARGET_S else 'OVER'}   rmse {rmse}",
              flush=True)


if __name__ == "__main__":
    main()
