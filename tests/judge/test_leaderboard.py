"""The leaderboard (experiment uci_leaderboard): ranks, average ranks, paired tests over the shared splits and the
Nemenyi critical difference, from records, against scipy and Demsar's (2006) published constants."""

import json
import math
import shutil

import numpy as np
import pytest
from scipy import stats

from bnnbench.cli import main
from bnnbench.run.config import experiment_spec
from bnnbench.judge.leaderboard import average_ranks, build_leaderboard, q_nemenyi, render_leaderboard
from bnnbench.run.results import run_dir

SPEC = {"name": "lb", "title": "LB", "datasets": ["uci/a", "uci/b"],
        "methods": {"m1": {"label": "One"}, "m2": {"label": "Two"}, "m3": {"label": "Three"}},
        "leaderboard": {"rank_by": "ll", "alpha": 0.05, "open": True,
                        "metrics": {"ll": {"label": "LL", "higher_is_better": True},
                                    "rmse": {"label": "RMSE", "higher_is_better": False}}}}


def _record(root, label, ds, ll, rmse):
    d = run_dir(root, "lb", label, ds)
    d.mkdir(parents=True)
    rec = {"status": "ok", "metrics": [{"split": str(i), "ll": a, "rmse": b} for i, (a, b) in enumerate(zip(ll, rmse))]}
    (d / "record.json").write_text(json.dumps(rec))


@pytest.fixture
def runs(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.normal(size=20)
    vals = {("m1", "uci/a"): base + 1.0, ("m2", "uci/a"): base + 0.99 + 0.01 * rng.normal(size=20),
            ("m3", "uci/a"): base - 1.0, ("m1", "uci/b"): base - 1.0, ("m2", "uci/b"): base,
            ("m3", "uci/b"): base + 2.0, ("mine", "uci/a"): base, ("mine", "uci/b"): base}
    for (m, ds), v in vals.items():
        _record(tmp_path, m, ds, v, -v)
    return tmp_path, vals


def test_ranks_and_paired_tests_are_computed_from_the_records(runs):
    root, vals = runs
    df = build_leaderboard(SPEC, root)
    a = df[(df.metric == "ll") & (df.dataset == "uci/a")].set_index("method")
    assert a.loc["m1", "rank"] == 1 and a.loc["m3", "rank"] == 4 and a.loc["m1", "mean"] == vals[("m1", "uci/a")].mean()
    assert a.loc["m1", "se"] == pytest.approx(vals[("m1", "uci/a")].std() / math.sqrt(20))
    for m in ("m2", "m3", "mine"):
        p = stats.wilcoxon(vals[(m, "uci/a")], vals[("m1", "uci/a")]).pvalue
        assert a.loc[m, "p_vs_best"] == pytest.approx(p) and a.loc[m, "tied_best"] == (p >= 0.05)
    assert a.loc["m3", "tied_best"] == False   # noqa: E712  (1 unit below on every split)
    r = df[(df.metric == "rmse") & (df.dataset == "uci/b")].set_index("method")
    assert r.loc["m3", "rank"] == 1   # lower RMSE is better: -v, m3 has the largest v on b


def test_average_ranks_and_the_critical_difference(runs):
    root, _ = runs
    df = build_leaderboard(SPEC, root)
    avg = average_ranks(df, "ll", SPEC["datasets"])
    ranks = df[df.metric == "ll"].pivot(index="method", columns="dataset", values="rank")
    assert avg["m1"] == pytest.approx(ranks.loc["m1"].mean())
    # Demsar (2006) Table 5a, alpha = 0.05: q = 2.343 (k = 3), 2.569 (k = 4), 3.164 (k = 10)
    assert q_nemenyi(3, 0.05) == pytest.approx(2.343, abs=1e-3)
    assert q_nemenyi(4, 0.05) == pytest.approx(2.569, abs=1e-3)
    assert q_nemenyi(10, 0.05) == pytest.approx(3.164, abs=1e-3)
    md = render_leaderboard(df, SPEC)
    cd = 2.569 * math.sqrt(4 * 5 / (6 * 2))
    assert f"{cd:.2f} ranks" in md and "| One | **" in md and "mine" in md   # an added method gets its column


def test_a_board_part_way_run_ranks_over_the_data_sets_all_its_methods_ran_on(runs):
    """A third data set where m3 (a method of the board) has not run: the average ranks and the Friedman test are over
    a and b alone, the table says so; a method added with --label that ran on a alone (``yours``) does not shrink
    them (it is not counted and gets no average)."""
    from bnnbench.judge.leaderboard import friedman, ranked_datasets
    root, vals = runs
    spec = {**SPEC, "datasets": ["uci/a", "uci/b", "uci/c"]}
    for m in ("m1", "m2", "mine"):
        _record(root, m, "uci/c", vals[(m, "uci/a")], -vals[(m, "uci/a")])
    _record(root, "yours", "uci/a", vals[("m1", "uci/a")] + 0.5, -vals[("m1", "uci/a")])
    df = build_leaderboard(spec, root)
    assert ranked_datasets(df, spec, "ll") == ["uci/a", "uci/b"]
    ranks = df[df.metric == "ll"].pivot(index="method", columns="dataset", values="rank")
    md = render_leaderboard(df, spec)
    assert "Average rank: over a, b, the data sets on which the most of the board's methods have run so far." in md
    m1 = next(line for line in md.splitlines() if line.startswith("| One |"))
    assert m1.endswith(f"| {ranks.loc['m1', ['uci/a', 'uci/b']].mean():.2f} |")
    assert next(line for line in md.splitlines() if line.startswith("| yours |")).endswith("|  |")
    chi2, _, k, n = friedman(df, "ll", ["uci/a", "uci/b"])
    assert (k, n) == (4, 2) and f"chi^2 = {chi2:.2f}" in md
    # complete: no such line
    assert "Average rank: over" not in render_leaderboard(build_leaderboard(SPEC, root), SPEC)


def test_reproduce_adds_a_registered_method_of_yours_to_an_open_leaderboard(tmp_path, monkeypatch, capsys):
    import bnnbench.cli as cli
    ran = []
    monkeypatch.setattr(cli, "_reproduce_cell", lambda exp, root, ov, cores=None: ran.append(ov) or "ok")
    monkeypatch.setattr(cli, "cmd_table", lambda args: 0)   # the cells above write no record to render
    assert main(["reproduce", "uci_leaderboard", "--label", "bbb",
                 "--runs-root", str(tmp_path), "--out", str(tmp_path / "t")]) == 0
    spec = experiment_spec("uci_leaderboard")
    assert len(ran) == len(spec["datasets"])           # bbb is a column: its five cells
    ran.clear()
    assert main(["reproduce", "uci_leaderboard", "--label", "full_gaussian", "--runs-root", str(tmp_path),
                 "--out", str(tmp_path / "t")]) == 0
    assert [o for ov in ran for o in ov if o.startswith("method=")] == ["method=full_gaussian"] * len(spec["datasets"])
    ran.clear()
    assert main(["reproduce", "uci_leaderboard", "--label", "no_such_method", "--runs-root", str(tmp_path)]) == 2
    assert ran == [] and "has the label 'no_such_method'; its labels: bbb, " in capsys.readouterr().err


def test_a_method_added_with_label_is_named_by_its_method_class(runs, monkeypatch):
    """The board names its own methods by the experiment's labels, a registered method added with ``--label`` by its
    class's ``label`` (a plugin's own display name), and anything else by its run label."""
    import bnnbench.methods as methods
    from bnnbench.judge.leaderboard import method_labels

    class Mine(methods.Method):
        name, label = "mine", "My Method"

    monkeypatch.setitem(methods.METHODS, "mine", Mine)
    root, _ = runs
    labels = method_labels(SPEC)
    assert (labels["m1"], labels["mine"], labels["bbb"], labels["unregistered"]) == ("One", "My Method", "bbb",
                                                                                      "unregistered")
    table = render_leaderboard(build_leaderboard(SPEC, root), SPEC)
    assert "| My Method |" in table and "| mine |" not in table and "| One |" in table


def test_a_diverged_run_ranks_below_every_finished_one(runs):
    root, _ = runs
    d = run_dir(root, "lb", "m3", "uci/b")
    shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / "failed.json").write_text(json.dumps({"status": "failed", "reason": "diverged at epoch 1"}))
    df = build_leaderboard(SPEC, root)
    b = df[(df.metric == "ll") & (df.dataset == "uci/b")].set_index("method")
    assert b.loc["m3", "diverged"] and b.loc["m3", "rank"] == 4 and b.loc["m3", "rank"] > b["rank"].drop("m3").max()
    assert "diverged (4)" in render_leaderboard(df, SPEC)


def test_claims_are_checked_against_the_table_with_the_differences_in_standard_errors():
    import pandas as pd

    from bnnbench.judge.leaderboard import render_claims
    rows = [{"metric": "accuracy", "dataset": "mnist", "method": m, "mean": v, "se": 0.001, "n": 1, "rank": r,
             "best": "a", "p_vs_best": float("nan"), "tied_best": m == "a", "diverged": False}
            for m, v, r in (("a", 0.99, 1.0), ("b", 0.98, 2.0), ("c", 0.97, 3.0))]
    rows += [{"metric": "ece", "dataset": "mnist", "method": m, "mean": v, "se": float("nan"), "n": 1, "rank": r,
              "best": "b", "p_vs_best": float("nan"), "tied_best": False, "diverged": False}
             for m, v, r in (("a", 0.02, 3.0), ("b", 0.01, 1.0), ("c", 0.015, 2.0))]
    spec = {"datasets": ["mnist"], "methods": {"a": {"label": "A"}, "b": {}, "c": {}},
            "leaderboard": {"metrics": {"accuracy": {"higher_is_better": True, "label": "acc"},
                                        "ece": {"higher_is_better": False}},
                            "claims": [{"claim": "a first in accuracy", "better": "a", "than": ["b", "c"],
                                        "metrics": ["accuracy"]},
                                       {"claim": "a first in both", "better": "a", "than": ["c"],
                                        "metrics": ["accuracy", "ece"]},
                                       {"claim": "d first", "better": "d", "than": ["a"], "metrics": ["accuracy"]}]}}
    out = "\n".join(render_claims(pd.DataFrame(rows), spec))
    assert "a first in accuracy (mnist): **holds**. acc vs b: +0.0100 (+7.1 SE); acc vs c: +0.0200 (+14.1 SE)." in out
    assert "a first in both (mnist): **does not hold**" in out and "ece vs c: +0.0050." in out
    assert "d first (mnist): **not checked (a run is missing)**" in out


def test_a_metric_with_a_target_is_ranked_and_tested_by_the_distance_to_it(tmp_path):
    """Coverage of a 90 % interval: the method nearest 0.9 on average over the splits ranks first, whichever side."""
    rng = np.random.default_rng(1)
    cov = {"over": 0.97 + 0.01 * rng.normal(size=20), "near": 0.89 + 0.01 * rng.normal(size=20),
           "under": 0.80 + 0.01 * rng.normal(size=20)}
    for m, v in cov.items():
        d = run_dir(tmp_path, "lb", m, "uci/a")
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps({"status": "ok", "metrics": [{"split": str(i), "cov": float(x)}
                                                                                for i, x in enumerate(v)]}))
    spec = {"name": "lb", "datasets": ["uci/a"], "methods": {m: {} for m in cov},
            "leaderboard": {"alpha": 0.05, "metrics": {"cov": {"label": "90 %", "target": 0.9}}}}
    df = build_leaderboard(spec, tmp_path).set_index("method")
    assert df["rank"].to_dict() == {"near": 1.0, "over": 2.0, "under": 3.0}
    assert df.loc["over", "mean"] == pytest.approx(cov["over"].mean())          # the value shown is the coverage
    p = stats.wilcoxon(np.abs(cov["over"] - 0.9), np.abs(cov["near"] - 0.9)).pvalue
    assert df.loc["over", "p_vs_best"] == pytest.approx(p)
    assert "closest to 0.9 is better" in render_leaderboard(build_leaderboard(spec, tmp_path), spec)


def test_critical_difference_cliques_and_figure(runs, tmp_path):
    from itertools import combinations

    from bnnbench.present.plots import cd_cliques, critical_difference_figure
    rng = np.random.default_rng(2)
    for _ in range(50):   # against a brute force: the maximal sets of consecutive methods within CD of each other
        ranks, cd = list(rng.uniform(1, 8, size=7)), rng.uniform(0.3, 3)
        r = sorted(ranks)
        groups = [(i, j) for i, j in combinations(range(7), 2) if r[j] - r[i] < cd]
        maximal = [(i, j) for i, j in groups if not any(a <= i and j <= b and (a, b) != (i, j) for a, b in groups)]
        assert sorted(cd_cliques(ranks, cd)) == sorted(maximal)
    root, _ = runs
    out = critical_difference_figure(SPEC, root, tmp_path / "cd.png")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rank_stability_compares_the_average_ranks_of_two_boards(runs):
    """A second board whose LL order over the methods is reversed: tau = -1 for the LL; the RMSE (the negated values)
    reversed too. Against itself: tau = 1."""
    from bnnbench.judge.leaderboard import rank_stability
    root, vals = runs
    for (m, ds), v in vals.items():
        d = run_dir(root, "lb2", m, ds)
        d.mkdir(parents=True)
        rec = {"status": "ok", "metrics": [{"split": str(i), "ll": float(-a), "rmse": float(a)}
                                           for i, a in enumerate(v)]}
        (d / "record.json").write_text(json.dumps(rec))
    spec2 = {**SPEC, "name": "lb2"}
    df = build_leaderboard(SPEC, root)
    text = "\n".join(rank_stability(df, SPEC, spec2, root))
    common = ["m1", "m2", "m3", "mine"]
    ranks = {m: np.mean([stats.rankdata([-vals[(k, ds)].mean() for k in common])[common.index(m)]
                         for ds in SPEC["datasets"]]) for m in common}
    tau = stats.kendalltau([ranks[m] for m in common], [len(common) + 1 - ranks[m] for m in common])[0]
    assert f"### LL: Kendall's tau = {tau:.2f}" in text and tau < -0.5
    assert "### LL: Kendall's tau = 1.00" in "\n".join(rank_stability(df, SPEC, SPEC, root))


def test_significant_orders_count_the_pairs_the_paired_tests_order_on_both_boards(runs):
    """Against a board with every LL negated, each pair the Wilcoxon test separates (looped over by hand with scipy)
    is reversed and none kept; against itself each is kept. A pair the test does not separate (m2 and mine on b, the
    same values) is in no list."""
    from bnnbench.judge.leaderboard import significant_orders
    root, vals = runs
    for (m, ds), v in vals.items():
        d = run_dir(root, "lb2", m, ds)
        d.mkdir(parents=True)
        (d / "record.json").write_text(json.dumps({"status": "ok", "metrics": [
            {"split": str(i), "ll": float(-a), "rmse": float(a)} for i, a in enumerate(v)]}))
    common = ["m1", "m2", "m3", "mine"]
    separated = {ds: sorted((a, b) if vals[(a, ds)].mean() > vals[(b, ds)].mean() else (b, a)
                            for i, a in enumerate(common) for b in common[i + 1:]
                            if np.any(vals[(a, ds)] != vals[(b, ds)])
                            and stats.wilcoxon(vals[(a, ds)], vals[(b, ds)]).pvalue < 0.05)
                 for ds in SPEC["datasets"]}
    assert len(separated["uci/a"]) == 6 and len(separated["uci/b"]) == 5
    flips = significant_orders(SPEC, {**SPEC, "name": "lb2"}, root, common, "ll")
    assert {ds: sorted(p) for ds, p in flips["reversed"].items()} == separated
    assert not any(flips["kept"].values()) and not any(flips["lost"].values()) and not any(flips["gained"].values())
    assert all(("m2", "mine") not in p and ("mine", "m2") not in p for k in flips for p in [flips[k]["uci/b"]])
    same = significant_orders(SPEC, SPEC, root, common, "ll")
    assert {ds: sorted(p) for ds, p in same["kept"].items()} == separated and not any(same["reversed"].values())
    df = build_leaderboard(SPEC, root)
    from bnnbench.judge.leaderboard import rank_stability
    n = sum(map(len, separated.values()))
    assert f"0 in the same order on both boards, **{n} in the opposite order**" in "\n".join(
        rank_stability(df, SPEC, {**SPEC, "name": "lb2"}, root))


@pytest.mark.e2e
def test_the_classification_board_runs_a_binary_set_as_two_logits(tmp_path, module_env, monkeypatch):
    """cls_leaderboard's protocol is multiclass: a binary LIBSVM set runs as K = 2 softmax logits (here last-layer
    Laplace through laplace-torch, which takes no single logit)."""
    from datapaths import MIRROR
    if not (MIRROR / "MANIFEST.md").is_file():
        pytest.skip("needs the data mirror")
    monkeypatch.setattr("sys.argv", ["bnnbench"])
    ov = ["experiment=cls_leaderboard", "method=laplace_ll", "data=libsvm/australian", "protocol.epochs=2",
          "protocol.splits=[1,2]", "hpo=fixed", f"runs_root={tmp_path}", "threads=1", "progress=false"]
    assert main(["run", *ov]) == 0
    rec = json.loads((run_dir(tmp_path, "cls_leaderboard", "laplace_ll", "libsvm/australian") / "record.json")
                     .read_text())
    assert {"accuracy", "nll", "ece"} <= set(rec["summary"]) and 0.5 < rec["summary"]["accuracy"]["mean"] <= 1


@pytest.mark.e2e
def test_a_method_that_cannot_take_the_network_is_one_error_line(tmp_path, module_env, monkeypatch, capsys):
    """A full (dense) Laplace over all 39 760 weights of the MNIST network: refused before any work, with the ways out
    named."""
    from datapaths import MIRROR
    if not (MIRROR / "MANIFEST.md").is_file():
        pytest.skip("needs the data mirror")
    monkeypatch.setattr("sys.argv", ["bnnbench"])
    assert main(["run", "experiment=cls_leaderboard", "method=laplace", "method.hessian_structure=full", "data=mnist",
                 "hpo=fixed", f"runs_root={tmp_path}", "progress=false"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: method laplace on mnist: laplace: 39760 approximated parameters") and \
        "take hessian_structure=kron or laplace_ll" in err and "Traceback" not in err
    assert not (tmp_path / "cls_leaderboard").exists()
