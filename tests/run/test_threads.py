"""The ``threads`` setting: the count a run trains with (through the real command line), its record, its errors,
and the counts of ``workers`` processes and ``reproduce --jobs`` cells."""

import json

import pytest
import torch

from bnnbench.run import execute, fit, replica_workers, results, threads
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


def test_auto_is_one_thread_for_small_networks_and_the_cores_for_mnist_size(monkeypatch):
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.0)   # idle cores
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

    def shutdown(self, wait=True, cancel_futures=False):
        pass


def test_workers_train_with_one_thread_each_on_a_small_network(tmp_path, monkeypatch, trained_with):
    monkeypatch.setattr(replica_workers, "ProcessPoolExecutor", _InProcess)
    assert main(["run", *TINY, "workers=2", f"runs_root={tmp_path}"]) == 0
    assert trained_with == [1, 1]


def test_a_reproduce_worker_trains_a_small_network_with_one_thread(tmp_path, trained_with):
    ov = [*TINY, f"runs_root={tmp_path}"]
    out = _reproduce_cell("adhoc", str(tmp_path), ov, 2)   # a worker of --jobs N allowed 2 cores
    assert "rmse" in out and trained_with == [1]
    assert _record(tmp_path)["versions"]["torch_threads"] == 1


CGROUP_QUOTA = threads._cgroup_quota


class _Stat:
    """``/proc/stat`` whose successive reads are ``texts``."""

    def __init__(self, *texts):
        self.texts = list(texts)

    def read_text(self):
        return self.texts.pop(0)


def _stat(*per_cpu):
    """``/proc/stat`` lines of CPUs with (user, idle) jiffies."""
    lines = ["cpu  1 2 3 4 5 6 7 8 0 0"] + [f"cpu{k} {u} 0 0 {i} 0 0 0 0 0 0" for k, (u, i) in enumerate(per_cpu)]
    return "\n".join([*lines, "intr 1 2 3", "ctxt 9"])


@pytest.fixture
def four_cpus(monkeypatch):
    """A 4-CPU machine, no cgroup quota, this process allowed on all four."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: None)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)


@pytest.mark.parametrize("busy, want", [(0.0, 4), (0.4, 4), (1.0, 3), (1.2, 3), (2.9, 1), (3.0, 1), (7.5, 1)])
def test_auto_gives_a_large_network_the_usable_cores_other_work_leaves_free(four_cpus, monkeypatch, busy, want):
    monkeypatch.setattr(threads, "busy_cores", lambda: busy)
    assert threads.choose("auto", 478_410) == want
    assert threads.choose("auto", 751) == 1     # a small network: 1, whatever the load
    assert threads.choose(3, 478_410) == 3      # an explicit count: as given


def test_two_cores_beside_other_jobs_give_a_convolutional_network_one_thread(monkeypatch):
    """Issue 31: a convolutional network got both cores of a 2-core host beside three other jobs (392 s, not 27 s)."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: None)
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    monkeypatch.setattr(threads, "PROC_STAT", _Stat(_stat((0, 0), (0, 0)), _stat((100, 0), (97, 3))))
    assert threads.choose("auto", threads.MANY_PARAMS) == 1


def test_busy_cores_counts_only_the_cpus_of_the_affinity_mask(four_cpus, monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})   # e.g. taskset -c 0,1 or SLURM's cpuset
    before = _stat((0, 0), (0, 0), (0, 0), (0, 0))
    after = _stat((25, 0), (0, 25), (25, 0), (25, 0))   # cpu0 busy, cpu1 idle; cpu2 and cpu3 (not ours) busy
    monkeypatch.setattr(threads, "PROC_STAT", _Stat(before, after))
    assert threads.busy_cores() == 1.0
    monkeypatch.setattr(threads, "PROC_STAT", _Stat(before, after))
    assert threads.choose("auto", 478_410) == 1
    monkeypatch.setattr(threads, "PROC_STAT", _Stat(before, _stat((0, 25), (0, 25), (25, 0), (25, 0))))
    assert threads.choose("auto", 478_410) == 2


def test_without_proc_stat_the_load_average_against_the_usable_cores_decides(four_cpus, monkeypatch, tmp_path):
    monkeypatch.setattr(threads, "PROC_STAT", tmp_path / "no_such_file")
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (3.0, 0.0, 0.0))
    assert threads.busy_cores() == 1.5                   # 3 on 4 cores, half of them ours
    assert threads.choose("auto", 478_410) == 1
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.4, 0.0, 0.0))
    assert threads.choose("auto", 478_410) == 2


def test_a_cgroup_quota_caps_the_usable_cores(four_cpus, monkeypatch, tmp_path):
    monkeypatch.setattr(threads, "_cgroup_quota", CGROUP_QUOTA)   # the real reader, of a file of ours
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", quota)
    for text, want in (("200000 100000\n", 2), ("max 100000\n", 4), ("50000 100000\n", 1), ("garbage", 4)):
        quota.write_text(text)
        assert threads.usable_cores() == want
    quota.unlink()
    assert threads.usable_cores() == 4


def _resolved(n):
    return {"config_schema": 2, "method": "noisy_adam", "dataset": "mnist", "seed": 0, "spec": {"epochs": 3},
            "threads": n}


def test_auto_keeps_the_count_of_the_record_or_checkpoint_already_in_its_run_directory(tmp_path):
    """A large network's ``auto`` count depends on the load; a finished record is still reused and a killed job still
    resumes from its checkpoint when the load at the new start picks another count (``adopt_earlier``)."""
    fresh = tmp_path / "fresh"
    assert threads.adopt_earlier("auto", _resolved(1), fresh) == _resolved(1)      # nothing there: as chosen
    done = tmp_path / "done"
    results.write_record(done, {"status": "ok", "config": {**_resolved(2), "hydra_overrides": ["threads=auto"]}})
    assert threads.adopt_earlier("auto", _resolved(1), done) == _resolved(2)
    assert results.is_done(done, results.config_hash(threads.adopt_earlier("auto", _resolved(1), done)))
    assert threads.adopt_earlier(1, _resolved(1), done) == _resolved(1)            # an explicit count: as given
    other = {**_resolved(1), "seed": 1}
    assert threads.adopt_earlier("auto", other, done) == other                     # another configuration: as chosen
    killed = tmp_path / "killed"
    killed.mkdir()
    chash = results.config_hash(_resolved(3))
    (killed / f".checkpoint-{chash}.pt").write_bytes(b"")
    assert threads.adopt_earlier("auto", _resolved(1), killed) == _resolved(3)
    assert results.ResumeFiles(killed, chash).existing() == [killed / f".checkpoint-{chash}.pt"]
