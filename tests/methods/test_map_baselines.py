"""The leaderboard's MAP-based baselines against exact references: a deep ensemble is M independent MAP runs; SWAG's
moments and deviations are those of the collected iterates (a loop over them) and its samples have the stated
covariance; the Laplace adapter hands laplace-torch the same network and reads back the same posterior (the dense
GGN + prior precision, formed here from the network's Jacobian), and its predictive is f(theta_MAP) + J delta; the
engine applies ``posthoc`` before the final evaluation."""

import numpy as np
import pytest
import torch

from bnnbench.core.models import MLP
from bnnbench.methods import MAP, Batch, Problem
from bnnbench.methods.gaussian.laplace import LastLayerLaplace, Laplace
from bnnbench.methods.gaussian.swag import SWAG
from bnnbench.methods.point.ensemble import DeepEnsemble
from bnnbench.run.engine import ReplicaData, train

DT = torch.float64


def _problem(R, P, n=12, tau=4.0):
    g = torch.Generator().manual_seed(3)
    return Problem("gaussian", torch.full((R,), n), (0.5 + torch.rand(R, P, generator=g, dtype=DT)),
                   noise_prec=torch.full((R,), tau, dtype=DT), y_scale=torch.ones(R, dtype=DT))


def _batch(R, B, D, n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Batch(torch.randn(R, B, D, generator=g, dtype=DT), torch.randn(R, B, generator=g, dtype=DT),
                 torch.full((R,), n))


def test_deep_ensemble_is_independent_map_runs():
    model, R, M = MLP([3, 5, 1]), 2, 3
    ens = DeepEnsemble({"members": M, "lr": 0.01}, model, "gaussian")
    single = MAP({"lr": 0.01}, model, "gaussian")
    problem = _problem(R, model.n_params)
    state = ens.init(problem, torch.Generator().manual_seed(0))
    assert state.theta.shape == (R, M, model.n_params)
    assert not torch.allclose(state.theta[:, 0], state.theta[:, 1])          # independent initialisations
    members = [single.init(problem, torch.Generator()).replace(theta=state.theta[:, m].clone()) for m in range(M)]
    for k in range(4):
        batch = _batch(R, 6, 3, seed=k)
        state, stats = ens.step(state, batch, None)
        members = [single.step(s, batch, None)[0] for s in members]
        for m in range(M):
            torch.testing.assert_close(state.theta[:, m], members[m].theta, rtol=1e-12, atol=1e-14)
    x = torch.randn(R, 4, 3, dtype=DT)
    f = ens.predict(state, x, 2 * M, torch.Generator()).f                     # sample s: member s mod M
    for s in range(2 * M):
        torch.testing.assert_close(f[:, s], model.forward(members[s % M].theta[:, None], x)[:, 0])


def test_swag_moments_are_those_of_the_collected_iterates():
    model, R, n, B = MLP([2, 3, 1]), 2, 6, 4       # an epoch's rows at steps 2, 3, 5, 6, 8, 9, ... (t B // N grows)
    swag = SWAG({"lr": 0.05, "rank": 3, "start_epoch": 2}, model, "gaussian")
    state = swag.init(_problem(R, model.n_params, n=n), torch.Generator().manual_seed(0))
    iterates, collected = [], []
    for t in range(1, 25):
        state, _ = swag.step(state, _batch(R, B, 2, n=n, seed=t), None)
        if t * B // n > (t - 1) * B // n and t * B // n >= 2:
            collected.append(state.theta.clone())
        iterates.append(state.theta)
    th = torch.stack(collected)                                               # [n_swa, R, P]
    assert state.n_swa.tolist() == [len(collected)] * R
    torch.testing.assert_close(state.swa_mean, th.mean(0), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(state.swa_sq, (th * th).mean(0), rtol=1e-12, atol=1e-14)
    for i in range(len(collected) - 3, len(collected)):                       # the ring's last K columns
        mean_i = th[:i + 1].mean(0)
        torch.testing.assert_close(state.dev[:, i % 3], th[i] - mean_i, rtol=1e-10, atol=1e-12)
    # samples: the covariance (1/2) (diag(s - mean^2) + D D^T / (K - 1)), a moment check over 200 000 draws
    S = 200_000
    draws = swag.sample_params(state, S, torch.Generator().manual_seed(1))
    cov = swag.covariance(state)
    centred = draws - state.swa_mean[:, None]
    emp = centred.transpose(1, 2) @ centred / S
    var = cov.diagonal(dim1=1, dim2=2)
    se = (var[:, :, None] * var[:, None, :] + cov ** 2).sqrt() / S ** 0.5     # of a Gaussian's sample covariance
    assert ((emp - cov).abs() <= 5 * se + 1e-12).all()
    torch.testing.assert_close(centred.mean(1), torch.zeros_like(state.swa_mean),
                               atol=float(5 * cov.diagonal(dim1=1, dim2=2).max().sqrt() / S ** 0.5), rtol=0)


@pytest.mark.slow   # one compilation, about 10-30 s in a fresh inductor cache
def test_swags_compiled_step_collects_as_the_eager_one():
    """``compile=true`` (``SWAG.compiled_step``: the Adam step and the moments compiled, the deviations written eagerly
    at the steps where some replica collects): through steps where no replica, one or both collect (training sets
    of 6 and 9 rows, minibatches of 4), every state entry equals the eager step's to 1e-12 relative, and a step where
    none collects hands the deviations on unchanged."""
    from bnnbench.run.compiled import compiled_step
    model, R, B = MLP([2, 3, 1]), 2, 4
    swag = SWAG({"lr": 0.05, "rank": 3, "start_epoch": 1}, model, "gaussian")
    problem = _problem(R, model.n_params)
    problem = Problem("gaussian", torch.tensor([6, 9]), problem.prior_prec, noise_prec=problem.noise_prec,
                      y_scale=problem.y_scale)
    state = swag.init(problem, torch.Generator().manual_seed(0))
    step = compiled_step(swag)
    kinds = set()
    for t in range(1, 16):
        batch = _batch(R, B, 2, seed=t)
        batch = Batch(batch.x, batch.y, problem.n_data)
        eager, _ = swag.step(state, batch, None)
        comp, _ = step(state, batch, None)
        collected = (eager.n_swa > state.n_swa).tolist()
        kinds.add(tuple(collected))
        if not any(collected):
            assert comp.dev is state.dev and eager.dev is state.dev
        comp = comp.tensors()
        for key, v in eager.tensors().items():
            if v.is_floating_point():
                assert float((comp[key] - v).abs().max() / v.abs().max().clamp_min(1e-300)) <= 1e-12, key
            else:
                assert torch.equal(comp[key], v), key
        state = eager
    assert kinds == {(False, False), (True, False), (False, True), (True, True)}


def test_swag_predicts_its_iterate_before_collecting():
    model = MLP([2, 3, 1])
    swag = SWAG({"start_epoch": 50}, model, "gaussian")
    state = swag.init(_problem(2, model.n_params), torch.Generator().manual_seed(0))
    state, _ = swag.step(state, _batch(2, 4, 2), None)
    x = torch.randn(2, 5, 2, dtype=DT)
    f = swag.predict(state, x, 3, torch.Generator()).f
    torch.testing.assert_close(f, model.forward(state.theta[:, None].expand(-1, 3, -1), x))


def _laplace_data(R=2, n=30, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n + 10, d))
    y = np.sin(X @ rng.normal(size=d)) + 0.1 * rng.normal(size=n + 10)
    pairs = [(rng.permutation(n + 10)[:n], np.arange(n, n + 10)) for _ in range(R)]
    return ReplicaData.build(X, y, pairs, dtype=DT)


def _trained(cls, model, data, settings, epochs=30):
    method = cls({"lr": 0.02, **settings}, model, "gaussian")
    R, P = data.n_replicas, model.n_params
    problem = Problem("gaussian", data.n_train[data.data_index], torch.full((R, P), 2.0, dtype=DT),
                      noise_prec=torch.tensor([5.0, 20.0], dtype=DT)[:R], y_scale=data.y_std[data.data_index])
    state = method.init(problem, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    return method, train(method, state, data, epochs=epochs, batch_size=10, eval_samples=4, generator=g,
                         task="regression").state


def _jacobian(model, theta, x):
    """J [T, P] of f(x_t; theta) for one replica: torch.func over the flat parameters."""
    return torch.func.jacrev(lambda th: model.forward(th[None, None], x[None])[0, 0, :, 0])(theta)


@pytest.mark.parametrize("cls", [Laplace, LastLayerLaplace])
def test_laplace_posterior_is_the_dense_ggn_plus_prior(cls):
    """hessian_structure=full without tuning: root^-2 = J^T J tau + lambda I over the approximated parameters."""
    model, data = MLP([3, 4, 1]), _laplace_data()
    method, state = _trained(cls, model, data, {"hessian_structure": "full", "prior_tuning": "none"})
    idx = method.index
    for r in range(data.n_replicas):
        u = int(data.data_index[r])
        n = int(data.n_train[u])
        J = _jacobian(model, state.theta[r], data.x_train[u, :n])[:, idx]
        prec = float(state.noise_prec[r]) * J.T @ J + 2.0 * torch.eye(len(idx), dtype=DT)
        root = method.dense_root(state)[r]
        torch.testing.assert_close(root, root.T)
        # to 1e-7 of its scale: laplace-torch's GGN (curvlinops) differs from this one by ~2e-8 of it in float64
        torch.testing.assert_close(torch.linalg.inv(root @ root), prec, rtol=0, atol=1e-7 * float(prec.abs().max()))


@pytest.mark.parametrize("cls", [Laplace, LastLayerLaplace])
def test_laplace_kron_root_is_laplace_torchs_posterior(cls):
    """kron with the marginal-likelihood prior: root^-2 is laplace-torch's dense posterior precision, reordered
    from nn.Module's parameter order to the flat layout; delta is laplace-torch's tuned prior precision."""
    model, data = MLP([3, 4, 2, 1]), _laplace_data()
    method, state = _trained(cls, model, data, {})
    perm = method.torch_order()
    for r in range(data.n_replicas):
        u = int(data.data_index[r])
        n = int(data.n_train[u])
        la = method.fit_replica(state.theta[r], data.x_train[u, :n], data.y_train[u, :n], state.noise_prec[r], 2.0)
        prec = la.posterior_precision.to_matrix()                            # laplace-torch's order
        ours = torch.empty_like(prec)
        ours[perm[:, None], perm[None, :]] = prec
        root = method.dense_root(state)[r]
        torch.testing.assert_close(torch.linalg.inv(root @ root), ours, rtol=0, atol=1e-9 * float(ours.abs().max()))
        assert float(state.delta[r]) == pytest.approx(float(la.prior_precision), rel=1e-10)
        # the draws: the blocks applied to z in laplace-torch's order equal the dense root on z in the flat layout's
        z = torch.randn(3, len(method.index), generator=torch.Generator().manual_seed(r), dtype=DT)
        draws = method.sample_offsets(state[r:r + 1], 3, torch.Generator().manual_seed(r))[0]
        torch.testing.assert_close(draws[:, method.index], z @ root)
        assert (draws[:, [i for i in range(model.n_params) if i not in set(method.index.tolist())]] == 0).all()
        assert float(state.delta[r]) != pytest.approx(2.0, rel=1e-3)          # the marginal likelihood moved it
        # the module laplace-torch fits computes our network
        x = data.x_eval[u]
        torch.testing.assert_close(method.module(state.theta[r])(x)[:, 0],
                                   model.forward(state.theta[r][None, None], x[None])[0, 0, :, 0])


def test_laplace_predictive_is_the_linearised_network():
    model, data = MLP([3, 4, 1]), _laplace_data()
    method, state = _trained(Laplace, model, data, {})
    x = data.x_eval[data.data_index]
    f = method.predict(state, x, 5, torch.Generator().manual_seed(7)).f[..., 0]
    delta = method.sample_offsets(state, 5, torch.Generator().manual_seed(7))
    for r in range(data.n_replicas):
        J = _jacobian(model, state.theta[r], x[r])
        f_map = model.forward(state.theta[r][None, None], x[r][None])[0, 0, :, 0]
        torch.testing.assert_close(f[r], f_map[None] + delta[r] @ J.T)


def test_laplace_refuses_what_laplace_torch_cannot_take():
    with pytest.raises(ValueError, match="categorical"):
        Laplace({}, MLP([3, 4, 1]), "bernoulli")
    with pytest.raises(ValueError, match="laplace_ll"):
        Laplace({"hessian_structure": "full"}, MLP([784, 100, 10]), "categorical")
    Laplace({}, MLP([784, 100, 10]), "categorical")   # K-FAC keeps factors, not a dense root: any size
    with pytest.raises(ValueError, match="valid: kron, full, diag"):
        Laplace({"hessian_structure": "lowrank"}, MLP([3, 4, 1]), "gaussian")


def test_laplace_classification_runs_on_a_categorical_likelihood():
    model = MLP([2, 5, 3])
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 2))
    y = (X[:, 0] > 0).astype(float) + (X[:, 1] > 0.5)
    data = ReplicaData.build(X, y, [(np.arange(30), np.arange(30, 40))], normalize_y=False, dtype=DT)
    method = LastLayerLaplace({"lr": 0.05}, model, "categorical")
    state = method.init(Problem("categorical", data.n_train, torch.ones(1, model.n_params, dtype=DT)),
                        torch.Generator().manual_seed(0))
    res = train(method, state, data, epochs=20, batch_size=10, eval_samples=8, generator=torch.Generator(),
                task="classification")
    assert method.dense_root(res.state).abs().sum() > 0 and torch.isfinite(res.final["nll"]).all()


def test_posthoc_runs_before_the_final_evaluation():
    """A MAP whose ``posthoc`` zeroes theta: the final evaluation predicts the training mean."""
    class Zeroed(MAP):
        def posthoc(self, state, data):
            return state.replace(theta=torch.zeros_like(state.theta))
    model, data = MLP([3, 4, 1]), _laplace_data(R=1)
    method = Zeroed({"lr": 0.02}, model, "gaussian")
    problem = Problem("gaussian", data.n_train, torch.ones(1, model.n_params, dtype=DT),
                      noise_prec=torch.ones(1, dtype=DT), y_scale=data.y_std)
    res = train(method, method.init(problem, torch.Generator()), data, epochs=3, batch_size=10, eval_samples=2,
                generator=torch.Generator(), task="regression")
    assert (res.state.theta == 0).all()
    rmse = float((data.y_eval[0] - data.y_mean[0]).pow(2).mean().sqrt())
    assert float(res.final["rmse"][0]) == pytest.approx(rmse, rel=1e-6)   # metrics are float32


def test_laplace_leaves_a_diverged_replica_diverged_and_fits_the_others():
    model, data = MLP([3, 4, 1]), _laplace_data()
    method, state = _trained(Laplace, model, data, {})
    broken = state.replace(theta=state.theta.clone().index_fill_(0, torch.tensor([0]), float("nan")))
    out = method.posthoc(broken, data)
    assert all(torch.isnan(t[0]).all() for b in out.root for t in (b.U1, b.U2, b.s)) and torch.isnan(out.delta[0])
    torch.testing.assert_close(method.dense_root(out)[1], method.dense_root(state)[1])
