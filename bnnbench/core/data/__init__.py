"""Data layer of bnnbench: registry of raw files, verified cache, dataset loaders.

Public API::

    load_dataset("uci/boston") -> Dataset     # fetch on first use, convert once, then load the cached npz
    list_datasets() -> list[str]
    fetch("mnist") -> list[Path]               # fetch + verify raw files ("all": every dataset)
    dataset_files("mnist") -> list[dict]       # registry entries of a dataset

Environment: ``BNNBENCH_CACHE`` (cache root), ``BNNBENCH_MIRROR`` (a local raw-data mirror laid
out like the registry paths), ``BNNBENCH_OFFLINE=1`` (never download),
``BNNBENCH_DOWNLOAD_TIMEOUT`` (seconds). See ``data_scripts/README.md``.
"""
from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path

import numpy as np

from .dataset import Dataset, Split
from .errors import ChecksumError, DataError, DataMissingError, NonFiniteDataError, UnknownDatasetError

__all__ = [
    "Split", "Dataset", "list_datasets", "load_dataset", "fetch", "dataset_files",
    "DataError", "UnknownDatasetError", "DataMissingError", "ChecksumError", "NonFiniteDataError", "cli",
]

log = logging.getLogger("bnnbench.core.data")

CANONICAL_FORMAT = 2   # 2: the logistic-regression sets carry the authors' MATLAB splits


# ----------------------------------------------------------------------------- API


def list_datasets() -> list[str]:
    from . import registry

    return registry.dataset_names()


def dataset_files(name: str) -> list[dict]:
    """Copies of the registry entries of the raw files a dataset needs."""
    from . import registry

    return [dict(e) for e in registry.file_entries(name)]


def _expand(name: str) -> list[str]:
    """``"all"`` -> every dataset; a family prefix such as ``"uci"`` -> its datasets."""
    from . import registry

    names = registry.dataset_names()
    if name == "all":
        return names
    if name in names:
        return [name]
    pref = [n for n in names if n.startswith(name.rstrip("/") + "/")]
    if pref:
        return pref
    raise registry.unknown_dataset(name)


def fetch(name: str) -> list[Path]:
    """Fetch and verify the raw files of a dataset (``"all"`` or a family prefix like ``"uci"``
    for several). Files already cached are re-verified. Returns the cached paths."""
    from . import store

    out: list[Path] = []
    for n in _expand(name):
        for p in store.ensure_dataset_files(n).values():
            if p not in out:
                out.append(p)
    return out


def load_dataset(name: str) -> Dataset:
    """Load a dataset, fetching its raw files on first use (mirror or upstream) and
    converting them once to ``<cache>/canonical/<name>.npz``; later calls load that npz."""
    from . import registry, store

    spec = registry.dataset_spec(name)
    if spec["family"] == "synthetic":  # generated from its parameters: nothing to fetch or cache
        from .synthetic import build
        built = build(name, spec)
        _check_dataset(built, f"its generator ({spec['family']})")
        return built
    path = store.canonical_path(name)
    sources = registry.source_digests(name)
    if path.is_file():
        try:
            ds = _read_canonical(path, name, sources)
        except NonFiniteDataError:
            raise
        except Exception as exc:  # unreadable / truncated npz: rebuild it
            log.warning("rebuilding %s: cannot read %s (%s)", name, path, exc)
            ds = None
        if ds is not None:
            return ds
    return prepare(name, spec=spec, sources=sources)


def prepare(name: str, *, spec: dict | None = None, sources: dict | None = None) -> Dataset:
    """(Re)build the canonical npz of a dataset from verified raw files and load it."""
    from . import registry, store

    spec = spec or registry.dataset_spec(name)
    sources = sources or registry.source_digests(name)
    files = store.ensure_dataset_files(name)  # fetches missing files, re-verifies cached ones
    module = importlib.import_module(f"{__name__}.{spec['family']}")
    built = module.build(name, spec, files)
    _check_dataset(built, "its raw files " + ", ".join(str(p) for p in files.values()))
    path = store.canonical_path(name)
    store.atomic_savez(path, _to_arrays(built, sources))
    log.info("wrote %s", path)
    ds = _read_canonical(path, name, sources)
    if ds is None:  # pragma: no cover - would be a bug in _to_arrays/_read_canonical
        raise DataError(f"canonical file {path} failed its own consistency check")
    return ds


# ----------------------------------------------------------------------------- canonical npz
def _check_dataset(ds: Dataset, source: str) -> None:
    """Splits that index inside the data and never overlap, and finite values (``source`` says where they came from)."""
    _check_finite(ds.name, {"X": ds.X, "y": ds.y}, source, rebuild=False)
    n = len(ds.X)
    extra = [v for v in ds.meta.values() if isinstance(v, Split)]
    for s in list(ds.splits) + extra:
        for part in (s.train, s.test):
            if len(part) and (part.min() < 0 or part.max() >= n):
                raise DataError(f"{ds.name}: split {s.name} has indices outside [0, {n})")
        if np.intersect1d(s.train, s.test).size:
            raise DataError(f"{ds.name}: split {s.name} train and test overlap")
        if len(np.unique(s.train)) != len(s.train) or len(np.unique(s.test)) != len(s.test):
            raise DataError(f"{ds.name}: split {s.name} has repeated indices")


def _check_finite(name: str, arrays: dict[str, np.ndarray], source: str, rebuild: bool) -> None:
    """A NaN or infinity in a data set makes every method stop with "diverged at epoch 1", which blames the method:
    raise ``NonFiniteDataError`` naming the data set, ``source`` (the file) and the rows instead. ``rebuild``: the
    values come from the cache, which the raw files (checksum-verified) rebuild; else the source itself holds them."""
    for key, a in arrays.items():
        if not np.issubdtype(a.dtype, np.floating) or np.isfinite(np.sum(a, dtype=np.float64)):
            continue   # one pass, no mask: a sum is finite when every value is (short of overflow past 1e308)
        bad = ~np.isfinite(a.reshape(len(a), -1)).all(axis=1) if a.ndim > 1 else ~np.isfinite(a)
        if not bad.any():
            continue
        rows = np.flatnonzero(bad)
        shown = ", ".join(str(r) for r in rows[:5]) + (", ..." if len(rows) > 5 else "")
        said = f"{name}: {source} holds NaN or infinite values in {key} ({len(rows)} row(s): {shown}); the data " \
               "is broken, not the method."
        fix = (" Delete that file (it is rebuilt from the checksum-verified raw files on next use), or run "
               f"`bnnbench data fetch {name}`, which rebuilds it.") if rebuild else \
            f" Check the raw files of {name} (`bnnbench data fetch {name}` fetches and verifies them again)."
        raise NonFiniteDataError(said + fix)


def _to_arrays(ds: Dataset, sources: dict) -> dict[str, np.ndarray]:
    arrays = {"X": ds.X, "y": ds.y}
    meta = {}
    extra = []
    for k, v in ds.meta.items():
        if isinstance(v, Split):
            extra.append({"key": k, "name": v.name})
            arrays[f"extra_{k}_train"] = v.train
            arrays[f"extra_{k}_test"] = v.test
        else:
            meta[k] = v
    for i, s in enumerate(ds.splits):
        arrays[f"split{i}_train"] = s.train
        arrays[f"split{i}_test"] = s.test
    header = {
        "canonical_format": CANONICAL_FORMAT,
        "name": ds.name,
        "task": ds.task,
        "n_classes": ds.n_classes,
        "split_names": [s.name for s in ds.splits],
        "extra_splits": extra,
        "sources": sources,
        "meta": meta,
    }
    arrays["header"] = np.array(json.dumps(header))
    return arrays


def _read_canonical(path: Path, name: str, sources: dict) -> Dataset | None:
    """Load a canonical npz; ``None`` if it is stale (other format, name or raw digests)."""
    from . import store

    a = store.read_npz(path)
    header = json.loads(str(a["header"]))
    if (header.get("canonical_format") != CANONICAL_FORMAT or header.get("name") != name
            or header.get("sources") != sources):
        log.info("canonical %s is stale; rebuilding", path)
        return None
    _check_finite(name, {"X": a["X"], "y": a["y"]}, f"the cached data file {path}", rebuild=True)
    meta = dict(header["meta"])
    X = a["X"]
    storage = meta.get("x_storage")
    if storage == "uint8/255":
        X = np.divide(X, np.float32(255.0), dtype=np.float32)
    elif storage is not None:
        raise DataError(f"{path}: unknown x_storage {storage!r}")
    splits = tuple(Split(n, a[f"split{i}_train"], a[f"split{i}_test"])
                   for i, n in enumerate(header["split_names"]))
    for e in header["extra_splits"]:
        meta[e["key"]] = Split(e["name"], a[f"extra_{e['key']}_train"], a[f"extra_{e['key']}_test"])
    meta["canonical_path"] = str(path)
    return Dataset(name=header["name"], task=header["task"], X=X, y=a["y"], splits=splits,
                   n_classes=header["n_classes"], meta=meta)


# ----------------------------------------------------------------------------- CLI
def _load_or_rebuild(name: str) -> Dataset:
    """``load_dataset``, with a cached file of non-finite values rebuilt from the verified raw files (what the
    error of ``_check_finite`` tells a user to run this for)."""
    try:
        return load_dataset(name)
    except NonFiniteDataError as exc:
        log.warning("rebuilding %s: %s", name, exc)
        return prepare(name)


def cli(argv: list[str] | None = None) -> int:
    """``fetch NAME [NAME ...] | all``, ``--list``; used by data_scripts/fetch.py and
    usable by the ``bnnbench data fetch`` sub-command."""
    import argparse
    import sys

    from . import registry, store

    ap = argparse.ArgumentParser(
        prog="bnnbench data fetch",
        description="Fetch and verify raw benchmark data into the bnnbench cache "
                    "(from $BNNBENCH_MIRROR if set, else the upstream URLs).")
    ap.add_argument("names", nargs="*", help="dataset ids, a family prefix (uci, libsvm) or 'all'")
    ap.add_argument("--list", action="store_true", help="list datasets and their cache status")
    ap.add_argument("--prepare", action="store_true",
                    help="also build the canonical npz (what load_dataset uses)")
    args = ap.parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")

    if not args.list and not args.names:
        ap.print_help()
        return 2
    if args.list:
        print(f"cache: {store.cache_dir()}   mirror: {store.mirror_dir() or '-'}")
        for n in registry.dataset_names():
            entries = registry.file_entries(n)
            size = sum(e.get("bytes") or 0 for e in entries)
            have = sum(store.raw_path(e["path"]).is_file() for e in entries)
            conv = "npz" if store.canonical_path(n).is_file() else "   "
            print(f"  {n:32s} {len(entries):3d} files {size / 1e6:9.2f} MB  "
                  f"cached {have:3d}/{len(entries):<3d} {conv}  {registry.dataset_spec(n).get('description', '')}")
        if not args.names:
            return 0

    failed = []
    try:
        names = [n for x in args.names for n in _expand(x)]
    except UnknownDatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for n in dict.fromkeys(names):
        try:
            paths = fetch(n)
            if args.prepare:
                _load_or_rebuild(n)
            print(f"ok    {n} ({len(paths)} files)")
        except DataError as exc:
            failed.append(n)
            print(f"FAIL  {n}: {exc}", file=sys.stderr)
    if failed:
        print(f"{len(failed)} dataset(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
