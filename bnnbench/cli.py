"""Command line: ``bnnbench run | reproduce | table | plot | list | data | regression``.

``run`` composes one configuration from Hydra overrides (``method=bbb data=uci/boston protocol.epochs=10``); with
``-m`` it is a Hydra sweep over comma-separated values. Every failure a user can cause is one ``error:`` line and an
exit code (``run_one``).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from bnnbench import __version__
from bnnbench.core.errors import say_error
from bnnbench.run.cell import reproduce_cell as _reproduce_cell, run_dir_of, summary_lines
from bnnbench.run.config import cell_label, cell_overrides, check_choices, experiment_spec, list_names
from bnnbench.run.signals import EXIT_INTERRUPTED, EXIT_TERMINATED, exit_code, how, sigterm_interrupts

RESULTS = Path("results")       # the committed report, relative to the working directory (a checkout)
RECORDS = str(RESULTS / "runs")  # the run records that results/tables and results/figures are rendered from
RECORDS_HELP = f"the run records (default: {RECORDS})"
OUT_HELP = ("where the {0} go (default: results/{0} for the default --runs-root; beside other records, "
            "<runs-root>/{0}, so that rendering them never overwrites the committed report)")
EXIT_CONFIG, EXIT_FAILED = 2, 3   # and 130 / 143: interrupted by Ctrl-C / SIGTERM (bnnbench.run.signals)
EXIT_NO_RECORDS = 1   # ``table``: no record to render
HELP_FLAGS = ("-h", "--help")
RUN_USAGE = """usage: bnnbench run [-m] OVERRIDE [OVERRIDE ...]

Run one method on one data set under one protocol (all its splits as one batched program) and write its record
to <runs_root>/<experiment or adhoc>/<label>/<data set>/record.json. The configuration is configs/config.yaml with
Hydra overrides applied:

  group=option      choose an option of a config group: method=bbb data=uci/boston protocol=slang_uci hpo=bo
                    model=mlp experiment=slang_table2
  group.key=value   set one setting of a group: protocol.epochs=10 protocol.splits=[0,1] method.lr=0.01
  key=value         a top-level setting: seed=1 device=cuda dtype=float64 runs_root=/tmp/runs label=mine
  -m, --multirun    a sweep: comma-separated values run one after the other (method=map,bbb)

examples:
  bnnbench run method=bbb data=uci/boston
  bnnbench run method=map data=uci/yacht protocol.epochs=10 protocol.splits=[0] hpo=fixed
  bnnbench run experiment=slang_table2 method=bbb data=uci/energy     # one cell of a paper table
  bnnbench run -m method=map,bbb data=uci/yacht

The options of every group: `bnnbench list` (datasets, methods, models, protocols, experiments).
Exit status: 0 done (or already recorded), 2 a configuration or data problem (nothing ran), 3 the run failed
(failed.json says why; the same configuration is not run again unless retry_failed=true), 130 interrupted by
Ctrl-C, 143 stopped by SIGTERM (the same command resumes either)."""


def run_one(cfg, overrides: list[str]) -> int:
    """``execute`` one composed configuration, turning every expected failure into one line and an exit code:
    2 a configuration, data or run-directory problem (nothing ran), 3 a run that failed (``failed.json`` says why),
    130 / 143 an interruption by Ctrl-C / SIGTERM (the same command resumes from the last checkpoint)."""
    from bnnbench.core.data import DataError
    from bnnbench.run.engine import DivergenceError
    from bnnbench.methods.exact.exact_vi import NotConvergedError
    from bnnbench.run.execute import execute
    from bnnbench.methods import UnknownMethodError
    from bnnbench.run.config import ConfigError
    from bnnbench.run.results import RunDirError
    from bnnbench.run.signals import exit_code, resume_line
    run_dir = run_dir_of(cfg)
    try:
        record = execute(cfg, overrides, run_dir)
    except (DivergenceError, NotConvergedError) as e:
        say_error(f"run failed, no result written ({run_dir / 'failed.json'} has the reason): {e}")
        return EXIT_FAILED
    except (ConfigError, DataError, UnknownMethodError, RunDirError) as e:
        say_error(str(e))
        return EXIT_CONFIG
    except KeyboardInterrupt as e:
        print(f"\n{resume_line(run_dir, e)}", file=sys.stderr, flush=True)
        return exit_code(e)
    print("\n".join(summary_lines(record)))
    print(f"record: {run_dir / 'record.json'}")
    return 0


def cmd_run(overrides: list[str]) -> int:
    """``bnnbench run <overrides>``: one run composed here; with ``-m``/``--multirun``, a Hydra sweep whose
    every job goes through ``run_one`` as well."""
    err = check_choices([o for o in overrides if not o.startswith("-")])
    if err:
        say_error(err)
        return EXIT_CONFIG
    from bnnbench.run.config import ConfigError, check_overrides, compose_checked
    flags = [o for o in overrides if o.startswith("-")]
    try:
        if any(f in ("-m", "--multirun") for f in flags):
            return _multirun(flags, check_overrides([o for o in overrides if not o.startswith("-")]))
        cfg = compose_checked(overrides)
    except ConfigError as e:
        say_error(str(e))
        return EXIT_CONFIG
    return run_one(cfg, overrides)


def _multirun(flags: list[str], overrides: list[str]) -> int:
    """A Hydra sweep over the checked ``overrides`` (as ``check_overrides`` returns them)."""
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from bnnbench.run.config import config_dir, register_resolvers
    register_resolvers()
    codes = []

    @hydra.main(config_path=config_dir(), config_name="config", version_base=None)
    def app(cfg):
        codes.append(run_one(cfg, list(HydraConfig.get().overrides.task)))
        if codes[-1] in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            raise _SweepStopped(codes[-1])   # the sweep's later jobs do not start

    sys.argv = [f"{Path(sys.argv[0]).name} run", *flags, *overrides]
    try:
        app()
    except _SweepStopped as e:
        return e.code
    return max(codes, default=0)


class _SweepStopped(KeyboardInterrupt):
    """A job of a sweep was interrupted (its line printed): the sweep stops with its exit code."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _cell_overrides(args, cell) -> list[str]:
    return [*cell_overrides(args.experiment, cell, args.runs_root), f"runs_root={args.runs_root}", *args.overrides]


def _unknown_filter(experiment: str, spec: dict, keep_data: set | None, keep_label: set | None) -> str | None:
    """Why ``--data`` / ``--label`` select nothing real (a typo would otherwise run nothing and still rewrite the
    tables): a data set or label that no cell of the experiment has, or a pair of filters no cell meets. An open
    leaderboard also takes its data sets and, as a label, any method (a column of yours)."""
    open_board = bool((spec.get("leaderboard") or {}).get("open"))
    data = {c["data"] for c in spec["runs"]} | (set(spec.get("datasets") or []) if open_board else set())
    labels = {cell_label(c) for c in spec["runs"]} | (set(list_names("method")) if open_board else set())
    for kind, asked, valid in (("data set", keep_data, sorted(data)), ("label", keep_label, sorted(labels))):
        for name in sorted((asked or set()) - set(valid)):
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"no cell of {experiment} has the {kind} {name!r}{hint}; its {kind}s: {', '.join(valid)}"
    if keep_data and keep_label and not open_board and not any(
            c["data"] in keep_data and cell_label(c) in keep_label for c in spec["runs"]):
        return (f"no cell of {experiment} has both a data set of --data {','.join(sorted(keep_data))} and a label of "
                f"--label {','.join(sorted(keep_label))}")
    return None


def _run_wave(args, wave: list[list[str]]) -> int:
    """Run the cells ``wave`` one after the other in this process; returns 0, or the exit code of an interruption
    (its line printed)."""
    from bnnbench.run.signals import CellInterrupted
    for ov in wave:
        try:
            print(_reproduce_cell(args.experiment, args.runs_root, ov), flush=True)
        except CellInterrupted as e:
            print(f"\n{e.line}", file=sys.stderr, flush=True)
            return e.code
    return 0


def _run_wave_in_workers(args, wave: list[list[str]], jobs: int) -> int:
    """Run the cells ``wave`` in ``jobs`` worker processes, printing each cell's lines in order; returns 0, or the exit
    code of an interruption, after every worker has stopped (``bnnbench.run.signals``) and each interrupted cell's line
    has been printed."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    from bnnbench.run.signals import CellInterrupted, exit_code, stop_workers, worker_init
    from bnnbench.run.threads import available_cores
    cores = max(1, available_cores() // jobs)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=worker_init)
    futures = [pool.submit(_reproduce_cell, args.experiment, args.runs_root, ov, cores) for ov in wave]
    printed = 0
    try:
        for f in futures:
            print(f.result(), flush=True)
            printed += 1
    except (KeyboardInterrupt, CellInterrupted) as e:
        code = e.code if isinstance(e, CellInterrupted) else exit_code(e)
        stop_workers()
        pool.shutdown(wait=True, cancel_futures=True)
        print("", file=sys.stderr)
        for f in futures[printed:]:
            _print_outcome(f)
        return code
    finally:   # a cell's unexpected error too: the cells not started are dropped, the running ones awaited
        pool.shutdown(wait=True, cancel_futures=True)
    return 0


def _print_outcome(future) -> None:
    """What a cell of an interrupted wave left: its lines when it finished, its ``CellInterrupted`` line when it was
    interrupted; nothing when it never started."""
    from bnnbench.run.signals import CellInterrupted
    if future.cancelled():
        return
    e = future.exception()
    if isinstance(e, CellInterrupted):
        print(e.line, file=sys.stderr, flush=True)
    elif isinstance(e, Exception):
        say_error(f"{type(e).__name__}: {e}")
    elif e is None and future.result() is not None:
        print(future.result(), flush=True)


def cmd_reproduce(args) -> int:
    """Run every cell of an experiment that has no finished record, then write its tables.

    ``--data`` / ``--label`` (comma lists) keep only those cells. ``--jobs N`` runs N cells at a time
    in worker processes, each allowed cores // N (``threads=auto`` uses at most that); cells whose overrides
    name another cell's record (``{runs_root}``, e.g. Vprop with Vadam's hyper-parameters) start after all
    the others have finished."""
    spec = experiment_spec(args.experiment)
    keep_data = set(args.data.split(",")) if getattr(args, "data", None) else None
    keep_label = set(args.label.split(",")) if getattr(args, "label", None) else None
    err = _unknown_filter(args.experiment, spec, keep_data, keep_label)
    if err:
        say_error(err)
        return EXIT_CONFIG
    cells = [(c, _cell_overrides(args, c)) for c in spec["runs"]
             if (keep_data is None or c["data"] in keep_data)
             and (keep_label is None or cell_label(c) in keep_label)]
    if keep_label and (spec.get("leaderboard") or {}).get("open"):   # a method of yours adds its column
        for label in sorted(keep_label - {cell_label(c) for c in spec["runs"]}):
            cells += [({"method": label, "data": ds}, _cell_overrides(args, {"method": label, "data": ds}))
                      for ds in spec["datasets"] if keep_data is None or ds in keep_data]
    waves = [[ov for c, ov in cells if not any("{runs_root}" in o for o in c.get("overrides", []))],
             [ov for c, ov in cells if any("{runs_root}" in o for o in c.get("overrides", []))]]
    launched = 0
    from bnnbench.run import launchers
    if launchers.wanted(args):   # one job per cell (or shared selection) through a Hydra launcher (launchers.py)
        launched, waves = launchers.launch(args, cells), []
        if launched == EXIT_CONFIG:
            return launched
    jobs = int(getattr(args, "jobs", 1) or 1)
    for wave in waves:
        stopped = _run_wave(args, wave) if jobs <= 1 else _run_wave_in_workers(args, wave, jobs)
        if stopped:
            print(f"{args.experiment}: stopped; tables and figures not rewritten", file=sys.stderr, flush=True)
            return stopped
    _default_out(args, "tables")
    figures = args.figures or str(Path(args.out).parent / "figures")    # beside the tables
    cmd_plot(argparse.Namespace(experiment=args.experiment, runs_root=args.runs_root, out=figures))
    tables = cmd_table(args) if spec.get("reference") or spec.get("leaderboard") else 0
    return launched or tables   # a failed job's exit code first


def _no_records(args) -> int:
    """A table of no records would only say "not run" in every cell: say where the records were looked for instead."""
    root = Path(args.runs_root).resolve()
    say_error(f"no run records of {args.experiment} under {root} (a cell's record is {root}/{args.experiment}/<label>/"
           f"<data set>/record.json); nothing written. Run its cells with `bnnbench reproduce {args.experiment}`, "
           "or give --runs-root where your records are")
    return EXIT_NO_RECORDS


def _default_out(args, kind: str) -> None:
    """``--out`` when not given: ``results/<kind>`` (the committed report) for the committed records, else
    ``<runs-root>/<kind>``: tables and figures of other records never replace the committed ones."""
    if getattr(args, "out", None):
        return
    root = Path(args.runs_root)
    args.out = str(RESULTS / kind if root.resolve() == Path(RECORDS).resolve() else root / kind)


def cmd_table(args) -> int:
    _default_out(args, "tables")
    from bnnbench.judge.counts import count_line, update_summaries
    from bnnbench.run.results import finished_run_dirs
    from bnnbench.judge.tables import build_table
    from bnnbench.present.render import write_tables
    spec = experiment_spec(args.experiment)
    if spec.get("leaderboard"):
        from bnnbench.judge.leaderboard import write_leaderboard
        if not finished_run_dirs(args.runs_root, args.experiment):
            return _no_records(args)
        paths = write_leaderboard(spec, Path(args.runs_root), Path(args.out))
        print(f"{args.experiment}: wrote " + ", ".join(str(p) for p in paths.values()))
    else:
        df = build_table(spec, Path(args.runs_root))
        if (df["verdict"] == "not_run").all():
            return _no_records(args)
        paths = write_tables(df, spec, Path(args.out))
        print(f"{args.experiment}: {count_line(df)}; wrote " + ", ".join(str(p) for p in paths.values()))
    # the committed report's tables: the generated counts of results/README.md and README.md (between their counts
    # markers) follow them; tables written elsewhere (--out) leave the READMEs alone
    if Path(args.out).resolve() == (RESULTS / "tables").resolve():
        for p in update_summaries(Path(args.out), [RESULTS / "README.md", Path("README.md")]):
            print(f"updated the counts in {p}")
    return 0


def cmd_plot(args) -> int:
    _default_out(args, "figures")
    from bnnbench.present.plots import (box_figure, convergence_figure, covariance_figure,
                                        critical_difference_figure, elbo_depth_figure, final_values_table,
                                        predictive_figure)
    spec = experiment_spec(args.experiment)
    fig = spec.get("figure") or {}
    if spec.get("leaderboard"):
        out = critical_difference_figure(spec, Path(args.runs_root), Path(args.out) / f"{args.experiment}_cd.png")
        print(f"wrote {out}" if out else f"no critical-difference diagram of {args.experiment}: it needs two methods "
              f"on two data sets among the records under {args.runs_root}")
    if fig.get("convergence", True):
        out = convergence_figure(spec, Path(args.runs_root), Path(args.out) / f"{args.experiment}_convergence.png")
        print(f"wrote {out}" if out else f"no run histories of {args.experiment} under {args.runs_root}")
    for key, draw in (("predictive", predictive_figure), ("elbo_depth", elbo_depth_figure)):
        if fig.get(key):
            out = draw(spec, Path(args.runs_root), Path(args.out) / f"{args.experiment}_{key}.png")
            print(f"wrote {out}" if out else f"no run records of {args.experiment} under {args.runs_root}")
    if (spec.get("figure") or {}).get("covariance"):
        out = covariance_figure(spec, Path(args.runs_root), Path(args.out) / f"{args.experiment}_covariance.png")
        print(f"wrote {out}" if out else f"no stored posteriors of {args.experiment} under {args.runs_root}")
    if (spec.get("figure") or {}).get("boxes"):
        out = box_figure(spec, Path(args.runs_root), Path(args.out) / f"{args.experiment}_boxes.png")
        print(f"wrote {out}" if out else f"no run records of {args.experiment} under {args.runs_root}")
    if fig.get("final_table"):   # beside the tables: results/tables/<experiment>_final.md
        table = Path(args.out).parent / "tables" / f"{args.experiment}_final.md"
        out = final_values_table(spec, Path(args.runs_root), table)
        print(f"wrote {out}" if out else f"no run records of {args.experiment} under {args.runs_root}")
    return 0


def cmd_report(args) -> int:
    import time
    from bnnbench.present.report import build_site
    t = time.perf_counter()
    pages = build_site(Path(args.results), Path(args.out))
    index = Path(args.out) / "index.html"
    print(f"wrote {len(pages)} pages to {args.out} in {time.perf_counter() - t:.1f} s; open {index}")
    return 0


def cmd_check_method(args) -> int:
    """Exit 0 when every contract check passes, 1 (with what failed and why) when one does not."""
    from bnnbench.run.contract import check_method
    from bnnbench.methods import UnknownMethodError
    try:
        results = check_method(args.name)
    except UnknownMethodError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for check, why in results:
        print(f"  {'ok  ' if why is None else 'FAIL'}  {check}" + (f": {why}" if why else ""))
    failed = [c for c, why in results if why is not None]
    print(f"{args.name}: " + (f"{len(failed)} of {len(results)} contract checks failed; fix them before a long run"
                              if failed else f"all {len(results)} contract checks passed"))
    return 1 if failed else 0


def cmd_list(args) -> int:
    from bnnbench.core.data import list_datasets
    from bnnbench.methods import METHODS
    what = args.what
    if what in ("all", "datasets"):
        print("datasets:    " + ", ".join(list_datasets()))
    if what in ("all", "methods"):
        print("methods:     " + ", ".join(f"{n} (solved)" if METHODS[n].solved else n for n in sorted(METHODS)))
        print("  on convolutional networks (model=vgg_mnist, vgg16_half): "
              + ", ".join(n for n in sorted(METHODS) if METHODS[n].conv))
    if what in ("all", "models"):
        print("models:      " + ", ".join(list_names("model")))
    if what in ("all", "protocols"):
        print("protocols:   " + ", ".join(list_names("protocol")))
    if what in ("all", "experiments"):
        print("experiments: " + ", ".join(list_names("experiment")))
    return 0


def cmd_data(args) -> int:
    from bnnbench.core.data import cli as data_cli
    if args.action == "list":
        return data_cli(["--list"])
    return data_cli([*args.names, "--prepare"])


def cmd_regression(args) -> int:
    from bnnbench.core.data import DataError
    from bnnbench.judge.regression_check import main as regression_main
    try:
        return regression_main(args)
    except DataError as e:   # a re-run needs the data set: one line that says how to get it, never a traceback
        say_error(str(e))
        return EXIT_CONFIG


def main(argv: list[str] | None = None) -> int:
    """The command line. SIGTERM stops it as Ctrl-C does (``bnnbench.run.signals``); an interruption outside a run
    (while starting up, rendering tables) is one line and exit 130 (Ctrl-C) or 143 (SIGTERM), never a traceback."""
    try:
        with sigterm_interrupts():
            return _main(list(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt as e:
        print(f"\ninterrupted ({how(e)}) while no run was training: nothing to resume", file=sys.stderr, flush=True)
        return exit_code(e)


def _main(argv: list[str]) -> int:
    # here: it imports numpy, after main's signal handling is in place
    from bnnbench.judge.regression_check import MAX_CELL_S
    if argv and argv[0] == "run":
        if any(a in HELP_FLAGS for a in argv[1:]):
            print(RUN_USAGE)
            return 0
        return cmd_run(argv[1:])
    p = argparse.ArgumentParser(prog="bnnbench", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="run one configuration (Hydra overrides follow; -m sweeps; run --help: the syntax)")
    r = sub.add_parser("reproduce", help="run the missing cells of an experiment, then write its tables")
    r.add_argument("experiment")
    r.add_argument("overrides", nargs="*", help="Hydra overrides applied to every cell")
    r.add_argument("--runs-root", default=RECORDS, help=RECORDS_HELP)
    r.add_argument("--out", help=OUT_HELP.format("tables"))
    r.add_argument("--figures", help="where the figures go (default: figures/ beside --out: results/figures)")
    r.add_argument("--jobs", type=int, default=1, help="cells run at a time in worker processes")
    r.add_argument("--data", help="only the cells of these data sets (comma list, e.g. libsvm/a1a,usps/3vs5)")
    r.add_argument("--label", help="only the cells of these methods / run labels (comma list)")
    from bnnbench.run.launchers import add_arguments as launcher_arguments
    launcher_arguments(r)   # --launcher joblib | submitit_slurm | ... and its settings
    t = sub.add_parser("table", help="render an experiment's table from its run records")
    t.add_argument("experiment")
    t.add_argument("--runs-root", default=RECORDS, help=RECORDS_HELP)
    t.add_argument("--out", help=OUT_HELP.format("tables"))
    pl = sub.add_parser("plot", help="an experiment's figures from its stored run records (no training)")
    pl.add_argument("experiment")
    pl.add_argument("--runs-root", default=RECORDS, help=RECORDS_HELP)
    pl.add_argument("--out", help=OUT_HELP.format("figures"))
    lst = sub.add_parser("list", help="list data sets, methods, protocols and experiments")
    lst.add_argument("what", nargs="?", default="all",
                     choices=["all", "datasets", "methods", "models", "protocols", "experiments"])
    d = sub.add_parser("data", help="fetch and verify data sets")
    d.add_argument("action", choices=["list", "fetch"])
    d.add_argument("names", nargs="*", default=["all"], help="data set ids, a family (uci, libsvm) or all")
    rp = sub.add_parser("report", help="a static site of the results (results/site/index.html), from the records")
    rp.add_argument("--results", default=str(RESULTS))
    rp.add_argument("--out", default=str(RESULTS / "site"))
    cm = sub.add_parser("check-method", help="the suite's contract checks on a method (yours too) on a tiny problem")
    cm.add_argument("name")
    g = sub.add_parser("regression", help="re-run the short cells of the paper tables and fail on any moved number")
    g.add_argument("--results", default=str(RESULTS))
    g.add_argument("--runs-root", default="runs/regression")
    g.add_argument("--only", nargs="*", default=[], metavar="EXP[/LABEL[/DATA]]",
                   help="only these cells (an experiment, a column of it, or one cell: nng_table4/pbp/uci/yacht)")
    g.add_argument("--max-cell-s", type=float, default=None,
                   help="re-run a cell outside its experiment's own subset when its record says the re-run takes "
                        f"at most this many seconds (default: the experiment's regression_max_cell_s, else "
                        f"{MAX_CELL_S:g})")
    g.add_argument("--references", action="store_true",
                   help="with --only: re-run the reference runs (HMC) of paired metrics it names, not only the columns")
    g.add_argument("--list", action="store_true", help="list the cells it would re-run, with their cost; run nothing")
    g.add_argument("--rerecord", action="store_true",
                   help="write the re-runs' numbers into the committed records where they moved (a deliberate change)")
    g.add_argument("--baseline", action="store_true",
                   help="on a machine of another numerics class than the records (its CPU rounds differently): "
                        "write what the re-runs give here as this class's baseline (results/regression/), not fail")
    g.add_argument("--reuse-runs", action="store_true",
                   help="take a re-run already in --runs-root (the same configuration; say, of a check that has just "
                        "failed at this commit) instead of training it again")
    g.add_argument("--train-only", action="store_true",
                   help="a worker: re-run the cells into --runs-root (a fresh one), skipping those already there or "
                        "being re-run by another worker, and compare nothing; then the check with --reuse-runs "
                        "compares (how .ci/run spreads the re-runs over its cores)")
    g.add_argument("--reason", help="with --rerecord or --baseline: why the numbers move (stored with them)")
    args, extra = p.parse_known_args(argv)
    if args.cmd == "reproduce":  # overrides may also follow the options
        args.overrides += [a for a in extra if not a.startswith("-")]
        extra = [a for a in extra if a.startswith("-")]
    if extra:
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.cmd in ("reproduce", "table", "plot"):
        known = set(list_names("experiment"))
        if args.experiment not in known:
            p.error(f"unknown experiment {args.experiment!r}; valid: {', '.join(sorted(known))}")
    return {"reproduce": cmd_reproduce, "table": cmd_table, "plot": cmd_plot, "list": cmd_list, "data": cmd_data,
            "regression": cmd_regression, "check-method": cmd_check_method, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
