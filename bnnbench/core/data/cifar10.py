"""CIFAR-10 from the python-pickle tarball ``cifar-10-python.tar.gz``.

Members ``cifar-10-batches-py/data_batch_1..5``, ``test_batch`` (pickled dicts with
``b"data"``: uint8 [n, 3072] (R, G, B planes of 32x32) and ``b"labels"``) and ``batches.meta``
(``b"label_names"``). The pickles are read with a restricted unpickler that only allows
numpy array reconstruction. Canonical X: uint8 [60000, 3, 32, 32] (train batches 1..5, then
test); on load float32 / 255. One split "official": 50k train / 10k test.
"""
from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from .errors import DataError

PREFIX = "cifar-10-batches-py/"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META = "batches.meta"

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
    ("__builtin__", "object"), ("builtins", "object"),
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"CIFAR-10 pickle references forbidden global {module}.{name}")


def _load_pickle(data: bytes, what: str = "pickle") -> dict:
    try:
        d = _SafeUnpickler(io.BytesIO(data), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise DataError(f"cannot unpickle {what}: {exc}") from exc
    if not isinstance(d, dict):
        raise DataError(f"{what}: expected a pickled dict, got {type(d).__name__}")
    return d


def read_tarball(path: Path):
    """``(X uint8 [N, 3, 32, 32], y int64 [N], n_train, class_names)``."""
    wanted = {PREFIX + n: n for n in TRAIN_BATCHES + (TEST_BATCH, META)}
    found: dict[str, dict] = {}
    try:
        with tarfile.open(path, "r:gz") as tf:
            for m in tf:  # one sequential pass (the real tarball is not in batch order)
                mname = m.name[2:] if m.name.startswith("./") else m.name
                if m.isfile() and mname in wanted:
                    f = tf.extractfile(m)
                    with f:
                        found[wanted[mname]] = _load_pickle(f.read(), f"{path}:{m.name}")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"cannot read CIFAR-10 tarball {path}: {exc}") from exc
    missing = [PREFIX + n for n in wanted.values() if n not in found]
    if missing:
        raise DataError(f"{path}: members missing: {missing}")

    xs, ys = [], []
    for b in TRAIN_BATCHES + (TEST_BATCH,):
        d = found[b]
        if b"data" not in d or b"labels" not in d:
            raise DataError(f"{path}: {b} lacks b'data' or b'labels' (keys {sorted(d)})")
        x = np.asarray(d[b"data"], dtype=np.uint8)
        lab = np.asarray(d[b"labels"], dtype=np.int64)
        if x.ndim != 2 or x.shape[1] != 3072 or len(x) != len(lab):
            raise DataError(f"{path}: {b} has data {x.shape} and {len(lab)} labels")
        xs.append(x)
        ys.append(lab)
    meta = found[META]
    if b"label_names" not in meta:
        raise DataError(f"{path}: {META} lacks b'label_names'")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta[b"label_names"]]
    n_train = sum(len(x) for x in xs[:-1])
    X = np.concatenate(xs).reshape(-1, 3, 32, 32)
    y = np.concatenate(ys)
    if y.min() < 0 or y.max() >= len(names):
        raise DataError(f"{path}: labels outside 0..{len(names) - 1}")
    return X, y, n_train, names


def build(name: str, spec: dict, files: dict[str, Path]):
    from .dataset import Dataset, Split

    X, y, n_train, names = read_tarball(files[spec["params"]["file"]])
    meta = {
        "source": spec["params"]["file"],
        "x_storage": "uint8/255",
        "image_shape": [3, 32, 32],
        "class_names": names,
        "n_train": int(n_train),
        "n_test": int(len(y) - n_train),
    }
    splits = (Split("official", np.arange(n_train), np.arange(n_train, len(y))),)
    return Dataset(name=name, task="multiclass", X=X, y=y, splits=splits, n_classes=len(names), meta=meta)
