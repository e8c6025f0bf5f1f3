"""Re-key run records written under an older configuration schema (``config.CONFIG_SCHEMA``), so that finished runs
stay finished: ``python -m bnnbench.run.migrate [--runs-root results/runs] [--check]``.

A record is re-keyed only when today's configuration of its command (its stored overrides, recomposed and resolved)
differs from the one it stores in ways that cannot change its numbers:

Resume state of unfinished cells (``results.ResumeFiles``) is renamed to its cell's new hash in the same way.

* schema 1 -> 2 (typed method configs): ``config_schema`` is new; a setting that a method read with a default in its
  code is now stored with that default (``MOVED_DEFAULTS``); a setting that a protocol's ``method:`` block gave to
  every method is no longer stored for a method that has no such setting (its ``Config`` has no field of that name,
  so the method never read it).

Anything else is a real change of configuration: the record is left as it is and named, and the command fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

# (method, setting) -> the default its code applied while the setting was unset (schema 1)
MOVED_DEFAULTS = {("full_gaussian", "momentum"): 0.0, ("bbb", "learn_noise"): False, ("bbb", "noise_lr_drop"): True}


def unexplained(old: dict, new: dict, method: str) -> list[str]:
    """The differences between a stored (``old``) and today's (``new``) resolved configuration that the schema change
    does not explain."""
    from bnnbench.methods import method_class
    from bnnbench.run.results import flat_config
    own = {f.name for f in fields(method_class(method).Config)}
    a, b = flat_config(old), flat_config(new)
    bad = []
    for key in sorted(a.keys() | b.keys()):
        va, vb = a.get(key), b.get(key)
        if json.dumps(va) == json.dumps(vb) or key == "config_schema":
            continue
        setting = key.removeprefix("spec.method.")
        if key.startswith("spec.method.") and va is None and (method, setting) in MOVED_DEFAULTS \
                and vb == MOVED_DEFAULTS[(method, setting)]:
            continue
        if key.startswith("spec.method.") and vb is None and setting not in own:
            continue
        bad.append(f"{key}: {json.dumps(va)} -> {json.dumps(vb)}")
    return bad


def schema1(resolved: dict) -> dict:
    """Today's resolved configuration as schema 1 stored it, where the settings of ``MOVED_DEFAULTS`` were unset."""
    method = dict(resolved["spec"]["method"])
    for (m, setting), default in MOVED_DEFAULTS.items():
        if m == resolved["method"] and method.get(setting) == default:
            method[setting] = None
    old = {k: v for k, v in resolved.items() if k != "config_schema"}
    return {**old, "spec": {**resolved["spec"], "method": method}}


def migrate_resume_state(runs_root: Path, check: bool) -> tuple[int, list[str]]:
    """Resume files of unfinished cells (no record beside them) renamed to their cell's configuration hash under the
    current schema, where their name is the hash of that same configuration under schema 1."""
    from bnnbench.run import results
    from bnnbench.run.config import cell_overrides, cells_in, compose
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
        new, old = results.config_hash(resolved), results.config_hash(schema1(resolved))
        for p in results.ResumeFiles.in_dir(d):
            if new in p.name:
                continue
            if old not in p.name:
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
