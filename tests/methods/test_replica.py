"""The replica axis: for every registered method (with its typed config's settings), a replica's update equals
the same update computed alone (same minibatch, same noise), a replica's solve its solve alone (solved methods);
per-replica minibatching and standardisation."""


from dataclasses import fields

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from bnnbench import methods
from bnnbench.run.config import ConfigError
from bnnbench.run.contract import slice_noise
from bnnbench.run.engine import ReplicaData, Standardiser, epoch_batches, evaluate, make_batch, train
from bnnbench.methods import METHODS, MAP, Batch, Problem, State, state_class
from bnnbench.methods.base import hyper_state
from bnnbench.methods.point.map import MAPState
from bnnbench.core.models import MLP
from bnnbench.run.protocol import RunSpec
from bnnbench.run.fit import make_problem

DT = torch.float64

STEPPED = sorted(n for n, cls in METHODS.items() if not cls.solved)
SOLVED = sorted(n for n, cls in METHODS.items() if cls.solved)
# other code paths of a method's update: (method, settings over its config)
VARIANTS = {
    "bbb_lrt": ("bbb", dict(local_reparam=True)),
    "vogn_ggn": ("vogn", dict(curvature="ggn")),
    "slang_rnd": ("slang", dict(rank=2, decay_lr=0.0, momentum=0.0, eig="randomized", n_iter=4, oversample=2)),
    "full_gaussian_ggn": ("full_gaussian", dict(curvature="ggn")),
    "hmc_noise_jitter": ("hmc", dict(learn_noise=True, leapfrog_jitter=0.5, warmup=2, thin=1, keep=2)),
    "gi_dual": ("gi", dict(inducing=3)),  # fewer inducing points than weight rows: the P x P regression
    # global inducing's convolutional networks on 1 x 4 x 4 images (2 channels), one per family, every conv prior
    "gi_resnet8": ("gi", dict(arch="resnet8", image_shape=[1, 4, 4], channels=2, inducing=3, prior="spatial_iw")),
    "fac_gi_resnet8": ("fac_gi", dict(arch="resnet8", image_shape=[1, 4, 4], channels=2, inducing=3, prior="scale")),
    "rand_gi_cnn": ("rand_gi", dict(arch="mnist500_cnn", image_shape=[1, 4, 4], channels=2, inducing=3,
                                    prior="spatial_iw")),
    "li_cnn": ("li", dict(arch="mnist500_cnn", image_shape=[1, 4, 4], channels=2, prior="spatial_iw")),
    "fac_cnn": ("fac", dict(arch="mnist500_cnn", image_shape=[1, 4, 4], channels=2, prior="neal")),
}
CASES = {**{name: (name, {}) for name in STEPPED}, **VARIANTS}


def method_cfg(name: str, **settings):
    """The method's typed config with two samples per step (noise with a sample axis) and uniform initial means
    (non-zero activations) where the method has them, then ``settings``."""
    cfg = OmegaConf.structured(METHODS[name].Config)
    test = {k: v for k, v in dict(train_samples=2, init_mean="uniform_fan_in").items() if k in cfg}
    return OmegaConf.merge(cfg, test, settings)


@pytest.mark.parametrize("names", [pytest.param(("map", "slang", "noisy_kfac", "gi", "laplace"), id="one-per-family"),
                                   pytest.param(tuple(sorted(METHODS)), id="all", marks=pytest.mark.e2e)])
def test_every_registered_method_is_a_config_option_with_its_defaults(names):
    """A Hydra composition a method (0.17 s each): the fast suite composes one method of each family, CI every one."""
    from bnnbench.run.config import compose, list_names
    assert list_names("method") == sorted(METHODS)
    for name in names:
        assert OmegaConf.to_container(compose([f"method={name}"]).method) == OmegaConf.to_container(
            OmegaConf.structured(METHODS[name].Config)), name


def _problem(R, model, g, declared=()):
    """R replicas' hyper-parameters, with the per-replica hyper-parameters among ``declared`` (the method's
    ``replica_hparams``: a state class has a field for each it declares, and none for others) as ``make_problem``."""
    prior = torch.rand(R, 1, generator=g, dtype=DT).expand(R, model.n_params) + 0.5
    hparams = {"dropout": torch.tensor([0.05, 0.1, 0.2][:R], dtype=DT)}
    return Problem("gaussian", n_data=torch.tensor([40, 37, 40][:R]), prior_prec=prior.clone(),
                   noise_prec=torch.rand(R, generator=g, dtype=DT) + 0.5,
                   y_scale=torch.rand(R, generator=g, dtype=DT) + 0.5,
                   hparams={k: v for k, v in hparams.items() if k in declared})


@pytest.mark.parametrize("case", sorted(CASES))
def test_replica_update_equals_update_alone(case):
    g = torch.Generator().manual_seed(0)
    name, settings = CASES[case]
    d_in = int(np.prod(settings.get("image_shape", [4])))
    model = MLP([d_in, 6, 1])
    method = METHODS[name](method_cfg(name, **settings), model, "gaussian")
    R = 3
    state = method.init(_problem(R, model, g, method.replica_hparams), g)
    assert isinstance(state, State), (case, type(state))
    B = int(state.n_data.max()) if method.full_batch else 5   # a full-batch method sees every row (HMC)
    batch = Batch(x=torch.randn(R, B, d_in, generator=g, dtype=DT), y=torch.randn(R, B, generator=g, dtype=DT),
                  n_data=state.n_data)
    for _ in range(3):  # a few steps so that optimiser moments are non-trivial
        noise = method.noise(state, batch, g)
        new, stats = method.step(state, batch, noise)
        for r in range(R):
            alone_batch = Batch(batch.x[r:r + 1], batch.y[r:r + 1], batch.n_data[r:r + 1])
            nz = _slice_noise(noise, r)
            alone, st = method.step(state[r], alone_batch, nz)
            assert type(alone) is type(new), (case, r)
            alone = alone.tensors()
            assert alone.keys() == new.tensors().keys(), (case, r)
            for k, v in new.tensors().items():
                assert torch.allclose(v[r:r + 1], alone[k], rtol=1e-12, atol=1e-14), (case, k, r)
            assert torch.allclose(stats["objective"][r], st["objective"][0], rtol=1e-12)
        state = new


@pytest.mark.parametrize("name", SOLVED)
def test_replica_solve_equals_solve_alone(name, tmp_path, monkeypatch):
    """Replicas with their own rows (two share a training set) and prior precisions, solved at once and one by one,
    each with a fresh solution cache: the same states."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 3))
    y = (rng.random(50) < 1 / (1 + np.exp(-X @ [1.0, -2.0, 0.5]))).astype(float)
    pairs = [(np.arange(0, 30), np.arange(30, 50)), (np.arange(15, 50), np.arange(0, 15))]
    model = MLP([3, 1])
    method = METHODS[name](method_cfg(name), model, "bernoulli")
    data = ReplicaData.build(X, y, pairs, data_index=[0, 1, 1], normalize_x=False, normalize_y=False, dtype=DT)
    prior = torch.tensor([[0.5], [1.0], [3.0]], dtype=DT).expand(3, model.n_params).clone()
    n_data = data.n_train[data.data_index]
    monkeypatch.setenv("BNNBENCH_CACHE", str(tmp_path / "all"))
    state, info = method.solve(Problem("bernoulli", n_data, prior), data, gtol=1e-8)
    assert info["cached_solutions"] == 0
    for r, u in enumerate(data.data_index.tolist()):
        monkeypatch.setenv("BNNBENCH_CACHE", str(tmp_path / f"alone{r}"))
        alone_data = ReplicaData.build(X, y, pairs[u:u + 1], normalize_x=False, normalize_y=False, dtype=DT)
        alone, _ = method.solve(Problem("bernoulli", n_data[r:r + 1], prior[r:r + 1]), alone_data, gtol=1e-8)
        assert type(alone) is type(state) and isinstance(state, State)
        alone = alone.tensors()
        assert alone.keys() == state.tensors().keys()
        for k, v in state.tensors().items():
            assert torch.equal(v[r:r + 1], alone[k]), (name, k, r)


_slice_noise = slice_noise   # the contract's: the same slicing as bnnbench check-method


def _toy(n=30, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * [1.0, 5.0, 0.0] + [0.0, 3.0, 7.0]  # last column constant
    y = X[:, 0] * 2.0 + rng.normal(size=n) + 10.0
    return X, y


@state_class
class _TemperedMAPState(MAPState):
    """MAP's state and each replica's temperature ``[R]``."""
    temperature: torch.Tensor


class _TemperedMAP(MAP):
    """A method that declares a per-replica hyper-parameter of its own (and a field for it in its state class)."""
    name = "tempered_map"
    replica_hparams = {"temperature": (0.5, 20.0)}

    def init(self, problem, generator):
        theta = self.init_params(problem, generator)
        z = torch.zeros_like(theta)
        return _TemperedMAPState(**hyper_state(problem), theta=theta, m=z, v=z.clone(),
                                 t=torch.zeros(problem.n_replicas, dtype=torch.long, device=theta.device))


def _spec(method_cfg: dict) -> RunSpec:
    return RunSpec(method=OmegaConf.create(method_cfg), model_hidden=[5], activation="relu", task="regression",
                   likelihood="gaussian", epochs=1, batch_size=4, eval_samples=1, eval_every=None, normalize_x=True,
                   normalize_y=True, noise_prec_units="original", bias_prior_prec=None, loglik="joint")


@pytest.mark.parametrize("name, declared", [("mc_dropout", "dropout"), ("tempered_map", "temperature"),
                                            ("map", None)])
def test_declared_replica_hparams_reach_the_state_per_replica(monkeypatch, name, declared):
    """``make_problem`` builds ``Problem.hparams`` from the replicas' hyper-parameters for exactly the names the
    method declares, and ``init`` puts each into the state as ``[R]`` in the replicas' order."""
    monkeypatch.setitem(methods.METHODS, "tempered_map", _TemperedMAP)
    X, y = _toy(n=30)
    data = ReplicaData.build(X, y, [(np.arange(0, 20), np.arange(20, 30))], data_index=[0, 0, 0], dtype=DT)
    hparams = [{"prior_prec": 1.0, "noise_prec": 2.0, "dropout": p, "temperature": 1 / p} for p in (0.05, 0.1, 0.2)]
    cfg = {**OmegaConf.to_container(method_cfg("mc_dropout" if name == "mc_dropout" else "map")), "name": name}
    spec = _spec(cfg)
    model = MLP([3, 5, 1])
    problem = make_problem(spec, model, data, hparams)
    assert sorted(problem.hparams) == ([declared] if declared else [])
    state = methods.method_class(name)(spec.method, model, "gaussian").init(problem, torch.Generator().manual_seed(0))
    undeclared = {"dropout", "temperature"} - {declared}
    assert not undeclared & {f.name for f in fields(state)}
    if declared:
        expected = torch.tensor([h[declared] for h in hparams], dtype=DT)
        assert getattr(state, declared).dtype == DT and torch.equal(getattr(state, declared), expected)


def test_lr_drop_is_the_lr_scale_passed_to_update():
    """``train`` with ``lr_drop = {at: 0.5, factor: 0.25}`` makes exactly the updates ``update(..., lr_scale)`` makes by
    hand with scale 1 for the first half of the epochs and 0.25 after."""
    X, y = _toy(n=30)
    data = ReplicaData.build(X, y, [(np.arange(0, 20), np.arange(20, 30))], data_index=[0, 0], dtype=DT)
    model = MLP([3, 5, 1])
    method = METHODS["vadam"](method_cfg("vadam"), model, "gaussian")
    prob = Problem("gaussian", data.n_train[data.data_index], torch.ones(2, model.n_params, dtype=DT),
                   noise_prec=torch.tensor([1.0, 2.0], dtype=DT), y_scale=data.replica("y_std"))
    state0 = method.init(prob, torch.Generator().manual_seed(1))
    res = train(method, state0, data, epochs=4, batch_size=8, eval_samples=1,
                generator=torch.Generator().manual_seed(2),
                task="regression", lr_drop={"at": 0.5, "factor": 0.25})

    def by_hand(scales):
        g, state = torch.Generator().manual_seed(2), state0
        for scale in scales:
            for rows in epoch_batches(data, 8, g):
                state, _ = method.update(state, make_batch(data, rows), g, lr_scale=scale)
        return state
    dropped, constant = by_hand([1.0, 1.0, 0.25, 0.25]), by_hand([1.0] * 4)
    trained, dropped = res.state.tensors(), dropped.tensors()
    assert trained.keys() == dropped.keys() and all(torch.equal(trained[k], v) for k, v in dropped.items())
    assert not torch.equal(res.state.mean, constant.mean)


def test_epoch_batches_wrap_and_short_last_batch():
    """Default: ceil(N / B) batches of B rows, the last filled from the start of the epoch's permutation (so N mod B
    rows are seen twice); ``last_batch="short"``: the same permutation, every row exactly once, the last batch the
    N mod B rows left, as a DataLoader with ``drop_last=False``. Unequal training sizes are refused for "short"."""
    X, y = _toy(n=30)
    data = ReplicaData.build(X, y, [(np.arange(23), np.arange(23, 30)), (np.arange(7, 30), np.arange(7))], dtype=DT)
    wrap = list(epoch_batches(data, 5, torch.Generator().manual_seed(3)))
    short = list(epoch_batches(data, 5, torch.Generator().manual_seed(3), "short"))
    assert [b.shape[1] for b in wrap] == [5] * 5 and [b.shape[1] for b in short] == [5] * 4 + [3]
    for r in range(2):
        perm = torch.cat([b[r] for b in short])
        assert sorted(perm.tolist()) == list(range(23))               # each row once
        assert torch.equal(torch.cat([b[r] for b in wrap]), torch.cat([perm, perm[:2]]))
    uneven = ReplicaData.build(X, y, [(np.arange(23), np.arange(23, 30)), (np.arange(22), np.arange(22, 30))], dtype=DT)
    with pytest.raises(ConfigError, match="one size"):
        next(epoch_batches(uneven, 5, torch.Generator(), "short"))
    with pytest.raises(ConfigError, match="valid: wrap, short"):
        next(epoch_batches(data, 5, torch.Generator(), "drop"))


def test_fixed_batch_order_is_a_dataloader_without_shuffling():
    """``batch_order="fixed"``: every epoch the training rows in their split's order, batch k rows kB..(k+1)B - 1
    (``shuffle=False``), the last batch short or wrapped; the generator is not drawn from."""
    X, y = _toy(n=30)
    data = ReplicaData.build(X, y, [(np.arange(23), np.arange(23, 30)), (np.arange(7, 30), np.arange(7))], dtype=DT)
    g = torch.Generator().manual_seed(3)
    before = g.get_state()
    short = list(epoch_batches(data, 5, g, "short", "fixed"))
    wrap = list(epoch_batches(data, 5, g, None, "fixed"))
    assert torch.equal(g.get_state(), before)
    loader = [list(range(k, min(k + 5, 23))) for k in range(0, 23, 5)]
    for r in range(2):
        assert [b[r].tolist() for b in short] == loader
        assert torch.cat([b[r] for b in wrap]).tolist() == list(range(23)) + [0, 1]
    with pytest.raises(ConfigError, match="valid: shuffled, fixed"):
        next(epoch_batches(data, 5, g, None, "sorted"))


def test_standardisation_uses_training_rows_only_and_guards_constant_columns():
    X, y = _toy()
    tr, te = np.arange(20), np.arange(20, 30)
    data = ReplicaData.build(X, y, [(tr, te)], dtype=DT)
    mu, sd = X[tr].mean(0), X[tr].std(0, ddof=1)
    sd[2] = 1.0
    assert np.allclose(data.x_train[0].numpy(), (X[tr] - mu) / sd)
    assert np.allclose(data.x_eval[0].numpy(), (X[te] - mu) / sd)
    assert np.allclose(data.y_train[0].numpy(), (y[tr] - y[tr].mean()) / y[tr].std(ddof=1))
    assert np.allclose(data.y_eval[0].numpy(), y[te])  # evaluation targets stay in original units
    assert np.isfinite(data.x_train.numpy()).all()
    s = Standardiser.fit(X[tr])
    assert s.std[2] == 1.0


def test_epoch_batches_cover_each_replicas_rows():
    X, y = _toy(n=30)
    pairs = [(np.arange(0, 12), np.arange(25, 30)), (np.arange(12, 22), np.arange(22, 25))]
    data = ReplicaData.build(X, y, pairs, data_index=[0, 1, 1], dtype=DT)
    g = torch.Generator().manual_seed(0)
    rows = torch.cat(list(epoch_batches(data, 4, g)), dim=1)  # [R, 12]
    assert rows.shape == (3, 12)
    assert sorted(rows[0].tolist()) == list(range(12))           # a full permutation of 12 rows
    assert set(rows[1].tolist()) == set(range(10))                 # 10 rows, wrapped to 12 draws
    assert torch.equal(rows[1], rows[2])                           # same data set -> shared permutation
    batch = make_batch(data, rows[:, :4])
    for r, u in enumerate([0, 1, 1]):
        assert torch.equal(batch.x[r], data.x_train[u][rows[r, :4]])
        assert torch.equal(batch.y[r], data.y_train[u][rows[r, :4]])
    assert batch.n_data.tolist() == [12, 10, 10]


def test_evaluate_padded_equals_alone():
    X, y = _toy(n=40)
    pairs = [(np.arange(0, 20), np.arange(20, 30)), (np.arange(10, 35), np.arange(35, 38))]
    model = MLP([3, 5, 1])
    method = METHODS["map"](method_cfg("map"), model, "gaussian")
    g = torch.Generator().manual_seed(0)
    both = ReplicaData.build(X, y, pairs, dtype=DT)
    prob = Problem("gaussian", both.n_train, torch.ones(2, model.n_params, dtype=DT),
                   noise_prec=torch.tensor([1.0, 2.0], dtype=DT), y_scale=both.y_std)
    state = method.init(prob, g)
    m_both = evaluate(method, state, both, 1, g, "regression")
    alone = ReplicaData.build(X, y, pairs[1:], dtype=DT)
    m_alone = evaluate(method, state[1], alone, 1, g, "regression")
    for k in m_both:
        assert m_both[k][1].item() == pytest.approx(m_alone[k][0].item(), rel=1e-10)


class _CountingMethod:
    """Sample k of the posterior predicts f = sin(k + x_1) (+ noise precision 1 + k / 10): a fixed
    sequence of samples however the calls to ``predict`` chunk it."""

    def __init__(self, out):
        self.model = MLP([3, 5, out])
        self.k = 0

    def predict(self, state, x, n_samples, generator):
        from bnnbench.methods import Predictive
        k = torch.arange(self.k, self.k + n_samples, dtype=x.dtype)
        self.k += n_samples
        f = torch.sin(k[None, :, None, None] + x[:, None, :, :1] * torch.arange(1, self.model.sizes[-1] + 1))
        return Predictive(f=f, noise_prec=(1 + k / 10)[None, :])


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_evaluation_in_sample_chunks_equals_one_pass(task):
    """One replica whose activations for all samples exceed ``max_elems``: the samples are predicted
    in chunks (5, 5, 2) and concatenated; every metric, the joint log-likelihood included, equals one pass."""
    X, y = _toy(n=40)
    if task == "classification":
        y = (np.arange(40) % 3).astype(np.int64)
    data = ReplicaData.build(X, y, [(np.arange(0, 30), np.arange(30, 40))], normalize_y=task == "regression",
                             dtype=DT)
    out = 1 if task == "regression" else 3
    state = State(n_data=data.n_train, prior_prec=torch.ones(1, 1, dtype=DT))   # the method reads none of it
    one = evaluate(_CountingMethod(out), state, data, 12, None, task)
    chunked = evaluate(_CountingMethod(out), state, data, 12, None, task, max_elems=10 * 5 * 5)
    assert set(one) == set(chunked) and len(one) >= 3
    for k in one:
        assert chunked[k].item() == pytest.approx(one[k].item(), rel=1e-12, abs=1e-14), k
