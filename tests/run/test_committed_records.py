"""The committed run records are current: recomposing each one's Hydra overrides with today's configs and code
resolves to the configuration stored in the record, so ``bnnbench reproduce`` / ``make reproduce-tables`` skip
them instead of re-running hours of training (a changed default in a method's config would re-run every cell)."""

import json

import pytest

from bnnbench.run import results
from bnnbench.run.config import compose
from bnnbench.run.execute import resolve_run

from datapaths import MIRROR, REPO

RECORDS = sorted((REPO / "results" / "runs").glob("*/*/*/record.json"))


def _first_per_experiment(paths):
    """The first record of each experiment in the default run, every other one in the e2e run (CI's make test-all):
    resolving a record's configuration takes about 0.3 s (its data set read, its group choices composed once per
    process), and there are hundreds."""
    seen = set()
    for p in paths:
        exp = p.parent.parent.parent.name
        rid = str(p.parent.relative_to(REPO / "results" / "runs"))
        yield pytest.param(p, id=rid, marks=() if exp not in seen else pytest.mark.e2e)
        seen.add(exp)


@pytest.fixture(scope="module")
def env(module_env):
    yield


@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the data mirror")
@pytest.mark.parametrize("path", list(_first_per_experiment(RECORDS)))
def test_committed_record_resolves_to_its_stored_configuration(path, env):
    rec = json.loads(path.read_text())
    overrides = [o for o in rec["config"]["hydra_overrides"] if not o.startswith("runs_root=")]
    _, _, _, resolved = resolve_run(compose(overrides), overrides, path.parent)   # as reproduce resolves it there
    assert results.config_hash(resolved) == results.stored_config_hash(rec), (
        f"{path.parent}: today's configs resolve differently from the record (reproduce would re-run it)")


RESUME = results.ResumeFiles.in_dir_tree(REPO / "results" / "runs")


@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the data mirror")
def test_committed_resume_state_belongs_to_an_unfinished_cell(env):
    """Resume state may be committed so that another machine continues a long cell, only beside no record, and only
    while it belongs to the configuration that cell resolves to today (anything else is stale). One test over all of
    them (none is committed most of the time: a parametrisation over nothing would skip, which fails under CI)."""
    from bnnbench.run.config import cell_overrides, cells_in
    for path in RESUME:
        assert results.load_record(path.parent) is None, f"{path}: its cell's record has landed; remove it"
        exp, label, slug = path.parent.relative_to(REPO / "results" / "runs").parts
        cell, = cells_in(exp, label, slug)
        overrides = cell_overrides(exp, cell, REPO / "results" / "runs")
        _, _, _, resolved = resolve_run(compose(overrides), overrides)
        assert results.config_hash(resolved) in path.name, f"{path}: stale (its cell resolves to another configuration)"


def test_migration_explains_only_changes_that_cannot_move_numbers():
    """``bnnbench.run.migrate`` re-keys a schema-1 record whose settings only became explicit defaults (or were dropped
    from a method that never read them), and refuses one whose configuration really changed."""
    from bnnbench.run.migrate import schema1, unexplained
    new = {"config_schema": 2, "method": "bbb", "seed": 0,
           "spec": {"epochs": 40, "method": {"name": "bbb", "lr": 0.01, "learn_noise": False, "noise_lr_drop": True}}}
    old = schema1(new)
    assert "config_schema" not in old and old["spec"]["method"]["learn_noise"] is None
    assert unexplained(old, new, "bbb") == []
    generic = {**old, "spec": {**old["spec"], "method": {**old["spec"]["method"], "s_init": 1.0}}}  # BBB has no s_init
    assert unexplained(generic, new, "bbb") == []
    moved = {**old, "spec": {**old["spec"], "epochs": 41}}
    assert unexplained(moved, new, "bbb") == ["spec.epochs: 41 -> 40"]
    own = {**old, "spec": {**old["spec"], "method": {**old["spec"]["method"], "lr": 0.02}}}
    assert unexplained(own, new, "bbb") == ["spec.method.lr: 0.02 -> 0.01"]
    other_default = {**new, "spec": {**new["spec"], "method": {**new["spec"]["method"], "noise_lr_drop": False}}}
    assert unexplained(old, other_default, "bbb") == ["spec.method.noise_lr_drop: null -> false"]


def test_migration_from_schema_2_explains_the_defaults_that_became_values():
    """Schema 3 stores noisy K-FAC's ``momentum_type`` and the inducing families' ``arch`` as values; a schema-2 record
    held ``None`` there. Only that is explained, and only from a record older than the schema that moved it."""
    from bnnbench.run.migrate import as_schema, unexplained
    new = {"config_schema": 3, "method": "noisy_kfac", "seed": 0,
           "spec": {"epochs": 40, "method": {"name": "noisy_kfac", "momentum_type": "ema", "lr": 0.01}}}
    old = as_schema(new, 2)
    assert old["config_schema"] == 2 and old["spec"]["method"]["momentum_type"] is None
    assert unexplained(old, new, "noisy_kfac") == []
    heavy = {**new, "spec": {**new["spec"], "method": {**new["spec"]["method"], "momentum_type": "heavy_ball"}}}
    assert as_schema(heavy, 2)["spec"]["method"]["momentum_type"] == "heavy_ball"   # set, not a default: kept
    assert unexplained(old, heavy, "noisy_kfac") == ["spec.method.momentum_type: null -> \"heavy_ball\""]
    current = {**old, "config_schema": 3}   # a schema-3 record with None there is not explained by the move
    assert unexplained(current, new, "noisy_kfac") == ["spec.method.momentum_type: null -> \"ema\""]
    assert unexplained({**old, "compile": None}, {**new, "compile": False, "threads": 1}, "noisy_kfac") == []
    assert unexplained(old, {**new, "threads": 2}, "noisy_kfac") == ["threads: null -> 2"]
    searched = {**new, "spec": {**new["spec"], "hpo": {"kind": "grid", "folds": 5, "grid_points": 5, "cv_seed": 123}}}
    before = {**old, "spec": {**old["spec"], "hpo": {"kind": "grid", "folds": 5, "grid_points": None, "n_random": 5}}}
    assert unexplained(before, searched, "noisy_kfac") == []   # grid_points now its default; n_random not grid's
    moved_search = {**before, "spec": {**before["spec"], "hpo": {**before["spec"]["hpo"], "folds": 3}}}
    assert unexplained(moved_search, searched, "noisy_kfac") == ["spec.hpo.folds: 3 -> 5"]
    gi = {"config_schema": 3, "method": "gi", "spec": {"method": {"name": "gi", "arch": "mlp"}}}
    assert unexplained(as_schema(gi, 2), gi, "gi") == [] and unexplained(as_schema(gi, 1), gi, "gi") == []


def test_migration_from_schema_3_explains_factorised_marginal_var_only_at_false():
    """Schema 4 stores factorised's ``marginal_var_unscaled``; every record before it ran as ``false`` does."""
    from bnnbench.run.migrate import as_schema, unexplained
    new = {"config_schema": 4, "method": "fac", "spec": {"method": {"name": "fac", "marginal_var_unscaled": False}}}
    old = as_schema(new, 3)
    assert old["config_schema"] == 3 and old["spec"]["method"]["marginal_var_unscaled"] is None
    assert unexplained(old, new, "fac") == []
    library = {**new, "spec": {"method": {"name": "fac", "marginal_var_unscaled": True}}}
    assert unexplained(old, library, "fac") == ["spec.method.marginal_var_unscaled: null -> true"]


def test_committed_sampler_diagnostics_have_no_negative_or_uncapped_ess():
    """Every ESS a committed record's ``diagnostics`` hold (HMC: the smallest bulk ESS of the test predictions per
    split) lies in (0, S log10 S], S = chains x kept draws per chain: the range of Stan's and ArviZ's estimator
    (``bnnbench.core.mcmc``; the records before it were checked by this test too: none was out of range)."""
    import math
    checked = 0
    for path in RECORDS:
        diag = json.loads(path.read_text()).get("diagnostics") or {}
        ess = [v for k, vals in diag.items() if k.startswith("ess_") for v in vals]
        if not ess:
            continue
        S = diag["chains"] * diag["kept_per_chain"]
        assert all(0 < v <= S * math.log10(S) for v in ess), (path, min(ess), max(ess), S)
        checked += 1
    assert checked >= 25
