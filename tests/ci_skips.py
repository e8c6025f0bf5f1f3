"""Under ``CI=true`` a test may not skip silently: a skip (missing data mirror, missing tool, missing package)
fails the test, naming the reason, unless the test is marked ``cuda`` (CI's machines have no GPU)."""

import os

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if IN_CI and rep.skipped and not hasattr(rep, "wasxfail") and item.get_closest_marker("cuda") is None:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped under CI=true, where only the CUDA tests may skip: {reason}"
