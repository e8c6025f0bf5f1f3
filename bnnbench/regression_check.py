"""CI regression of the published-number cells (``make regression``).

Re-runs the fast subset of every experiment whose table is committed in ``results/tables/``: the
final trainings on the small UCI data sets, at the paper protocol, with the per-split
hyper-parameters recorded in ``results/runs`` (``hpo=recorded``; repeating the Bayesian optimisation
would take hours), and the exact logistic-regression columns on the two small LIBSVM data sets. Rebuilds those
cells and fails when a cell that ``results/`` records as reproduced (or better) no longer is, printing the cells that
moved. The runs are seeded and CPU training is deterministic, so on unchanged code the numbers are the recorded ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from bnnbench.config import cell_label
from bnnbench.results import load_record, run_dir

FAST_DATASETS = ("uci/boston", "uci/concrete", "uci/energy", "uci/wine", "uci/yacht")
FAST_EXACT_DATASETS = ("libsvm/australian", "libsvm/breast_cancer")


def candidate_of(spec: dict) -> dict[str, str]:
    """Run label -> the table column it is a grid candidate of (columns with ``candidates``)."""
    return {str(c): mid for mid, m in (spec.get("methods") or {}).items() if isinstance(m, dict)
            for c in (m.get("candidates") or [])}


def is_fast(cell: dict, spec: dict | None = None) -> bool:
    """A cell CI re-runs: a column of the table (or a grid candidate of one), with the exact columns on the small
    LIBSVM sets, the final trainings on the small UCI sets, or the experiment's own ``regression_datasets`` (NNG
    Table 1 trains 1000 epochs per cell: yacht only), of its ``regression_columns`` where it names some."""
    from bnnbench.methods import method_class
    if spec is not None:
        label = cell_label(cell)
        column = candidate_of(spec).get(label, label)
        if column not in (spec.get("methods") or {}):
            return False   # not a column of the table (Vadam Figure 3(a)'s Vprop): nothing to check against
        if spec.get("regression_columns") and column not in spec["regression_columns"]:
            return False   # CI checks only these columns of a table whose fast cells take too long all together
    if method_class(cell["method"]).solved:
        return cell["data"] in FAST_EXACT_DATASETS
    return cell["data"] in ((spec or {}).get("regression_datasets") or FAST_DATASETS)


def main(args) -> int:
    from bnnbench.config import cell_overrides, compose, experiment_spec, list_names
    from bnnbench.execute import execute
    from bnnbench.methods import method_class
    from bnnbench.reference import KEYS
    from bnnbench.tables import build_table, load_table
    from bnnbench.verdicts import compare_verdicts

    results, runs_root = Path(args.results), Path(args.runs_root)
    moved_all, checked = [], 0
    for exp in list_names("experiment"):
        table = results / "tables" / f"{exp}.csv"
        if not table.exists():
            continue
        spec = experiment_spec(exp)
        if spec.get("leaderboard"):
            continue   # no published numbers: nothing to regress against (its cells are the other tables' methods)
        old = load_table(table)
        chosen = set(zip(old["our_dataset"], old["selected"])) if "selected" in old else set()
        cands = candidate_of(spec)
        against = {str(m["against"]) for m in (spec.get("metrics") or {}).values()
                   if isinstance(m, dict) and m.get("against")}
        done = []
        for cell in spec["runs"]:
            label = cell_label(cell)
            src = run_dir(results / "runs", exp, label, cell["data"])
            if label in against and load_record(src) is not None:
                # the reference run of a paired metric (Table 4's HMC): its record stands in, the columns are re-run
                dst = run_dir(runs_root, exp, label, cell["data"])
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst)
                continue
            if not is_fast(cell, spec) or load_record(src) is None:
                continue
            if label in cands and (cell["data"], label) not in chosen:
                # a grid point the table did not choose: its record stands in, so the table chooses among the same
                # grid (only the chosen one is re-run: a drop of its ELBO below another's shows as a moved cell)
                dst = run_dir(runs_root, exp, label, cell["data"])
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(src, dst)
                continue
            hpo = [] if method_class(cell["method"]).solved else ["hpo=recorded", f"hpo.record={src}"]
            ov = [*cell_overrides(exp, cell, results / "runs"), *hpo, f"runs_root={runs_root}", "progress=false",
                  "skip_done=false"]
            print(f"== regression {exp}: {label} on {cell['data']}", flush=True)
            execute(compose(ov), ov, run_dir(runs_root, exp, label, cell["data"]))
            done.append(cell)
        if not done:
            continue
        new = build_table(spec, runs_root)
        ran = {(cands.get(cell_label(c), cell_label(c)), c["data"]) for c in done}
        # the cells of the columns this check re-ran, with or without a number: one it can no longer compute (a
        # paired metric's reference or stored predictive missing) counts as moved
        new = new[[(m, d) in ran for m, d in zip(new["our_method"], new["our_dataset"])]]
        old_sub = old.merge(new[KEYS], on=KEYS)
        checked += len(old_sub)
        moved = compare_verdicts(old_sub, new)
        if len(moved):
            moved_all.append(moved.assign(experiment=exp))
        for _, r in new.merge(old_sub[KEYS + ["ours", "verdict"]], on=KEYS, suffixes=("", "_recorded")).iterrows():
            print(f"   {r['dataset']:>13s} {r['method']:>19s} {r['setting']:>4s} {r['metric']:>12s}: "
                  f"ours {r['ours']:.4f} (recorded {r['ours_recorded']:.4f}) paper {r['paper']:g} -> {r['verdict']}"
                  f" (recorded {r['verdict_recorded']})")
    if moved_all:
        moved = pd.concat(moved_all)
        print("\nREGRESSION: cells recorded as reproduced/better that no longer are:")
        print(moved.to_string(index=False))
        return 1
    print(f"\nregression check passed: {checked} published cell(s) re-checked"
          + ("" if checked else " (no committed table has fast cells yet)"))
    return 0
