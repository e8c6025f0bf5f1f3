"""MNIST from the four gzip-compressed idx files (parsed here, no torchvision).

idx header: big-endian int32 magic (2051 images, 2049 labels), then the dimensions.
X: float32 [70000, 784] in [0, 1] (train rows first, then test; stored as uint8 in the
canonical npz and divided by 255 on load), y: int64. Splits: ``splits[0]`` = "official"
60k/10k; ``meta["validation_split"]`` = "validation": first 50k train / last 10k of train;
``meta["first_stage_test_split"]`` = "train50k": the same first 50k against the 10k test images (the
first stage of SLANG's schedule, scored on the test set: ``protocol=slang_mnist_50k``).
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from .errors import DataError

MAGIC_IMAGES = 2051
MAGIC_LABELS = 2049


def read_idx(path: Path, magic: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = {MAGIC_IMAGES: 3, MAGIC_LABELS: 1}[magic]
    hdr = 4 * (1 + ndim)
    if len(data) < hdr:
        raise DataError(f"{path}: truncated idx header")
    head = np.frombuffer(data, dtype=">i4", count=1 + ndim)
    if int(head[0]) != magic:
        raise DataError(f"{path}: idx magic {int(head[0])}, expected {magic}")
    dims = tuple(int(v) for v in head[1:])
    n = int(np.prod(dims))
    if len(data) - hdr != n:
        raise DataError(f"{path}: {len(data) - hdr} payload bytes, header says {dims}")
    return np.frombuffer(data, dtype=np.uint8, offset=hdr).reshape(dims)


def build(name: str, spec: dict, files: dict[str, Path]):
    from .dataset import Dataset, Split

    p = spec["params"]
    Xtr = read_idx(files[p["train_images"]], MAGIC_IMAGES)
    ytr = read_idx(files[p["train_labels"]], MAGIC_LABELS)
    Xte = read_idx(files[p["test_images"]], MAGIC_IMAGES)
    yte = read_idx(files[p["test_labels"]], MAGIC_LABELS)
    if len(Xtr) != len(ytr) or len(Xte) != len(yte) or Xtr.shape[1:] != Xte.shape[1:]:
        raise DataError(f"{name}: image/label counts or shapes disagree")
    X = np.concatenate([Xtr.reshape(len(Xtr), -1), Xte.reshape(len(Xte), -1)])
    y = np.concatenate([ytr, yte]).astype(np.int64)
    if y.min() < 0 or y.max() > 9:
        raise DataError(f"{name}: labels outside 0..9")
    ntr, nte, nval = len(ytr), len(yte), int(p["n_validation"])
    meta = {
        "source": "idx files (yann.lecun.com/exdb/mnist)",
        "x_storage": "uint8/255",
        "image_shape": list(Xtr.shape[1:]),
        "class_names": [str(i) for i in range(10)],
        "n_train": ntr,
        "n_test": nte,
        "validation_split": Split("validation", np.arange(ntr - nval), np.arange(ntr - nval, ntr)),
        "first_stage_test_split": Split("train50k", np.arange(ntr - nval), np.arange(ntr, ntr + nte)),
    }
    splits = (Split("official", np.arange(ntr), np.arange(ntr, ntr + nte)),)
    return Dataset(name=name, task="multiclass", X=X, y=y, splits=splits, n_classes=10, meta=meta)
