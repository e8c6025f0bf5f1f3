#!/usr/bin/env python
"""Fetch and verify bnnbench raw data into the cache.

    python data_scripts/fetch.py NAME [NAME ...]   # e.g. uci/boston, uci (all UCI sets), mnist
    python data_scripts/fetch.py all [--prepare]   # every dataset; --prepare also builds the npz
    python data_scripts/fetch.py --list            # datasets, sizes, cache status

Sources: $BNNBENCH_MIRROR/<path> if set, else the upstream URLs. Cache: $BNNBENCH_CACHE
(default: the platform user cache dir, ~/.cache/bnnbench on Linux).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from bnnbench.core.data import cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
