"""Shared test fixtures."""

import os

import pytest
import torch

from datapaths import MIRROR

# one intra-op thread per test process, as CI's pinned processes and a run's threads=auto on a small model have:
# `make test` runs a process per core (pytest-xdist), which torch's default of a thread per core would oversubscribe
# (one process: 172 s at 2 threads, 165 s at 1; two processes at 1 thread: 99 s; idle 2-core host, 2026-11-29);
# the tests of the thread setting set their own counts
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def module_env(tmp_path_factory):
    """The data mirror, a fresh cache for the module and no network, restored afterwards."""
    old = {k: os.environ.get(k) for k in ("BNNBENCH_MIRROR", "BNNBENCH_CACHE", "BNNBENCH_OFFLINE")}
    os.environ.update(BNNBENCH_MIRROR=str(MIRROR), BNNBENCH_CACHE=str(tmp_path_factory.mktemp("cache")),
                      BNNBENCH_OFFLINE="1")
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
