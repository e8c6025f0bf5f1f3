"""Methods from other packages (entry points ``bnnbench.methods``) and the contract checks of ``bnnbench
check-method``: every built-in method passes them; a method whose state is not a typed ``State``, that modifies its
input state, leaks between replicas or produces non-finite numbers is told which check failed; a bad entry point is
refused with the reason."""

from dataclasses import dataclass
from importlib.metadata import EntryPoint

import pytest
import torch
from omegaconf import OmegaConf

from bnnbench import methods
from bnnbench.cli import main
from bnnbench.core.models import MLP
from bnnbench.run.compiled import compiles
from bnnbench.run.contract import check_compiled, check_method, compiled_graph_breaks
from bnnbench.methods import MAP, BUILT_IN, METHODS, Batch, PluginError, plugin_methods
from bnnbench.methods.point.map import MAPConfig


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_every_built_in_method_keeps_the_contract(name):
    assert [(c, why) for c, why in check_method(name) if why is not None] == []


@dataclass(frozen=True)
class MyMAPConfig(MAPConfig):
    name: str = "my_map"


class MyMAP(MAP):
    """A user's method: MAP under another name."""
    name = "my_map"
    Config = MyMAPConfig


def _map_as(name: str, **overrides):
    """MAP under ``name`` (with its own Config) with ``overrides`` (functions) in place of MAP's."""
    fields = {"__annotations__": {"name": str}, "name": name}
    config = dataclass(frozen=True)(type(f"{name}Config", (MAPConfig,), fields))
    return type(name, (MAP,), {"name": name, "Config": config, **overrides})


def _broken_map(name: str, after_step):
    """MAP under ``name`` whose step then applies ``after_step(state_given, new_state) -> new_state``."""
    def step(self, state, batch, noise, lr_scale=1.0):
        new, stats = MAP.step(self, state, batch, noise, lr_scale)
        return after_step(state, new), stats
    return _map_as(name, step=step)


def _in_place(state, new):
    state.theta.copy_(new.theta)   # writes into the state it was given
    return new


InPlace = _broken_map("in_place", _in_place)
Leaky = _broken_map("leaky", lambda state, new: new.replace(theta=new.theta - 1e-3 * new.theta.mean(
    0, keepdim=True)))   # mixes replicas
BlowUp = _broken_map("blow_up", lambda state, new: new.replace(theta=new.theta / 0.0))


def _dict_init(self, problem, generator):
    return MAP.init(self, problem, generator).tensors()   # MAP's tensors as a plain dict: a state written the old way


DictState = _map_as("dict_state", init=_dict_init)


def _entry_points(monkeypatch, **targets):
    eps = [EntryPoint(name, f"{__name__}:{cls}", methods.ENTRY_POINT_GROUP) for name, cls in targets.items()]
    monkeypatch.setattr("importlib.metadata.entry_points",
                        lambda group=None: [e for e in eps if group in (None, e.group)])


def test_an_entry_point_method_runs_like_a_built_in_one(monkeypatch, tmp_path, capsys):
    _entry_points(monkeypatch, my_map="MyMAP")
    found = plugin_methods()
    assert found == {"my_map": MyMAP}
    monkeypatch.setitem(METHODS, "my_map", MyMAP)
    assert main(["check-method", "my_map"]) == 0
    assert "all 7 contract checks passed" in capsys.readouterr().out
    from datapaths import MIRROR
    if not (MIRROR / "MANIFEST.md").is_file():
        pytest.skip("needs the data mirror")
    monkeypatch.setenv("BNNBENCH_MIRROR", str(MIRROR))
    monkeypatch.setenv("BNNBENCH_CACHE", str(tmp_path / "cache"))
    assert main(["run", "method=my_map", "data=uci/yacht", "protocol.epochs=2", "protocol.splits=[0,1]",
                 f"runs_root={tmp_path}", "progress=false"]) == 0
    assert (tmp_path / "adhoc" / "my_map" / "uci__yacht" / "record.json").is_file()


def test_a_method_no_longer_registered_leaves_hydras_store(monkeypatch):
    """The store is pickled into a launcher's jobs (bnnbench.run.launchers): a class of this test module in it stopped
    every later job at unpickling, in processes that cannot import the module (CI of 992cec2)."""
    import pickle
    import subprocess
    import sys

    from hydra.core.config_store import ConfigStore

    from bnnbench.run.config import register_resolvers
    with monkeypatch.context() as m:
        m.setitem(METHODS, "my_map", MyMAP)
        register_resolvers()
        assert "my_map.yaml" in ConfigStore.instance().repo["method"]
    register_resolvers()
    assert "my_map.yaml" not in ConfigStore.instance().repo["method"]
    assert "map.yaml" in ConfigStore.instance().repo["method"]
    blob = pickle.dumps(ConfigStore.instance().repo)
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"], input=blob,
                   check=True)


@pytest.mark.parametrize("cls, failing", [
    (DictState, "a typed state (a methods.State)"),
    (InPlace, "the given state is not modified"),
    (Leaky, "replica invariance (a replica's step equals its step alone)"),
    (BlowUp, "finite state and objective through a few steps"),
])
def test_a_method_that_breaks_the_contract_is_told_which_check(monkeypatch, capsys, cls, failing):
    monkeypatch.setitem(METHODS, cls.name, cls)
    failed = {c: why for c, why in check_method(cls.name) if why is not None}
    assert failing in failed and failed[failing]
    assert main(["check-method", cls.name]) == 1
    out = capsys.readouterr().out
    assert f"FAIL  {failing}" in out and "fix them before a long run" in out


def test_a_method_whose_state_is_a_dict_is_told_to_declare_a_state_class(monkeypatch):
    """A plain dict (the states before issue #32) fails the typed-state check, which says what to do, and the checks
    that need a typed state (slicing replicas, naming tensors) are not run on it."""
    monkeypatch.setitem(METHODS, DictState.name, DictState)
    results = check_method(DictState.name)
    assert [c for c, _ in results] == ["typed Config with a default for every setting",
                                       "a typed state (a methods.State)"]
    assert results[0][1] is None
    assert results[1][1] == "the state is a dict: declare a methods.State subclass with @state_class"


@pytest.mark.parametrize("targets, match", [
    ({"not_a_method": "torch"}, "cannot be imported|not a subclass"),
    ({"map": "MyMAP"}, "the class's name attribute is 'my_map'"),
    ({"wrong": "MyMAP"}, "must equal the entry point's name 'wrong'"),
])
def test_a_bad_entry_point_is_refused_with_its_reason(monkeypatch, targets, match):
    _entry_points(monkeypatch, **targets)
    with pytest.raises(PluginError, match=match):
        plugin_methods()


def test_an_entry_point_may_not_replace_a_built_in_method(monkeypatch):
    @dataclass(frozen=True)
    class C(MAPConfig):
        name: str = "bbb"

    class Impostor(MAP):
        name = "bbb"
        Config = C
    monkeypatch.setattr(f"{__name__}.Impostor", Impostor, raising=False)
    _entry_points(monkeypatch, bbb="Impostor")
    with pytest.raises(PluginError, match="built-in method"):
        plugin_methods()


def test_unknown_method_lists_the_valid_ones(capsys):
    assert main(["check-method", "nope"]) == 2
    assert "valid methods: bbb" in capsys.readouterr().err


# settings that take another path through a compilable step than its defaults
COMPILED_VARIANTS = [
    ("bbb", {"local_reparam": True}),
    ("bbb", {"learn_noise": True, "noise_prior_shape": 6.0, "noise_prior_rate": 6.0, "noise_lr": 0.001}),
    ("vogn", {"curvature": "ggn", "train_samples": 2}),
    ("noisy_adam", {"learn_noise": False, "kl_clip": 1e-3}),
    # HMC's compiled proposal runs L_max masked steps where eager stops at the longest chain's L
    ("hmc", {"learn_noise": True, "leapfrog_jitter": 0.5, "warmup": 2, "noise_prior_shape": 6.0,
             "noise_prior_rate": 6.0, "leapfrog_steps": 2}),
]
# HMC's compiled proposal unrolls L_max leapfrog steps: compared at L_max = 2 (the same code as its default 20, which
# takes the compiler minutes in a fresh cache; with the variant's jitter 0.5 a chain's L is 1 or 2, so a chain stops
# early and its masked steps are checked too; L_max = 4 cost 100 s of compiling against 73 s)
HMC_CHECKED = {"leapfrog_steps": 2}


# HMC in float32 is checked by its own test below, not here: its positions agree, but the warm-up's dual averaging
# reads alpha = exp(H - H'), a difference of energies of order 10-100 whose float32 rounding (eager's as much as the
# compiled step's) moves alpha, and so H_bar and log eps, by 1-4e-5 relative: above the 1e-5 tolerance, which stays;
# in float64 all agree to 1e-13


def _compiled_cases():
    for name, settings in [(n, HMC_CHECKED if n == "hmc" else {}) for n in sorted(BUILT_IN)] + COMPILED_VARIANTS:
        for dtype, label in ((torch.float32, "float32"), (torch.float64, "float64")):
            if name != "hmc" or dtype == torch.float64:
                yield pytest.param(name, settings, dtype, id=f"{'-'.join([name, *settings])}-{label}")


@pytest.mark.slow   # each compilation takes 5-50 s in a fresh inductor cache
@pytest.mark.parametrize("name, settings, dtype", list(_compiled_cases()))
def test_a_compiled_step_equals_the_eager_step(name, settings, dtype):
    """The ``compile`` setting: for every registered method, its compiled step equals its eager step to float rounding
    (1e-5 relative in float32, 1e-12 in float64) from the same state, minibatch and noise (a method that is not
    ``compilable`` keeps its eager step, trivially equal)."""
    assert check_compiled(name, dtype, settings=settings) is None


@pytest.mark.slow   # two compilations, about 30 s in a fresh inductor cache
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_slangs_compiled_step_on_the_boards_gram_matrices(dtype, monkeypatch):
    """The boards' SLANG step (minibatch 32, 4 samples: 129 x 129 Gram matrices; 301 parameters, more than 129, so not
    the dense route) on 8 replicas, whose eigenpairs the compiled step takes from the SIMD kernel
    (``low_rank.SIMD_MAX_N_LANES``), equals the eager step (LAPACK's ``?syevr``) to float rounding."""
    from bnnbench.core.linalg import top_eigpair
    calls = []
    kernel = top_eigpair.top_eigpair
    monkeypatch.setattr(top_eigpair, "top_eigpair", lambda A: calls.append(tuple(A.shape)) or kernel(A))
    assert check_compiled("slang", dtype, settings={"train_samples": 4}, R=8, rows=32, sizes=(4, 50, 1)) is None
    assert calls and set(calls) == {(8, 129, 129)}


def _kernel_calls(monkeypatch) -> list:
    """The input shapes of each trace of the fused ReLU-network kernel (``core/linalg/mlp_relu.forward``) from now."""
    from bnnbench.core.linalg import mlp_relu
    calls = []
    kernel = mlp_relu.forward
    monkeypatch.setattr(mlp_relu, "forward", lambda x, theta, sizes: calls.append(tuple(x.shape)) or kernel(x, theta,
                                                                                                           sizes))
    return calls


@pytest.mark.slow   # two compilations, about 20 s in a fresh inductor cache
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_bbbs_compiled_step_with_the_examples_innermost(dtype, monkeypatch):
    """BBB's compiled step on minibatches of ``EXAMPLES_INNER_MIN_BATCH`` rows and more takes the network's forward pass
    and gradient from the fused kernel in float32 (``core/linalg/mlp_relu``) and lays the MLP's activations out with
    the examples innermost in float64 (``MLP.forward_layers(examples_inner=True)``): it equals the eager step to float
    rounding either way (the contract's 5-row minibatches keep the eager layout)."""
    from bnnbench.core.linalg import mlp_relu
    from bnnbench.methods.gaussian.bbb import EXAMPLES_INNER_MIN_BATCH
    calls = _kernel_calls(monkeypatch)
    assert check_compiled("bbb", dtype, rows=EXAMPLES_INNER_MIN_BATCH) is None
    assert compiled_graph_breaks("bbb", dtype, rows=EXAMPLES_INNER_MIN_BATCH) == 0
    assert bool(calls) == (dtype == torch.float32 and mlp_relu.available())
    # with a learned noise precision (NNG Table 1's BBB), whose Gamma posterior's step reads the outputs f
    assert check_compiled("bbb", dtype, settings=COMPILED_VARIANTS[1][1], rows=EXAMPLES_INNER_MIN_BATCH) is None


@pytest.mark.slow   # four compilations, about 30 s in a fresh inductor cache
@pytest.mark.parametrize("name", ["vadam", "vprop"])
def test_vadams_compiled_step_takes_the_fused_kernel_on_long_minibatches(name, monkeypatch):
    """Vadam's and Vprop's compiled steps take the samples' gradients from the fused kernel (``core/linalg/mlp_relu``)
    on minibatches of ``MIN_ROWS`` rows in float32, in one graph, and equal the eager step to float rounding."""
    from bnnbench.core.linalg import mlp_relu
    calls = _kernel_calls(monkeypatch)
    assert check_compiled(name, torch.float32, settings={"train_samples": 3}, rows=mlp_relu.MIN_ROWS) is None
    assert compiled_graph_breaks(name, torch.float32, rows=mlp_relu.MIN_ROWS) == 0
    assert bool(calls) == mlp_relu.available()


@pytest.mark.slow   # two compilations, about 25 s in a fresh inductor cache
@pytest.mark.parametrize("eig", ["nystrom", "randomized"])
def test_slangs_randomised_eigensolvers_take_the_outer_product_kernel(eig, monkeypatch):
    """SLANG's compiled step with the randomised eigensolvers (the large UCI sets' ``eig: nystrom``) takes its products
    with the per-example gradients' outer products from the fused kernel (``core/linalg/outer_times``) in float32, at
    the large sets' net and rows (whole 16 x 16 blocks of its transposes), Nystrom's whole subspace iteration
    (``nystrom_range``, with its own orthonormalisations): it equals the eager step to float rounding."""
    from bnnbench.core.linalg import outer_times
    calls = []
    name = "nystrom_range" if eig == "nystrom" else "times"
    kernel = getattr(outer_times, name)
    monkeypatch.setattr(outer_times, name, lambda *args: calls.append(len(args)) or kernel(*args))
    assert check_compiled("slang", torch.float32, settings={"eig": eig, "train_samples": 2}, R=3, rows=40,
                          sizes=(16, 50, 1)) is None
    assert bool(calls) == outer_times.available()


# compiled in parts by design: an eager eigensolver (LAPACK) between the compiled parts, HMC's proposal alone,
# PBP's per-point ADF update (the loop over the points and the prior's EP sweep eager), or SWAG's step without its
# deviations' update (once an epoch). SLANG's L = 1 step traces whole: its eigensolver is an operator
# (bnnbench::top_eigh_simd)
COMPILED_IN_PARTS = {"noisy_kfac_blktri", "hmc", "pbp", "swag"}


@pytest.mark.slow   # dynamo traces each step: 0.2-2.5 s a method
@pytest.mark.parametrize("name", sorted(n for n in BUILT_IN if n not in COMPILED_IN_PARTS
                                        and not METHODS[n].solved and compiles(METHODS[n], True)))
def test_a_compilable_step_compiles_into_one_graph(name):
    """A graph break leaves the code around it eager and splits the fused kernels: a ``functools.cached_property``
    read in ``MLP.layers`` broke BBB's compiled step 5 times, 1.4-5x slower (bench/step_ab.py), with every compiled
    number still right; so every compilable method but those compiled in parts by design traces without one."""
    assert compiled_graph_breaks(name) == 0


@pytest.mark.slow
def test_hmc_compiled_in_float32_moves_the_chains_as_eager_and_accepts_alike():
    """HMC's compiled proposal in float32: after each of three transitions (warm-up, jittered L, learned noise) the
    chains' positions equal the eager step's to 1e-5 relative and every chain's accept decision is the same."""
    from bnnbench.run.compiled import compiled_step
    from bnnbench.run.contract import _problem
    g = torch.Generator().manual_seed(0)
    model = MLP([4, 6, 1])
    cfg = OmegaConf.merge(OmegaConf.structured(METHODS["hmc"].Config), dict(COMPILED_VARIANTS[-1][1]))
    method = METHODS["hmc"](cfg, model, "gaussian")
    state = method.init(_problem("gaussian", model, g, torch.float32), g)
    x = torch.randn(3, int(state.n_data.max()), 4, generator=g)
    batch = Batch(x, torch.randn(3, x.shape[1], generator=g), state.n_data)
    step = compiled_step(method)
    with torch.inference_mode():
        for _ in range(3):
            noise = method.noise(state, batch, g)
            eager, _ = method.step(state, batch, noise)
            comp, _ = step(state, batch, noise)
            for q in ("theta", "log_tau"):
                e, c = getattr(eager, q), getattr(comp, q)
                assert float((e - c).abs().max() / e.abs().max()) < 1e-5, q
            moved_e, moved_c = (eager.theta != state.theta).any(-1), (comp.theta != state.theta).any(-1)
            assert torch.equal(moved_e, moved_c)
            state = eager


def test_the_compilable_methods_are_the_measured_ones():
    """``compilable`` is declared where the step compiles whole (checked above; measured 1.3-2x faster for BBB, VOGN,
    Vadam, noisy Adam and MC dropout by bench/compile_step.py) and inherited by their variants (Vprop, the MATLAB
    Vadam, SGD, and the MAP-based baselines of the leaderboard: deep ensembles, SWAG, Laplace), for HMC, whose
    proposal compiles whole (bench/hmc_numpyro.py), for SLANG, compiled around its eigensolver (bench/step_ab.py:
    1.4-1.8x), for noisy K-FAC and its block-tridiagonal variant (1.1-1.3x), and for the inducing-point families on
    their MLP (1.5-2.5x; ``compiles_with``: not on their convolutional architectures), and for PBP's per-point ADF
    update (bench/step_ab.py); K-FAC (the convolutional networks' optimiser) is not."""
    assert {n for n in BUILT_IN if METHODS[n].compilable} == {"bbb", "vogn", "vadam", "vprop", "vadam_matlab",
                                                             "noisy_adam", "map", "sgd", "mc_dropout", "hmc",
                                                             "slang", "noisy_kfac", "noisy_kfac_blktri",
                                                             "fac", "li", "gi", "fac_gi", "rand_gi",
                                                             "deep_ensemble", "swag", "laplace", "laplace_ll",
                                                             "pbp"}
    for name in ("fac", "li", "gi", "fac_gi", "rand_gi"):
        assert METHODS[name].compiles_with({"arch": "mlp"})
        assert not METHODS[name].compiles_with({"arch": "mnist500_cnn"})
