"""Registry, cache, mirror/download and checksum behaviour of bnnbench.core.data."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import io
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

import bnnbench.core.data as bd
from bnnbench.core.data import registry, store
from bnnbench.core.data.errors import ChecksumError, DataError, DataMissingError, UnknownDatasetError

from datapaths import MIRROR, REPO

needs_mirror = pytest.mark.skipif(
    not (MIRROR / "MANIFEST.md").is_file(),
    reason=f"raw-data mirror not found at {MIRROR} (set BNNBENCH_MIRROR or BNNBENCH_TEST_MIRROR)")

EXPECTED_DATASETS = [
    "uci/boston", "uci/concrete", "uci/energy", "uci/kin8nm", "uci/naval", "uci/power",
    "uci/protein", "uci/wine", "uci/yacht", "uci/naval_turbine",
    "libsvm/australian", "libsvm/australian_presplit", "libsvm/breast_cancer",
    "libsvm/breast_cancer_presplit", "libsvm/a1a", "usps/3vs5", "mnist", "cifar10",
    "synthetic/gap_cubic", "synthetic/deep_linear",
]
YACHT_DATA = "uci_gal/UCI_Datasets/yacht/data/data.txt"
YACHT_DIR = "uci_gal/UCI_Datasets/yacht/data"


@pytest.fixture
def data_env(tmp_path, monkeypatch):
    """Empty cache in tmp_path, the shared mirror as source, downloads disabled."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("BNNBENCH_CACHE", str(cache))
    monkeypatch.setenv("BNNBENCH_MIRROR", str(MIRROR))
    monkeypatch.setenv("BNNBENCH_OFFLINE", "1")
    return cache


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and (p.name.endswith(".part") or p.name.startswith("."))]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _copy_dir(rel: str, dst_root: Path) -> Path:
    dst = dst_root / rel
    shutil.copytree(MIRROR / rel, dst)
    return dst


def _flip_byte(path: Path, offset: int = 10) -> None:
    b = bytearray(path.read_bytes())
    b[offset] = ord("7") if b[offset] != ord("7") else ord("8")
    path.write_bytes(bytes(b))


# ----------------------------------------------------------------------------- registry
@needs_mirror
def test_registry_mirror_files_exist_and_match():
    entries = registry.all_file_entries()
    assert len(entries) == 423
    checked = 0
    for e in entries:
        if e["path"].startswith("cifar10/"):
            assert e["sha256"] is None and e["md5"] == "c58f30108f718f92721af3b95e74349a"
            assert not (MIRROR / e["path"]).exists()
            continue
        p = MIRROR / e["path"]
        assert p.is_file(), e["path"]
        data = p.read_bytes()
        assert len(data) == e["bytes"], e["path"]
        assert hashlib.sha256(data).hexdigest() == e["sha256"], e["path"]
        assert hashlib.md5(data).hexdigest() == e["md5"], e["path"]
        checked += 1
    assert checked == 422


def test_registry_covers_every_dataset():
    assert bd.list_datasets() == EXPECTED_DATASETS
    used = set()
    for name in bd.list_datasets():
        spec = registry.dataset_spec(name)
        files = bd.dataset_files(name)
        assert bool(files) == (spec["family"] != "synthetic"), name  # generated sets have no raw files
        assert all(f["url"].startswith(("http://", "https://")) for f in files)
        assert all(registry.checksum_of(f)[1] for f in files)
        used.update(f["path"] for f in files)
        mod = importlib.import_module(f"bnnbench.core.data.{spec['family']}")
        assert callable(mod.build)
        assert spec["task"] in ("regression", "binary", "multiclass")
    unused = {e["path"] for e in registry.all_file_entries()} - used
    assert unused == {"slang_matlab/a1a.mat", "slang_matlab/australian_scale.mat",
                      "slang_matlab/breast_cancer_scale.mat"}
    # dataset_files returns copies, not the live registry entries
    bd.dataset_files("uci/yacht")[0]["sha256"] = "x"
    assert registry.file_entries("uci/yacht")[0]["sha256"] != "x"


@needs_mirror
def test_registry_json_is_up_to_date_with_manifest():
    spec = importlib.util.spec_from_file_location("make_registry", REPO / "data_scripts" / "make_registry.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.dumps(mod.build_registry((MIRROR / "MANIFEST.md").read_text(encoding="utf-8")))
    assert text == registry.REGISTRY_PATH.read_text(encoding="utf-8"), \
        "registry.json is stale: run python data_scripts/make_registry.py"


def test_cache_dir_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("BNNBENCH_CACHE", str(tmp_path / "c"))
    assert store.cache_dir() == (tmp_path / "c").resolve()
    assert store.raw_path(YACHT_DATA) == (tmp_path / "c").resolve() / "raw" / YACHT_DATA
    assert store.canonical_path("uci/yacht").name == "uci__yacht.npz"
    monkeypatch.delenv("BNNBENCH_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):  # platformdirs follows XDG there
        assert store.cache_dir() == tmp_path / "xdg" / "bnnbench"
    with pytest.raises(DataError):
        store.raw_path("../etc/passwd")


# ----------------------------------------------------------------------------- fetching
@needs_mirror
def test_fetch_from_mirror(data_env):
    paths = bd.fetch("uci/yacht")
    assert len(paths) == 48
    for p in paths:
        rel = p.relative_to(data_env / "raw").as_posix()
        assert p.read_bytes() == (MIRROR / rel).read_bytes()
    assert not _leftovers(data_env)
    # second fetch re-verifies and returns the same files
    assert bd.fetch("uci/yacht") == paths


@needs_mirror
def test_corrupted_mirror_raises_and_leaves_nothing(data_env, tmp_path, monkeypatch):
    bad = tmp_path / "badmirror"
    _copy_dir(YACHT_DIR, bad)
    _flip_byte(bad / YACHT_DATA)
    actual = _sha256(bad / YACHT_DATA)
    monkeypatch.setenv("BNNBENCH_MIRROR", str(bad))
    with pytest.raises(ChecksumError) as ei:
        bd.fetch("uci/yacht")
    msg = str(ei.value)
    expected = registry.file_entry(YACHT_DATA)["sha256"]
    assert YACHT_DATA in msg and expected in msg and actual in msg
    assert ei.value.expected == expected and ei.value.actual == actual
    assert not (data_env / "raw" / YACHT_DATA).exists()
    assert not _leftovers(data_env)
    with pytest.raises(ChecksumError):
        bd.load_dataset("uci/yacht")
    assert not store.canonical_path("uci/yacht").exists()
    assert not (data_env / "raw" / YACHT_DATA).exists()
    assert not _leftovers(data_env)


@needs_mirror
def test_corrupted_download_via_file_url(data_env, tmp_path, monkeypatch):
    bad = tmp_path / "data.txt"
    shutil.copyfile(MIRROR / YACHT_DATA, bad)
    _flip_byte(bad, 100)
    monkeypatch.delenv("BNNBENCH_MIRROR")
    monkeypatch.delenv("BNNBENCH_OFFLINE")
    entry = registry.file_entry(YACHT_DATA)
    monkeypatch.setitem(entry, "url", bad.as_uri())
    with pytest.raises(ChecksumError) as ei:
        store.ensure_file(entry, "uci/yacht")
    assert bad.as_uri() in str(ei.value)
    assert not (data_env / "raw" / YACHT_DATA).exists()
    assert not _leftovers(data_env)


@needs_mirror
def test_corrupted_cached_raw_file_is_detected(data_env):
    bd.fetch("uci/yacht")
    cached = data_env / "raw" / YACHT_DATA
    _flip_byte(cached)
    with pytest.raises(ChecksumError) as ei:
        bd.fetch("uci/yacht")
    assert str(cached) in str(ei.value) and "corrupted" in str(ei.value)
    assert not cached.exists()  # removed so that the next call refetches
    bd.fetch("uci/yacht")
    assert cached.read_bytes() == (MIRROR / YACHT_DATA).read_bytes()
    # detected again when converting (no canonical npz yet)
    _flip_byte(cached, 200)
    with pytest.raises(ChecksumError):
        bd.load_dataset("uci/yacht")
    assert not store.canonical_path("uci/yacht").exists()
    ds = bd.load_dataset("uci/yacht")  # refetched from the mirror
    assert ds.X.shape == (308, 6)


@needs_mirror
def test_fetch_via_file_url_without_mirror(data_env, monkeypatch):
    monkeypatch.delenv("BNNBENCH_MIRROR")
    monkeypatch.delenv("BNNBENCH_OFFLINE")
    for e in registry.file_entries("libsvm/australian_presplit"):
        monkeypatch.setitem(e, "url", (MIRROR / e["path"]).as_uri())
    paths = bd.fetch("libsvm/australian_presplit")
    assert len(paths) == 4 and all(p.is_file() for p in paths)
    assert not _leftovers(data_env)


@needs_mirror
def test_normalized_text_entry_accepts_crlf_copy(data_env, tmp_path, monkeypatch):
    rel = "libsvm/australian_scale"
    raw = (MIRROR / rel).read_bytes()
    crlf = tmp_path / "m" / rel
    crlf.parent.mkdir(parents=True)
    crlf.write_bytes(raw.replace(b"\n", b"\r\n\r\n"))  # like the public copy the mirror came from
    monkeypatch.setenv("BNNBENCH_MIRROR", str(tmp_path / "m"))
    p = store.ensure_file(registry.file_entry(rel), "libsvm/australian")
    assert p.read_bytes() == raw


def test_md5_only_entry(data_env, tmp_path, monkeypatch):
    src = tmp_path / "m" / "cifar10" / "cifar-10-python.tar.gz"
    src.parent.mkdir(parents=True)
    src.write_bytes(b"not really a tarball")
    monkeypatch.setenv("BNNBENCH_MIRROR", str(tmp_path / "m"))
    entry = registry.file_entry("cifar10/cifar-10-python.tar.gz")
    assert entry["sha256"] is None
    with pytest.raises(ChecksumError) as ei:  # the real md5 does not match
        store.ensure_file(entry, "cifar10")
    assert ei.value.algorithm == "md5" and "c58f30108f718f92721af3b95e74349a" in str(ei.value)
    assert not (data_env / "raw" / "cifar10" / "cifar-10-python.tar.gz").exists()
    monkeypatch.setitem(entry, "md5", hashlib.md5(src.read_bytes()).hexdigest())
    assert store.ensure_file(entry, "cifar10").read_bytes() == src.read_bytes()


def _usps_fake_entry(monkeypatch, tmp_path, member_bytes: bytes, member_name="usps_resampled/usps_resampled.mat"):
    """Point the USPS entry at a small fake .mat packed in a .tar.bz2 (file:// URL)."""
    arch = tmp_path / "up" / "usps_resampled.tar.bz2"
    arch.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(arch, "w:bz2") as tf:
        info = tarfile.TarInfo(member_name)
        info.size = len(member_bytes)
        tf.addfile(info, io.BytesIO(member_bytes))
        info2 = tarfile.TarInfo("usps_resampled/README")
        info2.size = 3
        tf.addfile(info2, io.BytesIO(b"hi\n"))
    entry = registry.file_entry("usps/usps_resampled.mat")
    assert entry["archive"]["member"] == "usps_resampled.mat"
    monkeypatch.setitem(entry, "url", arch.as_uri())
    return entry, arch


def test_usps_archive_from_url_and_mirror(data_env, tmp_path, monkeypatch):
    payload = b"MATLAB 5.0 MAT-file fake payload" * 100
    entry, arch = _usps_fake_entry(monkeypatch, tmp_path, payload)
    monkeypatch.setitem(entry, "sha256", hashlib.sha256(payload).hexdigest())
    # 1) upstream archive via file:// URL (mirror has no USPS at all)
    monkeypatch.setenv("BNNBENCH_MIRROR", str(tmp_path / "empty"))
    monkeypatch.delenv("BNNBENCH_OFFLINE")
    p = store.ensure_file(entry, "usps/3vs5")
    assert p.read_bytes() == payload and p == data_env / "raw" / "usps" / "usps_resampled.mat"
    assert not _leftovers(data_env)
    p.unlink()
    # 2) the archive placed in a mirror next to where the .mat would be; no download allowed
    m = tmp_path / "m2" / "usps"
    m.mkdir(parents=True)
    shutil.copyfile(arch, m / arch.name)
    monkeypatch.setenv("BNNBENCH_MIRROR", str(tmp_path / "m2"))
    monkeypatch.setenv("BNNBENCH_OFFLINE", "1")
    assert store.ensure_file(entry, "usps/3vs5").read_bytes() == payload
    p.unlink()
    # 3) a member with the wrong digest: ChecksumError, nothing left
    monkeypatch.setitem(entry, "sha256", "0" * 64)
    with pytest.raises(ChecksumError):
        store.ensure_file(entry, "usps/3vs5")
    assert not p.exists() and not _leftovers(data_env)


# ----------------------------------------------------------------------------- errors
def test_unknown_dataset_lists_valid_names():
    with pytest.raises(UnknownDatasetError) as ei:
        bd.load_dataset("uci/bostn")
    exc = ei.value
    assert isinstance(exc, KeyError) and isinstance(exc, DataError)
    msg = str(exc)
    assert not msg.startswith("'")  # not KeyError's quoted repr
    assert "Did you mean 'uci/boston'?" in msg
    for n in EXPECTED_DATASETS:
        assert n in msg
    for fn in (bd.fetch, bd.dataset_files):
        with pytest.raises(UnknownDatasetError):
            fn("mnits")


def test_missing_data_gives_fetch_instructions(data_env, tmp_path, monkeypatch):
    empty = tmp_path / "empty_mirror"
    empty.mkdir()
    monkeypatch.setenv("BNNBENCH_MIRROR", str(empty))
    monkeypatch.delenv("BNNBENCH_OFFLINE")
    for e in registry.file_entries("uci/yacht"):
        monkeypatch.setitem(e, "url", "file:///nonexistent/bnnbench/" + e["path"])
    with pytest.raises(DataMissingError) as ei:
        bd.load_dataset("uci/yacht")
    msg = str(ei.value)
    assert "bnnbench data fetch uci/yacht" in msg and "BNNBENCH_MIRROR=" in msg
    assert "file:///nonexistent/bnnbench/" in msg and str(empty) in msg
    assert not store.canonical_path("uci/yacht").exists()
    assert not [p for p in data_env.rglob("*") if p.is_file()]
    # offline and no mirror at all
    monkeypatch.delenv("BNNBENCH_MIRROR")
    monkeypatch.setenv("BNNBENCH_OFFLINE", "1")
    with pytest.raises(DataMissingError, match="BNNBENCH_OFFLINE"):
        bd.fetch("mnist")


# ----------------------------------------------------------------------------- canonical npz
@needs_mirror
def test_canonical_npz_is_built_once_and_reused(data_env, tmp_path, monkeypatch):
    ds1 = bd.load_dataset("uci/yacht")
    npz = store.canonical_path("uci/yacht")
    assert npz.is_file() and npz.parent == data_env / "canonical"
    assert not _leftovers(data_env)
    # raw files and sources gone: the canonical npz alone is enough
    shutil.rmtree(data_env / "raw")
    monkeypatch.setenv("BNNBENCH_MIRROR", str(tmp_path / "nothing"))
    t = time.perf_counter()
    ds2 = bd.load_dataset("uci/yacht")
    assert time.perf_counter() - t < 0.5
    np.testing.assert_array_equal(ds1.X, ds2.X)
    np.testing.assert_array_equal(ds1.splits[3].test, ds2.splits[3].test)
    # a damaged npz is rebuilt (here: from the mirror again)
    npz.write_bytes(b"garbage")
    monkeypatch.setenv("BNNBENCH_MIRROR", str(MIRROR))
    ds3 = bd.load_dataset("uci/yacht")
    np.testing.assert_array_equal(ds1.y, ds3.y)
    # a registry digest change makes the npz stale -> rebuilt from raw files (which then fail)
    monkeypatch.setitem(registry.file_entry(YACHT_DATA), "sha256", "f" * 64)
    with pytest.raises(ChecksumError):
        bd.load_dataset("uci/yacht")


def test_atomic_savez_roundtrip(tmp_path):
    p = tmp_path / "sub" / "a.npz"
    store.atomic_savez(p, {"a": np.arange(3), "h": np.array("{}")})
    assert store.read_npz(p)["a"].tolist() == [0, 1, 2]
    assert [q.name for q in p.parent.iterdir()] == ["a.npz"]


# ----------------------------------------------------------------------------- CLI
@needs_mirror
def test_cli_list_and_fetch(data_env, capsys):
    assert bd.cli(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in EXPECTED_DATASETS)
    assert bd.cli(["uci/yacht", "libsvm/a1a"]) == 0
    assert (data_env / "raw" / "libsvm" / "a1a.t").is_file()
    assert bd.cli(["uci/bostn"]) == 2
    assert "uci/boston" in capsys.readouterr().err
    assert bd.cli(["cifar10"]) == 1  # not in the mirror, downloads disabled


def test_family_prefix_expansion():
    from bnnbench.core.data import _expand

    assert _expand("uci") == EXPECTED_DATASETS[:10]
    assert _expand("all") == EXPECTED_DATASETS
    with pytest.raises(UnknownDatasetError):
        _expand("ucx")
