"""One cell of an experiment, run in this process: what ``bnnbench reproduce`` does per cell (in its own process, a
worker of ``--jobs N``, or a job of a launcher, ``bnnbench.run.launchers``), and the lines it prints of a record."""

from __future__ import annotations

from pathlib import Path


def summary_lines(record: dict) -> list[str]:
    """A record as the command line prints it: the run, then each summary metric's mean and standard error."""
    lines = [f"{record['method']} on {record['dataset']} ({record['protocol']}), "
             f"{len(record['metrics'])} splits, {record['wall_time_s']:.1f}s:"]
    for k, s in record["summary"].items():
        lines.append(f"  {k:>18s} = {s['mean']:.4f} +- {s['stderr']:.4f}  "
                     f"(n={s['n']}, +- is {record['stderr_convention']})")
    lines.append(f"  the paper's log-likelihood convention for this protocol: {record['loglik_convention_of_paper']}")
    return lines


def run_dir_of(cfg) -> Path:
    """The run directory of a composed configuration (``results.run_dir``)."""
    from bnnbench.run.results import run_dir
    return run_dir(cfg.runs_root, cfg.experiment.name if cfg.get("experiment") else None, cfg.label, cfg.data.name)


def reproduce_cell(experiment: str, runs_root: str, ov: list[str], cores: int | None = None) -> str | None:
    """Run one cell (in this process, or in a worker that may use ``cores`` cores); returns the lines to print, or
    ``None`` for a cell a stopping worker does not start. An interrupted cell raises ``CellInterrupted`` with its
    line."""
    from bnnbench.run.signals import in_cell, stopping
    if stopping():
        return None
    with in_cell():
        return _run_cell(experiment, ov, cores)


def _run_cell(experiment: str, ov: list[str], cores: int | None) -> str:
    from bnnbench.run.config import ConfigError, compose
    from bnnbench.run.engine import DivergenceError
    from bnnbench.run.execute import execute
    from bnnbench.methods.exact.exact_vi import NotConvergedError
    from bnnbench.run.results import RunDirError
    from bnnbench.run.signals import CellInterrupted, exit_code, resume_line
    from bnnbench.run.threads import share_cores
    if cores:
        share_cores(cores)
    cfg = compose(ov)
    run_dir = run_dir_of(cfg)
    head = f"== {experiment}: {cfg.label} on {cfg.data.name} -> {run_dir}"
    try:
        rec = execute(cfg, ov, run_dir)
        return "\n".join([head, *summary_lines(rec)])
    except (DivergenceError, NotConvergedError) as e:
        return f"{head}\n   FAILED (recorded in failed.json, not a result): {e}"
    except (ConfigError, RunDirError) as e:
        return f"{head}\n   skipped: {e}"
    except KeyboardInterrupt as e:
        raise CellInterrupted(resume_line(run_dir, e), exit_code(e)) from None
