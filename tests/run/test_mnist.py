"""MNIST (SLANG Table 3): the protocol a plain ``bnnbench run ... data=mnist`` gets, the staged schedule
(first 50k images, then all 60k, the method's state carried over), and a staged run interrupted between
stages resuming to the same record as an uninterrupted one."""

import json

import pytest

from bnnbench.cli import main
from bnnbench.run.config import compose
from bnnbench.run.execute import execute

from datapaths import MIRROR

needs_mirror = pytest.mark.skipif(not (MIRROR / "mnist").is_dir(), reason="needs the data mirror with MNIST")

# a small network on 400 / 300 images, two short stages: the schedule, not the accuracy
TINY = ["protocol=slang_mnist_fast", "model.hidden=[16]", "protocol.subset.train=400", "protocol.subset.test=300",
        "protocol.stages=[{split: validation, epochs: 2}, {split: official, epochs: 2}]", "protocol.eval_samples=4",
        "protocol.eval_samples_final=8", "protocol.batch_size=100", "protocol.eval_every=1", "progress=false"]


@pytest.fixture(scope="module")
def env(module_env):
    yield


def test_plain_mnist_run_gets_the_slang_table3_protocol():
    cfg = compose(["method=slang", "data=mnist", "method.rank=8"])
    assert cfg.protocol.name == "slang_mnist" and cfg.method.rank == 8
    assert list(cfg.protocol.hidden) == [400, 400] and cfg.protocol.batch_size == 200
    assert [(s.split, s.epochs) for s in cfg.protocol.stages] == [("validation", 100), ("official", 300)]
    assert cfg.protocol.eval_samples_final == 1000
    assert compose(["method=bbb", "data=uci/boston"]).protocol.name == "slang_uci"


def _run(tmp_path, *extra):
    ov = ["experiment=slang_table3", "method=slang", "method.rank=2", "label=slang_L2", f"runs_root={tmp_path}",
          *TINY, *extra]
    return execute(compose(ov), ov, tmp_path / "run", log=lambda m: None)


class _Interrupt(Exception):
    pass


@needs_mirror
def test_stages_train_on_50k_then_60k_and_resume_between_stages(tmp_path, env, monkeypatch):
    import bnnbench.run.stages as stages_mod
    real, seen = stages_mod.fit_replicas, []
    monkeypatch.setattr(stages_mod, "fit_replicas", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    ref = _run(tmp_path / "ref")
    # stage 2 continues stage 1's state (SLANG's step counter goes on: the decays continue), with N = its data
    assert [int(r.state.t[0]) for r in seen] == [8, 16]
    assert [int(r.state.n_data[0]) for r in seen] == [400, 400]
    monkeypatch.setattr(stages_mod, "fit_replicas", real)
    assert [(s["split"], s["epochs"], s["n_train"], s["n_eval"]) for s in ref["stages"]] == [
        ("validation", 2, 400, 300), ("official", 2, 400, 300)]
    assert ref["stages"][0]["final"]["error"] != ref["stages"][1]["final"]["error"]  # validation vs test images
    assert [m["split"] for m in ref["metrics"]] == ["official"]
    assert ref["metrics"][0]["error"] == pytest.approx(ref["stages"][1]["final"]["error"][0])
    assert 0 < ref["metrics"][0]["error_se"] < 0.05
    hist = json.loads((tmp_path / "ref" / "run" / "history.json").read_text())
    assert hist["epochs"] == [1, 2, 3, 4]
    assert ref["train_steps"] == 4 * 4                           # 400 images / 100 per step, 4 epochs

    calls = {"n": 0}

    def dies_in_stage_2(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise _Interrupt
        return real(*a, **k)

    monkeypatch.setattr(stages_mod, "fit_replicas", dies_in_stage_2)
    with pytest.raises(_Interrupt):
        _run(tmp_path / "cut")
    assert len(list((tmp_path / "cut" / "run").glob(".stage0-*.pt"))) == 1   # stage 1 kept
    calls["n"] = 0
    monkeypatch.setattr(stages_mod, "fit_replicas",
                        lambda *a, **k: (calls.__setitem__("n", calls["n"] + 1), real(*a, **k))[1])
    resumed = _run(tmp_path / "cut")
    assert calls["n"] == 1                                       # only stage 2 trained again
    assert resumed["metrics"] == ref["metrics"] and resumed["stages"] == ref["stages"]
    assert not list((tmp_path / "cut" / "run").glob(".*.pt"))   # resume state removed with the record


@needs_mirror
def test_table3_from_a_record_states_its_protocol(tmp_path, env):
    runs = tmp_path / "runs"
    ov = ["experiment=slang_table3", "method=bbb", f"runs_root={runs}", *TINY]
    execute(compose(ov), ov, runs / "slang_table3" / "bbb" / "mnist", log=lambda m: None)
    assert main(["table", "slang_table3", "--runs-root", str(runs), "--out", str(tmp_path / "t")]) == 0
    md = (tmp_path / "t" / "slang_table3.md").read_text()
    assert "slang_mnist_fast (2 ep. on 400 + 2 ep. on 400)" in md
    assert "binomial standard error" in md


def test_cpu_protocol_is_the_first_stage_scored_on_the_test_images():
    cfg = compose(["experiment=slang_table3", "method=slang", "method.rank=8", "protocol=slang_mnist_50k"])
    assert cfg.protocol.stages is None and list(cfg.protocol.splits) == ["train50k"]
    assert cfg.protocol.epochs == 100 and cfg.protocol.batch_size == 200 and cfg.protocol.eval_samples_final == 1000


@needs_mirror
def test_table3_states_a_single_stage_protocol(tmp_path, env):
    runs = tmp_path / "runs"
    ov = ["experiment=slang_table3", "method=bbb", f"runs_root={runs}", *TINY, "protocol.stages=null",
          "protocol.splits=[train50k]", "protocol.epochs=2"]
    rec = execute(compose(ov), ov, runs / "slang_table3" / "bbb" / "mnist", log=lambda m: None)
    assert [m["split"] for m in rec["metrics"]] == ["train50k"] and "stages" not in rec
    assert main(["table", "slang_table3", "--runs-root", str(runs), "--out", str(tmp_path / "t")]) == 0
    assert "slang_mnist_fast (2 ep. on split train50k)" in (tmp_path / "t" / "slang_table3.md").read_text()


@pytest.mark.slow
@needs_mirror
def test_fast_protocol_ranks_the_methods_as_the_long_runs(tmp_path, env):
    """protocol=slang_mnist_fast (1000 steps) must get SLANG out of its initial phase: a higher rank gives a lower
    -ELBO/N and test NLL (measured: L = 1, 8: 27.2 / 24.6 and 0.66 / 0.61), and BBB is ahead, as after 100 epochs of
    slang_mnist_50k. With 125 steps every L sat at 42-47% in no order. About 10 min on 2 cores."""
    recs = {}
    for label, extra in (("slang_L1", ["method=slang", "method.rank=1"]),
                         ("slang_L8", ["method=slang", "method.rank=8"]), ("bbb", ["method=bbb"])):
        ov = ["experiment=slang_table3", "protocol=slang_mnist_fast", f"label={label}", f"runs_root={tmp_path}",
              "progress=false", *extra]
        recs[label] = execute(compose(ov), ov, tmp_path / label, log=lambda m: None)["summary"]
    elbo = {k: json.loads((tmp_path / k / "history.json").read_text())["metrics"][-1]["train_objective"][0]
            for k in ("slang_L1", "slang_L8")}
    assert elbo["slang_L8"] < elbo["slang_L1"]
    assert recs["slang_L8"]["nll"]["mean"] < recs["slang_L1"]["nll"]["mean"]
    assert recs["slang_L1"]["error"]["mean"] < 0.25                      # out of the initial phase (42-47% before)
    assert recs["bbb"]["error"]["mean"] < recs["slang_L8"]["error"]["mean"]
