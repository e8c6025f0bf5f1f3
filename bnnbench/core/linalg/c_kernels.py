"""The package's small C kernels (``top_eigpair.c``, ``chol_root.c``, ...), built at first use with the system's C
compiler (``$CC``, else ``cc``) for this machine (``-march=native``) and cached under the cache directory
(``kernels/``), keyed by the source, the headers beside it, the compiler, its flags and the CPU's features; loaded
with ctypes. Where one cannot be built, its caller says so once (a warning) and uses LAPACK or torch's products."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

FLAGS = ("-O3", "-march=native", "-std=c99", "-shared", "-fPIC")


def _cpu_features() -> str:
    """What ``-march=native`` compiles for: the CPU's feature line (Linux), else the platform's names."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def build(source: Path, what: str, signatures: dict, instead: str = "LAPACK",
          mode: int = ctypes.DEFAULT_MODE) -> ctypes.CDLL | None:
    """The shared library of the C file ``source``, built if need be (aside, then moved into place: never a
    half-written library), loaded with ``mode`` (``ctypes.RTLD_GLOBAL``: its symbols seen by libraries loaded after
    it), its functions declared from ``signatures`` (``{name: (argtypes, restype)}``); or None with a RuntimeWarning
    that names ``what`` and what is used ``instead``."""
    from bnnbench.core.data.store import cache_dir
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    text = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    key = hashlib.sha256(text + repr((cc, FLAGS, _cpu_features())).encode()).hexdigest()[:16]
    path = cache_dir() / "kernels" / f"{source.stem}-{key}.so"
    try:
        if not path.exists():
            if cc is None:
                raise OSError("no C compiler: set CC")
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                built = Path(tmp) / path.name
                subprocess.run([cc, *FLAGS, "-o", str(built), str(source), "-lm"], check=True, capture_output=True,
                               text=True)
                os.replace(built, path)
        lib = ctypes.CDLL(str(path), mode=mode)
    except (OSError, subprocess.CalledProcessError) as err:
        why = err.stderr.strip() if isinstance(err, subprocess.CalledProcessError) else err
        warnings.warn(f"the {what} kernel {source.name} could not be built ({why}); {instead} used instead",
                      RuntimeWarning, stacklevel=4)
        return None
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib
