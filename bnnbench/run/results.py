"""Run directories and what they hold: the one place that names, writes and reads them.

``<runs_root>/<experiment or adhoc>/<label>/<data set>/`` (``run_dir``) holds either ``record.json`` (a result)
or ``failed.json`` (a diverged or broken run, with its reason), never both; beside a record, ``history.json``
(metrics per evaluation) and, for Gaussian posteriors of linear models, ``posterior.npz``. While a run is
unfinished, its resume state sits there too (``ResumeFiles``: dot-files keyed by the configuration hash) and
is removed when the record lands. Nothing is ever half-written: every file goes through ``atomic_write``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import subprocess
from contextlib import contextmanager
from pathlib import Path

from bnnbench.core.files import atomic_write, atomic_write_json, atomic_write_text, jsonable, save_npz

__all__ = ["atomic_write", "atomic_write_json", "atomic_write_text", "save_npz"]   # the core's writes, as here before

RECORD = "record.json"
FAILED = "failed.json"
HISTORY = "history.json"
POSTERIOR = "posterior.npz"
PREDICTIVE = "predictive.npz"  # regression predictive at the test rows (protocol.save_predictive)
LOCK = ".lock"
ADHOC = "adhoc"  # the experiment part of a run directory outside any experiment


def run_dir(runs_root, experiment: str | None, label: str, dataset: str) -> Path:
    """Where the run of ``label`` (a method or a named variant) on ``dataset`` in ``experiment`` lives."""
    return Path(runs_root) / (experiment or ADHOC) / label / str(dataset).replace("/", "__")


class RunDirError(RuntimeError):
    """A run directory that cannot be used: not writable, or taken by another process."""


@contextmanager
def claimed(run_dir: Path):
    """Hold ``run_dir`` for this process while a run trains there: a second process asking for it (the same
    command started twice, or ``reproduce --jobs``) is refused at once instead of training the same cells again."""
    run_dir = Path(run_dir)
    created = _missing_dirs(run_dir)
    fd = _open_lock(run_dir)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise RunDirError(f"{run_dir} is in use by another bnnbench process (pid {holder}); wait for it to "
                              "finish (its record is then reused) or give this run its own label=<name>") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield run_dir
        finally:
            (run_dir / LOCK).unlink(missing_ok=True)
            _remove_if_empty([run_dir, *created[1:]])  # a run refused before it wrote anything leaves no trace
    finally:
        os.close(fd)


def _missing_dirs(run_dir: Path) -> list[Path]:
    """``run_dir`` and those of its ancestors that do not exist yet, innermost first: what claiming it creates."""
    out = []
    for d in (run_dir, *run_dir.parents):
        if d.exists():
            break
        out.append(d)
    return out


def _open_lock(run_dir: Path, tries: int = 3) -> int:
    """The lock file's descriptor, ``run_dir`` created first. A parent that another refused run removes between the two
    steps (``_remove_if_empty``) is created again."""
    for k in range(tries):
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            return os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            if k == tries - 1:
                raise RunDirError(f"cannot create the run directory {run_dir}: its parents keep vanishing") from None
        except OSError as e:
            raise RunDirError(f"cannot write the run directory {run_dir}: {e.strerror}; "
                              "choose another place with runs_root=<dir>") from None


def _remove_if_empty(dirs: list[Path]) -> None:
    """Remove each of ``dirs`` (innermost first) while it is empty; stop at the first that holds anything."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return


class ResumeFiles:
    """The resume state of an unfinished run of configuration ``chash`` in ``run_dir``: the finished rounds of
    its hyper-parameter search (``hpo``; Bayesian optimisation's rounds or the grid's one) and the checkpoints of a
    round part-trained (``rounds()``: ``.hpo-<hash>-round<k>.pt``), the final training's checkpoint (``fit``; worker
    chunks and stages add suffixes to its name) and each finished stage of a staged protocol (``stages``)."""

    def __init__(self, run_dir: Path, chash: str, n_stages: int = 0):
        self.dir, self.chash = Path(run_dir), chash
        self.hpo = self.dir / f".hpo-{chash}.pt"
        self.fit = self.dir / f".checkpoint-{chash}.pt"
        self.stages = [self.dir / f".stage{k}-{chash}.pt" for k in range(n_stages)]

    def rounds(self) -> list[Path]:
        """The checkpoints of search rounds' trainings (``selection.round_checkpoint``; worker chunks' parts too)."""
        return sorted(self.dir.glob(f".hpo-{self.chash}-round*.pt"))

    def existing(self) -> list[Path]:
        return [p for p in (self.hpo, self.fit, *self.stages, *self.dir.glob(f".checkpoint-{self.chash}-*.pt"),
                            *self.rounds()) if p.exists()]

    def remove(self) -> None:
        for p in self.existing():
            p.unlink(missing_ok=True)

    @staticmethod
    def in_dir(run_dir: Path) -> list[Path]:
        """Every resume file in ``run_dir``, of whatever configuration."""
        d = Path(run_dir)
        return sorted(p for pat in (".hpo-*.pt", ".checkpoint-*.pt", ".stage*-*.pt") for p in d.glob(pat)) \
            if d.is_dir() else []

    @staticmethod
    def in_dir_tree(runs_root: Path) -> list[Path]:
        """Every resume file in the run directories under ``runs_root``."""
        return [p for d in sorted(Path(runs_root).glob("*/*/*")) for p in ResumeFiles.in_dir(d)]

    def describe(self) -> str | None:
        """What a run of this configuration resumes from (``None``: nothing saved); reads the saved epoch and rounds."""
        import torch
        said = []
        done = len(torch.load(self.hpo, weights_only=False)) if self.hpo.exists() else 0
        if done:
            said.append(f"{done} finished hyper-parameter search round(s)")
        stem = f".hpo-{self.chash}-round{done}"
        part = [p for p in self.rounds() if p.name == f"{stem}.pt" or p.name.startswith(f"{stem}-part")]
        if part:
            epoch = min(torch.load(p, weights_only=False, map_location="cpu")["epoch"] for p in part)
            said.append(f"epoch {epoch} of search round {done + 1}")
        stages = sum(p.exists() for p in self.stages)
        if stages:
            said.append(f"{stages} finished training stage(s)")
        fits = [self.fit] if self.fit.exists() else sorted(self.dir.glob(f".checkpoint-{self.chash}-*.pt"))
        epochs = [torch.load(p, weights_only=False, map_location="cpu")["epoch"] for p in fits]
        if epochs:
            said.append(f"epoch {min(epochs)} of the final training")
        return ", ".join(said) or None


def save_checkpoint(path: Path, payload: dict) -> Path:
    """``torch.save`` of ``payload`` (tensors, generator states), atomically."""
    import torch
    return atomic_write(path, lambda f: torch.save(payload, f))


def save_posterior(run_dir: Path, mean, cov) -> Path:
    """A Gaussian q (one split's mean and covariance, float32) beside the record, for figures without retraining."""
    import numpy as np
    return save_npz(Path(run_dir) / POSTERIOR, mean=np.asarray(mean, dtype=np.float32),
                    cov=np.asarray(cov, dtype=np.float32))


def load_posterior(run_dir: Path):
    """``(mean, cov)`` in float64 of a finished run's stored posterior, else ``None``."""
    import numpy as np
    path = Path(run_dir) / POSTERIOR
    if not path.exists() or not (Path(run_dir) / RECORD).exists():
        return None
    z = np.load(path)
    return z["mean"].astype(np.float64), z["cov"].astype(np.float64)


def save_predictive(run_dir: Path, arrays: dict) -> Path:
    """Each split's predictive mean and variance at its test rows (``fit.predictive``) beside the record."""
    return save_npz(Path(run_dir) / PREDICTIVE, **arrays)


def load_predictive(run_dir: Path) -> dict | None:
    """A finished run's stored predictive (``save_predictive``) as arrays, else ``None``."""
    import numpy as np
    path = Path(run_dir) / PREDICTIVE
    if not path.exists() or not (Path(run_dir) / RECORD).exists():
        return None
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def load_history(run_dir: Path) -> dict | None:
    """A finished run's ``history.json`` (``epochs``, ``metrics`` per evaluation, ``splits``), else ``None``."""
    p = Path(run_dir) / HISTORY
    if not p.exists() or not (Path(run_dir) / RECORD).exists():
        return None
    with open(p) as f:
        return json.load(f)


def _drop_none(obj):
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, (list, tuple)):
        return [_drop_none(v) for v in obj]
    return obj


# top-level settings left out of the hash at this value: what every record made before the setting existed ran with
# (``threads``: 1 thread is the reference order of float reductions; bnnbench.run.threads; ``compile``: the eager step,
# bnnbench.run.compiled; ``rng``: torch's generator, bnnbench.core.prng)
HASH_DEFAULTS = {"threads": 1, "compile": False, "rng": "torch"}


def config_hash(config: dict) -> str:
    """Hash of the resolved run configuration (what decides the numbers), for skip-if-done.
    Unset (``None``) entries, and top-level entries at their ``HASH_DEFAULTS`` value, are left out, so adding an
    optional setting keeps finished runs valid."""
    config = {k: v for k, v in config.items() if k not in HASH_DEFAULTS or v != HASH_DEFAULTS[k]}
    blob = json.dumps(_drop_none(config), sort_keys=True, default=jsonable).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_record(run_dir: Path, record: dict, history: dict | None = None) -> Path:
    run_dir = Path(run_dir)
    if history is not None:
        atomic_write_json(run_dir / HISTORY, history, compact=True)  # metrics per evaluation and replica
    atomic_write_json(run_dir / RECORD, record)
    (run_dir / FAILED).unlink(missing_ok=True)
    return run_dir / RECORD


def write_failure(run_dir: Path, reason: str, record: dict) -> Path:
    run_dir = Path(run_dir)
    (run_dir / RECORD).unlink(missing_ok=True)
    atomic_write_json(run_dir / FAILED, {**record, "status": "failed", "reason": reason})
    return run_dir / FAILED


def finished_run_dirs(runs_root, experiment: str | None) -> list[Path]:
    """The run directories of ``experiment`` (``None``: the ad-hoc runs) under ``runs_root`` that hold a record or a
    failure."""
    return sorted(d for d in (Path(runs_root) / (experiment or ADHOC)).glob("*/*")
                  if (d / RECORD).is_file() or (d / FAILED).is_file())


def load_record(run_dir: Path) -> dict | None:
    """A run directory's ``record.json``, or ``None`` where there is none (or it cannot be read)."""
    try:
        with open(Path(run_dir) / RECORD) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def recorded_failure(run_dir: Path, chash: str) -> str | None:
    """The reason ``failed.json`` gives where it records a failure of exactly this configuration (the hash recomputed
    from the configuration it stores, as ``is_done`` does for records), else ``None``."""
    try:
        with open(Path(run_dir) / FAILED) as f:
            failed = json.load(f)
    except (OSError, ValueError):
        return None
    if "config" not in failed or stored_config_hash(failed) != chash:
        return None
    return str(failed.get("reason", "no reason recorded"))


def is_done(run_dir: Path, chash: str) -> bool:
    """A finished record exists for exactly this configuration (its hash is recomputed from the
    configuration stored in the record, so records outlive changes of the hashing)."""
    rec = load_record(run_dir)
    if rec is None or rec.get("status") != "ok" or "config" not in rec:
        return False
    return stored_config_hash(rec) == chash


def flat_config(config: dict, prefix: str = "") -> dict:
    """A stored configuration as ``{dotted key: value}``, unset entries and the command line's overrides left out."""
    out = {}
    for k, v in (config or {}).items():
        if k == "hydra_overrides" or v is None:
            continue
        if isinstance(v, dict):
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(a: dict, b: dict, most: int = 6) -> list[str]:
    """The dotted keys whose values differ between two stored configurations (unset entries left out)."""
    fa, fb = flat_config(a), flat_config(b)
    keys = sorted(k for k in fa.keys() | fb.keys() if json.dumps(fa.get(k), default=jsonable)
                  != json.dumps(fb.get(k), default=jsonable))
    return [*keys[:most], *([f"{len(keys) - most} more"] if len(keys) > most else [])]


def stored_config_hash(record: dict) -> str:
    """``config_hash`` of the resolved configuration a record stores (its Hydra overrides left out)."""
    return config_hash({k: v for k, v in record["config"].items() if k != "hydra_overrides"})


def versions() -> dict:
    import numpy
    import torch
    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__}
    for mod in ("scipy", "pandas", "sklearn", "hydra", "omegaconf"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # pragma: no cover - optional
            pass
    from bnnbench import __version__
    out["bnnbench"] = __version__
    # CPU results are bitwise reproducible for a given thread count (it fixes the order of float reductions)
    out["torch_threads"] = torch.get_num_threads()
    # and for a given class of CPU (bnnbench.run.numerics: one wheel rounds differently on other instruction sets)
    from bnnbench.run.numerics import numerics_class
    out["numerics"] = numerics_class()
    return out


_GIT_COMMIT: list = []


def git_commit() -> str | None:
    """The commit of the source tree (``-dirty`` with uncommitted changes), read once per process:
    the code a long-running process executes is the code it loaded, not what HEAD says later."""
    if not _GIT_COMMIT:
        _GIT_COMMIT.append(_read_git_commit())
    return _GIT_COMMIT[0]


def _read_git_commit() -> str | None:
    """``$BNNBENCH_GIT_COMMIT`` where the code runs from an installed copy outside its clone (a lent GPU machine, see
    bench/gpu_session.sh), else ``git rev-parse HEAD`` of the source tree."""
    if os.environ.get("BNNBENCH_GIT_COMMIT"):
        return os.environ["BNNBENCH_GIT_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[2]
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        # results/ is excluded: a finished run deletes its committed checkpoint, which is not a code change
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
                               cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:
        return None
