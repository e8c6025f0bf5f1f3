"""Files written whole or not at all: every file bnnbench writes (records, caches, tables, figures' data) goes
through ``atomic_write`` (a temporary file beside the target, fsync, ``os.replace``), so that a reader, or a run
interrupted at any moment, never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> Path:
    """``write(f)`` into a fresh temporary file beside ``path``, fsync, then ``os.replace``: readers see the old
    file or the new one, never a partial one, and concurrent writers never share a temporary file. Permissions
    as for a plain new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def atomic_write_json(path: Path, obj, compact: bool = False) -> None:
    """``obj`` as JSON, atomically: indented for reading, or ``compact`` (one line, no spaces) for bulk data."""
    text = json.dumps(obj, separators=(",", ":"), default=jsonable) if compact else \
        json.dumps(obj, indent=1, default=jsonable)
    atomic_write_text(path, text)


def jsonable(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def save_npz(path: Path, **arrays) -> Path:
    """``np.savez`` of ``arrays``, atomically."""
    import numpy as np
    return atomic_write(path, lambda f: np.savez(f, **arrays))
