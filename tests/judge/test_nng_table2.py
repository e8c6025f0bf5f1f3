"""Noisy natural gradient's CIFAR-10 table (experiment nng_table2) end to end on a file in CIFAR-10's distribution
format: the loader (checksum, pickles), the halved VGG16 with and without batch normalisation, the augmentation, the
five methods and the table against the published numbers. CIFAR-10 itself is not on these machines."""

import hashlib
import json

import pandas as pd
import pytest

from bnnbench.cli import main
from bnnbench.core.data import registry
from test_data_loaders import _make_cifar_tarball


@pytest.mark.e2e
def test_nng_table2_end_to_end_on_a_cifar_format_file(tmp_path, monkeypatch):
    src = tmp_path / "mirror" / "cifar10" / "cifar-10-python.tar.gz"
    src.parent.mkdir(parents=True)
    _make_cifar_tarball(src, per_batch=4)            # 20 training and 4 test images
    monkeypatch.setitem(registry.file_entry("cifar10/cifar-10-python.tar.gz"), "md5",
                        hashlib.md5(src.read_bytes()).hexdigest())
    monkeypatch.setenv("BNNBENCH_MIRROR", str(tmp_path / "mirror"))
    monkeypatch.setenv("BNNBENCH_OFFLINE", "1")
    monkeypatch.setenv("BNNBENCH_CACHE", str(tmp_path / "cache"))
    runs, out = tmp_path / "runs", tmp_path / "res" / "tables"
    # five of the 16 cells: every method and every setting (augmentation, BN, both) once, for CI's time
    cells = ["noisy_kfac_DB", "kfac_B", "sgd_D", "bbb_plain", "noisy_adam_D"]
    argv = ["reproduce", "nng_table2", "protocol.epochs=1", "protocol.batch_size=10", "protocol.eval_samples=2",
            "protocol.eval_every=1", "progress=false", "threads=1", "--runs-root", str(runs), "--out", str(out),
            "--label", ",".join(cells)]
    assert main(argv) == 0
    labels = sorted(p.parent.parent.name for p in runs.glob("nng_table2/*/cifar10/record.json"))
    assert labels == sorted(cells)
    spec = json.loads((runs / "nng_table2" / "noisy_kfac_DB" / "cifar10" / "record.json").read_text())["config"]["spec"]
    assert spec["augment"] == {"crop_pad": 4, "flip": True} and spec["conv"]["batch_norm"] is True
    assert spec["method"]["kl_weight"] == 0.1 and spec["method"]["kl_clip"] == 0.01 and spec["conv"]["arch"][-1] == "M"
    table = pd.read_csv(out / "nng_table2.csv")
    ours = table.dropna(subset=["ours"])
    assert len(ours) == 5 and ours["ours"].between(0, 1).all() and ours["paper"].notna().all()
    assert set(ours["setting"]) == {"plain", "D", "B", "D+B"}
    assert table["ours"].isna().sum() == 11   # the cells not run are in the table, marked so
