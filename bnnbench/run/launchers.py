"""The cells of ``bnnbench reproduce`` as jobs through Hydra's launcher plugins: ``reproduce <experiment> --launcher
joblib`` (processes on this machine), ``submitit_slurm`` (a SLURM cluster), ``submitit_local`` (local processes that
behave like SLURM jobs, for testing), or a ``hydra/launcher`` config of yours.

What a job is. ``reproduce`` lists the cells it would run (``cli.cmd_reproduce``: the ``--data`` / ``--label`` filters
applied); each becomes one job, except that cells which read another cell's record (their overrides name
``{runs_root}``: Vprop with Vadam's per-data-set selection in ``vadam_table1``) go into one job with that cell, after
it (``jobs_of``). A job runs its cells one after another through ``cell.reproduce_cell``, the code path of a plain
``reproduce`` (and ``--jobs``), in the directory the command was started from, so ``--runs-root`` means the same path
there (it is part of a record's configuration where a cell names ``{runs_root}``): records and resume state live on
the shared file system, and the per-directory lock (``results.claimed``) keeps two jobs, or two commands, off one
cell. When every job has ended, ``reproduce`` renders the experiment's figures and tables as usual, and reports each
job that did not end well by its cells and its log.

How the launcher is called. Hydra's launchers are plugins with one public interface (``hydra.plugins.launcher.
Launcher``: ``setup`` with a Hydra context, a task function and the composed configuration, then ``launch`` with one
list of overrides per job), which Hydra's own sweeper calls. ``hydra.main`` is not used: it returns nothing from a
multirun, while here every job's result is needed, and ``bnnbench`` parses its own command line. So this module
composes the configuration with ``hydra/launcher=<name>`` and the launcher's settings (``hydra.compose`` with
``return_hydra_config``), instantiates the launcher as Hydra does (``Plugins.instantiate_launcher``), and launches
one job per group of cells, each with its own output directory (``hydra.sweep.subdir``). The Hydra context needs a
``Callbacks`` object, which Hydra keeps in ``hydra._internal.callbacks`` (the one internal import; hydra-core 1.1-1.3).
No engine of ours: joblib and submitit do the scheduling.

Each job writes, in ``<log dir>/<job name>/``: ``job.log`` (everything its cells print, torch's warnings and any
traceback), ``job.pid`` (host and process) and, when it ends, ``result.json``. A job that has no ``result.json``
after the launch was killed (by the scheduler, out of memory, out of time) or never started; the launcher's own logs
(submitit: ``<log dir>/.submitit/``) say more. submitit's launcher raises at the first such job: then the jobs still
running are waited for (submitit's own job handles) before the tables are rendered.

A job killed by the scheduler (SIGTERM, then SIGKILL) leaves its cell's resume state (``results.ResumeFiles``: the
finished selection rounds, the training checkpoint every ``checkpoint_every`` epochs, ``checkpoint_seconds`` apart);
the same command resubmits it, finished cells are skipped and the killed one resumes there, to the numbers of an
uninterrupted run (``threads=auto`` keeps the count it started with: ``threads.adopt_earlier``). SIGTERM is left to
the launcher: submitit ignores it in a job so that a preempted SLURM job can be requeued (``max_num_timeout``) and
resume.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bnnbench.core.errors import say_error
from bnnbench.run.config import cell_label, slug

RESULT, LOG, PID = "result.json", "job.log", "job.pid"
EXIT_CONFIG, EXIT_FAILED = 2, 3
# command-line option -> the setting of submitit's launchers (hydra_submitit_launcher.config)
SUBMITIT = {"partition": "partition", "time": "timeout_min", "cpus": "cpus_per_task", "gpus": "gpus_per_node",
            "mem": "mem_gb"}


@dataclass(frozen=True)
class Job:
    name: str                   # its output directory under the log directory
    cells: tuple[tuple[str, ...], ...]   # each cell's overrides, in the order the job runs them
    titles: tuple[str, ...]     # "<label> on <data set>", per cell


def add_arguments(parser) -> None:
    """The options of ``reproduce`` that send its cells out as jobs."""
    g = parser.add_argument_group("jobs through a Hydra launcher (README: On a cluster)")
    g.add_argument("--launcher", metavar="NAME",
                   help="one job per cell through hydra/launcher=NAME: joblib (this machine; --jobs N at a time, "
                        "default all cores), submitit_slurm, submitit_local, or a config of yours in "
                        "configs/hydra/launcher/")
    g.add_argument("--partition", help="submitit_slurm: the SLURM partition")
    g.add_argument("--time", type=int, metavar="MINUTES", help="submitit: each job's time limit (timeout_min)")
    g.add_argument("--cpus", type=int, help="submitit: CPUs per job (cpus_per_task)")
    g.add_argument("--gpus", type=int, help="submitit: GPUs per job (gpus_per_node); add device=cuda to run on them")
    g.add_argument("--mem", type=int, metavar="GB", help="submitit: memory per job (mem_gb)")
    g.add_argument("--launcher-set", action="append", default=[], metavar="KEY=VALUE",
                   help="any other setting of the launcher (hydra.launcher.KEY), e.g. account=abc, qos=high, "
                        "max_num_timeout=3; repeatable")
    g.add_argument("--log-dir", help="each job's log and result (default: multirun/<experiment>/<date>_<time>); "
                                     "on the shared file system for SLURM")


def wanted(args) -> bool:
    """Whether ``reproduce`` was asked for jobs (``--launcher`` or any launcher setting)."""
    return bool(getattr(args, "launcher", None) or getattr(args, "launcher_set", None)
                or any(getattr(args, k, None) is not None for k in SUBMITIT))


def jobs_of(experiment: str, cells: list) -> list[Job]:
    """The jobs of ``cells`` (``(cell, overrides)`` pairs as ``reproduce`` lists them): one per cell, and one per group
    of cells joined by a ``{runs_root}/<experiment>/<label>/<data set>`` reference in a cell's overrides (the
    referenced cell first)."""
    keys = [f"{experiment}/{cell_label(c)}/{slug(c['data'])}" for c, _ in cells]
    index = {k: i for i, k in enumerate(keys)}
    parent = list(range(len(cells)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    needs = [set() for _ in cells]
    for i, (c, _) in enumerate(cells):
        for o in c.get("overrides", []):
            for ref in re.findall(r"\{runs_root\}/([^\s,\]'\"]+)", o):
                j = index.get(ref.strip("/"))
                if j is not None and j != i:
                    needs[i].add(j)
                    parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(cells)):
        groups.setdefault(root(i), []).append(i)
    jobs = []
    for members in sorted(groups.values()):
        order, left = [], list(members)
        while left:   # the referenced cells first, otherwise the experiment's order
            ready = [i for i in left if needs[i] <= set(order)] or left[:1]
            order.append(ready[0])
            left.remove(ready[0])
        labels = list(dict.fromkeys(cell_label(cells[i][0]) for i in order))
        datas = list(dict.fromkeys(slug(cells[i][0]["data"]) for i in order))
        name = re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{len(jobs):03d}-{'+'.join(labels)}-{'+'.join(datas)}")[:120]
        jobs.append(Job(name, tuple(tuple(cells[i][1]) for i in order),
                        tuple(f"{cell_label(cells[i][0])} on {cells[i][0]['data']}" for i in order)))
    return jobs


@contextmanager
def _logged_to(path: Path):
    """This process's stdout and stderr (file descriptors 1 and 2: torch's and tracebacks too) appended to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def run_job(experiment: str, runs_root: str, job: Job, out: Path, cwd: str, cores: int | None = None) -> dict:
    """Run the cells of ``job`` in this process (a job of the launcher), one after another as ``reproduce`` does,
    logging into ``out/job.log``; stops at a cell that raises (the cells after it may need its record). Returns, and
    writes into ``out/result.json``, ``{"job", "status" (ok | failed | interrupted), "lines", "error", "cell"}``."""
    from bnnbench.run.cell import reproduce_cell
    from bnnbench.run.results import atomic_write_json
    try:   # a cell stopped by a signal, where the command line turns signals into this (bnnbench.run.signals)
        from bnnbench.run.signals import CellInterrupted
    except ImportError:
        CellInterrupted = ()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(cwd)   # --runs-root as typed: relative to where the command was started
    (out / RESULT).unlink(missing_ok=True)
    ident = {"host": socket.gethostname(), "pid": os.getpid()}
    try:
        import submitit
        ident["scheduler_job"] = submitit.JobEnvironment().job_id
    except Exception:   # not a submitit job (joblib)
        pass
    (out / PID).write_text(json.dumps(ident))
    result = {"job": job.name, "status": "ok", "lines": [], "error": None, "cell": None}
    with _logged_to(out / LOG):
        print(f"job {job.name} on {ident['host']} (pid {ident['pid']}), {time.strftime('%Y-%m-%d %H:%M:%S')}: "
              f"{'; '.join(job.titles)}", flush=True)
        for title, ov in zip(job.titles, job.cells):
            try:
                text = reproduce_cell(experiment, runs_root, list(ov), cores)
            except KeyboardInterrupt:
                result.update(status="interrupted", cell=title,
                              error="interrupted; its resume state is kept and the same command resumes it")
                break
            except CellInterrupted as e:
                result.update(status="interrupted", cell=title, error=e.args[0] if e.args else "interrupted")
                break
            except BaseException as e:   # noqa: BLE001 - a job reports every failure by its cell, never dies of it
                traceback.print_exc()
                result.update(status="failed", cell=title, error=f"{type(e).__name__}: {e}")
                break
            if text is None:   # a cell not started: this process was told to stop
                result.update(status="interrupted", cell=title, error="not started: the job was told to stop")
                break
            print(text, flush=True)
            result["lines"].append(text)
        print(f"job {job.name}: {result['status']}" + (f" at {result['cell']}: {result['error']}"
                                                          if result["error"] else ""), flush=True)
    atomic_write_json(out / RESULT, result)
    return result


class _Task:
    """The task function of every job (pickled into the launcher's processes): runs job number ``hydra.job.num``."""

    def __init__(self, experiment: str, runs_root: str, jobs: list[Job], cwd: str, cores: int | None):
        self.experiment, self.runs_root, self.jobs, self.cwd, self.cores = experiment, runs_root, jobs, cwd, cores

    def __call__(self, cfg) -> dict:
        from hydra.core.hydra_config import HydraConfig
        hc = HydraConfig.get()
        return run_job(self.experiment, self.runs_root, self.jobs[int(hc.job.num)], Path(hc.runtime.output_dir),
                       self.cwd, self.cores)


def _overrides(args, n_jobs: int | None) -> list[str]:
    out = [f"{SUBMITIT[k]}={getattr(args, k)}" for k in SUBMITIT if getattr(args, k, None) is not None]
    if n_jobs is not None:
        out.append(f"n_jobs={n_jobs}")
    return out + list(args.launcher_set or [])


def _compose(name: str, log_dir: Path, job_name: str, settings: list[str]):
    """The configuration with ``hydra/launcher=name`` and its ``settings``, and Hydra's context for the launcher."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    from bnnbench.run.config import config_dir, register_resolvers
    register_resolvers()
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = compose(config_name="config", return_hydra_config=True,
                      overrides=[f"hydra/launcher={name}", f"hydra.sweep.dir={log_dir}", f"hydra.job.name={job_name}",
                                 *(f"hydra.launcher.{s}" for s in settings)])
        return cfg, HydraContext(config_loader=GlobalHydra.instance().hydra.config_loader, callbacks=Callbacks(cfg))


def _launcher_settings(name: str) -> dict:
    """The settings (and ``_target_``) of ``hydra/launcher=name``; ``ValueError`` naming the valid launchers."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    try:
        cfg, _ = _compose(name, Path("/nonexistent"), "bnnbench", [])
    except HydraException as e:
        raise ValueError(f"unknown launcher {name!r} ({str(e).splitlines()[0]}); valid: joblib, submitit_local, "
                         "submitit_slurm (pip install 'bnnbench[cluster]'), or a file of yours in "
                         "configs/hydra/launcher/") from None
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=False)


def _wait_for_submitit(log_dir: Path, target: str, poll_s: float = 2.0) -> None:
    """Wait until every job that submitit's launcher submitted into ``log_dir`` has ended (its launcher stops collecting
    at the first job that ended without a result)."""
    import submitit
    from submitit.local import local
    folder, root = log_dir / ".submitit" / "%j", log_dir / ".submitit"
    ids = [p.name for p in root.iterdir() if p.is_dir() and p.name != "%j"] if root.is_dir() else []
    if "Slurm" in target:
        handles = [submitit.SlurmJob(folder=folder, job_id=i) for i in ids]
    else:
        handles = [local.LocalJob(folder=folder, job_id=i, process=local._PROCESSES.get(i)) for i in ids]
    while not all(h.done() for h in handles):
        time.sleep(poll_s)


def _why_no_result(ret, launch_error: BaseException | None) -> str:
    if ret is not None and getattr(ret, "_return_value", None) is not None and not isinstance(ret._return_value, dict):
        return f"{type(ret._return_value).__name__}: {ret._return_value}"
    if launch_error is not None:
        text = str(launch_error)
        trace = text.split("-" * 22)   # submitit's FailedJobError: the job's traceback between two rules
        said = ([x for x in trace[1].strip().splitlines() if x.strip()] or [""])[-1] if len(trace) > 2 else ""
        return (f"it ended without a result (killed by the scheduler, out of memory or time, or never started; "
                f"the launcher said {type(launch_error).__name__}: {(said or text.splitlines()[0]).strip()[:300]})")
    return "it ended without a result (killed, or never started)"


def launch(args, cells: list) -> int:
    """Run ``cells`` (as ``cmd_reproduce`` lists them) as jobs through ``--launcher``; print each job's output and
    every job that failed, by cell and log. Returns 0, or 3 when a job failed (2: a launcher setting is wrong)."""
    from bnnbench.run.threads import available_cores
    if not args.launcher:
        say_error("--partition, --time, --cpus, --gpus, --mem and --launcher-set need --launcher <name>")
        return EXIT_CONFIG
    jobs = jobs_of(args.experiment, cells)
    if not jobs:
        print(f"{args.experiment}: no cells to run")
        return 0
    try:
        settings = _launcher_settings(args.launcher)
    except ValueError as e:
        say_error(str(e))
        return EXIT_CONFIG
    target = str(settings.get("_target_", ""))
    joblib = "n_jobs" in settings
    n_jobs = (args.jobs if (args.jobs or 1) > 1 else available_cores()) if joblib else None
    wrong = [k for k in SUBMITIT if getattr(args, k, None) is not None and SUBMITIT[k] not in settings]
    if wrong:
        say_error(f"launcher {args.launcher} has no setting for --{', --'.join(wrong)} (its settings: "
               f"{', '.join(k for k in settings if not k.startswith('_'))})")
        return EXIT_CONFIG
    log_dir = Path(args.log_dir or Path("multirun") / args.experiment / time.strftime("%Y-%m-%d_%H-%M-%S")).resolve()
    from hydra.core.plugins import Plugins
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException
    try:
        cfg, context = _compose(args.launcher, log_dir, f"bnnbench-{args.experiment}", _overrides(args, n_jobs))
    except (HydraException, OmegaConfBaseException) as e:
        say_error(f"launcher {args.launcher}: {str(e).splitlines()[0]}")
        return EXIT_CONFIG
    cores = max(1, available_cores() // n_jobs) if joblib else None   # as each cell of reproduce --jobs N
    task = _Task(args.experiment, args.runs_root, jobs, os.getcwd(), cores)
    print(f"{args.experiment}: {len(jobs)} job(s) through hydra/launcher={args.launcher}"
          + (f" ({n_jobs} at a time)" if joblib else "") + f"; logs in {log_dir}/<job>/{LOG}", flush=True)
    for job in jobs:
        print(f"  {job.name}: {'; '.join(job.titles)}", flush=True)
    launcher = Plugins.instance().instantiate_launcher(hydra_context=context, task_function=task, config=cfg)
    returns, launch_error = [None] * len(jobs), None
    try:
        returns = list(launcher.launch([[f"hydra.sweep.subdir={job.name}"] for job in jobs], initial_job_idx=0))
    except Exception as e:   # submitit: a job that ended without a result; joblib: a worker that died
        launch_error = e
        if "submitit" in target:
            _wait_for_submitit(log_dir, target)
    failed = []
    for job, ret in zip(jobs, returns):
        path = log_dir / job.name / RESULT
        res = json.loads(path.read_text()) if path.is_file() else None
        for text in (res or {}).get("lines", []):
            print(text, flush=True)
        if res is None or res["status"] != "ok":
            failed.append((job, res, ret))
    for job, res, ret in failed:
        log = log_dir / job.name / LOG
        where = log if log.is_file() else (log_dir / ".submitit" if "submitit" in target else log_dir)
        why = " ".join(str(res["error"] if res else _why_no_result(ret, launch_error)).split())   # one line
        why = why if len(why) <= 400 else why[:397] + "..."
        cells = [res["cell"]] if res and res.get("cell") else list(job.titles)
        print(f"FAILED job {job.name}: cell {', '.join(cells)}: {why}; log: {where}", flush=True)
    if failed:
        print(f"{args.experiment}: {len(failed)} of {len(jobs)} job(s) failed; the same command resumes them "
              "(finished cells are skipped)", flush=True)
    return EXIT_FAILED if failed else 0
