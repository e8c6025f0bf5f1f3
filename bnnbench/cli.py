"""Command line: ``bnnbench run | reproduce | table | plot | list | data | regression``.

``run`` is a Hydra application: every argument after it is a Hydra override (``method=bbb
data=uci/boston protocol.epochs=10``), and ``-m`` sweeps over comma-separated values.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")
RESULTS = Path("results")       # the committed report, relative to the working directory (a checkout)
RECORDS = str(RESULTS / "runs")  # the run records that results/tables and results/figures are rendered from
RECORDS_HELP = f"the run records (default: {RECORDS})"


def config_dir() -> str:
    """The Hydra config tree: ``configs/`` of the source tree, installed as ``bnnbench.configs``."""
    try:
        import importlib.resources as ir
        p = Path(str(ir.files("bnnbench.configs")))
        if (p / "config.yaml").exists():
            return str(p)
    except Exception:  # pragma: no cover
        pass
    return CONFIG_DIR


def _register_resolvers():
    from omegaconf import OmegaConf
    if not OmegaConf.has_resolver("slug"):
        OmegaConf.register_new_resolver("slug", lambda name: str(name).replace("/", "__"))


def _summary_lines(record: dict) -> list[str]:
    lines = [f"{record['method']} on {record['dataset']} ({record['protocol']}), "
             f"{len(record['metrics'])} splits, {record['wall_time_s']:.1f}s:"]
    for k, s in record["summary"].items():
        lines.append(f"  {k:>18s} = {s['mean']:.4f} +- {s['stderr']:.4f}  (n={s['n']}, +- is {record['stderr_convention']})")
    lines.append(f"  the paper's log-likelihood convention for this protocol: {record['loglik_convention_of_paper']}")
    return lines


def _run_app():
    import hydra
    from hydra.core.hydra_config import HydraConfig

    @hydra.main(config_path=config_dir(), config_name="config", version_base=None)
    def app(cfg):
        from bnnbench.data import DataError
        from bnnbench.engine import DivergenceError
        from bnnbench.exact_vi import NotConvergedError
        from bnnbench.methods import UnknownMethodError
        from bnnbench.protocol import ConfigError
        from bnnbench.run import execute
        hc = HydraConfig.get()
        run_dir = Path(hc.runtime.output_dir)
        try:
            record = execute(cfg, list(hc.overrides.task), run_dir)
        except (DivergenceError, NotConvergedError) as e:
            print(f"error: run failed, no result written ({run_dir / 'failed.json'} has the reason): {e}",
                  file=sys.stderr)
            sys.exit(3)
        except (ConfigError, DataError, UnknownMethodError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        print("\n".join(_summary_lines(record)))
        print(f"record: {run_dir / 'record.json'}")

    app()


def compose(overrides: list[str]):
    from hydra import compose as hcompose, initialize_config_dir
    _register_resolvers()
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        return hcompose(config_name="config", overrides=overrides)


def experiment_spec(name: str) -> dict:
    from omegaconf import OmegaConf
    cfg = compose([f"experiment={name}"])
    return OmegaConf.to_container(cfg.experiment, resolve=True)


def list_names(group: str) -> list[str]:
    root = Path(config_dir()) / group
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def cell_own_overrides(cell, runs_root) -> list[str]:
    """An experiment cell's overrides, with ``{runs_root}`` (another cell's record, e.g. Vprop with Vadam's
    optimum) pointing into ``runs_root``."""
    return [o.replace("{runs_root}", str(runs_root)) for o in cell.get("overrides", [])]


def _cell_overrides(args, cell) -> list[str]:
    cell_ov = cell_own_overrides(cell, args.runs_root)
    return [f"experiment={args.experiment}", f"method={cell['method']}", f"data={cell['data']}",
            f"runs_root={args.runs_root}", *([f"label={cell['label']}"] if cell.get("label") else []),
            *cell_ov, *args.overrides]


def _reproduce_cell(experiment: str, runs_root: str, ov: list[str], cores: int | None = None) -> str:
    """Run one cell (in this process, or in a worker that may use ``cores`` cores); returns the lines to print."""
    from bnnbench.engine import DivergenceError
    from bnnbench.exact_vi import NotConvergedError
    from bnnbench.protocol import ConfigError
    from bnnbench.run import execute
    from bnnbench.threads import share_cores
    if cores:
        share_cores(cores)
    cfg = compose(ov)
    run_dir = Path(runs_root) / experiment / cfg.label / cfg.data.name.replace("/", "__")
    head = f"== {experiment}: {cfg.label} on {cfg.data.name} -> {run_dir}"
    try:
        rec = execute(cfg, ov, run_dir)
        return "\n".join([head, *_summary_lines(rec)])
    except (DivergenceError, NotConvergedError) as e:
        return f"{head}\n   FAILED (recorded in failed.json, not a result): {e}"
    except ConfigError as e:
        return f"{head}\n   skipped: {e}"


def cmd_reproduce(args) -> int:
    """Run every cell of an experiment that has no finished record, then write its tables.

    ``--data`` / ``--label`` (comma lists) keep only those cells. ``--jobs N`` runs N cells at a time
    in worker processes, each allowed cores // N (``threads=auto`` uses at most that); cells whose overrides
    name another cell's record (``{runs_root}``, e.g. Vprop with Vadam's hyper-parameters) start after all
    the others have finished."""
    spec = experiment_spec(args.experiment)
    keep_data = set(args.data.split(",")) if getattr(args, "data", None) else None
    keep_label = set(args.label.split(",")) if getattr(args, "label", None) else None
    cells = [(c, _cell_overrides(args, c)) for c in spec["runs"]
             if (keep_data is None or c["data"] in keep_data)
             and (keep_label is None or c.get("label", c["method"]) in keep_label)]
    waves = [[ov for c, ov in cells if not any("{runs_root}" in o for o in c.get("overrides", []))],
             [ov for c, ov in cells if any("{runs_root}" in o for o in c.get("overrides", []))]]
    jobs = int(getattr(args, "jobs", 1) or 1)
    for wave in waves:
        if jobs <= 1:
            for ov in wave:
                print(_reproduce_cell(args.experiment, args.runs_root, ov), flush=True)
            continue
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        from bnnbench.threads import available_cores
        cores = max(1, available_cores() // jobs)
        with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
            for out in pool.map(_reproduce_cell, [args.experiment] * len(wave), [args.runs_root] * len(wave),
                                wave, [cores] * len(wave)):
                print(out, flush=True)
    figures = args.figures or str(Path(args.out).parent / "figures")    # beside the tables
    cmd_plot(argparse.Namespace(experiment=args.experiment, runs_root=args.runs_root, out=figures))
    return cmd_table(args) if spec.get("reference") else 0


def cmd_table(args) -> int:
    from bnnbench.tables import build_table, write_tables
    spec = experiment_spec(args.experiment)
    df = build_table(spec, Path(args.runs_root))
    paths = write_tables(df, spec, Path(args.out))
    counts = df.groupby("verdict").size().to_dict()
    print(f"{args.experiment}: {counts}; wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def cmd_plot(args) -> int:
    from bnnbench.plots import box_figure, convergence_figure, covariance_figure
    spec = experiment_spec(args.experiment)
    out = convergence_figure(spec, Path(args.runs_root), Path(args.out) / f"{args.experiment}_convergence.png")
    print(f"wrote {out}" if out else f"no run histories of {args.experiment} under {args.runs_root}")
    if (spec.get("figure") or {}).get("covariance"):
        out = covariance_figure(spec, Path(args.runs_root), Path(args.out) / f"{args.experiment}_covariance.png")
        print(f"wrote {out}" if out else f"no stored posteriors of {args.experiment} under {args.runs_root}")
    if (spec.get("figure") or {}).get("boxes"):
        out = box_figure(spec, Path(args.runs_root), Path(args.out) / f"{args.experiment}_boxes.png")
        print(f"wrote {out}" if out else f"no run records of {args.experiment} under {args.runs_root}")
    return 0


def cmd_list(args) -> int:
    from bnnbench.data import list_datasets
    from bnnbench.logreg import EXACT_METHODS
    from bnnbench.methods import METHODS
    what = args.what
    if what in ("all", "datasets"):
        print("datasets:    " + ", ".join(list_datasets()))
    if what in ("all", "methods"):
        print("methods:     " + ", ".join(sorted(METHODS)) + "; exact VI (logistic regression): "
              + ", ".join(sorted(EXACT_METHODS)))
    if what in ("all", "protocols"):
        print("protocols:   " + ", ".join(list_names("protocol")))
    if what in ("all", "experiments"):
        print("experiments: " + ", ".join(list_names("experiment")))
    return 0


def cmd_data(args) -> int:
    from bnnbench.data import cli as data_cli
    if args.action == "list":
        return data_cli(["--list"])
    return data_cli([*args.names, "--prepare"])


def cmd_regression(args) -> int:
    from bnnbench.regression import main as regression_main
    return regression_main(args)


GROUPS = ("data", "method", "protocol", "hpo", "experiment", "model")


def check_choices(overrides: list[str]) -> str | None:
    """An error message for a config-group choice that does not exist (all valid ones listed;
    Hydra itself lists only the top level of nested groups such as ``data/uci``)."""
    import difflib
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.lstrip("+~")
        if key not in GROUPS or not value or value == "null":
            continue
        valid = list_names(key)
        for v in value.split(","):
            if v not in valid:
                close = difflib.get_close_matches(v, valid, n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                return f"unknown {key} {v!r}{hint}; valid: {', '.join(valid)}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        err = check_choices(argv[1:])
        if err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        _register_resolvers()
        sys.argv = [f"{Path(sys.argv[0]).name} run", *argv[1:]]
        _run_app()
        return 0
    p = argparse.ArgumentParser(prog="bnnbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("run", help="run one configuration (Hydra overrides follow; -m sweeps)")
    r = sub.add_parser("reproduce", help="run the missing cells of an experiment, then write its tables")
    r.add_argument("experiment")
    r.add_argument("overrides", nargs="*", help="Hydra overrides applied to every cell")
    r.add_argument("--runs-root", default=RECORDS, help=RECORDS_HELP)
    r.add_argument("--out", default=str(RESULTS / "tables"))
    r.add_argument("--figures", help="where the figures go (default: figures/ beside --out: results/figures)")
    r.add_argument("--jobs", type=int, default=1, help="cells run at a time in worker processes")
    r.add_argument("--data", help="only the cells of these data sets (comma list, e.g. libsvm/a1a,usps/3vs5)")
    r.add_argument("--label", help="only the cells of these methods / run labels (comma list)")
    t = sub.add_parser("table", help="render an experiment's table from its run records")
    t.add_argument("experiment")
    t.add_argument("--runs-root", default=RECORDS, help=RECORDS_HELP)
    t.add_argument("--out", default=str(RESULTS / "tables"))
    pl = sub.add_parser("plot", help="an experiment's figures from its stored run records (no training)")
    pl.add_argument("experiment")
    pl.add_argument("--runs-root", default=RECORDS, help=RECORDS_HELP)
    pl.add_argument("--out", default=str(RESULTS / "figures"))
    lst = sub.add_parser("list", help="list data sets, methods, protocols and experiments")
    lst.add_argument("what", nargs="?", default="all", choices=["all", "datasets", "methods", "protocols", "experiments"])
    d = sub.add_parser("data", help="fetch and verify data sets")
    d.add_argument("action", choices=["list", "fetch"])
    d.add_argument("names", nargs="*", default=["all"], help="data set ids, a family (uci, libsvm) or all")
    g = sub.add_parser("regression", help="re-run the fast subset of the tables and fail on a regressed cell")
    g.add_argument("--results", default=str(RESULTS))
    g.add_argument("--runs-root", default="runs/regression")
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
            "regression": cmd_regression}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
