"""The replica axis over worker processes (``workers=W``): each chunk trains exactly as it would alone with its
seed, the joined result puts every replica back in its place, and a run records ``workers`` and stays
deterministic."""

import json

import pytest
import torch

from bnnbench.run.config import CommandLine, compose
from bnnbench.core.data import load_dataset
from bnnbench.run.engine import DivergenceError
from bnnbench.run.config import ConfigError
from bnnbench.run.protocol import resolve
from bnnbench.methods.point.map import MAPState
from bnnbench.run.replica_workers import chunks, join_states, split_state
from bnnbench.run.execute import execute
from bnnbench.run.fit import FitOptions, fit
from bnnbench.run import replica_workers
from bnnbench.run.replica_workers import fit_replicas, run_pool
from bnnbench.run.splits import select_splits

from datapaths import MIRROR

needs_data = pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file(), reason="needs the data mirror")
pytestmark = pytest.mark.e2e   # worker processes: make test-e2e

TINY = ["protocol.epochs=2", "protocol.splits=[0,1,2]", "protocol.eval_every=1", "progress=false"]


@pytest.fixture(scope="module", autouse=True)
def env(module_env):
    yield


def test_chunks_are_contiguous_and_cover_the_replicas():
    assert chunks(5, 2) == [range(0, 2), range(2, 5)]
    assert chunks(20, 2) == [range(0, 10), range(10, 20)]
    assert chunks(2, 4) == [range(0, 1), range(1, 2)]
    assert chunks(7, 1) == [range(0, 7)]


def test_state_split_and_join_round_trip():
    state = MAPState(n_data=torch.arange(5), prior_prec=torch.ones(5, 2), theta=torch.arange(10.0).reshape(5, 2),
                     m=torch.zeros(5, 2), v=torch.zeros(5, 2), t=torch.arange(5))
    parts = chunks(5, 2)
    back = join_states([split_state(state, idx, 5) for idx in parts], [len(i) for i in parts])
    assert type(back) is MAPState and back.noise_prec is None
    assert all(torch.equal(v, state.tensors()[k]) for k, v in back.tensors().items())
    assert split_state(state, parts[1], 5).theta.shape == (3, 2)
    with pytest.raises(ValueError, match="not on the replica axis"):
        split_state(state.replace(noise_prec=torch.tensor(2.0)), parts[0], 5)


@needs_data
def test_each_chunk_trains_as_it_would_alone_with_its_seed():
    ov = ["method=bbb", "data=uci/yacht", *TINY]
    cfg = compose(ov)
    ds = load_dataset(cfg.data.name)
    spec = resolve(cfg, CommandLine.parse(ov), meta=ds.meta)
    splits = select_splits(ds, [0, 1, 2], spec.split_scheme)
    pairs = [(s.train, s.test) for s in splits]
    hps = [dict(spec.fixed, prior_prec=p) for p in (0.5, 1.0, 2.0)]
    opts = FitOptions(device=torch.device("cpu"), dtype=torch.float32, eval_every=1)
    joined = fit_replicas(spec, ds, pairs, [0, 1, 2], hps, torch.Generator().manual_seed(7), opts, workers=2)
    seeds = torch.randint(0, 2 ** 62, (2,), generator=torch.Generator().manual_seed(7)).tolist()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // 2))  # the workers' thread count: same float reductions
    try:
        alone = [fit(spec, ds, pairs[:2], [0, 1], hps[:2], torch.Generator().manual_seed(seeds[0]), opts),
                 fit(spec, ds, pairs[2:], [0], hps[2:], torch.Generator().manual_seed(seeds[1]), opts)]
    finally:
        torch.set_num_threads(threads)
    for k in alone[0].final:
        assert torch.equal(joined.final[k], torch.cat([a.final[k] for a in alone])), k
    assert type(joined.state) is type(alone[0].state)
    parts, whole = [a.state.tensors() for a in alone], joined.state.tensors()
    assert whole.keys() == parts[0].keys()
    for k in parts[0]:
        assert torch.equal(whole[k], torch.cat([p[k] for p in parts])), k
    assert joined.history.epochs == [1, 2]
    first = [a.history.metrics[0]["rmse"] for a in alone]
    assert joined.history.metrics[0]["rmse"] == first[0] + first[1]
    assert joined.method is not None and joined.steps == alone[0].steps


@needs_data
def test_a_run_keeps_its_worker_processes_and_their_numbers():
    # a selection's rounds in one run: the same processes for every fit and the numbers of workers spawned per fit,
    # also after a fit whose replicas diverged in a worker
    def spec_of(*extra):
        ov = ["method=bbb", "data=uci/yacht", *TINY, *extra]
        return resolve(compose(ov), CommandLine.parse(ov), meta=ds.meta)

    ds = load_dataset("uci/yacht")
    spec, diverging = spec_of(), spec_of("method.lr=1e30")
    pairs = [(s.train, s.test) for s in select_splits(ds, [0, 1, 2], spec.split_scheme)]
    hps = [dict(spec.fixed, prior_prec=p) for p in (0.5, 1.0, 2.0)]
    opts = FitOptions(device=torch.device("cpu"), dtype=torch.float32, eval_every=1, stop_on_divergence=True)

    def fit_at(seed, spec=spec):
        return fit_replicas(spec, ds, pairs, [0, 1, 2], hps, torch.Generator().manual_seed(seed), opts, workers=2)

    fresh = [fit_at(7), fit_at(8)]
    with run_pool():
        kept, pids = [fit_at(7)], [set(replica_workers._RUN_POOL["pool"]._processes)]
        with pytest.raises(DivergenceError):
            fit_at(7, diverging)
        kept.append(fit_at(8))
        pids.append(set(replica_workers._RUN_POOL["pool"]._processes))
    assert replica_workers._RUN_POOL["pool"] is None and len(pids[0]) == 2 and pids[0] == pids[1]
    for a, b in zip(fresh, kept):
        assert all(torch.equal(a.final[k], b.final[k]) for k in a.final)
        assert all(torch.equal(v, b.state.tensors()[k]) for k, v in a.state.tensors().items())


@needs_data
@pytest.mark.parametrize("setting", [["method=bbb"],
                                     ["method=noisy_adam", "protocol=nng_uci", "protocol.splits=[r0,r1,r2]"]])
def test_a_run_with_workers_records_them_and_repeats_its_numbers(tmp_path, setting):
    # noisy Adam at nng_uci learns q(tau), and its predictions sample tau from it
    ov = ["data=uci/yacht", *TINY, *setting, "workers=2"]
    a = execute(compose(ov), ov, tmp_path / "a", log=lambda m: None)
    b = execute(compose(ov), ov, tmp_path / "b", log=lambda m: None)
    assert a["config"]["workers"] == 2 and a["metrics"] == b["metrics"]
    assert not list((tmp_path / "a").glob(".checkpoint-*"))
    one = ["data=uci/yacht", *TINY, *setting]
    assert execute(compose(one), one, tmp_path / "c", log=lambda m: None)["config_hash"] != a["config_hash"]


@needs_data
@pytest.mark.parametrize("method", ["vogn", "slang", "noisy_kfac"])
def test_other_methods_run_in_workers(tmp_path, method):
    ov = [f"method={method}", "data=uci/yacht", *TINY, "protocol.epochs=1", "workers=2"]
    rec = execute(compose(ov), ov, tmp_path / "run", log=lambda m: None)
    assert [m["split"] for m in rec["metrics"]] == ["0", "1", "2"]


@needs_data
def test_bayesian_optimisation_rounds_run_in_workers(tmp_path):
    ov = ["method=bbb", "data=uci/yacht", *TINY, "hpo=bo", "hpo.n_random=2", "hpo.n_iter=1", "hpo.folds=2",
          "protocol.epochs=1", "workers=2"]
    rec = execute(compose(ov), ov, tmp_path / "run", log=lambda m: None)
    assert len(rec["hpo_trace"]) == 3 and all(len(t) == 3 for t in rec["hpo_trace"])  # 2 random + 1 EI per split
    assert {h["split"] for h in rec["hparams"]} == {"0", "1", "2"}


@needs_data
def test_divergence_in_a_worker_fails_the_run_naming_replicas_of_the_run(tmp_path):
    ov = ["method=bbb", "data=uci/yacht", *TINY, "workers=2", "method.lr=1e30"]
    with pytest.raises(DivergenceError, match=r"replica\(s\) \[0, 1\]"):
        execute(compose(ov), ov, tmp_path / "run", log=lambda m: None)
    assert not (tmp_path / "run" / "record.json").exists()
    assert json.loads((tmp_path / "run" / "failed.json").read_text())["status"] == "failed"
    cfg = compose(ov)  # a chunk numbers its replicas from its offset in the run
    ds = load_dataset(cfg.data.name)
    spec = resolve(cfg, CommandLine.parse(ov), meta=ds.meta)
    pairs = [(s.train, s.test) for s in select_splits(ds, [0, 1], spec.split_scheme)]
    with pytest.raises(DivergenceError, match=r"replica\(s\) \[5, 6\]"):
        fit(spec, ds, pairs, [0, 1], [dict(spec.fixed)] * 2, torch.Generator().manual_seed(0),
            FitOptions(device=torch.device("cpu"), dtype=torch.float32, replica_offset=5))


@pytest.mark.parametrize("bad, msg", [("workers=0", "workers must be"), ("workers=2 device=cuda", "device=cuda")])
def test_bad_workers_is_a_clear_error(tmp_path, bad, msg):
    ov = ["method=bbb", "data=uci/yacht", *TINY, *bad.split()]
    with pytest.raises(ConfigError, match=msg):
        execute(compose(ov), ov, tmp_path / "run", log=lambda m: None)
