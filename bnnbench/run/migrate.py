"""Re-key run records written under an older configuration schema (``config.CONFIG_SCHEMA``), so that finished runs
stay finished: ``python -m bnnbench.run.migrate [--runs-root results/runs] [--check]``.

A record is re-keyed only when today's configuration of its command (its stored overrides, recomposed and resolved)
differs from the one it stores in ways that cannot change its numbers:

* schema 1 -> 2 (typed method configs): ``config_schema`` is new; a setting that a method read with a default in its
  code is now stored with that default (``MOVED_DEFAULTS[2]``); a setting that a protocol's ``method:`` block gave to
  every method is no longer stored for a method that has no such setting (its ``Config`` has no field of that name,
  so the method never read it).
* schema 2 -> 3 (defaults as values): a setting whose ``None`` the code read as a default now holds that default
  (``MOVED_DEFAULTS[3]``: noisy K-FAC's ``momentum_type``, the inducing families' ``arch``); the search's settings
  are those of its kind (``schema.SEARCHES``) with their defaults: a key left unset now holds its default, and a key
  of another kind of search (a protocol's ``hpo:`` block under ``hpo=fixed``), which the search never read, is
  no longer stored.
* schema 3 -> 4: factorised's ``marginal_var_unscaled`` (the library's marginal variance under the Scale prior) is
  new; every run before it computed it as ``false`` does (``MOVED_DEFAULTS[4]``).

This is how a setting gets a real default: add it with its default to the method's ``Config``, bump
``CONFIG_SCHEMA``, name it in ``MOVED_DEFAULTS`` under the new schema, and run this module over the committed records.

Resume state of unfinished cells (``results.ResumeFiles``) is renamed to its cell's new hash in the same way.

Anything else is a real change of configuration: the record is left as it is and named, and the command fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

_INDUCING = ("fac", "li", "gi", "fac_gi", "rand_gi")
# schema -> {(method, setting): the default its code applied while the setting was unset, before that schema}
MOVED_DEFAULTS = {
    2: {("full_gaussian", "momentum"): 0.0, ("bbb", "learn_noise"): False, ("bbb", "noise_lr_drop"): True},
    3: {**{(m, "momentum_type"): "ema" for m in ("noisy_kfac", "kfac", "noisy_kfac_blktri")},
        **{(m, "arch"): "mlp" for m in _INDUCING}},
    4: {("fac", "marginal_var_unscaled"): False},
}


def schema_of(config: dict) -> int:
    """The schema a stored configuration was written under (schema 1 stored none)."""
    return int(config.get("config_schema") or 1)


def _moved_since(schema: int) -> dict:
    return {k: v for s, moved in MOVED_DEFAULTS.items() if s > schema for k, v in moved.items()}


def unexplained(old: dict, new: dict, method: str) -> list[str]:
    """The differences between a stored (``old``) and today's (``new``) resolved configuration that the schema changes
    since ``old``'s schema do not explain."""
    from bnnbench.methods import method_class
    from bnnbench.run.results import HASH_DEFAULTS, flat_config
    from bnnbench.run.schema import SEARCHES
    own = {f.name for f in fields(method_class(method).Config)}
    moved = _moved_since(schema_of(old))
    kind = (new.get("spec") or {}).get("hpo", {}).get("kind")
    search = {f.name: f.default for f in fields(SEARCHES[kind])} if schema_of(old) < 3 and kind in SEARCHES else None
    a, b = flat_config(old), flat_config(new)
    bad = []
    for key in sorted(a.keys() | b.keys()):
        va, vb = a.get(key), b.get(key)
        if json.dumps(va) == json.dumps(vb) or key == "config_schema":
            continue
        setting = key.removeprefix("spec.method.")
        if key.startswith("spec.method.") and va is None and (method, setting) in moved \
                and vb == moved[(method, setting)]:
            continue
        if key.startswith("spec.method.") and vb is None and setting not in own:
            continue
        if key in HASH_DEFAULTS and va is None and vb == HASH_DEFAULTS[key]:
            continue   # a setting added later (threads, compile) at the value its hash leaves out
        hpo_key = key.removeprefix("spec.hpo.")
        if search is not None and key.startswith("spec.hpo.") and (
                (vb is None and hpo_key not in search) or (va is None and hpo_key in search and vb == search[hpo_key])):
            continue
        bad.append(f"{key}: {json.dumps(va)} -> {json.dumps(vb)}")
    return bad


def as_schema(resolved: dict, schema: int) -> dict:
    """Today's resolved configuration as ``schema`` stored it: the settings of ``MOVED_DEFAULTS`` since then unset
    where they hold their moved default (schema 1 stored no ``config_schema``)."""
    method = dict(resolved["spec"]["method"])
    for (m, setting), default in _moved_since(schema).items():
        if m == resolved["method"] and method.get(setting) == default:
            method[setting] = None
    old = {k: v for k, v in resolved.items() if k != "config_schema"}
    return {**old, **({"config_schema": schema} if schema > 1 else {}), "spec": {**resolved["spec"], "method": method}}


def schema1(resolved: dict) -> dict:
    """Today's resolved configuration as schema 1 stored it."""
    return as_schema(resolved, 1)


def migrate_resume_state(runs_root: Path, check: bool) -> tuple[int, list[str]]:
    """Resume files of unfinished cells (no record beside them) renamed to their cell's configuration hash under the
    current schema, where their name is the hash of that same configuration under an older schema."""
    from bnnbench.run import results
    from bnnbench.run.config import CONFIG_SCHEMA, cell_overrides, cells_in, compose
    from bnnbench.run.execute import resolve_run
    moved, refused = 0, []
    for d in sorted({p.parent for p in results.ResumeFiles.in_dir_tree(runs_root)}):
        if results.load_record(d) is not None:
            continue
        exp, label, slug = d.relative_to(runs_root).parts
        cells = cells_in(exp, label, slug)
        if len(cells) != 1:
            refused.append(f"{d}: no single cell of {exp} runs here")
            continue
        overrides = cell_overrides(exp, cells[0], runs_root)
        _, _, _, resolved = resolve_run(compose(overrides), overrides)
        new = results.config_hash(resolved)
        olds = [results.config_hash(as_schema(resolved, s)) for s in range(1, CONFIG_SCHEMA)]
        for p in results.ResumeFiles.in_dir(d):
            if new in p.name:
                continue
            old = next((h for h in olds if h in p.name), None)
            if old is None:
                refused.append(f"{p}: of another configuration")
                continue
            moved += 1
            if not check:
                p.rename(p.with_name(p.name.replace(old, new)))
    return moved, refused


def migrate(runs_root: Path, check: bool = False) -> int:
    from bnnbench.run import results
    from bnnbench.run.config import CONFIG_SCHEMA, compose
    from bnnbench.run.execute import resolve_run
    moved, current, refused = 0, 0, []
    for path in sorted(Path(runs_root).glob("*/*/*/" + results.RECORD)):
        rec = json.loads(path.read_text())
        if rec["config"].get("config_schema") == CONFIG_SCHEMA:
            current += 1
            continue
        overrides = [o for o in rec["config"]["hydra_overrides"] if not o.startswith("runs_root=")]
        _, _, _, resolved = resolve_run(compose(overrides), overrides)
        bad = unexplained(rec["config"], resolved, rec["method"])
        if bad:
            refused.append(f"{path.parent}: " + "; ".join(bad))
            continue
        moved += 1
        if not check:
            rec["config"] = {**resolved, "hydra_overrides": rec["config"]["hydra_overrides"]}
            rec["config_hash"] = results.config_hash(resolved)
            results.atomic_write_json(path, rec)
    resumed, refused_resume = migrate_resume_state(Path(runs_root), check)
    refused += refused_resume
    print(f"{moved} record(s) and {resumed} resume file(s) {'to re-key' if check else 're-keyed'} to schema "
          f"{CONFIG_SCHEMA}, {current} record(s) current, {len(refused)} refused")
    for r in refused:
        print(f"  refused (its configuration changed): {r}")
    return 1 if refused else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bnnbench.run.migrate", description=__doc__.splitlines()[0])
    p.add_argument("--runs-root", default="results/runs")
    p.add_argument("--check", action="store_true", help="only say what would be re-keyed")
    args = p.parse_args(argv)
    return migrate(Path(args.runs_root), args.check)


if __name__ == "__main__":
    sys.exit(main())
