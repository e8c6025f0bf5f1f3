"""CI regression of the published-number cells (``make regression``): numbers, not only verdicts.

Which cells: every column cell of a committed paper table or leaderboard (``results/tables/<experiment>.csv``) with
a record whose re-run is short: the experiment's own subset (``regression_datasets`` / ``regression_columns``,
:func:`is_fast`), and every other cell whose re-run costs at most ``max_cell_s`` by its record (:func:`rerun_cost`: a
searched cell re-runs only its final training, with the hyper-parameters its record holds, ``hpo=recorded``; the exact
columns and fixed-hyper-parameter cells re-run whole). ``max_cell_s`` is the experiment's ``regression_max_cell_s``
where it states one (0: its own subset only), else :data:`MAX_CELL_S`; ``--max-cell-s`` overrides both. Each is
re-run with its record's own configuration, then

1. **record numbers**: every summary metric's mean and standard error equals the record's (seeded CPU runs repeat
   bit for bit; an experiment's ``regression_rtol`` only where a measured host-to-host difference forces one);
2. **table numbers**: ``ours`` and ``ours_se`` of each rebuilt table cell equal the committed table's (this covers
   the derived ones: paired metrics against a reference run, KL to an exact posterior);
3. **verdicts**: a cell whose verdict changed.

A leaderboard has no published numbers: its cells are checked by their records' numbers (1) alone.

Exact within a numerics class: a seeded CPU run repeats bit for bit only on machines that round alike
(bnnbench.run.numerics). On a machine of another class than a record, (1) and (2) compare against that class's
committed baseline (bnnbench.judge.baselines), written once on such a machine by ``bnnbench regression --baseline
--reason "..."``, which refuses to absorb a moved number of a record made in its own class; a baseline holds only
on the processor model it was written on (another model of the class checks as if it had none). Where this machine's
class has no baseline for a cell, the check cannot be exact (a change of CPU moves chaotic float32 trainings as a
change of seed would): it compares that cell **across classes**, each summary mean and standard error within
:data:`CROSS_CLASS_SE` of the record's standard errors and every verdict unchanged, reports the largest such move,
and leaves the numbers of single runs (no standard error) unchecked; the output says so and how to make it exact.

Spread over processes: ``--train-only`` workers re-run the cells into one fresh ``--runs-root`` (each skips a cell
that another holds or has finished: the run directory's lock), then one check with ``--reuse-runs`` compares.

Every moved number is listed with its cell, and the check fails. A deliberate change that moves numbers comes with
re-recorded cells: ``bnnbench regression --rerecord --reason "..."`` writes the re-run's numbers into the committed
records (the configuration, its hash and the search's trace kept; a ``rerecorded`` entry names the commit before and
the reason), after which ``make tables`` re-renders the tables. ``--references --only <cells>`` re-runs the
reference runs of paired metrics (HMC) it names too, instead of letting their records stand in (with ``--rerecord``,
a record whose sampler diagnostics changed is re-written as well: the estimators of ``bnnbench.core.mcmc`` moved).
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bnnbench.judge.baselines import Baseline, same
from bnnbench.run.config import cell_label
from bnnbench.run.numerics import cpu_model, numerics_class, record_class
from bnnbench.run.results import RECORD, RunDirError, load_record, run_dir, write_record

FAST_DATASETS = ("uci/boston", "uci/concrete", "uci/energy", "uci/wine", "uci/yacht")
FAST_EXACT_DATASETS = ("libsvm/australian", "libsvm/breast_cancer")
MAX_CELL_S = 30.0
"""A cell outside its experiment's own subset is re-run when its record says the re-run takes at most this long."""

_SEARCHED = ("bo", "grid")

CROSS_CLASS_SE = 5.0
"""How far a summary number of a cell recorded in another numerics class, with no baseline of this machine's class,
may move, in standard errors of its record. Measured (results/README.md, Provenance): from the records' class to an
Intel Xeon's with AMX, the 893 summary means with a standard error of 189 re-run cells moved by at most 2.07 of them
(the x4 board's SWAG on yacht, its 90% coverage), their standard errors by at most 0.97 (SLANG Table 2 on yacht); to
an AMD EPYC's with AVX2, those of 117 cells by at most 1.24 (the x4 board's last-layer Laplace on yacht, its joint
LL). A code change that moves a cell by more than this fails on any machine; one that moves it less fails only where
the check is exact."""

CROSS_CLASS_ATOL = 1e-9
"""A move this small passes across classes whatever the standard error: a number that is zero up to float rounding
(the symmetric KL of Mean-Field Exact to itself, SLANG Table 1: 1e-16, with a standard error of 4e-17)."""


def candidate_of(spec: dict) -> dict[str, str]:
    """Run label -> the table column it is a grid candidate of (columns with ``candidates``)."""
    return {str(c): mid for mid, m in (spec.get("methods") or {}).items() if isinstance(m, dict)
            for c in (m.get("candidates") or [])}


def column_of(cell: dict, spec: dict) -> str | None:
    """The table column of a cell (itself or the column it is a grid candidate of), or None (a figure-only run)."""
    label = cell_label(cell)
    column = candidate_of(spec).get(label, label)
    return column if column in (spec.get("methods") or {}) else None


def is_fast(cell: dict, spec: dict | None = None) -> bool:
    """A cell of the experiment's own regression subset: a column of the table (or a grid candidate of one), with
    the exact columns on the small LIBSVM sets, the final trainings on the small UCI sets, or the experiment's own
    ``regression_datasets`` (NNG Table 1 trains 1000 epochs per cell: yacht only), of its ``regression_columns``
    where it names some."""
    from bnnbench.methods import method_class
    if spec is not None:
        column = column_of(cell, spec)
        if column is None:
            return False   # not a column of the table (Vadam Figure 3(a)'s Vprop): nothing to check against
        if spec.get("regression_columns") and column not in spec["regression_columns"]:
            return False   # CI checks only these columns of a table whose fast cells take too long all together
    if method_class(cell["method"]).solved:
        return cell["data"] in FAST_EXACT_DATASETS
    return cell["data"] in ((spec or {}).get("regression_datasets") or FAST_DATASETS)


def is_searched(record: dict) -> bool:
    return (record.get("config", {}).get("spec", {}).get("hpo") or {}).get("kind") in _SEARCHED


def rerun_cost(record: dict) -> float:
    """Seconds a re-run of this record takes, by the record: what followed the search for a searched cell (its
    hyper-parameters read back: the wall time less the search's, at least the training time, which for an active-
    learning run is its last round's alone), the whole run otherwise (the larger of its wall and training times: the
    wall time of a run resumed before d175337 counts only its last process)."""
    train = float(record.get("train_time_s") or 0.0)
    wall = float(record.get("wall_time_s") or 0.0)
    if not is_searched(record):
        return max(train, wall)
    hpo = record.get("hpo_time_s")
    return train if hpo is None else max(train, wall - float(hpo))


@dataclass(frozen=True)
class Moved:
    """One number of a re-run cell that differs from the committed one."""
    experiment: str
    cell: str
    what: str
    recorded: float
    now: float

    def __str__(self) -> str:
        return f"{self.experiment} {self.cell}: {self.what} recorded {self.recorded!r}, now {self.now!r}"


def _se(summary) -> float | None:
    """A summary's standard error where it has one (a finite, positive one over at least two splits), else None."""
    if not isinstance(summary, dict) or (summary.get("n") or 0) < 2:
        return None
    se = summary.get("stderr")
    return float(se) if se is not None and math.isfinite(se) and se > 0 else None


def se_moves(recorded: dict, now: dict) -> list[tuple[float, str]]:
    """``(|now - recorded| / recorded standard error, what)`` of every summary mean and standard error of
    ``recorded`` that has a standard error (:func:`_se`) and moved by more than :data:`CROSS_CLASS_ATOL`, largest
    first; inf where ``now`` lacks the number."""
    out = []
    for metric, old in (recorded.get("summary") or {}).items():
        se, new = _se(old), (now.get("summary") or {}).get(metric)
        for stat in ("mean", "stderr"):
            o = old.get(stat) if isinstance(old, dict) else None
            n = new.get(stat) if isinstance(new, dict) else None
            if se is None or o is None:
                continue
            if n is None or not math.isfinite(n):
                out.append((math.inf, f"{metric}.{stat}"))
            elif abs(n - o) > CROSS_CLASS_ATOL:
                out.append((abs(n - o) / se, f"{metric}.{stat}"))
    return sorted(out, reverse=True)


def record_moves(exp: str, cell: str, recorded: dict, now: dict, rtol: float = 0.0,
                 se_tol: float | None = None) -> list[Moved]:
    """Every summary number (mean, standard error) of ``recorded`` that ``now`` does not repeat, and the per-split
    values behind a moved mean. With ``se_tol`` (a cell checked across numerics classes): every summary number that
    moved by more than ``se_tol`` of the record's standard errors (and :data:`CROSS_CLASS_ATOL`), a number without
    one (a single run) unchecked."""
    out = []
    for metric, old in (recorded.get("summary") or {}).items():
        new = (now.get("summary") or {}).get(metric)
        for stat in ("mean", "stderr"):
            o = old.get(stat) if isinstance(old, dict) else None
            n = new.get(stat) if isinstance(new, dict) else None
            if o is None and n is None:
                continue
            if se_tol is not None:
                se = _se(old)
                if o is not None and n is not None and (same(o, n) or math.isfinite(n) and (
                        se is None or abs(n - o) <= max(se_tol * se, CROSS_CLASS_ATOL))):
                    continue
            elif o is not None and n is not None and same(o, n, rtol):
                continue
            out.append(Moved(exp, cell, f"{metric}.{stat}", float("nan") if o is None else o,
                             float("nan") if n is None else n))
    if out and se_tol is None:
        now_split = {m["split"]: m for m in now.get("metrics") or []}
        for m in recorded.get("metrics") or []:
            n = now_split.get(m["split"], {})
            for k, v in m.items():
                if k != "split" and isinstance(v, (int, float)) and not same(v, n.get(k, float("nan")), rtol):
                    out.append(Moved(exp, cell, f"split {m['split']} {k}", v, n.get(k, float("nan"))))
    return out


def table_moves(exp: str, old, new, rtol: float = 0.0, se_tol: float | None = None) -> list[Moved]:
    """Table cells (joined on dataset, method, setting, metric) whose ``ours``, ``ours_se`` or verdict changed, or
    that the rebuilt table lacks. With ``se_tol`` (cells checked across numerics classes): ``ours`` and ``ours_se``
    moved by more than ``se_tol`` committed ``ours_se`` (unchecked where it has none), any verdict changed."""
    from bnnbench.judge.reference import KEYS
    from bnnbench.judge.verdicts import norm_keys
    o, n = norm_keys(old), norm_keys(new).drop_duplicates(subset=KEYS)
    m = o.merge(n, on=KEYS, how="left", suffixes=("_old", "_new"), indicator=True)
    out = []
    for _, r in m.iterrows():
        cell = " / ".join(str(r[k]) for k in KEYS if str(r[k]))
        if r["_merge"] == "left_only":
            out.append(Moved(exp, cell, "table cell (missing from the re-run)", r["ours_old"], float("nan")))
            continue
        for col in ("ours", "ours_se"):
            o, n = float(r[f"{col}_old"]), float(r[f"{col}_new"])
            if se_tol is None:
                moved = not same(o, n, rtol)
            else:
                se = float(r["ours_se_old"])
                moved = math.isfinite(se) and se > 0 and not (math.isfinite(n)
                                                              and abs(n - o) <= max(se_tol * se, CROSS_CLASS_ATOL))
            if moved:
                out.append(Moved(exp, cell, f"table {col}", o, n))
        if r["verdict_old"] != r["verdict_new"]:
            out.append(Moved(exp, cell, f"verdict {r['verdict_old']} -> {r['verdict_new']}", r["ours_old"],
                             r["ours_new"]))
    return out


def cell_limit(spec: dict, max_cell_s: float | None) -> float:
    """The re-run cost (s) up to which a cell outside the experiment's own subset is re-run: ``max_cell_s`` where the
    command line gives one, else the experiment's ``regression_max_cell_s``, else :data:`MAX_CELL_S`."""
    if max_cell_s is not None:
        return float(max_cell_s)
    own = spec.get("regression_max_cell_s")
    return MAX_CELL_S if own is None else float(own)


def selected_cells(exp: str, spec: dict, results: Path, max_cell_s: float | None, only: list[str],
                   references: set[str] = frozenset()) -> list[dict]:
    """The cells of ``exp`` this check re-runs (see the module's docstring; ``max_cell_s``: :func:`cell_limit`); the
    reference runs of paired metrics whose labels are in ``references`` too, where ``only`` names them (HMC: minutes
    a cell)."""
    limit = cell_limit(spec, max_cell_s)
    out = []
    for cell in spec["runs"]:
        reference = cell_label(cell) in references
        if column_of(cell, spec) is None and not reference:
            continue
        name = f"{exp}/{cell_label(cell)}/{cell['data']}"
        if only and not any(name == o or name.startswith(o.rstrip("/") + "/") for o in only):
            continue
        rec = load_record(run_dir(results / "runs", exp, cell_label(cell), cell["data"]))
        if rec is None or rec.get("status") != "ok":
            continue
        if (reference and only) or (not reference and (is_fast(cell, spec) or rerun_cost(rec) <= limit)):
            out.append(cell)
    return out


def rerecord(src: Path, dst: Path, new: dict, reason: str) -> None:
    """Write a re-run's numbers into the committed record at ``src``: its configuration, hash, hyper-parameters and
    search trace stay (a searched cell re-ran only its final training); the re-run's metrics, summaries, times,
    versions, commit, diagnostics and files (history, predictive, posterior) replace the old ones."""
    old = load_record(src)
    keep = {"config", "config_hash", "hparams", "hpo_trace", "hpo_time_s", "rerecorded"}
    merged = {**{k: v for k, v in old.items() if k in keep or k not in new}, **{k: v for k, v in new.items()
                                                                              if k not in keep}}
    for k in ("diagnostics", "exact", "stages", "active_learning"):
        if k not in new:
            merged.pop(k, None)
    if is_searched(old):
        merged["wall_time_s"] = float(old.get("hpo_time_s") or 0.0) + float(new.get("train_time_s") or 0.0)
    merged["rerecorded"] = [*old.get("rerecorded", []), {
        "git_commit": new.get("git_commit"), "previous_git_commit": old.get("git_commit"), "reason": reason,
        "rerun": "final training, hyper-parameters from this record" if is_searched(old) else "whole run"}]
    for f in Path(dst).iterdir():
        if f.is_file() and f.name != RECORD and not f.name.startswith("."):
            tmp = Path(src) / f".{f.name}.tmp"
            shutil.copyfile(f, tmp)
            tmp.replace(Path(src) / f.name)
    write_record(src, merged)


def main(args) -> int:
    from bnnbench.run.config import cell_overrides, compose, experiment_spec, list_names
    from bnnbench.run.execute import execute
    from bnnbench.methods import method_class
    from bnnbench.judge.reference import KEYS
    from bnnbench.judge.tables import build_table, load_table

    results, runs_root = Path(args.results), Path(args.runs_root)
    only = list(getattr(args, "only", None) or [])
    max_cell_s = getattr(args, "max_cell_s", None)
    rerecording = bool(getattr(args, "rerecord", False))
    baselining = bool(getattr(args, "baseline", False))
    references = bool(getattr(args, "references", False))
    reuse = bool(getattr(args, "reuse_runs", False))
    train_only = bool(getattr(args, "train_only", False))
    if rerecording and baselining:
        print("error: --rerecord writes the records, --baseline this numerics class's baseline: one of them")
        return 2
    if train_only and (rerecording or baselining or getattr(args, "list", False)):
        print("error: --train-only re-runs and compares nothing: without --rerecord, --baseline, --list")
        return 2
    if (rerecording or baselining) and not getattr(args, "reason", None):
        print(f"error: --{'rerecord' if rerecording else 'baseline'} needs --reason \"why the numbers move\" "
              "(it is stored with them)")
        return 2
    numerics, cpu = numerics_class(), cpu_model()
    base = Baseline.load(results, numerics)
    set_aside = ""
    if not base.holds_on(cpu):
        set_aside = (f"{base.path} was written on another processor model of this class ({base.cpu}; this one: "
                     f"{cpu}), whose kernels may round otherwise")
        if baselining:
            print(f"error: {set_aside}: nothing written. To write this model's baseline instead, move that file "
                  "aside first")
            return 2
        base = Baseline(base.path, numerics)
    if baselining and not (base.cells or base.tables):
        base.cpu = cpu
    own_class_moves: list[str] = []
    other_class: set[str] = set()
    across_cells: dict[str, tuple[float, str]] = {}   # cell -> its largest move in SE, checked across classes
    unchecked = 0
    baselined = 0
    listing, total_s = bool(getattr(args, "list", False)), 0.0
    if not listing:
        print(f"numerics class: {numerics} ({cpu})"
              + (f" (its baseline: {base.path}, {len(base.cells)} cell(s))" if base.cells else "")
              + (f"\nnot used: {set_aside}" if set_aside else ""), flush=True)
    moved: list[Moved] = []
    checked_cells = checked_table = taken = found = 0
    for exp in list_names("experiment"):
        table = results / "tables" / f"{exp}.csv"
        if not table.exists():
            continue
        spec = experiment_spec(exp)
        board = bool(spec.get("leaderboard"))   # no published numbers: its records' numbers alone are checked
        against = {str(m["against"]) for m in (spec.get("metrics") or {}).values()
                   if isinstance(m, dict) and m.get("against")}
        cells = selected_cells(exp, spec, results, max_cell_s, only, against if references else frozenset())
        if not cells:
            continue
        rtol = float(spec.get("regression_rtol") or 0.0)
        old = None if board else load_table(table)
        chosen = set(zip(old["our_dataset"], old["selected"])) if old is not None and "selected" in old else set()
        cands = candidate_of(spec)
        if listing:
            for c in cells:
                if cell_label(c) in cands and (c["data"], cell_label(c)) not in chosen:
                    continue   # a grid point the table did not choose: its record stands in
                cost = rerun_cost(load_record(run_dir(results / "runs", exp, cell_label(c), c["data"])))
                total_s += cost
                print(f"{exp}/{cell_label(c)}/{c['data']}  {cost:7.1f} s by its record")
            continue
        rerun = {(cell_label(c), c["data"]) for c in cells}
        done = []
        for cell in spec["runs"]:
            label = cell_label(cell)
            src = run_dir(results / "runs", exp, label, cell["data"])
            dst = run_dir(runs_root, exp, label, cell["data"])
            unchosen = label in cands and (cell["data"], label) not in chosen
            stand_in = (label in against and not references) or unchosen or (label, cell["data"]) not in rerun
            if stand_in:
                # a paired metric's reference run, a grid point the table did not choose, a cell not re-run: its
                # record stands in, so the rebuilt table's other cells are computed as in the committed one
                if load_record(src) is not None and not train_only:
                    shutil.rmtree(dst, ignore_errors=True)
                    shutil.copytree(src, dst)
                continue
            searched = is_searched(load_record(src)) and not method_class(cell["method"]).solved
            hpo = ["hpo=recorded", f"hpo.record={src}"] if searched else []
            ov = [*cell_overrides(exp, cell, results / "runs"), *hpo, f"runs_root={runs_root}", "progress=false",
                  f"skip_done={str(reuse or train_only).lower()}"]
            print(f"== regression {exp}: {label} on {cell['data']}", flush=True)
            start = time.perf_counter()
            if train_only:
                finished = (dst / RECORD).exists()
                try:
                    execute(compose(ov), ov, dst)
                except RunDirError as e:
                    print(f"   skipped: {e}")
                    taken += 1
                else:
                    print(f"   {time.perf_counter() - start:.1f} s")
                    found += finished
                    checked_cells += not finished
                continue
            now = execute(compose(ov), ov, dst)
            print(f"   {time.perf_counter() - start:.1f} s")
            if reuse:
                print(f"   the re-run in {dst} (made at {now.get('git_commit')})")
            recorded = load_record(src)
            name = f"{exp}/{label}/{cell['data']}"
            expected, from_baseline = base.expected_record(name, recorded)
            own_class = record_class(recorded) == numerics
            moves = record_moves(exp, f"{label} on {cell['data']}", expected, now, rtol)
            across = bool(moves) and not (own_class or from_baseline or baselining or rerecording)
            if not own_class:
                other_class.add(name)
            if across:
                moves = record_moves(exp, f"{label} on {cell['data']}", expected, now, rtol, CROSS_CLASS_SE)
                largest = se_moves(recorded, now)
                across_cells[name] = largest[0] if largest else (0.0, "")
                unchecked += sum(_se(s) is None for s in (recorded.get("summary") or {}).values())
                if largest:
                    print(f"   across numerics classes (no baseline of this one): largest move "
                          f"{largest[0][0]:.3g} SE ({largest[0][1]})")
            if baselining and moves:
                if own_class:
                    own_class_moves.append(name)
                else:
                    base.add_cell(name, recorded, now, args.reason)
                    print(f"   baseline of this class: {len(moves)} number(s) differ from the record")
                    baselined += 1
                    moves = []
            if rerecording and (moves or now.get("diagnostics") != recorded.get("diagnostics")):
                rerecord(src, dst, now, args.reason)
                print(f"   re-recorded {src} ({len(moves)} number(s) moved"
                      f"{'' if now.get('diagnostics') == recorded.get('diagnostics') else ', diagnostics changed'})")
            moved += [] if rerecording else moves
            checked_cells += 1
            done.append(cell)
        if not done or board or train_only:
            continue
        new = build_table(spec, runs_root)
        ran = {(cands.get(cell_label(c), cell_label(c)), c["data"]) for c in done}
        crossed = {(cands.get(cell_label(c), cell_label(c)), c["data"]) for c in done
                   if f"{exp}/{cell_label(c)}/{c['data']}" in across_cells}
        new = new[[(m, d) in ran for m, d in zip(new["our_method"], new["our_dataset"])]]
        old_sub = old.merge(new[KEYS], on=KEYS)
        checked_table += len(old_sub)
        expected, from_baseline = base.expected_table(exp, old_sub, KEYS)
        across = pd.Series([(m, d) in crossed for m, d in zip(old_sub["our_method"], old_sub["our_dataset"])],
                           index=old_sub.index) & ~from_baseline
        table_moved = [] if rerecording else (table_moves(exp, expected[~across], new, rtol)
                                              + table_moves(exp, expected[across], new, se_tol=CROSS_CLASS_SE))
        if baselining and table_moved and not own_class_moves:
            base.add_table_rows(exp, old_sub, new, KEYS)
            table_moved = []
        moved += table_moved
        for _, r in new.merge(old_sub[KEYS + ["ours", "verdict"]], on=KEYS, suffixes=("", "_recorded")).iterrows():
            print(f"   {r['dataset']:>13s} {r['method']:>19s} {r['setting']:>4s} {r['metric']:>12s}: "
                  f"ours {r['ours']:.6g} (recorded {r['ours_recorded']:.6g}) paper {r['paper']:g} -> {r['verdict']}"
                  f" (recorded {r['verdict_recorded']})")
    if listing:
        print(f"{total_s / 60:.1f} min by the records (their hosts and loads; a re-run on an idle core is faster)")
        return 0
    if train_only:
        print(f"\nre-ran {checked_cells} cell(s) into {runs_root} ({found} found finished, {taken} taken by another "
              f"worker); compare them: bnnbench regression --runs-root {runs_root} --reuse-runs")
        return 0
    if rerecording:
        print(f"\nre-recorded where numbers moved, among {checked_cells} re-run cell(s); now `make tables`")
        return 0
    if baselining and own_class_moves:
        print(f"\nREGRESSION: not a baseline: {len(own_class_moves)} cell(s) recorded in this numerics class moved "
              f"({', '.join(own_class_moves)}); nothing written. A deliberate change? --rerecord --reason \"...\"")
        return 1
    if baselining:
        if baselined or base.tables:
            rows = sum(len(t) for t in base.tables.values())
            print(f"\nbaseline of this numerics class written: {base.save()} ({baselined} cell(s) of "
                  f"{checked_cells} re-run moved from their records, and it holds {rows} table row(s))")
        else:
            print(f"\nno baseline needed: {checked_cells} re-run cell(s) repeat their records' numbers exactly")
        return 0
    if moved:
        print(f"\nREGRESSION: {len(moved)} number(s) of {checked_cells} re-run cell(s) moved:")
        for m in moved:
            print(f"  {m}")
        print("\nA deliberate change? Re-record: bnnbench regression --rerecord --reason \"...\", then make tables.")
        if other_class:
            print(f"{len(other_class)} of the re-run cell(s) were recorded in another numerics class than this "
                  f"machine's ({numerics}), and {base.path} does not hold these numbers"
                  + (f" ({len(across_cells)} checked across classes, within {CROSS_CLASS_SE:g} SE)" if across_cells
                     else "") + ": only if the moves are this CPU's float rounding (bnnbench.run.numerics), record "
                  "its baseline: bnnbench regression --baseline --reason \"...\"")
        return 1
    exact = checked_cells - len(across_cells)
    print(f"\nregression check passed: {exact} re-run cell(s) repeat their records' numbers exactly"
          + (" (those of this numerics class's baseline where it has them)" if base.cells else "") + "; "
          f"{checked_table} published table cell(s) re-checked (numbers and verdicts)"
          + ("" if checked_cells else " (no committed table has a short cell)"))
    if across_cells:
        (z, what), name = max((v, k) for k, v in across_cells.items())
        print(f"NOT EXACT: {len(across_cells)} re-run cell(s) were recorded in another numerics class and "
              + (f"{set_aside}, so it was not used" if set_aside else f"{base.path} has no baseline for them")
              + f": checked across classes, within {CROSS_CLASS_SE:g} of their records' "
              f"standard errors and with every verdict unchanged (largest move {z:.3g} SE: {name} {what}; "
              f"{unchecked} single-run metric(s) unchecked). For an exact check on this machine's class ({numerics}),"
              f" if the moves are its float rounding (bnnbench.run.numerics): bnnbench regression --baseline "
              f"--reason \"...\" (with --reuse-runs --runs-root {runs_root}: these re-runs, not trained again)")
    return 0
