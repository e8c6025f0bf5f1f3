"""Re-measure, with this code, every step row that ``bench/projection.py`` takes (issue 31, section 5).

The projection divides each record's phases by the speed-up ``bench/step_ab.py`` measured for the record's method,
protocol and data set (the latest row of each, at the R nearest the phase's). A row measured before a later speed-up
of the compiled step (a C kernel for the draws, the forward pass or the eigensolver) keeps that older, smaller ratio,
so the projection overstates what a re-run costs now. This script finds the rows the projection reads (compiled new
code against the eager old, torch's draws, without ``BNNBENCH_MKL_ANY_VENDOR``), keeps the latest of each case, and
re-runs ``bench/step_ab.py`` for those measured before ``--before`` (default: all), one invocation per protocol, data
set and set of replica counts, with the methods of that group, appending the new rows to the same file:

    PYTHONPATH=. python bench/step_ab_refresh.py [--before "2026-12-04 19:26"] [--shard 0/2 --core 0] [--dry-run]

Rows whose base is not ``--base`` (e.g. ``HEAD``: the boards' later methods, timed against the eager code of their
day) are left alone: against today's eager step their ratio would say what compiling saves now, not against the code
that made their records. Two shards on two cores (``--shard 0/2 --core 0`` and ``--shard 1/2 --core 1``) split the
groups by their number of cases; each ``step_ab`` run interleaves the old and the new code on its own core, so the
ratios hold under the load of the other shard.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from projection import read_ratios   # bench/ is the script's folder, so it heads sys.path
from retime import shard

REPO = Path(__file__).resolve().parent.parent
ROWS = REPO / "results" / "speed" / "step_ab.jsonl"


def stale_groups(path: Path, before: str | None, base: str) -> list[dict]:
    """The latest row of each (method, protocol, data, R) that the projection reads (``projection.read_ratios``),
    measured against ``base`` before ``before``, grouped by (protocol, data, replica counts): ``{"protocol", "data",
    "replicas", "methods", "rounds"}``, in the file's order of first appearance."""
    rows = read_ratios(path)
    if rows.empty:
        return []
    latest = rows.sort_values("when", kind="stable").drop_duplicates(["method", "protocol", "data", "R"], keep="last")
    latest = latest[latest["base"].eq(base) & (latest["when"] < before if before else True)].sort_index()
    groups: dict[tuple, dict] = {}
    for (method, protocol, data), case in latest.groupby(["method", "protocol", "data"], sort=False):
        replicas = ",".join(str(int(R)) for R in sorted(set(case["R"]), reverse=True))
        g = groups.setdefault((protocol, data, replicas), {"protocol": protocol, "data": data, "replicas": replicas,
                                                           "methods": [], "rounds": 0})
        g["methods"].append(method)
        g["rounds"] = max(g["rounds"], int(case["rounds"].fillna(5).max()))
    return list(groups.values())


def cases(g: dict) -> int:
    """A group's number of cases (methods x replica counts): what ``shard`` balances."""
    return len(g["methods"]) * len(g["replicas"].split(","))


def command(g: dict, base: str, json_path: Path, core: str | None) -> list[str]:
    pin = ["taskset", "-c", core] if core is not None and shutil.which("taskset") else []
    return [*pin, sys.executable, str(REPO / "bench" / "step_ab.py"), "--base", base,
            "--methods", ",".join(g["methods"]), "--protocol", g["protocol"], "--data", g["data"],
            "--replicas", g["replicas"], "--rounds", str(g["rounds"]), "--json", str(json_path)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=ROWS, help="the rows read and appended to")
    ap.add_argument("--before", help='only cases whose latest row was measured before this time ("YYYY-MM-DD HH:MM")')
    ap.add_argument("--base", default="5c21305", help="the old code of the rows re-measured")
    ap.add_argument("--shard", default="0/1", help="i/k: run part i of k of the groups")
    ap.add_argument("--core", help="the core each step_ab run is pinned to (taskset)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = ap.parse_args(argv)
    i, k = (int(x) for x in args.shard.split("/"))
    if not 0 <= i < k:
        ap.error(f"--shard {args.shard}: i must lie in 0..k-1")
    groups = shard(stale_groups(args.json, args.before, args.base), i, k, cases)
    failed = 0
    for g in groups:
        cmd = command(g, args.base, args.json, args.core)
        print(shlex.join(cmd), flush=True)
        if not args.dry_run:
            failed += subprocess.run(cmd, cwd=REPO).returncode != 0
    print(f"{len(groups)} step_ab runs{'' if args.dry_run else f', {failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
