"""The committed run records are current: recomposing each one's Hydra overrides with today's configs and code
resolves to the configuration stored in the record, so ``bnnbench reproduce`` / ``make reproduce-tables`` skip
them instead of re-running hours of training (a changed default in a method's config would re-run every cell)."""

import json

import pytest

from bnnbench import results
from bnnbench.config import compose
from bnnbench.execute import resolve_run

from datapaths import MIRROR, REPO

RECORDS = sorted((REPO / "results" / "runs").glob("*/*/*/record.json"))


@pytest.fixture(scope="module")
def env(module_env):
    yield


@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the data mirror")
@pytest.mark.parametrize("path", RECORDS, ids=[str(p.parent.relative_to(REPO / "results" / "runs")) for p in RECORDS])
def test_committed_record_resolves_to_its_stored_configuration(path, env):
    rec = json.loads(path.read_text())
    overrides = [o for o in rec["config"]["hydra_overrides"] if not o.startswith("runs_root=")]
    _, _, _, resolved = resolve_run(compose(overrides), overrides)
    assert results.config_hash(resolved) == results.stored_config_hash(rec), (
        f"{path.parent}: today's configs resolve differently from the record (reproduce would re-run it)")
