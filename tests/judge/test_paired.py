"""Small-data trials (split_scheme kind subsample), metrics between two runs' predictives (bnnbench.judge.paired; the
noisy natural gradient paper's Table 4) and HMC's agreement-of-halves diagnostic. Fast: no training."""

import json
from pathlib import Path

import numpy as np
import pytest

from bnnbench.run.config import ConfigError
from bnnbench.core.data import Split
from bnnbench.core.mcmc import predvar_agreement
from bnnbench.judge.paired import pearson, predvar, predvar_correlation
from bnnbench.run.results import PREDICTIVE, RECORD
from bnnbench.run.splits import pool_rows, select_splits
from bnnbench.judge.tables import build_table


class _DS:
    def __init__(self, n):
        self.name = "uci/toy"
        self.y = np.arange(n, dtype=float)
        self.splits = [Split("0", np.arange(n - 5), np.arange(n - 5, n))]
        self.meta = {}


SCHEME = {"kind": "subsample", "n_splits": 4, "n_train": 20, "n_test": 100, "seed": 3}


def test_subsample_trials_partition_the_rows_and_differ_between_trials():
    ds = _DS(300)
    splits = select_splits(ds, "all", SCHEME)
    assert [s.name for s in splits] == ["s0", "s1", "s2", "s3"]
    for k, s in enumerate(splits):
        pool = pool_rows(ds, SCHEME, k)
        assert len(s.train) == 20 and len(s.test) == 100 and len(pool) == 180
        rows = np.concatenate([s.train, s.test, pool])
        assert np.array_equal(np.sort(rows), np.arange(300))          # disjoint and covering
        perm = np.random.default_rng(3 + k).permutation(300)
        assert np.array_equal(s.test, np.sort(perm[:100])) and np.array_equal(s.train, np.sort(perm[100:120]))
    assert not np.array_equal(splits[0].train, splits[1].train)
    assert select_splits(ds, "all", SCHEME)[2].train.tolist() == splits[2].train.tolist()   # seeded


def test_subsample_refuses_too_small_a_data_set_and_unknown_kinds():
    with pytest.raises(ConfigError, match="too few"):
        select_splits(_DS(50), "all", SCHEME)
    with pytest.raises(ConfigError, match="valid: random, subsample"):
        select_splits(_DS(300), "all", {"kind": "bootstrap"})


def test_pearson_equals_numpys_and_is_nan_for_a_constant():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=50), rng.normal(size=50)
    y = y + 0.5 * x
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-14)
    assert pearson(3 * x + 1, x) == pytest.approx(1.0)
    assert np.isnan(pearson(np.ones(5), x[:5]))


def _predictive(dirpath: Path, var_f, noise_var, x, n_test):
    dirpath.mkdir(parents=True, exist_ok=True)
    R, T = var_f.shape
    np.savez(dirpath / PREDICTIVE, mean=np.zeros((R, T)), var_f=var_f, noise_var=noise_var, x=x,
             y=np.zeros((R, T)), n_test=np.asarray(n_test))
    (dirpath / RECORD).write_text(json.dumps({"status": "ok", "metrics": [{"split": "s0"}], "summary": {}}))


def test_predvar_correlation_uses_each_splits_own_rows_and_the_total_variance(tmp_path):
    rng = np.random.default_rng(1)
    R, T = 3, 12
    n_test = [12, 9, 7]
    x = rng.normal(size=(R, T, 2))
    vf_a, vf_b = rng.gamma(2.0, size=(R, T)), rng.gamma(2.0, size=(R, T))
    vf_a[1, 9:] = vf_b[1, 9:] = 1e6        # padding rows: must not count
    nv_a, nv_b = np.full((R, T), 0.3), np.full((R, T), 0.7)
    _predictive(tmp_path / "a", vf_a, nv_a, x, n_test)
    _predictive(tmp_path / "b", vf_b, nv_b, x, n_test)
    got = predvar_correlation(tmp_path / "a", tmp_path / "b")
    want = [np.corrcoef(vf_a[r, :n] + 0.3, vf_b[r, :n] + 0.7)[0, 1] for r, n in enumerate(n_test)]
    assert got == pytest.approx(want, abs=1e-12)
    assert [len(v) for v in predvar({"var_f": vf_a, "noise_var": nv_a, "n_test": np.asarray(n_test)})] == n_test
    _predictive(tmp_path / "c", vf_b, nv_b, x + 1.0, n_test)
    with pytest.raises(ValueError, match="same test rows"):
        predvar_correlation(tmp_path / "a", tmp_path / "c")
    assert predvar_correlation(tmp_path / "a", tmp_path / "missing") is None


def test_table4_cells_are_the_mean_and_stderr_of_the_per_trial_correlations(tmp_path):
    rng = np.random.default_rng(2)
    R, T = 10, 100
    x = rng.normal(size=(R, T, 3))
    hmc = rng.gamma(2.0, size=(R, T))
    meth = hmc + rng.normal(scale=0.5, size=(R, T)) ** 2
    root = tmp_path / "runs"
    _predictive(root / "t4" / "hmc" / "uci__yacht", hmc, np.full((R, T), 0.1), x, [T] * R)
    _predictive(root / "t4" / "noisy_kfac" / "uci__yacht", meth, np.full((R, T), 0.2), x, [T] * R)
    spec = {"name": "t4", "paper": "nng", "reference": "nng_table4_hmc_correlation.csv", "table": "Table 4",
            "methods": {"noisy_kfac": {"paper_method": "NNG-MVG", "setting": ""},
                        "pbp": {"paper_method": "PBP", "setting": ""}},
            "datasets": ["uci/yacht"],
            "metrics": {"predvar_corr_hmc": {"paper_metric": "pearson_corr_predvar_vs_hmc", "higher_is_better": True,
                                             "against": "hmc", "paired": "predvar_corr"}}}
    df = build_table(spec, root)
    cell = df[df.method == "NNG-MVG"].iloc[0]
    per = np.array([np.corrcoef(meth[r], hmc[r])[0, 1] for r in range(R)])
    assert cell.ours == pytest.approx(per.mean(), abs=1e-12)
    assert cell.ours_se == pytest.approx(per.std() / np.sqrt(R), abs=1e-12)
    assert cell.n == R and cell.paper == pytest.approx(0.717)
    assert df[df.method == "PBP"].iloc[0].verdict == "not_run"
    import shutil
    shutil.rmtree(root / "t4" / "hmc")
    cell = build_table(spec, root).query("method == 'NNG-MVG'").iloc[0]
    assert cell.verdict == "not_run" and cell.run_status.startswith("reference run hmc")


def test_a_cell_against_a_flagged_reference_run_is_inconclusive(tmp_path):
    """Table 4's cells are scored against HMC: where the HMC record's diagnostics flag it (an R-hat above the
    threshold), a cell that would be reproduced is inconclusive instead (its number stands, marked with the reason,
    and it is not counted as reproduced); unflagged, the same numbers are reproduced."""
    rng = np.random.default_rng(5)
    R, T = 10, 100
    x = rng.normal(size=(R, T, 3))
    hmc = rng.gamma(2.0, size=(R, T))
    meth = hmc + rng.gamma(2.0, size=(R, T))                     # a correlation of about 0.7 with HMC's
    root = tmp_path / "runs"
    ref_dir = root / "t4" / "hmc" / "uci__yacht"
    _predictive(ref_dir, hmc, np.full((R, T), 0.1), x, [T] * R)
    _predictive(root / "t4" / "noisy_kfac" / "uci__yacht", meth, np.full((R, T), 0.2), x, [T] * R)
    spec = {"name": "t4", "paper": "nng", "reference": "nng_table4_hmc_correlation.csv", "table": "Table 4",
            "methods": {"noisy_kfac": {"paper_method": "NNG-MVG", "setting": ""}},
            "datasets": ["uci/yacht"],
            "metrics": {"predvar_corr_hmc": {"paper_metric": "pearson_corr_predvar_vs_hmc", "higher_is_better": True,
                                             "against": "hmc", "paired": "predvar_corr"}}}
    rec = json.loads((ref_dir / RECORD).read_text())
    rec["diagnostics"] = {"flagged": False, "rhat_mean_max": [1.02] * R, "rhat_var_max": [1.01] * R,
                          "rhat_threshold": 1.1}
    (ref_dir / RECORD).write_text(json.dumps(rec))
    ok = build_table(spec, root).iloc[0]
    assert ok.verdict == "reproduced" and ok.run_status == "ok", (ok.ours, ok.verdict)
    rec["diagnostics"].update(flagged=True, rhat_mean_max=[1.02] * (R - 1) + [1.31])
    (ref_dir / RECORD).write_text(json.dumps(rec))
    df = build_table(spec, root)
    cell = df.iloc[0]
    assert cell.verdict == "inconclusive" and cell.ours == ok.ours and cell.ours_se == ok.ours_se
    assert cell.run_status == "reference hmc flagged: R-hat 1.31 > 1.1"
    from bnnbench.present.render import render_markdown
    md = render_markdown(df, spec)
    assert "inconclusive (reference hmc flagged: R-hat 1.31 > 1.1)" in md
    assert "Reproduced per method: NNG-MVG 0 of 1: inconclusive 1." in md


def test_predvar_agreement_of_chain_halves_is_one_for_identical_halves_and_low_for_unrelated_ones():
    rng = np.random.default_rng(4)
    R, T, C, k = 2, 30, 4, 40
    scale = rng.gamma(2.0, size=(R, T, 1, 1))
    f = rng.normal(size=(R, T, C, k)) * np.sqrt(scale)
    f[:, :, 2:] = f[:, :, :2]                        # the second half of the chains repeats the first
    second = f * f + 0.25
    out = predvar_agreement(f, second, np.ones((R, T), bool))
    assert out["predvar_corr_chain_halves"] == pytest.approx([1.0, 1.0])
    var_first = second[..., :20].mean((-2, -1)) - f[..., :20].mean((-2, -1)) ** 2
    var_all = second.mean((-2, -1)) - f.mean((-2, -1)) ** 2
    assert out["predvar_corr_first_half"][0] == pytest.approx(np.corrcoef(var_first[0], var_all[0])[0, 1])
    g = rng.normal(size=(R, T, C, k))                 # every row the same variance: halves unrelated
    low = predvar_agreement(g, g * g, np.ones((R, T), bool))["predvar_corr_chain_halves"]
    assert max(abs(v) for v in low) < 0.6
