"""Seconds to compose a committed record's configuration (what ``bnnbench reproduce`` does before it skips a finished
cell, what the regression check does before each re-run, and what tests/run/test_committed_records.py does for every
record), with and without parsing each config file once per process (``bnnbench.run.config.cache_config_files``).

    python bench/compose_cost.py [--records 60] [--rounds 3]

Both in one process, in alternating rounds (this host is shared: ratios in one run); every composition is checked to
resolve to the same configuration hash either way.
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
    ap.add_argument("--records", type=int, default=60, help="every n-th record, to this many")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from hydra._internal.sources_registry import SourcesRegistry

    import bnnbench.run.config as config
    from bnnbench.run import results
    from bnnbench.run.config import _composed, compose
    from bnnbench.run.execute import resolve_run

    paths = sorted((REPO / "results" / "runs").glob("*/*/*/record.json"))
    paths = paths[::max(1, len(paths) // args.records)][:args.records]
    cases = []
    for p in paths:
        rec = json.loads(p.read_text())
        cases.append((p.parent, [o for o in rec["config"]["hydra_overrides"] if not o.startswith("runs_root=")]))

    config.compose(["method=bbb"])   # Hydra's plugins scanned, the file source registered, the cache installed
    FileConfigSource = SourcesRegistry.instance().resolve("file")
    plain = getattr(FileConfigSource.load_config, "uncached", None)
    cached = FileConfigSource.load_config
    config.cache_config_files = lambda: None   # compose() would install the cache again

    def one_round(load) -> tuple[float, list[str]]:
        FileConfigSource.load_config = load
        _composed.cache_clear()
        t = time.perf_counter()
        hashes = [results.config_hash(resolve_run(compose(ov), ov, d)[3]) for d, ov in cases]
        return (time.perf_counter() - t) / len(cases), hashes

    one_round(cached)   # the cache warm, as in a process that has composed once
    times = {"plain": [], "cached": []}
    for _ in range(args.rounds):
        for name, load in (("plain", plain), ("cached", cached)):
            dt, hashes = one_round(load)
            times[name].append(dt)
            times.setdefault(f"{name}_hashes", hashes)
            assert hashes == times[f"{name}_hashes"]
    assert times["plain_hashes"] == times["cached_hashes"], "the cache changed a composition"
    p, c = statistics.median(times["plain"]), statistics.median(times["cached"])
    print(f"{len(cases)} records, {args.rounds} rounds: per record {p * 1e3:.0f} ms parsed every time, "
          f"{c * 1e3:.0f} ms parsed once ({p / c:.2f}x); same hashes")


if __name__ == "__main__":
    main()
