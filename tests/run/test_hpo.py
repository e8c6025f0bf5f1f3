"""Hyper-parameter selection: EI formula, BO on a known function, K-fold positions, grid."""

import numpy as np
import pytest
from scipy.stats import norm

from bnnbench.run.hpo import GPBayesOpt, expected_improvement, grid_points, kfold_indices


def test_expected_improvement_by_hand():
    mu, sd, best = np.array([1.0]), np.array([2.0]), 0.5
    z = 0.25
    assert expected_improvement(mu, sd, best)[0] == pytest.approx(0.5 * norm.cdf(z) + 2 * norm.pdf(z))
    assert expected_improvement(np.array([0.0]), np.array([0.0]), 1.0)[0] == pytest.approx(0.0, abs=1e-9)


def test_bo_finds_the_maximum_of_a_smooth_function():
    f = lambda x: -((x[:, 0] - 0.3) ** 2 + (x[:, 1] + 1.2) ** 2)  # noqa: E731
    opt = GPBayesOpt([[-2, 2], [-3, 1]], [0.7, 0.7], n_random=5, alpha=1e-6, seed=0)
    x = opt.ask(5)
    assert len(x) == 5  # the random start
    opt.tell(x, f(x))
    for _ in range(20):
        x = opt.ask(1)
        opt.tell(x, f(x))
    xb, yb = opt.best
    assert len(opt.y) == 25
    assert yb > -0.02 and np.allclose(xb, [0.3, -1.2], atol=0.15)
    # every proposal stays in the box
    X = np.array(opt.X)
    assert (X[:, 0] >= -2).all() and (X[:, 0] <= 2).all() and (X[:, 1] >= -3).all() and (X[:, 1] <= 1).all()


def test_bo_is_seeded():
    a = GPBayesOpt([[0, 1]], [0.3], seed=5).ask(3)
    b = GPBayesOpt([[0, 1]], [0.3], seed=5).ask(3)
    assert np.array_equal(a, b)


def test_batch_proposals_are_distinct():
    opt = GPBayesOpt([[0, 1]], [0.2], n_random=3, seed=1, fit_length_scales=False)
    x = opt.ask(3)
    opt.tell(x, np.sin(6 * x[:, 0]))
    prop = opt.ask(3)
    assert len(np.unique(np.round(prop, 6), axis=0)) == 3


def test_kfold_positions_cover_and_are_disjoint():
    folds = kfold_indices(23, 5, 123)
    assert len(folds) == 5
    val = np.concatenate([b for _, b in folds])
    assert sorted(val.tolist()) == list(range(23))
    for a, b in folds:
        assert not set(a) & set(b) and len(a) + len(b) == 23


def test_grid_points():
    g = grid_points([np.linspace(0, 1, 3), [2.0, 4.0]])
    assert g.shape == (6, 2)
    assert {tuple(r) for r in g} == {(a, b) for a in (0.0, 0.5, 1.0) for b in (2.0, 4.0)}


def test_length_scales_are_refitted_like_bayes_opt():
    """bayes_opt 0.6.0 re-fits the Matern length-scales each step; the protocol value is the start."""
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(20, 2))
    y = np.sin(3 * X[:, 0]) + 0.01 * X[:, 1]  # varies fast along x0, hardly along x1
    fitted = GPBayesOpt([[-2, 2], [-2, 2]], [1.0, 1.0], seed=0)._gp(X, y).kernel_.length_scale
    fixed = GPBayesOpt([[-2, 2], [-2, 2]], [1.0, 1.0], seed=0, fit_length_scales=False)._gp(X, y).kernel_.length_scale
    assert np.allclose(fixed, [1.0, 1.0])
    assert fitted[0] < 1.0 < fitted[1]
