"""``results/probes/summarise.py``: the misses' experiments beside their committed cell, read from records."""

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _summarise():
    spec = importlib.util.spec_from_file_location("summarise", ROOT / "results" / "probes" / "summarise.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _record(taus, lams, kind="bo", learn_noise=False):
    return {"method": "bbb", "wall_time_s": 120.0,
            "config": {"hydra_overrides": ["experiment=x", "method=bbb", "data=uci/yacht", "seed=3", "threads=1"],
                       "spec": {"loglik": "joint", "hpo": {"kind": kind}, "method": {"learn_noise": learn_noise},
                                "space": {"noise_prec": {"log_range": [-1.0, 0.0]},
                                          "prior_prec": {"log_range": [-2.0, 2.0]}}}},
            "hparams": [{"split": str(i), "noise_prec": math.exp(t), "prior_prec": math.exp(p)}
                        for i, (t, p) in enumerate(zip(taus, lams))],
            "summary": {"rmse": {"mean": 1.25, "stderr": 0.125, "n": 3},
                        "loglik_joint": {"mean": -1.5, "stderr": 0.05, "n": 3}}}


def test_a_probe_row_gives_the_metrics_the_changed_settings_and_the_box_edges(tmp_path, monkeypatch):
    mod = _summarise()
    monkeypatch.setattr(mod, "ROOT", tmp_path)       # no committed cell: only the probe's row
    d = tmp_path / "probes" / "slang_table2" / "bbb_seed3" / "uci__yacht"
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps(_record([0.0, -0.5, 0.0], [-2.0, 1.0, 0.5])))
    text = mod.summary(tmp_path / "probes")
    assert "## slang_table2, bbb on uci/yacht" in text
    row = next(line for line in text.splitlines() if line.startswith("| `bbb_seed3`"))
    assert "| seed=3 |" in row and "1.2500 ± 0.1250" in row and "-1.5000 ± 0.0500" in row
    assert "log τ 0.00 [-0.50, 0.00] box [-1, 0], 2 on an edge" in row     # median, range, two at the top
    assert "log λ 0.50 [-2.00, 1.00] box [-2, 2], 1 on an edge" in row
    assert row.endswith("| 2.0 |")


def test_a_learned_noise_is_not_read_as_a_chosen_tau(tmp_path, monkeypatch):
    mod = _summarise()
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    d = tmp_path / "probes" / "nng_table1" / "bbb_lr" / "uci__yacht"
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps(_record([0.0] * 3, [0.0] * 3, kind="fixed", learn_noise=True)))
    row = next(line for line in mod.summary(tmp_path / "probes").splitlines() if line.startswith("| `bbb_lr`"))
    assert "τ learned; log λ 0.00 [0.00, 0.00] (fixed)" in row and "box" not in row


def test_a_grid_candidates_probe_sits_beside_that_candidate_and_others_beside_the_method(tmp_path, monkeypatch):
    mod = _summarise()
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    committed = _record([0.0] * 3, [0.0] * 3, kind="fixed", learn_noise=True)
    committed["summary"]["rmse"]["mean"] = 9.0
    for label in ("gi_standard_lr0.03", "gi_standard_lr0.01", "bbb"):
        d = tmp_path / "results" / "runs" / "gi_tableG" / label / "uci__yacht"
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(committed))
    for label in ("gi_standard_lr0.03_s10", "gi_standard_lr0.03_split0_s30", "bbb_seed1", "other"):
        d = tmp_path / "probes" / "gi_tableG" / label / "uci__yacht"
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps(_record([0.0] * 3, [0.0] * 3, kind="fixed", learn_noise=True)))
    text = mod.summary(tmp_path / "probes")
    sections = {s.splitlines()[0]: s for s in text.split("\n## ")[1:]}
    grid = sections["gi_tableG, gi_standard_lr0.03 on uci/yacht"]    # the longest prefix with a record, not _lr0.01
    assert "| committed `gi_standard_lr0.03` |" in grid and "9.0000 ± 0.1250" in grid
    assert "| `gi_standard_lr0.03_s10` |" in grid and "| `gi_standard_lr0.03_split0_s30` |" in grid
    method = sections["gi_tableG, bbb on uci/yacht"]                  # no prefix has a record: the method's run
    assert "| committed `bbb` |" in method and "| `bbb_seed1` |" in method and "| `other` |" in method
    assert "gi_standard_lr0.01" not in text


def test_a_logistic_regression_probe_gives_its_kl_and_test_nll(tmp_path, monkeypatch):
    mod = _summarise()
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    rec = _record([0.0], [1.0], kind="fixed")
    rec["summary"] = {"sym_kl": {"mean": 224.8923, "stderr": 0.0, "n": 1},
                      "test_nll": {"mean": 0.3389, "stderr": 0.0, "n": 1},
                      "loglik_joint": {"mean": -0.3445, "stderr": 0.0, "n": 1}}
    d = tmp_path / "probes" / "slang_table1" / "mf_hessian_seed1" / "libsvm__a1a"
    d.mkdir(parents=True)
    (d / "record.json").write_text(json.dumps(rec))
    text = mod.summary(tmp_path / "probes")
    assert "| run | settings changed | sym. KL to Full-Gaussian Exact | test NLL |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `mf_hessian_seed1`"))
    assert "| 224.8923 ± 0.0000 | 0.3389 ± 0.0000 |" in row


def test_a_probe_with_no_setting_changed_is_the_cells_earlier_record(tmp_path, monkeypatch):
    # SLANG Table 2's large cells at the paper's minibatch of 100, kept as probes when the column took the code's 10
    mod = _summarise()
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    plain = _record([0.0] * 3, [0.0] * 3)
    plain["config"]["hydra_overrides"] = ["experiment=x", "method=bbb", "data=uci/yacht", "threads=1"]
    for where in (tmp_path / "results" / "runs" / "slang_table2" / "bbb", tmp_path / "probes" / "slang_table2" /
                  "bbb_batch100"):
        (where / "uci__yacht").mkdir(parents=True)
        (where / "uci__yacht" / "record.json").write_text(json.dumps(plain))
    lines = mod.summary(tmp_path / "probes").splitlines()
    assert next(line for line in lines if line.startswith("| committed `bbb`")).startswith(
        "| committed `bbb` | (committed cell) |")
    assert next(line for line in lines if line.startswith("| `bbb_batch100`")).startswith(
        "| `bbb_batch100` | (none: the cell's record before its column was re-made) |")
