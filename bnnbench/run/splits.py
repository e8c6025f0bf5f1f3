"""A run's splits: the data set's own (Gal's 20 UCI splits, the SLANG/Vadam MATLAB splits, MNIST's
validation split) or a protocol's seeded random ones, optionally restarted and cut to their first rows."""

from __future__ import annotations

import numpy as np

from bnnbench.run.config import ConfigError
from bnnbench.core.data import Split


def random_splits(ds, n_splits: int, test_fraction: float, seed: int) -> list:
    """Seeded random train/test splits (the noisy-NG paper's own 90/10 scheme): split k permutes the
    rows with ``numpy.random.default_rng(seed + k)`` and holds out the first ``round(test_fraction N)``."""
    N = len(ds.y)
    n_test = int(round(test_fraction * N))
    out = []
    for k in range(n_splits):
        perm = np.random.default_rng(seed + k).permutation(N)
        out.append(Split(name=f"r{k}", train=np.sort(perm[n_test:]), test=np.sort(perm[:n_test])))
    return out


def subsample_splits(ds, n_splits: int, n_train: int, n_test: int, seed: int) -> list:
    """Seeded small-data trials (PBP's active-learning protocol, Hernandez-Lobato & Adams 2015; the noisy-NG paper's
    Tables 3 and 4): trial k permutes the rows with ``numpy.random.default_rng(seed + k)``; its first ``n_test`` rows
    are the test set, the next ``n_train`` the training set and the rest, in that permuted order, the pool
    (:func:`pool_rows`)."""
    N = len(ds.y)
    if n_train + n_test > N:
        raise ConfigError(f"{ds.name} has {N} rows: too few for {n_train} training and {n_test} test rows")
    out = []
    for k in range(n_splits):
        perm = np.random.default_rng(seed + k).permutation(N)
        out.append(Split(name=f"s{k}", train=np.sort(perm[n_test:n_test + n_train]), test=np.sort(perm[:n_test])))
    return out


def pool_rows(ds, scheme: dict, k: int) -> np.ndarray:
    """Trial ``k``'s pool of a ``subsample`` scheme: the rows outside its training and test sets, in the trial's
    permuted order (random acquisition takes them in this order)."""
    perm = np.random.default_rng(int(scheme.get("seed", 0)) + k).permutation(len(ds.y))
    return perm[int(scheme["n_test"]) + int(scheme["n_train"]):]


def select_splits(ds, which, scheme: dict | None = None) -> list:
    """The protocol's splits: ``all`` of the data set's (or of the protocol's random ``scheme``), the
    first ``which`` ones, or those named; a name may also be an extra split of the data set
    (MNIST's ``validation``: the first 50k training images against the last 10k)."""
    splits = list(ds.splits)
    if scheme and scheme.get("kind") == "random":
        n = int(scheme.get("n_splits_by_dataset", {}).get(ds.name.split("/")[-1], scheme.get("n_splits", 20)))
        splits = random_splits(ds, n, float(scheme.get("test_fraction", 0.1)), int(scheme.get("seed", 0)))
    elif scheme and scheme.get("kind") == "subsample":
        splits = subsample_splits(ds, int(scheme.get("n_splits", 10)), int(scheme["n_train"]), int(scheme["n_test"]),
                                  int(scheme.get("seed", 0)))
    elif scheme and scheme.get("kind") is not None:
        raise ConfigError(f"unknown split_scheme kind {scheme.get('kind')!r}; valid: random, subsample")
    if which in (None, "all"):
        return splits
    if isinstance(which, int):
        return splits[:which]
    names = [str(w) for w in which]
    by_name = {**{v.name: v for v in ds.meta.values() if isinstance(v, Split)}, **{s.name: s for s in splits}}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ConfigError(f"unknown split(s) {missing} of {ds.name}; valid: {list(by_name)}")
    return [by_name[n] for n in names]


def with_restarts(splits: list, restarts: int | None) -> list:
    """Each split ``restarts`` times, named ``<split>/<k>`` (random restarts on the same data)."""
    if not restarts:
        return splits
    return [Split(name=f"{s.name}/{k}", train=s.train, test=s.test) for s in splits for k in range(restarts)]


def subset(splits: list, sub: dict | None) -> list:
    """The first ``sub["train"]`` training and ``sub["test"]`` evaluation rows of each split (fast protocols)."""
    if not sub:
        return splits
    n_tr, n_te = sub.get("train"), sub.get("test")
    return [Split(s.name, s.train[:n_tr] if n_tr else s.train, s.test[:n_te] if n_te else s.test) for s in splits]


def stage_splits(ds, spec, name: str) -> list:
    """The split ``name`` of a staged protocol (``protocol.stages``), restarted and cut as the protocol says."""
    return subset(with_restarts(select_splits(ds, [name], spec.split_scheme), spec.restarts), spec.subset)


def run_splits(ds, spec) -> list:
    """The splits a run trains on: the last stage's split for a staged protocol, else the protocol's ``splits``."""
    if spec.stages:
        return stage_splits(ds, spec, spec.stages[-1]["split"])
    return subset(with_restarts(select_splits(ds, spec.splits, spec.split_scheme), spec.restarts), spec.subset)
