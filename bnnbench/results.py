"""Run records: one ``record.json`` per finished run, written atomically.

A run directory holds either ``record.json`` (a result) or ``failed.json`` (a diverged or broken run,
with its reason), never both, and never a half-written file: each is written to a temporary file in
the same directory and moved into place with ``os.replace``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from pathlib import Path

RECORD = "record.json"
FAILED = "failed.json"
HISTORY = "history.json"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file in the same directory, fsync, then ``os.replace``: readers
    see the old file or the new one, never a partial one. Permissions as for a plain new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, default=_jsonable))


def _jsonable(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _drop_none(obj):
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, (list, tuple)):
        return [_drop_none(v) for v in obj]
    return obj


# top-level settings left out of the hash at this value: what every record made before the setting existed ran with
# (``threads``: 1 thread is the reference order of float reductions; bnnbench.threads)
HASH_DEFAULTS = {"threads": 1}


def config_hash(config: dict) -> str:
    """Hash of the resolved run configuration (what decides the numbers), for skip-if-done.
    Unset (``None``) entries, and top-level entries at their ``HASH_DEFAULTS`` value, are left out, so adding an
    optional setting keeps finished runs valid."""
    config = {k: v for k, v in config.items() if k not in HASH_DEFAULTS or v != HASH_DEFAULTS[k]}
    blob = json.dumps(_drop_none(config), sort_keys=True, default=_jsonable).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_record(run_dir: Path, record: dict, history: dict | None = None) -> Path:
    run_dir = Path(run_dir)
    if history is not None:
        atomic_write_json(run_dir / HISTORY, history)
    atomic_write_json(run_dir / RECORD, record)
    (run_dir / FAILED).unlink(missing_ok=True)
    return run_dir / RECORD


def write_failure(run_dir: Path, reason: str, record: dict) -> Path:
    run_dir = Path(run_dir)
    (run_dir / RECORD).unlink(missing_ok=True)
    atomic_write_json(run_dir / FAILED, {**record, "status": "failed", "reason": reason})
    return run_dir / FAILED


def load_record(run_dir: Path) -> dict | None:
    p = Path(run_dir) / RECORD
    if not p.exists():
        return None
    with open(p) as f:
        return json.load(f)


def is_done(run_dir: Path, chash: str) -> bool:
    """A finished record exists for exactly this configuration (its hash is recomputed from the
    configuration stored in the record, so records outlive changes of the hashing)."""
    rec = load_record(run_dir)
    if rec is None or rec.get("status") != "ok" or "config" not in rec:
        return False
    return stored_config_hash(rec) == chash


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
    return out


_GIT_COMMIT: list = []


def git_commit() -> str | None:
    """The commit of the source tree (``-dirty`` with uncommitted changes), read once per process:
    the code a long-running process executes is the code it loaded, not what HEAD says later."""
    if not _GIT_COMMIT:
        _GIT_COMMIT.append(_read_git_commit())
    return _GIT_COMMIT[0]


def _read_git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parent.parent
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        # results/ is excluded: a finished run deletes its committed checkpoint, which is not a code change
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
                               cwd=root, capture_output=True, text=True, timeout=5).stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:
        return None
