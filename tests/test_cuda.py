"""CUDA: every method's step on the GPU equals its step on the CPU (float64, the same state, minibatch and noise), the
replica axis holds there, the solved methods solve alike, and every method runs end to end with ``device=cuda``.

Skipped without a GPU (CI has none); `bench/gpu_session.sh` runs it on a lent one. ``BNNBENCH_TEST_DEVICE=cpu``
runs the same checks with the CPU standing in for the GPU (a check of this file, not of CUDA)."""

import json
import os

import pytest
import torch

from bnnbench.run.config import compose
from bnnbench.run.execute import execute
from bnnbench.methods import METHODS, Batch, State
from bnnbench.core.models import MLP

from datapaths import MIRROR
from interrupts import ctrl_c_at_evaluation
from test_replica import CASES, DT, SOLVED, _problem, _slice_noise, method_cfg

DEVICE = torch.device(os.environ.get("BNNBENCH_TEST_DEVICE", "cuda"))
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="no CUDA device")]


def _to(x, dev):
    if x is None or isinstance(x, (int, float, str)):
        return x
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, Batch):
        return Batch(_to(x.x, dev), _to(x.y, dev), _to(x.n_data, dev))
    if isinstance(x, State):
        return x.map(lambda v: v.to(dev))
    if isinstance(x, dict):
        return {k: _to(v, dev) for k, v in x.items()}
    return type(x)(_to(v, dev) for v in x)


def _comparable(key, value):
    """Eigenvector factors are defined up to sign: SLANG's ``U`` is compared through U U^T."""
    if key.rsplit(".", 1)[-1] == "U" and value.dim() == 3:
        return value @ value.transpose(1, 2)
    return value


def _setup(case, g):
    name, settings = CASES[case]
    d_in = 1
    for s in settings.get("image_shape", [4]):
        d_in *= s
    model = MLP([d_in, 6, 1])
    method = METHODS[name](method_cfg(name, **settings), model, "gaussian")
    R = 3
    state = method.init(_problem(R, model, g, method.replica_hparams), g)
    B = int(state.n_data.max()) if method.full_batch else 5
    batch = Batch(x=torch.randn(R, B, d_in, generator=g, dtype=DT), y=torch.randn(R, B, generator=g, dtype=DT),
                  n_data=state.n_data)
    return method, state, batch


def _assert_same_step(case, new, stats, on_dev, stats_dev):
    """The device's step ``(on_dev, stats_dev)`` equals the CPU's ``(new, stats)``: every state entry on the device,
    of the same dtype, within 1e-8 relative (cuBLAS / cuSOLVER against LAPACK sum in other orders)."""
    assert type(on_dev) is type(new), case
    new, on_dev = new.tensors(), on_dev.tensors()
    assert on_dev.keys() == new.keys()
    for k in new:
        assert on_dev[k].device.type == DEVICE.type, (case, k)
        a, b = _comparable(k, new[k].detach()), _comparable(k, on_dev[k].detach().cpu())
        assert a.dtype == b.dtype, (case, k)
        if a.is_floating_point():
            scale = a.abs().max().clamp_min(1.0)
            assert torch.allclose(b, a, rtol=1e-8, atol=1e-10 * float(scale)), (case, k, (b - a).abs().max())
        else:
            assert torch.equal(a, b), (case, k)
    assert torch.allclose(stats_dev["objective"].cpu(), stats["objective"], rtol=1e-8), case


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_on_the_device_equals_the_step_on_the_cpu(case):
    """Three steps from the same CPU-drawn state and noise, on the CPU and on the device, float64: every state entry
    and the objective agree to 1e-8 relative (cuBLAS / cuSOLVER against LAPACK sum in other orders)."""
    g = torch.Generator().manual_seed(0)
    method, state, batch = _setup(case, g)
    for _ in range(3):
        noise = method.noise(state, batch, g)
        new, stats = method.step(state, batch, noise)
        on_dev, stats_dev = method.step(_to(state, DEVICE), _to(batch, DEVICE), _to(noise, DEVICE))
        _assert_same_step(case, new, stats, on_dev, stats_dev)
        state = new


@pytest.mark.parametrize("normal", [True, False])
def test_philox_draws_on_the_device_are_the_cpus_bits(normal):
    """``rng=philox`` on the device draws by torch's integer and float32 operations (``prng._normal_torch``, one IEEE
    operation each): bit for bit the CPU's draws (its C kernel, or the same operations where no C compiler builds it),
    so a run's stream does not depend on where it runs."""
    from bnnbench.core import prng
    draw = prng.normal if normal else prng.uniform
    for k, n in [(1, 1), (12345, 1000), (2 ** 62 + 7, 100_003)]:
        cpu, dev = draw(k, (n,)), draw(k, (n,), device=DEVICE)
        assert dev.device.type == DEVICE.type and dev.dtype == torch.float32
        assert torch.equal(dev.cpu(), cpu), (k, n, int((dev.cpu() != cpu).sum()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_replica_update_equals_update_alone_on_the_device(case):
    g = torch.Generator().manual_seed(1)
    method, state, batch = _setup(case, g)
    state, batch = _to(state, DEVICE), _to(batch, DEVICE)
    noise = _to(method.noise(_to(state, "cpu"), _to(batch, "cpu"), g), DEVICE)
    new, stats = method.step(state, batch, noise)
    for r in range(batch.x.shape[0]):
        alone, st = method.step(state[r], Batch(batch.x[r:r + 1], batch.y[r:r + 1], batch.n_data[r:r + 1]),
                                _slice_noise(noise, r))
        alone = alone.tensors()
        assert alone.keys() == new.tensors().keys(), (case, r)
        for k, v in new.tensors().items():
            assert torch.allclose(v[r:r + 1], alone[k], rtol=1e-10, atol=1e-12), (case, k, r)
        assert torch.allclose(stats["objective"][r], st["objective"][0], rtol=1e-10)


@pytest.mark.parametrize("name", SOLVED)
def test_solved_methods_solve_alike_on_the_device(name, tmp_path, monkeypatch):
    import numpy as np

    from bnnbench.run.engine import ReplicaData
    from bnnbench.methods import Problem
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3))
    y = (rng.random(50) < 1 / (1 + np.exp(-X @ [1.0, -2.0, 0.5]))).astype(float)
    pairs = [(np.arange(0, 30), np.arange(30, 50))]
    model = MLP([3, 1])
    method = METHODS[name](method_cfg(name), model, "bernoulli")
    out = {}
    for dev in ("cpu", DEVICE):
        monkeypatch.setenv("BNNBENCH_CACHE", str(tmp_path / str(dev)))
        data = ReplicaData.build(X, y, pairs, normalize_x=False, normalize_y=False, dtype=DT, device=dev)
        prior = torch.ones(1, model.n_params, dtype=DT, device=dev)
        out[str(dev)], _ = method.solve(Problem("bernoulli", data.n_train[data.data_index], prior), data, gtol=1e-9)
    cpu, dev = out["cpu"].tensors(), out[str(DEVICE)].tensors()
    assert dev.keys() == cpu.keys()
    for k in cpu:
        assert torch.allclose(dev[k].cpu(), cpu[k], rtol=1e-6, atol=1e-8), (name, k)


# every method on a data set its default settings accept, two splits, two epochs (steps, transitions), few samples
UCI = ["data=uci/boston", "protocol.splits=[0,1]", "protocol.epochs=2"]
GI = ["data=uci/boston", "protocol=gi_uci", "protocol.splits=[0,1]", "protocol.steps={default: 2, fac: 2}"]
LOGREG = ["data=libsvm/australian", "protocol.splits=[1,2]", "protocol.epochs=2"]
E2E = {**{n: UCI for n in METHODS},
       **{n: GI for n in ("fac", "li", "gi", "fac_gi", "rand_gi")},
       "hmc": [*UCI, "protocol=hmc_uci", "method.warmup=1", "method.keep=1", "method.thin=1", "method.chains=2",
               "method.leapfrog_steps=3"],
       **{n: ["protocol=slang_logreg", *LOGREG] for n in ("exact_mf", "exact_full", "full_gaussian")},
       "vadam_matlab": ["protocol=vadam_logreg", "data=libsvm/breast_cancer", "protocol.splits=[1]",
                        "protocol.epochs=2"],
       "mc_dropout": [*UCI, "hparams.dropout=0.05"]}
TINY = ["protocol.eval_samples=4", "protocol.eval_every=null", "progress=false", "hpo=fixed"]


@pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file() and not (MIRROR / "mnist").is_dir(),
                    reason="needs the data mirror")
@pytest.mark.parametrize("name", sorted(E2E))
def test_every_method_runs_end_to_end_on_the_device(name, tmp_path, module_env):
    ov = [f"method={name}", *E2E[name], *TINY, f"device={DEVICE.type}"]
    rec = execute(compose(ov), ov, tmp_path / "run", log=lambda m: None)
    on_disk = json.loads((tmp_path / "run" / "record.json").read_text())
    assert on_disk["status"] == "ok" and on_disk["device"].startswith(DEVICE.type)
    assert rec["summary"] and all(abs(s["mean"]) < float("inf") for s in rec["summary"].values()), rec["summary"]


CONV = {"sgd": {}, "kfac": {"momentum_type": "heavy_ball", "kl_clip": 1e-3, "T_inv": 2},
        "bbb": {"train_samples": 2}, "noisy_adam": {"train_samples": 2, "kl_clip": 1e-4, "learn_noise": False},
        "noisy_kfac": {"train_samples": 2, "kl_clip": 1e-3, "damping_ex": 1e-3, "T_inv": 2, "learn_noise": False}}


def _conv_setup(name, g):
    """The convolutional network (grouped convolutions, pools, batch normalisation), ``name`` on it, 2 replicas, a
    minibatch of 5 images, float64."""
    from bnnbench.methods.base import Problem
    from bnnbench.core.models.convnet import ConvNet
    model = ConvNet((2, 6, 6), [3, "M", 4], 3, fc=[5], batch_norm=True)
    method = METHODS[name]({**CONV[name], "init_mean": "xavier_uniform"}, model, "categorical")
    R, B = 2, 5
    state = method.init(Problem("categorical", torch.full((R,), 40.0, dtype=DT),
                                torch.full((R, model.n_params), 10.0, dtype=DT)), g)
    batch = Batch(x=torch.randn(R, B, 72, generator=g, dtype=DT), y=torch.randint(0, 3, (R, B), generator=g),
                  n_data=state.n_data)
    return method, state, batch


@pytest.mark.parametrize("name", sorted(CONV))
def test_conv_step_on_the_device_equals_the_step_on_the_cpu(name):
    """The convolutional network (grouped convolutions, pools, batch normalisation, patches) and the methods that run
    on it: three steps from the same state and noise on the CPU and on the device, float64, agree to 1e-8."""
    g = torch.Generator().manual_seed(2)
    method, state, batch = _conv_setup(name, g)
    for _ in range(3):
        noise = method.noise(state, batch, g)
        new, stats = method.step(state, batch, noise)
        on_dev, stats_dev = method.step(_to(state, DEVICE), _to(batch, DEVICE), _to(noise, DEVICE))
        _assert_same_step(name, new, stats, on_dev, stats_dev)
        state = new


@pytest.mark.skipif(not (MIRROR / "MANIFEST.md").is_file(), reason="needs the data mirror")
def test_an_interrupted_run_resumes_on_the_device_to_the_same_numbers(tmp_path, capsys, monkeypatch, module_env):
    """The checkpoint is loaded onto the device (``map_location``) but the generator's state must stay a CPU tensor:
    a run interrupted after its epoch-2 checkpoint resumes there and ends where the uninterrupted run ends (the App. F
    lease of 2026-11-26 met ``RNG state must be a torch.ByteTensor`` here)."""
    from bnnbench.run import results
    from bnnbench.cli import main
    ov = ["method=bbb", "data=uci/yacht", "protocol.splits=[0,1]", "protocol.epochs=4", "protocol.eval_every=1",
          "checkpoint_every=2", "checkpoint_seconds=0", "progress=false", f"device={DEVICE.type}"]
    restore = ctrl_c_at_evaluation(monkeypatch, 3)   # epoch 3, after the epoch-2 checkpoint
    assert main(["run", *ov, f"runs_root={tmp_path / 'resumed'}"]) == 130
    restore()
    assert main(["run", *ov, f"runs_root={tmp_path / 'resumed'}"]) == 0
    assert "resuming from epoch 2" in capsys.readouterr().out
    assert main(["run", *ov, f"runs_root={tmp_path / 'whole'}"]) == 0
    summary = {}
    for root in ("resumed", "whole"):
        d = results.run_dir(tmp_path / root, None, "bbb", "uci/yacht")
        summary[root] = json.loads((d / "record.json").read_text())["summary"]
    assert summary["resumed"] == summary["whole"]


COMPILABLE = sorted(c for c, (name, _) in CASES.items() if getattr(METHODS[name], "compilable", False))


@pytest.mark.slow   # a compilation per case
@pytest.mark.parametrize("case", COMPILABLE)
def test_compiled_steps_on_the_device_follow_the_eager_steps(case):
    """``compile=true`` on the device (CUDA graphs, ``run.compiled.compile_mode``): four updates chained as the engine
    chains them (each step's new state the next one's input, its statistics read before the next step) from the same
    state and generator as four eager updates: every state entry agrees to the compiled check's float rounding
    (``COMPILED_RTOL``, compounded over the steps), and the objectives too."""
    from bnnbench.run.compiled import compiled_update
    from bnnbench.run.contract import COMPILED_RTOL
    g = torch.Generator().manual_seed(2)
    method, state, batch = _setup(case, g)
    state, batch = _to(state, DEVICE), _to(batch, DEVICE)
    update = compiled_update(method, DEVICE)
    g_e, g_c = (torch.Generator(device=DEVICE).manual_seed(3) for _ in range(2))
    eager = compiled = state
    rtol = 4 * COMPILED_RTOL[DT]
    try:
        for step in range(4):
            eager, st_e = method.update(eager, batch, g_e)
            compiled, st_c = update(compiled, batch, g_c)
            assert torch.allclose(st_c["objective"], st_e["objective"], rtol=rtol), (case, step)
        for k, v in eager.tensors().items():
            v, w = _comparable(k, v), _comparable(k, compiled.tensors()[k])
            if v.is_floating_point():
                assert torch.allclose(w, v, rtol=rtol, atol=rtol * float(v.abs().max())), (case, k)
            else:
                assert torch.equal(w, v), (case, k)
    finally:
        torch._dynamo.reset()


@pytest.mark.slow   # a compilation per method
@pytest.mark.parametrize("name", sorted(n for n in CONV if getattr(METHODS[n], "compilable", False)))
def test_compiled_conv_steps_on_the_device_follow_the_eager_steps(name):
    """On a GPU ``compile=true`` compiles a convolutional network's step too (CUDA graphs): four chained updates of
    the convolutional network (batch normalisation included), float64, give the eager updates' objectives to 1e-9.
    The states are not compared entry by entry: a convolution's bias before batch normalisation has an analytically
    zero gradient, and Adam's normalisation m / sqrt(v) turns its rounding noise (1e-17) into moves of +-lr whose
    signs differ between any two summation orders (compiled on this CPU: BBB's means differ by 1e-3 of the largest
    after three steps); the network's outputs do not see them, only the KL term does, later."""
    from bnnbench.run.compiled import compiled_update
    method, state, batch = _conv_setup(name, torch.Generator().manual_seed(2))
    batch = _to(batch, DEVICE)
    eager = compiled = _to(state, DEVICE)
    update = compiled_update(method, DEVICE)
    g_e, g_c = (torch.Generator(device=DEVICE).manual_seed(3) for _ in range(2))
    try:
        for step in range(4):
            eager, st_e = method.update(eager, batch, g_e)
            compiled, st_c = update(compiled, batch, g_c)
            assert torch.allclose(st_c["objective"], st_e["objective"], rtol=1e-9), (name, step)
    finally:
        torch._dynamo.reset()
