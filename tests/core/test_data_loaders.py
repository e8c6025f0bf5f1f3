"""Dataset loaders, checked against MANIFEST.md facts and against the raw files read directly."""
from __future__ import annotations

import collections
import gzip
import hashlib
import io
import pickle
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

import bnnbench.core.data as bd
from bnnbench.core.data import DataError, Dataset, Split, registry, store

from datapaths import MIRROR

HAVE_MIRROR = (MIRROR / "MANIFEST.md").is_file()


@pytest.fixture(scope="module")
def mirror_data_cache(tmp_path_factory):
    """One cache for the module (each dataset is converted once), the shared mirror as
    source, downloads disabled."""
    if not HAVE_MIRROR:
        pytest.skip(f"raw-data mirror not found at {MIRROR} (set BNNBENCH_MIRROR or BNNBENCH_TEST_MIRROR)")
    cache = tmp_path_factory.mktemp("bnnbench_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BNNBENCH_CACHE", str(cache))
        mp.setenv("BNNBENCH_MIRROR", str(MIRROR))
        mp.setenv("BNNBENCH_OFFLINE", "1")
        yield cache


@pytest.fixture
def load(mirror_data_cache):
    return bd.load_dataset


def _check_partition(ds: Dataset, split: Split, covering: bool = True):
    assert split.train.dtype == np.int64 and split.test.dtype == np.int64
    assert np.intersect1d(split.train, split.test).size == 0
    assert len(np.unique(split.train)) == len(split.train)
    if covering:
        assert len(split.train) + len(split.test) == len(ds.X)
        assert np.array_equal(np.sort(np.concatenate([split.train, split.test])), np.arange(len(ds.X)))


# ----------------------------------------------------------------------------- UCI
# name: folder, rows, cols, n features, target col, n_splits, split-0 train/test, n_hidden, n_epochs, tau grid
UCI = {
    "boston": ("bostonHousing", 506, 14, 13, 13, 20, 455, 51, 50, 40, [0.1, 0.15, 0.2]),
    "concrete": ("concrete", 1030, 9, 8, 8, 20, 927, 103, 50, 40, [0.025, 0.05, 0.075]),
    "energy": ("energy", 768, 9, 8, 8, 20, 691, 77, 50, 40, [0.25, 0.5, 0.75]),
    "kin8nm": ("kin8nm", 8192, 9, 8, 8, 20, 7373, 819, 50, 40, [150, 200, 250]),
    "naval": ("naval-propulsion-plant", 11934, 18, 16, 16, 20, 10741, 1193, 50, 40, [30000, 40000, 50000]),
    "power": ("power-plant", 9568, 5, 4, 4, 20, 8611, 957, 50, 40, [0.05, 0.1, 0.15]),
    "protein": ("protein-tertiary-structure", 45730, 10, 9, 9, 5, 41157, 4573, 100, 20, [0.025, 0.05, 0.075]),
    "wine": ("wine-quality-red", 1599, 12, 11, 11, 20, 1439, 160, 50, 40, [2.5, 3.0, 3.5]),
    "yacht": ("yacht", 308, 7, 6, 6, 20, 277, 31, 50, 40, [0.25, 0.5, 0.75]),
}


@pytest.mark.parametrize("short", list(UCI))
def test_uci_matches_manifest_and_raw_file(load, short):
    folder, rows, cols, nfeat, tcol, nsplits, ntr, nte, nhid, nep, tau = UCI[short]
    ds = load(f"uci/{short}")
    assert ds.name == f"uci/{short}" and ds.task == "regression" and ds.n_classes is None
    assert ds.X.dtype == np.float64 and ds.y.dtype == np.float64
    assert ds.X.shape == (rows, nfeat) and ds.y.shape == (rows,) and ds.input_dim == nfeat
    assert len(ds.splits) == nsplits and [s.name for s in ds.splits] == [str(k) for k in range(nsplits)]
    assert (len(ds.splits[0].train), len(ds.splits[0].test)) == (ntr, nte)
    for s in ds.splits:
        _check_partition(ds, s)
    assert ds.meta["target_column"] == tcol and ds.meta["feature_columns"] == list(range(nfeat))
    assert ds.meta["n_hidden"] == nhid and ds.meta["n_epochs"] == nep
    assert ds.meta["tau_values"] == tau and ds.meta["dropout_rates"] == [0.005, 0.01, 0.05, 0.1]
    # direct read of the raw file
    d = MIRROR / "uci_gal" / "UCI_Datasets" / folder / "data"
    raw = np.loadtxt(d / "data.txt")
    assert raw.shape == (rows, cols)
    np.testing.assert_array_equal(ds.X, raw[:, :nfeat])
    np.testing.assert_array_equal(ds.y, raw[:, tcol])
    last = nsplits - 1
    np.testing.assert_array_equal(ds.splits[last].train, np.loadtxt(d / f"index_train_{last}.txt", dtype=np.int64))
    np.testing.assert_array_equal(ds.splits[last].test, np.loadtxt(d / f"index_test_{last}.txt", dtype=np.int64))


def test_uci_naval_target_and_constant_feature(load):
    ds = load("uci/naval")
    raw = np.loadtxt(MIRROR / "uci_gal/UCI_Datasets/naval-propulsion-plant/data/data.txt")
    np.testing.assert_array_equal(ds.y, raw[:, 16])
    assert not np.array_equal(ds.y, raw[:, 17])
    assert 0.95 <= ds.y.min() and ds.y.max() <= 1.0
    assert ds.meta["unused_columns"] == [17]
    assert ds.X[:, 8].std() == 0 and ds.meta["constant_features"] == [8]


def test_uci_naval_turbine_is_the_nng_codes_column_choice(load):
    """The noisy natural gradient authors' code: the last column (the turbine decay) from all the others, the
    compressor decay (Gal's target, column 16) among them; Gal's rows and splits."""
    ds, gal = load("uci/naval_turbine"), load("uci/naval")
    raw = np.loadtxt(MIRROR / "uci_gal/UCI_Datasets/naval-propulsion-plant/data/data.txt")
    np.testing.assert_array_equal(ds.y, raw[:, 17])
    np.testing.assert_array_equal(ds.X, raw[:, :17])
    np.testing.assert_array_equal(ds.X[:, 16], gal.y)
    assert 0.975 <= ds.y.min() and ds.y.max() <= 1.0
    assert ds.meta["target_column"] == 17 and ds.meta["unused_columns"] == [] and ds.meta["constant_features"] == [8]
    for s, g in zip(ds.splits, gal.splits, strict=True):
        np.testing.assert_array_equal(s.train, g.train)
        np.testing.assert_array_equal(s.test, g.test)


def test_uci_other_facts(load):
    assert len(load("uci/protein").splits) == 5
    assert abs(load("uci/energy").y.mean() - 22.31) < 0.01  # heating load, not cooling
    assert load("uci/boston").meta["constant_features"] == []


def test_uci_canonical_load_is_fast(load):
    load("uci/protein")  # ensure converted
    t = time.perf_counter()
    for short in UCI:
        load(f"uci/{short}")
    assert (time.perf_counter() - t) / len(UCI) < 0.5


# ----------------------------------------------------------------------------- LIBSVM
@pytest.mark.parametrize("name,n,d,neg,pos,ntr", [
    ("libsvm/australian", 690, 14, 383, 307, 345),
    ("libsvm/breast_cancer", 683, 10, 444, 239, 341),
])
def test_libsvm_random_split_sets(load, name, n, d, neg, pos, ntr):
    ds = load(name)
    assert ds.task == "binary" and ds.n_classes == 2
    assert ds.X.shape == (n, d) and ds.X.dtype == np.float64 and ds.y.dtype == np.int64
    assert np.bincount(ds.y).tolist() == [neg, pos]
    assert -1 <= ds.X.min() and ds.X.max() <= 1
    assert len(ds.splits) == 20
    for s, sp in enumerate(ds.splits, start=1):
        assert sp.name == str(s) and len(sp.train) == ntr and len(sp.test) == n - ntr
        _check_partition(ds, sp)
        perm = np.argsort(np.random.RandomState(s).random_sample(n))   # MATLAB: setSeed(s); randperm(n)
        np.testing.assert_array_equal(sp.train, perm[:n // 2])
    assert not np.array_equal(np.sort(ds.splits[0].train), np.sort(ds.splits[1].train))


def test_libsvm_breast_cancer_label_coding(load):
    ds = load("libsvm/breast_cancer")
    labels = [int(float(line.split()[0])) for line in (MIRROR / "libsvm/breast-cancer_scale").read_text().splitlines()]
    np.testing.assert_array_equal(ds.y, (np.array(labels) == 4).astype(np.int64))


@pytest.mark.parametrize("full,pre,ntr,nte,counts", [
    ("libsvm/australian", "libsvm/australian_presplit", 345, 345, ((188, 157), (195, 150))),
    ("libsvm/breast_cancer", "libsvm/breast_cancer_presplit", 341, 342, ((210, 131), (234, 108))),
])
def test_presplit_rows_equal_libsvm_rows_as_a_multiset(load, full, pre, ntr, nte, counts):
    a, b = load(full), load(pre)
    assert len(b.splits) == 1 and b.splits[0].name == "presplit"
    sp = b.splits[0]
    assert (len(sp.train), len(sp.test)) == (ntr, nte)
    _check_partition(b, sp)
    assert tuple(np.bincount(b.y[sp.train])) == counts[0] and tuple(np.bincount(b.y[sp.test])) == counts[1]
    ra, rb = np.column_stack([a.X, a.y]), np.column_stack([b.X, b.y])
    ra, rb = ra[np.lexsort(ra.T[::-1])], rb[np.lexsort(rb.T[::-1])]
    np.testing.assert_array_equal(ra, rb)  # two independent files, same rows and labels


def test_libsvm_a1a(load):
    ds = load("libsvm/a1a")
    assert ds.X.shape == (1605 + 30956, 123) and ds.input_dim == 123
    sp = ds.splits[0]
    assert sp.name == "official" and (len(sp.train), len(sp.test)) == (1605, 30956)
    _check_partition(ds, sp)
    assert np.bincount(ds.y[sp.train]).tolist() == [1210, 395]
    assert np.bincount(ds.y[sp.test]).tolist() == [23510, 7446]
    assert set(np.unique(ds.X).tolist()) == {0.0, 1.0}
    assert not ds.X[sp.train, 119:].any() and ds.X[sp.test, 119:].any()
    # cross-check with SLANG's MATLAB copy
    from scipy.io import loadmat

    m = loadmat(str(MIRROR / "slang_matlab/a1a.mat"))
    np.testing.assert_array_equal(ds.X[sp.train, :119], m["X"].toarray())
    np.testing.assert_array_equal(ds.X[sp.test], m["X_te"].toarray())
    np.testing.assert_array_equal(ds.y[sp.test], (m["y_te"].ravel() == 1).astype(np.int64))


# ----------------------------------------------------------------------------- USPS
def test_usps_3vs5(load):
    ds = load("usps/3vs5")
    assert ds.X.shape == (1540, 256) and ds.X.dtype == np.float64 and ds.task == "binary"
    assert ds.meta["n_from_train"] == 767 and ds.meta["n_from_test"] == 773
    assert -1 <= ds.X.min() and ds.X.max() <= 1
    ntr = 767
    assert np.bincount(ds.y[:ntr]).tolist() == [406, 361]
    assert np.bincount(ds.y[ntr:]).tolist() == [418, 355]
    assert len(ds.splits) == 20 and all((len(s.train), len(s.test)) == (770, 770) for s in ds.splits)
    for s in ds.splits[:3]:
        _check_partition(ds, s)
    from scipy.io import loadmat

    m = loadmat(str(MIRROR / "usps/usps_resampled.mat"))
    digits_te = m["test_labels"].argmax(0)
    i = 800  # a test-set row
    col = ds.meta["test_columns"][i - ntr]
    assert digits_te[col] == (5 if ds.y[i] == 1 else 3)
    img = ds.X[i].reshape(16, 16)
    np.testing.assert_array_equal(img, m["test_patterns"][:, col].reshape(16, 16))
    first5 = int(np.flatnonzero(m["train_labels"].argmax(0) == 5)[0])
    j = ds.meta["train_columns"].index(first5)
    assert ds.y[j] == 1
    np.testing.assert_array_equal(ds.X[j], m["train_patterns"][:, first5])


# ----------------------------------------------------------------------------- MNIST
def test_mnist(load):
    ds = load("mnist")
    assert ds.X.shape == (70000, 784) and ds.X.dtype == np.float32 and ds.y.dtype == np.int64
    assert ds.task == "multiclass" and ds.n_classes == 10 and ds.input_dim == 784
    assert ds.X.min() == 0.0 and ds.X.max() == 1.0
    sp = ds.splits[0]
    assert sp.name == "official" and (len(sp.train), len(sp.test)) == (60000, 10000)
    np.testing.assert_array_equal(sp.train, np.arange(60000))
    assert np.bincount(ds.y[:60000]).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    assert np.bincount(ds.y[60000:]).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert ds.y[0] == 5 and ds.y[60000] == 7
    val = ds.meta["validation_split"]
    assert isinstance(val, Split) and val.name == "validation"
    np.testing.assert_array_equal(val.train, np.arange(50000))
    np.testing.assert_array_equal(val.test, np.arange(50000, 60000))
    assert ds.get_split("validation") is val
    first = ds.get_split("train50k")   # SLANG's first stage, scored on the test images
    np.testing.assert_array_equal(first.train, np.arange(50000))
    np.testing.assert_array_equal(first.test, np.arange(60000, 70000))
    # first test image straight from the idx file
    with gzip.open(MIRROR / "mnist/t10k-images-idx3-ubyte.gz") as f:
        raw = np.frombuffer(f.read(16 + 784), dtype=np.uint8)
    assert int.from_bytes(raw[:4].tobytes(), "big") == 2051
    np.testing.assert_array_equal(ds.X[60000], raw[16:].astype(np.float32) / np.float32(255))


def test_mnist_bad_magic_is_rejected(tmp_path):
    from bnnbench.core.data.mnist import read_idx

    p = tmp_path / "x.gz"
    with gzip.open(p, "wb") as f:
        f.write((2049).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"\x01\x02")
    assert read_idx(p, 2049).tolist() == [1, 2]
    with pytest.raises(DataError, match="magic"):
        read_idx(p, 2051)
    with gzip.open(p, "wb") as f:
        f.write((2049).to_bytes(4, "big") + (3).to_bytes(4, "big") + b"\x01\x02")
    with pytest.raises(DataError, match="payload"):
        read_idx(p, 2049)


# ----------------------------------------------------------------------------- CIFAR-10
CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _make_cifar_tarball(path: Path, per_batch: int = 2, seed: int = 0, extra_pickle=None):
    """A tiny tarball in the exact cifar-10-python.tar.gz layout (python-2 style pickles)."""
    rng = np.random.default_rng(seed)
    batches = {}
    order = ["data_batch_4", "readme.html", "test_batch", "data_batch_3", "batches.meta",
             "data_batch_2", "data_batch_5", "data_batch_1"]  # not in batch order, like the real one
    with tarfile.open(path, "w:gz") as tf:
        def add(name, payload: bytes):
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))

        for name in order:
            if name == "readme.html":
                add(name, b"<html></html>")
            elif name == "batches.meta":
                meta = {b"num_cases_per_batch": per_batch, b"label_names": [n.encode() for n in CIFAR_NAMES],
                        b"num_vis": 3072}
                add(name, pickle.dumps(meta, protocol=2))
            else:
                data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
                labels = rng.integers(0, 10, size=per_batch).tolist()
                batches[name] = (data, labels)
                d = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                     b"filenames": [f"img_{i}.png".encode() for i in range(per_batch)]}
                if extra_pickle is not None and name == "data_batch_1":
                    d[b"evil"] = extra_pickle
                add(name, pickle.dumps(d, protocol=2))
    return batches


@pytest.mark.parametrize("via", ["file_url", "mirror"])
def test_cifar10_roundtrip_through_fetch(tmp_path, monkeypatch, via):
    cache = tmp_path / "cache"
    monkeypatch.setenv("BNNBENCH_CACHE", str(cache))
    tarpath = tmp_path / "src" / "cifar10" / "cifar-10-python.tar.gz"
    tarpath.parent.mkdir(parents=True)
    batches = _make_cifar_tarball(tarpath)
    entry = registry.file_entry("cifar10/cifar-10-python.tar.gz")
    assert entry["sha256"] is None  # checked by md5 only
    monkeypatch.setitem(entry, "md5", hashlib.md5(tarpath.read_bytes()).hexdigest())
    if via == "file_url":
        monkeypatch.delenv("BNNBENCH_MIRROR", raising=False)
        monkeypatch.delenv("BNNBENCH_OFFLINE", raising=False)
        monkeypatch.setitem(entry, "url", tarpath.as_uri())
    else:
        monkeypatch.setenv("BNNBENCH_MIRROR", str(tmp_path / "src"))
        monkeypatch.setenv("BNNBENCH_OFFLINE", "1")

    ds = bd.load_dataset("cifar10")
    assert (cache / "raw" / "cifar10" / "cifar-10-python.tar.gz").read_bytes() == tarpath.read_bytes()
    order = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    X_u8 = np.concatenate([batches[b][0] for b in order]).reshape(-1, 3, 32, 32)
    y = np.concatenate([batches[b][1] for b in order]).astype(np.int64)
    assert ds.X.shape == (12, 3, 32, 32) and ds.X.dtype == np.float32 and ds.input_dim == 3072
    np.testing.assert_array_equal(ds.X, X_u8.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(ds.y, y)
    assert ds.y.dtype == np.int64 and ds.n_classes == 10 and ds.task == "multiclass"
    assert ds.meta["class_names"] == CIFAR_NAMES
    sp = ds.splits[0]
    assert sp.name == "official" and sp.train.tolist() == list(range(10)) and sp.test.tolist() == [10, 11]
    # canonical npz keeps uint8
    assert store.read_npz(store.canonical_path("cifar10"))["X"].dtype == np.uint8
    # R plane of the first image = first 1024 bytes of the first row of data_batch_1
    np.testing.assert_array_equal(ds.X[0, 0].ravel() * 255, batches["data_batch_1"][0][0, :1024])


def test_cifar10_rejects_foreign_pickle_globals(tmp_path):
    from bnnbench.core.data.cifar10 import read_tarball

    p = tmp_path / "c.tar.gz"
    _make_cifar_tarball(p, extra_pickle=collections.OrderedDict)  # any global outside the allow-list
    with pytest.raises(DataError, match="forbidden"):
        read_tarball(p)
