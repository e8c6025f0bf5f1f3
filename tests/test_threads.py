"""The ``threads`` setting: the count a run trains with (through the real command line), its record, its errors,
and the counts of ``workers`` processes and ``reproduce --jobs`` cells."""

import json

import pytest
import torch

from bnnbench import execute, fit, replica_workers, results, threads
from bnnbench.cli import _reproduce_cell, main

from datapaths import MIRROR

pytestmark = pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file(), reason="needs the data mirror")

TINY = ["method=bbb", "data=uci/yacht", "protocol.epochs=1", "protocol.splits=[0,1]", "progress=false"]


@pytest.fixture(autouse=True)
def env(module_env, monkeypatch):
    """torch at 4 threads (a default a small model must not get), and restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(4)
    monkeypatch.setattr(threads, "_SHARE", [])
    monkeypatch.setattr("sys.argv", ["bnnbench"])
    yield
    torch.set_num_threads(before)


@pytest.fixture
def trained_with(monkeypatch):
    """The thread counts ``train`` ran with, one per call."""
    seen = []
    real = fit.train

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        return real(*a, **k)

    monkeypatch.setattr(fit, "train", spy)
    return seen


def _record(root):
    return json.loads(next(root.rglob("record.json")).read_text())


def test_a_default_run_trains_a_uci_set_with_one_thread_and_records_it(tmp_path, trained_with):
    assert main(["run", *TINY, f"runs_root={tmp_path}"]) == 0
    rec = _record(tmp_path)
    assert trained_with == [1]
    assert rec["versions"]["torch_threads"] == 1 and rec["config"]["threads"] == 1


def test_threads_is_honoured_recorded_and_hashed_above_one(tmp_path, trained_with):
    assert main(["run", *TINY, "threads=2", f"runs_root={tmp_path / 'two'}"]) == 0
    assert main(["run", *TINY, "threads=1", f"runs_root={tmp_path / 'one'}"]) == 0
    two, one = _record(tmp_path / "two"), _record(tmp_path / "one")
    assert trained_with == [2, 1]
    assert two["versions"]["torch_threads"] == 2 and two["config"]["threads"] == 2
    assert two["metrics"] == one["metrics"]            # a UCI set: the same numbers at any count
    assert two["config_hash"] != one["config_hash"]    # elsewhere they can differ in the last digit
    before = {k: v for k, v in one["config"].items() if k not in ("threads", "hydra_overrides")}
    assert one["config_hash"] == results.config_hash(before)   # records from before the setting stay valid


@pytest.mark.parametrize("value", ["0", "abc", "-1", "1.5"])
def test_a_bad_thread_count_is_an_error_before_any_work(tmp_path, capsys, monkeypatch, trained_with, value):
    def no_data(name):
        raise AssertionError("the data set was read")

    monkeypatch.setattr(execute, "load_dataset", no_data)
    assert main(["run", *TINY, f"threads={value}", f"runs_root={tmp_path}"]) == 2
    assert "error: threads must be auto or an integer >= 1, got" in capsys.readouterr().err
    assert trained_with == [] and not list(tmp_path.rglob("record.json"))


def test_auto_is_one_thread_for_small_networks_and_the_cores_for_mnist_size():
    assert threads.choose("auto", 751) == 1                   # Boston's 13-50-1
    assert threads.choose("auto", 478_410) == threads.cores()  # MNIST's 784-400-400-10
    assert threads.choose(3, 751) == 3
    threads.share_cores(1)
    assert threads.choose("auto", 478_410) == 1


class _InProcess:
    """``ProcessPoolExecutor`` stand-in: the same calls in this process (so that ``train`` can be watched)."""

    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, *its):
        return list(map(fn, *its))


def test_workers_train_with_one_thread_each_on_a_small_network(tmp_path, monkeypatch, trained_with):
    monkeypatch.setattr(replica_workers, "ProcessPoolExecutor", _InProcess)
    assert main(["run", *TINY, "workers=2", f"runs_root={tmp_path}"]) == 0
    assert trained_with == [1, 1]


def test_a_reproduce_worker_trains_a_small_network_with_one_thread(tmp_path, trained_with):
    ov = [*TINY, f"runs_root={tmp_path}"]
    out = _reproduce_cell("adhoc", str(tmp_path), ov, 2)   # a worker of --jobs N allowed 2 cores
    assert "rmse" in out and trained_with == [1]
    assert _record(tmp_path)["versions"]["torch_threads"] == 1
