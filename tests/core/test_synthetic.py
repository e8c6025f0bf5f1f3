"""Generated data sets (bnnbench/core/data/synthetic.py), the stored regression predictive (protocol.save_predictive),
the ELBO kept in records, and the figures built from them."""

import math

import numpy as np
import pytest
import torch

from bnnbench.cli import main
from bnnbench.core.data import load_dataset
from bnnbench.core.data.synthetic import log_evidence
from bnnbench.run.results import load_predictive, load_record


@pytest.fixture(scope="module", autouse=True)
def env(module_env):
    yield


def test_deep_linear_log_evidence_is_the_dense_gaussian_density():
    ds = load_dataset("synthetic/deep_linear")
    s = ds.splits[1]
    X, y = ds.X[s.train[:60]], ds.y[s.train[:60]]
    K = 0.2 * X @ X.T + 0.1 * np.eye(60)
    ref = torch.distributions.MultivariateNormal(torch.zeros(60, dtype=torch.float64),
                                                 torch.as_tensor(K)).log_prob(torch.as_tensor(y))
    assert log_evidence(X, y, 0.2, 0.1) == pytest.approx(float(ref), rel=1e-12)
    assert len(ds.splits) == 3 and all(len(s.train) == 1000 and len(s.test) == 100 for s in ds.splits)
    assert not np.intersect1d(ds.splits[0].train, ds.splits[1].train).size


def test_gap_cubic_is_the_papers_toy_and_the_same_every_load():
    a, b = load_dataset("synthetic/gap_cubic"), load_dataset("synthetic/gap_cubic")
    np.testing.assert_array_equal(a.X, b.X)
    x = a.X[a.splits[0].train, 0]
    assert len(x) == 40 and ((x > -4) & (x < -2)).sum() == 20 and ((x > 2) & (x < 4)).sum() == 20
    resid = a.y - a.X[:, 0] ** 3
    assert 2.0 < resid.std() < 4.0


def test_a_run_stores_its_predictive_and_elbo_and_the_figures_draw(tmp_path):
    ov = ["method=gi", "data=synthetic/gap_cubic", "protocol=gi_toy", "protocol.epochs=3", "progress=false",
          f"runs_root={tmp_path}"]
    assert main(["run", *ov]) == 0
    d = tmp_path / "adhoc" / "gi" / "synthetic__gap_cubic"
    p, rec = load_predictive(d), load_record(d)
    assert p["mean"].shape == p["var_f"].shape == (1, 200) and p["x"].shape == (1, 200, 1)
    assert (p["var_f"] > 0).all() and np.allclose(p["noise_var"], 9.0)
    assert set(rec["summary"]) >= {"rmse", "loglik_pointwise", "elbo"}
    # the stored moments reproduce the recorded test RMSE (same predictive mean, up to the MC draws)
    rmse = math.sqrt(((p["mean"][0] - p["y"][0]) ** 2).mean())
    assert rmse == pytest.approx(rec["summary"]["rmse"]["mean"], rel=0.05)
    for name in ("fac", "li"):
        assert main(["run", *ov, f"method={name}"]) == 0
    import shutil
    shutil.copytree(tmp_path / "adhoc", tmp_path / "gi_fig1")
    assert main(["plot", "gi_fig1", "--runs-root", str(tmp_path), "--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "gi_fig1_predictive.png").stat().st_size > 10000


def test_the_neal_prior_scaling_gives_each_layer_the_precision_fan_in_plus_one():
    from bnnbench.run.config import compose
    from bnnbench.run.fit import program, FitOptions
    from bnnbench.run.protocol import resolve
    ov = ["method=hmc", "data=synthetic/gap_cubic", "protocol=gi_toy", "protocol.prior_scaling=fan_in"]
    spec = resolve(compose(ov))
    ds = load_dataset("synthetic/gap_cubic")
    s = ds.splits[0]
    _, _, problem = program(spec, ds, [(s.train, s.test)], [0], [{"prior_prec": 2.0, "noise_prec": 1 / 9}],
                            FitOptions(device=torch.device("cpu"), dtype=torch.float64))
    sizes = [1, 50, 50, 1]
    expect = torch.cat([torch.full(((a + 1) * b,), 2.0 * (a + 1), dtype=torch.float64)
                        for a, b in zip(sizes[:-1], sizes[1:])])
    assert torch.equal(problem.prior_prec[0], expect)
