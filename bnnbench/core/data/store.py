"""Local cache, mirror and download handling for raw data files, with checksum checks.

Layout of the cache (``$BNNBENCH_CACHE``, else ``platformdirs.user_cache_dir("bnnbench")``)::

    <cache>/raw/<registry path>            verified raw files, e.g. raw/mnist/t10k-labels-idx1-ubyte.gz
    <cache>/canonical/<name with / -> __>.npz  converted arrays, e.g. canonical/uci__boston.npz

Where a missing raw file comes from, in order:

1. ``$BNNBENCH_MIRROR/<registry path>`` if ``BNNBENCH_MIRROR`` is set and the file is there
   (for archive-backed entries such as USPS, also the archive next to it);
2. the registered upstream URL, then its alternates (``file://`` works), unless
   ``BNNBENCH_OFFLINE=1``. Timeout: ``BNNBENCH_DOWNLOAD_TIMEOUT`` seconds (default 60).

Every fetched file is written to a temporary file in the target directory, its sha256
(md5 where the registry has no sha256) is checked, and only then is it ``os.replace``-d
into place. A mismatch raises :class:`ChecksumError` and leaves nothing behind. A file
already in the cache is re-hashed whenever it is fetched or converted; a corrupted cached
file raises :class:`ChecksumError` and is deleted so that the next call fetches it again.
"""
from __future__ import annotations

import hashlib
import http.client
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

import numpy as np

from . import registry
from .errors import ChecksumError, DataError, DataMissingError

log = logging.getLogger("bnnbench.core.data")

ENV_CACHE = "BNNBENCH_CACHE"
ENV_MIRROR = "BNNBENCH_MIRROR"
ENV_OFFLINE = "BNNBENCH_OFFLINE"
ENV_TIMEOUT = "BNNBENCH_DOWNLOAD_TIMEOUT"
USER_AGENT = "bnnbench-data/0.1 (python-urllib)"
_CHUNK = 1 << 20


# ----------------------------------------------------------------------------- paths
def cache_dir() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser().resolve()
    import platformdirs

    return Path(platformdirs.user_cache_dir("bnnbench"))


def mirror_dir() -> Path | None:
    env = os.environ.get(ENV_MIRROR)
    return Path(env).expanduser().resolve() if env else None


def _safe_rel(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise DataError(f"invalid registry path {rel!r}")
    return p


def raw_path(rel: str) -> Path:
    return cache_dir() / "raw" / Path(*_safe_rel(rel).parts)


def canonical_path(name: str) -> Path:
    return cache_dir() / "canonical" / (name.replace("/", "__") + ".npz")


# ----------------------------------------------------------------------------- digests
def hash_file(path: Path, algorithm: str = "sha256") -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(path: Path, entry: dict) -> tuple[bool, str, str, str]:
    """``(ok, algorithm, expected, actual)`` for a file against its registry entry."""
    algo, expected = registry.checksum_of(entry)
    actual = hash_file(path, algo)
    return actual == expected, algo, expected, actual


def _normalize_text_lines(path: Path) -> None:
    """CRLF -> LF, drop blank lines, end with a newline (in place)."""
    data = path.read_bytes()
    lines = [ln.rstrip(b"\r") for ln in data.replace(b"\r\n", b"\n").split(b"\n")]
    lines = [ln for ln in lines if ln.strip()]
    path.write_bytes(b"\n".join(lines) + b"\n")


# ----------------------------------------------------------------------------- fetching
class _Unavailable(Exception):
    """A source that cannot deliver the file (missing, network error...)."""


def _tmp_in(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".part")
    os.close(fd)
    return Path(tmp)


def _download(url: str, dst: Path) -> None:
    timeout = float(os.environ.get(ENV_TIMEOUT, "60"))
    req = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    log.info("downloading %s", url)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp, open(dst, "wb") as f:
            shutil.copyfileobj(resp, f, _CHUNK)
            length = resp.headers.get("Content-Length") if resp.headers else None
        if length is not None and length.isdigit() and dst.stat().st_size != int(length):
            raise _Unavailable(f"incomplete download ({dst.stat().st_size} of {length} bytes)")
    except _Unavailable:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise _Unavailable(f"{type(exc).__name__}: {exc}") from exc


def _extract_member(archive: Path, member: str, dst: Path) -> None:
    """Copy the (unique) archive member whose basename is ``member`` to ``dst``."""
    try:
        with tarfile.open(archive, "r:*") as tf:
            hits = [m for m in tf.getmembers()
                    if m.isfile() and PurePosixPath(m.name).name == member]
            if len(hits) != 1:
                raise _Unavailable(f"archive has {len(hits)} members named {member!r}")
            src = tf.extractfile(hits[0])
            with src, open(dst, "wb") as f:
                shutil.copyfileobj(src, f, _CHUNK)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise _Unavailable(f"cannot read archive: {type(exc).__name__}: {exc}") from exc


def _sources(entry: dict) -> tuple[list[tuple[str, str, bool]], list[str]]:
    """Candidate sources ``(kind, location, is_archive)`` and notes on skipped ones."""
    rel = entry["path"]
    archive = entry.get("archive")
    srcs: list[tuple[str, str, bool]] = []
    notes: list[str] = []
    mirror = mirror_dir()
    if mirror is None:
        notes.append(f"mirror: {ENV_MIRROR} is not set")
    else:
        p = mirror / Path(*_safe_rel(rel).parts)
        if p.is_file():
            srcs.append(("mirror", str(p), False))
        else:
            notes.append(f"mirror: {p} does not exist")
        if archive:
            ap = p.parent / PurePosixPath(entry["url"]).name
            if ap.is_file():
                srcs.append(("mirror", str(ap), True))
    if os.environ.get(ENV_OFFLINE, "").strip().lower() in ("1", "true", "yes"):
        notes.append(f"download: disabled by {ENV_OFFLINE}")
    else:
        for url in [entry["url"], *entry.get("alt_urls", [])]:
            srcs.append(("url", url, bool(archive)))
    return srcs, notes


def _fetch_cmd(dataset: str | None) -> str:
    return f"bnnbench data fetch {dataset or 'NAME'}"


def _missing_message(entry: dict, dataset: str | None, problems: list[str]) -> str:
    rel = entry["path"]
    ds = f" of dataset {dataset!r}" if dataset else ""
    tried = "\n".join(f"  - {p}" for p in problems)
    return (
        f"Raw data file {rel!r}{ds} is not available.\n{tried}\n"
        f"To fix: run `{_fetch_cmd(dataset)}` (or `python data_scripts/fetch.py {dataset or 'NAME'}`) "
        f"on a machine with internet access, or set BNNBENCH_MIRROR=<dir> to a local copy of the "
        f"raw-data mirror (laid out like the registry, i.e. <dir>/{rel}), or place the file at "
        f"{raw_path(rel)} yourself (it is checksum-verified)."
    )


def ensure_file(entry: dict, dataset: str | None = None) -> Path:
    """Return the verified cached path of a raw file, fetching it if needed."""
    rel = entry["path"]
    target = raw_path(rel)
    if target.is_file():
        ok, algo, expected, actual = verify(target, entry)
        if ok:
            return target
        try:
            target.unlink()
        except OSError:
            pass
        raise ChecksumError(
            f"Cached raw file {target} is corrupted: expected {algo} {expected}, got {actual}. "
            f"It has been deleted; call again (or run `{_fetch_cmd(dataset)}`) to fetch a fresh copy.",
            path=rel, algorithm=algo, expected=expected, actual=actual,
        )

    srcs, problems = _sources(entry)
    for kind, loc, is_archive in srcs:
        tmp = _tmp_in(target.parent, target.name)
        archive_tmp = None
        try:
            try:
                if kind == "mirror" and not is_archive:
                    shutil.copyfile(loc, tmp)
                else:
                    if kind == "mirror":
                        src_archive = Path(loc)
                    else:
                        archive_tmp = _tmp_in(target.parent, target.name + ".archive") if is_archive else tmp
                        _download(loc, archive_tmp)
                        src_archive = archive_tmp
                    if is_archive:
                        _extract_member(src_archive, entry["archive"]["member"], tmp)
            except _Unavailable as exc:
                problems.append(f"{loc}: {exc}")
                continue
            except OSError as exc:
                problems.append(f"{loc}: {type(exc).__name__}: {exc}")
                continue
            if entry.get("normalize") == "text-lines":
                _normalize_text_lines(tmp)
            ok, algo, expected, actual = verify(tmp, entry)
            if not ok:
                hint = f" ({entry['note']})" if entry.get("note") else ""
                raise ChecksumError(
                    f"Checksum mismatch for raw file {rel!r}"
                    + (f" of dataset {dataset!r}" if dataset else "")
                    + f" from {loc}: expected {algo} {expected}, got {actual}{hint}. "
                    f"The file was discarded; nothing was written to {target.parent}.",
                    path=rel, algorithm=algo, expected=expected, actual=actual,
                )
            try:
                os.chmod(tmp, 0o644)
            except OSError:
                pass
            os.replace(tmp, target)
            tmp = None
            log.debug("fetched %s from %s", rel, loc)
            return target
        finally:
            for t in (tmp, archive_tmp):
                if t is not None:
                    try:
                        Path(t).unlink()
                    except FileNotFoundError:
                        pass
    raise DataMissingError(_missing_message(entry, dataset, problems))


def ensure_dataset_files(name: str) -> dict[str, Path]:
    """Fetch (or re-verify) every raw file of a dataset: ``{registry path: cached path}``."""
    return {e["path"]: ensure_file(e, dataset=name) for e in registry.file_entries(name)}


# ----------------------------------------------------------------------------- npz
def atomic_savez(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` of ``arrays``, atomically (``bnnbench.core.files``)."""
    from bnnbench.core.files import save_npz
    save_npz(path, **arrays)


def read_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
