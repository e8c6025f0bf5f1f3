"""Shared test fixtures."""

import os

import pytest

from datapaths import MIRROR


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
