"""Under CI=true a data-dependent test without the mirror fails, naming the reason; elsewhere it skips."""

import os
import subprocess
import sys

from datapaths import REPO

TEST = "tests/core/test_data_store.py::test_cli_list_and_fetch"   # needs the raw-data mirror


def _pytest(ci: str | None):
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BNNBENCH_MIRROR")}
    env.update(BNNBENCH_TEST_MIRROR=str(REPO / "no-such-mirror"), **({"CI": ci} if ci is not None else {}))
    return subprocess.run([sys.executable, "-m", "pytest", TEST, "-rs", "-p", "no:cacheprovider"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_skip_for_missing_data_fails_under_ci():
    ci = _pytest("true")
    assert ci.returncode == 1, ci.stdout[-2000:]
    assert "skipped under CI=true, where only the CUDA tests may skip" in ci.stdout
    assert "raw-data mirror not found" in ci.stdout
    local = _pytest(None)
    assert local.returncode == 0 and "1 skipped" in local.stdout, local.stdout[-2000:]
