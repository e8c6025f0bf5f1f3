"""Seconds to compose and resolve a committed record's configuration (what ``bnnbench reproduce`` does before it skips
a finished cell, what the regression check does before each re-run, and what tests/run/test_committed_records.py does
for every record): Hydra's whole composition, each config file parsed anew (``hydra``), against
``bnnbench.run.config.compose`` (``kept``: the group choices' tree composed once per process and kept pickled, the key
overrides applied to a copy; config files parsed once).

    python bench/compose_cost.py [--experiments gi_tableG,nng_table1] [--records 60] [--rounds 3]

The records: every one of the named experiments' (default: all of them) when ``--every 1``, else every n-th, up to
``--records``; a check of all the records composes each experiment's few choice sets for many records.

Both in one process, in alternating rounds (this host is shared: ratios in one run); every record must resolve to the
same configuration hash either way. The kept trees are cleared before each ``kept`` round, so a round pays for
composing each distinct set of choices once, as a process that checks these records would.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiments", default="", help="comma-separated; default all")
    ap.add_argument("--every", type=int, default=0, help="every n-th record (default: spread over --records)")
    ap.add_argument("--records", type=int, default=60, help="at most this many records")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from hydra._internal.sources_registry import SourcesRegistry

    from bnnbench.run import config, results
    from bnnbench.run.execute import resolve_run

    paths = sorted((REPO / "results" / "runs").glob("*/*/*/record.json"))
    if args.experiments:
        paths = [p for p in paths if p.parent.parent.parent.name in args.experiments.split(",")]
    paths = paths[::args.every or max(1, len(paths) // args.records)][:args.records]
    cases = []
    for p in paths:
        rec = json.loads(p.read_text())
        cases.append((p.parent, [o for o in rec["config"]["hydra_overrides"] if not o.startswith("runs_root=")]))

    config.compose(["method=bbb"])   # Hydra's plugins scanned, the file source registered, the parse cache installed
    source = SourcesRegistry.instance().resolve("file")
    parse_once = source.load_config

    def hydra(ov):
        source.load_config = parse_once.uncached
        try:
            return config._hydra_compose(config.check_overrides(ov))
        finally:
            source.load_config = parse_once

    def one_round(how) -> tuple[float, list[str]]:
        config._composed.cache_clear()
        config._choices_tree.cache_clear()
        t = time.perf_counter()
        hashes = [results.config_hash(resolve_run(how(ov), ov, d)[3]) for d, ov in cases]
        return (time.perf_counter() - t) / len(cases), hashes

    times, hashes = {"hydra": [], "kept": []}, {}
    for _ in range(args.rounds):
        for name, how in (("hydra", hydra), ("kept", config.compose)):
            dt, h = one_round(how)
            times[name].append(dt)
            assert hashes.setdefault(name, h) == h
    assert hashes["hydra"] == hashes["kept"], "the kept trees changed a composition"
    a, b = statistics.median(times["hydra"]), statistics.median(times["kept"])
    print(f"{len(cases)} records, {args.rounds} rounds, medians: per record (compose and resolve) {a * 1e3:.0f} ms "
          f"Hydra whole, {b * 1e3:.0f} ms kept ({a / b:.1f}x); the same hashes")


if __name__ == "__main__":
    main()
