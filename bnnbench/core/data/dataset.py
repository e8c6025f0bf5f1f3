"""A data set in memory: its arrays and its protocol splits (``Dataset``, ``Split``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TASKS = ("regression", "binary", "multiclass")


@dataclass(frozen=True, eq=False)
class Split:
    """Row indices (int64) into ``Dataset.X`` of one train/test protocol split."""

    name: str
    train: np.ndarray
    test: np.ndarray

    def __post_init__(self):
        for f in ("train", "test"):
            a = np.asarray(getattr(self, f))
            if a.ndim != 1:
                raise ValueError(f"Split {self.name!r}: {f} indices must be 1-D, got shape {a.shape}")
            object.__setattr__(self, f, a.astype(np.int64, copy=False))
        object.__setattr__(self, "name", str(self.name))

    def __repr__(self) -> str:
        return f"Split(name={self.name!r}, n_train={len(self.train)}, n_test={len(self.test)})"


@dataclass(frozen=True, eq=False)
class Dataset:
    """A dataset with its protocol splits.

    ``X``: float64 for tabular data, float32 in [0, 1] for images (MNIST [N, 784],
    CIFAR-10 [N, 3, 32, 32]); ``y``: float64 [N] targets (regression) or int64 [N] labels.
    ``splits``: the protocol splits in order; extra splits (MNIST ``validation_split``) are
    ``Split`` objects in ``meta``.
    """

    name: str
    task: str
    X: np.ndarray
    y: np.ndarray
    splits: tuple[Split, ...]
    n_classes: int | None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        object.__setattr__(self, "splits", tuple(self.splits))
        if len(self.X) != len(self.y):
            raise ValueError(f"{self.name}: X has {len(self.X)} rows but y has {len(self.y)}")

    @property
    def input_dim(self) -> int:
        """Number of input features (flattened: 3072 for CIFAR-10)."""
        return int(np.prod(self.X.shape[1:], dtype=np.int64))

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.X.shape[1:])

    def get_split(self, key: int | str) -> Split:
        """A split by position or name; also finds extra splits in meta (e.g. "validation")."""
        if isinstance(key, (int, np.integer)):
            return self.splits[int(key)]
        for s in self.splits:
            if s.name == key:
                return s
        for v in self.meta.values():
            if isinstance(v, Split) and v.name == key:
                return v
        names = [s.name for s in self.splits] + [v.name for v in self.meta.values() if isinstance(v, Split)]
        raise KeyError(f"{self.name} has no split {key!r}; splits: {names}")

    def split_arrays(self, key: int | str = 0):
        """``(X_train, y_train, X_test, y_test)`` of a split (copies, via fancy indexing)."""
        s = self.get_split(key)
        return self.X[s.train], self.y[s.train], self.X[s.test], self.y[s.test]

    def __repr__(self) -> str:
        return (f"Dataset(name={self.name!r}, task={self.task!r}, X={self.X.dtype}{list(self.X.shape)}, "
                f"y={self.y.dtype}{list(self.y.shape)}, splits={len(self.splits)}, n_classes={self.n_classes})")
