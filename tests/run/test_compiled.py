"""The ``compile`` setting (bnnbench/run/compiled.py): resolved per method (only a ``compilable`` method's step is
compiled, on an MLP), recorded, and hashed only when on, so that the records made before it keep their configuration
hash."""

import json
import os

import pytest
import torch

from bnnbench.run import results
from bnnbench.cli import main
from bnnbench.run.config import compose
from bnnbench.run.execute import resolve_run

from datapaths import MIRROR

pytestmark = pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file(), reason="needs the data mirror")

TINY = ["data=uci/yacht", "protocol.epochs=2", "protocol.splits=[0,1]", "progress=false"]


@pytest.fixture(autouse=True)
def env(module_env, monkeypatch):
    monkeypatch.setattr("sys.argv", ["bnnbench"])


def test_the_compile_cache_is_one_per_version_of_the_packages_operators(tmp_path, monkeypatch):
    """Inductor's cache key does not cover an operator's shape rule: a graph cached before the rule changed failed its
    layout check (2026-12-03, ``bnnbench::outer_times``). The cache directory is keyed by the modules defining
    operators, and by nothing else."""
    from bnnbench.run import compiled
    (tmp_path / "ops.py").write_text("@torch.library.custom_op('x::y', mutates_args=())\ndef y(t): ...\n")
    (tmp_path / "other.py").write_text("a = 1\n")
    key = compiled.operators_key(tmp_path)
    (tmp_path / "other.py").write_text("a = 2\n")
    assert compiled.operators_key(tmp_path) == key
    (tmp_path / "ops.py").write_text("@torch.library.custom_op('x::y', mutates_args=())\ndef y(t): return t\n")
    assert compiled.operators_key(tmp_path) != key
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    compiled._use_cache_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith(f"ops-{compiled.operators_key()}")


def _resolved(*overrides):
    overrides = list(overrides)
    return resolve_run(compose(overrides), overrides)[3]


@pytest.mark.parametrize("method, compiled", [("bbb", True), ("vogn", True), ("mc_dropout", True),
                                              ("slang", True), ("noisy_kfac", True), ("hmc", True), ("gi", True),
                                              ("gi method.arch=mnist500_cnn data=mnist", False)])
def test_compile_resolves_to_what_the_run_does_and_is_hashed_only_when_on(method, compiled):
    method, *more = method.split()
    data = next((m for m in more if m.startswith("data=")), "data=uci/yacht")
    more = [m for m in more if not m.startswith("data=")]
    off = _resolved(f"method={method}", data, *more)
    on = _resolved(f"method={method}", data, *more, "compile=true")
    assert off["compile"] is False and on["compile"] is compiled
    before = {k: v for k, v in off.items() if k != "compile"}   # a record from before the setting
    assert results.config_hash(off) == results.config_hash(before)
    assert (results.config_hash(on) != results.config_hash(off)) is compiled


@pytest.mark.parametrize("value", ["abc", "1", "null"])
def test_a_bad_compile_value_is_an_error_before_any_work(tmp_path, capsys, value):
    assert main(["run", "method=bbb", *TINY, f"compile={value}", f"runs_root={tmp_path}"]) == 2
    assert "error: compile must be true or false, got" in capsys.readouterr().err
    assert not list(tmp_path.rglob("record.json"))


@pytest.mark.slow   # a compilation: 10-30 s in a fresh inductor cache
def test_a_compiled_run_records_compile_and_matches_the_eager_run_to_rounding(tmp_path, monkeypatch):
    import bnnbench.run.compiled as compiled
    calls = []
    real = compiled.compiled_step
    monkeypatch.setattr(compiled, "compiled_step", lambda m, *a: calls.append(m.name) or real(m, *a))
    recs = {}
    for c in ("false", "true"):
        assert main(["run", "method=bbb", *TINY, f"compile={c}", f"runs_root={tmp_path / c}"]) == 0
        recs[c] = json.loads(next((tmp_path / c).rglob("record.json")).read_text())
    assert calls == ["bbb"]
    assert recs["true"]["config"]["compile"] is True and recs["false"]["config"]["compile"] is False
    assert recs["true"]["config_hash"] != recs["false"]["config_hash"]
    for row_e, row_c in zip(recs["false"]["metrics"], recs["true"]["metrics"]):
        for k, v in row_e.items():
            if isinstance(v, float):
                assert row_c[k] == pytest.approx(v, rel=1e-4), k
    torch._dynamo.reset()


def _counting_backend(monkeypatch):
    """``torch.compile`` with a counting backend in place of inductor (``counter.frame_count``: the frames compiled),
    from an empty dynamo cache."""
    from torch._dynamo.testing import CompileCounter
    counter, real = CompileCounter(), torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic=None, mode=None, options=None:
                        real(fn, backend=counter, dynamic=dynamic))
    torch._dynamo.reset()
    return counter


def test_each_run_in_a_process_compiles_its_step_past_dynamos_limit_of_versions(tmp_path, monkeypatch):
    """Dynamo keeps a function's compiled versions per code object and runs it eagerly past ``recompile_limit`` of
    them: in one ``bnnbench reproduce`` process, App. G's cells after the 64th would have run eager. Each run starts
    from none (``compiled.new_run``): with the limit at 1, a second run whose step differs in a constant (the step size)
    compiles its step as the first did. Counted by a counting backend instead of inductor."""
    from bnnbench.run import compiled
    counter = _counting_backend(monkeypatch)
    monkeypatch.setattr(compiled, "_CACHE_SIZE_LIMIT", 1)
    frames = []
    with torch._dynamo.config.patch(recompile_limit=1):
        for lr in (0.01, 0.02):
            assert main(["run", "method=bbb", *TINY, "compile=true", f"method.lr={lr}",
                         f"runs_root={tmp_path / str(lr)}"]) == 0
            frames.append(counter.frame_count)
    assert frames[0] > 0 and frames[1] == 2 * frames[0]
    torch._dynamo.reset()


def test_on_a_gpu_the_compiled_step_runs_as_cuda_graphs_each_update_a_new_graph_step(monkeypatch):
    """``compile_mode``: CUDA graphs (``reduce-overhead``) on a CUDA device, inductor's default elsewhere; the engine's
    update on a GPU marks a new graph step before each step (so that the previous step's outputs, its input now, may be
    overwritten by the replay) and returns the step's own results, copied out of the graphs' memory pool (a step split
    into several graphs reads its input state after its first replay). ``torch.compile`` and the marker are stand-ins
    here (no GPU on CI); tests/test_cuda.py runs the real thing on one."""
    from bnnbench.methods import METHODS
    from bnnbench.core.models import MLP
    import bnnbench.run.compiled as compiled
    assert compiled.compile_mode(torch.device("cuda")) == "reduce-overhead"
    assert compiled.compile_mode(torch.device("cuda", 1)) == "reduce-overhead"
    assert compiled.compile_mode(torch.device("cpu")) is None and compiled.compile_mode(None) is None
    # a convolutional network's step compiles on a GPU only; a method that is not compilable nowhere
    assert compiled.compiles(METHODS["bbb"], True, conv=True, device="cuda")
    assert not compiled.compiles(METHODS["bbb"], True, conv=True, device="cpu")
    assert not compiled.compiles(METHODS["kfac"], True, conv=True, device="cuda")
    assert compiled.compiles(METHODS["bbb"], True, device="cpu") and not compiled.compiles(METHODS["bbb"], False)
    modes, marks, pool, opts = [], [], [], []

    def fake_compile(fn, dynamic=None, mode=None, options=None):
        modes.append(mode)
        opts.append(options)

        def graphs(*a):
            marks.append("step")
            out = fn(*a)
            pool.extend(out[0].tensors().values())  # held, so no later tensor reuses their memory
            return out
        return graphs
    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append("mark"))
    from test_replica import DT, _problem, method_cfg
    model = MLP([3, 4, 1])
    method = METHODS["bbb"](method_cfg("bbb"), model, "gaussian")
    g = torch.Generator().manual_seed(0)
    state = method.init(_problem(2, model, g, method.replica_hparams), g)
    from bnnbench.methods import Batch
    batch = Batch(torch.randn(2, 5, 3, generator=g, dtype=DT), torch.randn(2, 5, generator=g, dtype=DT), state.n_data)
    for device, mode, per_step in ((torch.device("cuda"), "reduce-overhead", ["mark", "step"]),
                                   (torch.device("cpu"), None, ["step"])):
        modes.clear(), marks.clear(), pool.clear(), opts.clear()
        update = compiled.compiled_update(method, device)
        g_e, g_c = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
        eager = ours = state
        for _ in range(3):
            eager, st_e = method.update(eager, batch, g_e)
            ours, st_c = update(ours, batch, g_c)
            assert torch.equal(st_c["objective"], st_e["objective"])
            owned = {v.data_ptr() for v in ours.tensors().values()}.isdisjoint(v.data_ptr() for v in pool)
            assert owned is (mode == "reduce-overhead")
        assert modes == [mode] and marks == per_step * 3
        assert opts == [None]   # BBB's graph: inductor's Python wrapper
        for k, v in eager.tensors().items():
            assert torch.equal(ours.tensors()[k], v), k
    # HMC's trajectory (50 leapfrog steps of tiny kernels) calls its kernels from C++ on a CPU; not under CUDA graphs
    hmc = METHODS["hmc"](method_cfg("hmc"), model, "gaussian")
    for device, want in ((torch.device("cpu"), {"cpp_wrapper": True}), (torch.device("cuda"), None)):
        opts.clear()
        compiled.compiled_step(hmc, device)
        assert opts == [want]


def test_hmc_compiles_its_trajectory_once_and_once_more_for_a_data_set_that_grows(monkeypatch):
    """HMC's compiled proposal is one graph for every transition of a fit (the first state made outside inference
    mode, theta contiguous there and a slice of the position after a transition where the noise precision is learned:
    a tensor's dispatch keys and strides are guarded), and under active learning (a fresh fit on one row more each
    round, NNG Table 3) one more graph, with dynamic shapes, for all the later rounds: a compilation counted by a
    counting backend instead of inductor, the numbers the eager proposal's."""
    from bnnbench.core.models import MLP
    from bnnbench.methods import METHODS, Batch, Problem
    from bnnbench.run import compiled
    from test_replica import method_cfg
    counter = _counting_backend(monkeypatch)
    model = MLP([3, 4, 1])
    cfg = method_cfg("hmc", chains=2, warmup=2, leapfrog_steps=3, learn_noise=True)
    g = torch.Generator().manual_seed(0)
    for n in (6, 7, 8, 9):
        method = METHODS["hmc"](cfg, model, "gaussian")
        problem = Problem("gaussian", torch.tensor([n]), torch.ones(1, model.n_params, dtype=torch.float64),
                          noise_prec=torch.ones(1, dtype=torch.float64), y_scale=torch.ones(1, dtype=torch.float64))
        batch = Batch(torch.randn(1, n, 3, generator=g, dtype=torch.float64),
                      torch.randn(1, n, generator=g, dtype=torch.float64), torch.tensor([n]))
        state = method.init(problem, torch.Generator().manual_seed(n))
        update = compiled.compiled_update(method)
        eager, ours = state, state
        for _ in range(4):
            eager, _ = method.update(eager, batch, torch.Generator().manual_seed(1))
            ours, _ = update(ours, batch, torch.Generator().manual_seed(1))
        torch.testing.assert_close(ours.theta, eager.theta, rtol=1e-12, atol=1e-12)
        assert counter.frame_count == (1 if n == 6 else 2), n
    torch._dynamo.reset()


def _counted_fit(monkeypatch, name: str):
    """A counting backend in place of inductor (``counter.frame_count``: the frames compiled), and ``name``'s method,
    first state and a minibatch on a small float64 MLP with 3 replicas."""
    from bnnbench.core.models import MLP
    from bnnbench.methods import METHODS, Batch
    from bnnbench.run.contract import _problem
    from test_replica import method_cfg
    counter = _counting_backend(monkeypatch)
    model = MLP([3, 4, 1])
    method = METHODS[name](method_cfg(name, train_samples=2), model, "gaussian")
    g = torch.Generator().manual_seed(0)
    state = method.init(_problem("gaussian", model, g, torch.float64), g)
    batch = Batch(torch.randn(3, 5, 3, generator=g, dtype=torch.float64),
                  torch.randn(3, 5, generator=g, dtype=torch.float64), state.n_data)
    return counter, method, state, batch


def test_noisy_kfac_compiles_its_step_once_for_a_fit_through_the_lr_drop(monkeypatch):
    """One graph for a whole fit: noisy K-FAC's step returns its factor roots C = L^-T transposed (a tensor's strides
    are guarded: its second step had compiled a second graph) and the lr drop at half time changes ``lr_scale`` (a
    float is a constant of the graph: a third); the compiled update passes the state row-major and ``lr_scale`` as a
    0-d tensor. Counted by a counting backend instead of inductor; the numbers the eager update's."""
    from bnnbench.run import compiled
    counter, method, state, batch = _counted_fit(monkeypatch, "noisy_kfac")
    update = compiled.compiled_update(method)
    eager, ours = state, state
    for i, lr_scale in enumerate((1.0, 1.0, 1.0, 0.1, 0.1)):
        eager, _ = method.update(eager, batch, torch.Generator().manual_seed(i), lr_scale)
        ours, _ = update(ours, batch, torch.Generator().manual_seed(i), lr_scale)
    torch.testing.assert_close(ours.mean, eager.mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ours.layers[0].cA, eager.layers[0].cA, rtol=1e-10, atol=1e-12)
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_the_compiled_update_lays_out_a_state_once_when_the_graph_returns_it_row_major(monkeypatch):
    """The state a compiled step returns row-major is passed back as it is: ``_contiguous`` walks the first state of a
    fit (0.1 ms a step for App. G's) and a state that another caller made; the numbers are the eager update's, from
    one graph. Counted by a counting backend instead of inductor."""
    from bnnbench.run import compiled
    counter, method, state, batch = _counted_fit(monkeypatch, "bbb")
    laid_out, contiguous = [], compiled._contiguous
    monkeypatch.setattr(compiled, "_contiguous", lambda state, **kw: laid_out.append(state) or contiguous(state, **kw))
    update = compiled.compiled_update(method)
    eager, ours = state, state
    for i in range(4):
        eager, _ = method.update(eager, batch, torch.Generator().manual_seed(i))
        ours, _ = update(ours, batch, torch.Generator().manual_seed(i))
    assert len(laid_out) == 1
    update(eager, batch, torch.Generator().manual_seed(9))   # a state the update did not return is laid out
    assert len(laid_out) == 2
    torch.testing.assert_close(ours.mean, eager.mean, rtol=1e-10, atol=1e-12)
    assert counter.frame_count == 1
    torch._dynamo.reset()

