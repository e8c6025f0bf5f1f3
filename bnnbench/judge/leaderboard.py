"""One leaderboard across papers (an experiment with a ``leaderboard`` section, e.g. ``uci_leaderboard``): every
method under one protocol on the same splits, so that methods are compared with each other.

Per data set and metric: each method's mean and standard error over the splits (std(ddof=0)/sqrt(n)) and its rank
(1 = best, ties share the mean rank). Per method: its average rank over the data sets it ran on all of. Because the
splits are shared, each method is compared with the data set's best by a paired two-sided Wilcoxon signed-rank test
over the splits (``scipy.stats.wilcoxon``); a method whose p-value is at least ``alpha`` is not distinguishable from
the best there. A metric with a ``target`` (an interval's coverage: its nominal level) is ranked and tested by the
distance |value - target| per split. Over data sets: the Friedman test of the ranks and the Nemenyi critical difference
CD = q_alpha sqrt(k (k + 1) / (6 n)) for k methods on n data sets (Demsar, 2006): two methods whose average ranks
differ by less than CD are not distinguished by this benchmark.

Every number is computed from the run records (``record.json``'s per-split metrics); nothing is typed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from scipy import stats

from bnnbench.run.results import atomic_write_text, load_record, run_dir

# Studentised range statistic / sqrt(2) for the Nemenyi test at alpha = 0.05, k = 2..10 methods (Demsar, 2006, Table
# 5a), extended to 20 methods with the same definition (scipy.stats.studentized_range, infinite degrees of freedom)
def q_nemenyi(k: int, alpha: float) -> float:
    """q_alpha of the Nemenyi test: the studentised range quantile for k groups and infinite df, over sqrt(2)."""
    return float(stats.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2))


def method_labels(spec: Mapping) -> dict[str, str]:
    """How the board names each run label: the experiment's ``label`` for its own methods, else a registered method's
    ``Method.label`` (a method added with ``--label``: its package names it), else the label itself."""
    from bnnbench.methods import METHODS

    class Named(dict):
        def __missing__(self, lab):
            return getattr(METHODS.get(lab), "label", None) or lab

    return Named({k: (v or {}).get("label", k) for k, v in (spec.get("methods") or {}).items()})


def diverged_runs(spec: Mapping, runs_root: Path, labels: list[str]) -> set[tuple[str, str]]:
    """``(label, dataset)`` of the runs that stopped as diverged (``failed.json``, no record)."""
    from bnnbench.run.results import FAILED
    return {(lab, ds) for ds in spec["datasets"] for lab in labels
            if (run_dir(runs_root, spec["name"], lab, ds) / FAILED).exists()
            and load_record(run_dir(runs_root, spec["name"], lab, ds)) is None}


def per_split(spec: Mapping, runs_root: Path, labels: list[str]) -> dict[tuple[str, str, str], np.ndarray]:
    """``(label, dataset, metric) -> per-split values`` (in the record's split order) for every finished run."""
    out = {}
    for ds in spec["datasets"]:
        for label in labels:
            rec = load_record(run_dir(runs_root, spec["name"], label, ds))
            if rec is None or rec.get("status") != "ok":
                continue
            for metric in [*spec["leaderboard"]["metrics"],
                           *(m["se_metric"] for m in spec["leaderboard"]["metrics"].values() if m.get("se_metric"))]:
                if all(metric in m for m in rec["metrics"]):
                    out[(label, ds, metric)] = np.array([m[metric] for m in rec["metrics"]], dtype=float)
    return out


def build_leaderboard(spec: Mapping, runs_root, labels: list[str] | None = None) -> pd.DataFrame:
    """One row per (metric, dataset, method): mean, se, n, rank, p-value against the best, and ``tied_best``."""
    runs_root = Path(runs_root)
    lb = spec["leaderboard"]
    alpha = float(lb.get("alpha", 0.05))
    labels = list(labels or spec["methods"])
    if lb.get("open"):   # methods added with --label (a user's own) have run directories beside the spec's
        exp_dir = runs_root / spec["name"]
        labels += sorted(p.name for p in exp_dir.iterdir() if p.is_dir() and p.name not in labels) \
            if exp_dir.is_dir() else []
    values = per_split(spec, runs_root, labels)
    diverged = diverged_runs(spec, runs_root, labels)
    rows = []
    for metric, m in lb["metrics"].items():
        score = _score(m)
        for ds in spec["datasets"]:
            have = [lab for lab in labels if (lab, ds, metric) in values]
            failed = [lab for lab in labels if (lab, ds) in diverged]
            if not have:
                continue
            means = {lab: float(values[(lab, ds, metric)].mean()) for lab in have}
            # a run that diverged under the common protocol ranks below every finished one (ties among themselves)
            ranks = stats.rankdata([-float(score(values[(lab, ds, metric)]).mean()) for lab in have]
                                   + [np.inf] * len(failed), method="average")
            best = have[int(np.argmin(ranks[:len(have)]))]
            for lab, rank in zip(have + failed, ranks):
                if lab in failed:
                    rows.append({"metric": metric, "dataset": ds, "method": lab, "mean": np.nan, "se": np.nan,
                                 "n": 0, "rank": float(rank), "best": best, "p_vs_best": np.nan, "tied_best": False,
                                 "diverged": True})
                    continue
                v = values[(lab, ds, metric)]
                if len(v) == 1:   # one run (one test set): its own standard error where the record has one
                    se_key = m.get("se_metric")
                    se = float(values[(lab, ds, se_key)][0]) if (lab, ds, se_key) in values else float("nan")
                    p = 1.0 if lab == best else float("nan")
                else:
                    se = float(v.std() / math.sqrt(len(v)))
                    p = 1.0 if lab == best else _paired_p(score(v), score(values[(best, ds, metric)]))
                rows.append({"metric": metric, "dataset": ds, "method": lab, "mean": means[lab], "se": se,
                             "n": len(v), "rank": float(rank), "best": best, "p_vs_best": p,
                             "tied_best": bool(p >= alpha), "diverged": False})
    return pd.DataFrame(rows, columns=["metric", "dataset", "method", "mean", "se", "n", "rank", "best", "p_vs_best",
                                       "tied_best", "diverged"])


def _score(m: Mapping):
    """Per-split values -> scores, higher better: the value (``higher_is_better``), its negative, or for a metric
    with a ``target`` (an interval's coverage: its nominal level) minus the distance to it, |v - target|."""
    if m.get("target") is not None:
        return lambda v: -np.abs(np.asarray(v, dtype=float) - float(m["target"]))
    sign = 1.0 if m["higher_is_better"] else -1.0
    return lambda v: sign * np.asarray(v, dtype=float)


def _direction(m: Mapping) -> str:
    return (f"closest to {m['target']:g} is better: ranked by the mean over the splits of |value - {m['target']:g}|"
            if m.get("target") is not None else f"{'higher' if m['higher_is_better'] else 'lower'} is better")


def _paired_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value of the paired differences (1 where they are all zero)."""
    if len(a) != len(b):
        raise ValueError("paired test over runs with different numbers of splits")
    d = a - b
    if np.all(d == 0):
        return 1.0
    return float(stats.wilcoxon(a, b, zero_method="wilcox", alternative="two-sided").pvalue)


def average_ranks(df: pd.DataFrame, metric: str, datasets: list[str]) -> pd.Series:
    """Average rank per method over the data sets, for the methods that ran on all of them (others: NaN)."""
    sub = df[df["metric"] == metric]
    piv = sub.pivot(index="method", columns="dataset", values="rank").reindex(columns=datasets)
    return piv.mean(axis=1).where(piv.notna().all(axis=1))


def ranked_datasets(df: pd.DataFrame, spec: Mapping, metric: str) -> list[str]:
    """The data sets on which the most methods of the board (``spec``'s own, not those added with ``--label``) have
    a finished or diverged run (every data set once the board is complete): the average ranks, the Friedman test and
    the critical difference are taken over these, so that a board part-way run still ranks, and a user's method run
    on one data set does not shrink them."""
    sub = df[df["metric"] == metric]
    own = set(spec.get("methods") or {})
    count = {ds: len(own & set(sub[sub["dataset"] == ds]["method"])) for ds in spec["datasets"]}
    most = max(count.values(), default=0)
    return [ds for ds in spec["datasets"] if most and count[ds] == most]


def friedman(df: pd.DataFrame, metric: str, datasets: list[str]) -> tuple[float, float, int, int]:
    """(chi^2, p, k methods, n data sets) of the Friedman test of the ranks (methods ranked on every data set)."""
    piv = df[df["metric"] == metric].pivot(index="dataset", columns="method", values="rank").reindex(datasets)
    piv = piv.dropna(axis=1)
    if piv.shape[1] < 3 or piv.shape[0] < 2:
        return float("nan"), float("nan"), piv.shape[1], piv.shape[0]
    res = stats.friedmanchisquare(*[piv[c].to_numpy() for c in piv.columns])
    return float(res.statistic), float(res.pvalue), piv.shape[1], piv.shape[0]


def render_leaderboard(df: pd.DataFrame, spec: Mapping) -> str:
    lb, datasets = spec["leaderboard"], list(spec["datasets"])
    alpha = float(lb.get("alpha", 0.05))
    label_of = method_labels(spec)
    one_run = not df.empty and bool((df["n"] <= 1).all())
    cells = ("Cells: one run each, its value ± the record's standard error where it has one (accuracy: binomial, "
             "over the test images) (rank). **Bold**: the data set's best. " if one_run else
             "Cells: mean ± standard error over the splits (rank). **Bold**: the data set's best, or not "
             f"distinguishable from it by a paired two-sided Wilcoxon signed-rank test over the shared splits at "
             f"alpha = {alpha}. ")
    out = [f"# {spec.get('title', spec['name'])}", "",
           f"Generated by `bnnbench table {spec['name']}` from the run records; protocol and reading: "
           "results/README.md.",
           cells + "*diverged*: the run stopped with a non-finite state under this protocol (its failed.json says "
           "where); it ranks below every finished run.", ""]
    for metric, m in lb["metrics"].items():
        sub = df[df["metric"] == metric]
        if sub.empty:
            continue
        ranked = ranked_datasets(df, spec, metric)
        avg = average_ranks(df, metric, ranked) if ranked else pd.Series(dtype=float)
        chi2, p, k, n = friedman(df, metric, ranked)
        order = sorted(sub["method"].unique(), key=lambda lab: (math.isnan(avg.get(lab, float("nan"))),
                                                                  avg.get(lab, float("nan"))))
        out += [f"## {m.get('label', metric)} ({_direction(m)})", "",
                *([] if ranked == datasets else [
                    "Average rank: over " + (", ".join(d.split("/")[-1] for d in ranked) if ranked else "no data set")
                    + ", the data sets on which the most of the board's methods have run so far.", ""]),
                "| method | " + " | ".join(d.split("/")[-1] for d in datasets) + " | average rank |",
                "|---|" + "--:|" * len(datasets) + "--:|"]
        for lab in order:
            cells = []
            for ds in datasets:
                r = sub[(sub["method"] == lab) & (sub["dataset"] == ds)]
                if r.empty:
                    cells.append("not run")
                    continue
                r = r.iloc[0]
                if r["diverged"]:
                    cells.append(f"diverged ({r['rank']:g})")
                    continue
                digits = int(m.get("digits", 3))
                s = (f"{r['mean']:.{digits}f} ({r['rank']:g})" if math.isnan(r["se"])
                     else f"{r['mean']:.{digits}f} ± {r['se']:.{digits}f} ({r['rank']:g})")
                cells.append(f"**{s}**" if r["tied_best"] else s)
            a = avg.get(lab, float("nan"))
            a = "" if math.isnan(a) else f"{a:.2f}"
            out.append(f"| {label_of[lab]} | " + " | ".join(cells) + f" | {a} |")
        if k >= 2 and n >= 2:
            cd = q_nemenyi(k, alpha) * math.sqrt(k * (k + 1) / (6 * n))
            out += ["", f"Friedman test over the {n} data sets ({k} methods that ran on all): chi^2 = {chi2:.2f}, "
                        f"p = {p:.3g}. Nemenyi critical difference at alpha = {alpha}: {cd:.2f} ranks (average ranks "
                        "closer than that are not distinguished on so few data sets)."]
        out.append("")
    out += render_claims(df, spec)
    return "\n".join(out)


def render_claims(df: pd.DataFrame, spec: Mapping) -> list[str]:
    """Each of the spec's ``leaderboard.claims`` (a paper's ranking: ``better`` ahead of every method of ``than`` in
    each of ``metrics``) checked against the table: per pair the difference and its size in standard errors
    (sqrt(se_a^2 + se_b^2)); the claim holds on a data set where every difference has the claimed sign."""
    claims = spec["leaderboard"].get("claims") or []
    if not claims:
        return []
    lb = spec["leaderboard"]
    label_of = method_labels(spec)
    out = ["## Claims checked", ""]
    for c in claims:
        for ds in spec["datasets"]:
            parts, holds, missing = [], True, False
            for metric in c["metrics"]:
                sign = 1.0 if lb["metrics"][metric].get("higher_is_better", True) else -1.0
                cell = {r["method"]: r for _, r in df[(df["metric"] == metric) & (df["dataset"] == ds)].iterrows()}
                for other in c["than"]:
                    a, b = cell.get(c["better"]), cell.get(other)
                    if a is None or b is None or a["diverged"] or b["diverged"]:
                        missing = True
                        continue
                    d = a["mean"] - b["mean"]
                    holds &= bool(sign * d > 0)
                    z = d / math.hypot(a["se"], b["se"]) if not math.isnan(a["se"] + b["se"]) else float("nan")
                    parts.append(f"{lb['metrics'][metric].get('label', metric)} vs {label_of[other]}: "
                                 f"{d:+.4f}" + ("" if math.isnan(z) else f" ({z:+.1f} SE)"))
            verdict = "not checked (a run is missing)" if missing else ("holds" if holds else "does not hold")
            out += [f"- {c['claim']} ({ds.split('/')[-1]}): **{verdict}**. " + "; ".join(parts) + ".", ""]
    return out


def rank_stability(df: pd.DataFrame, spec: Mapping, other_spec: Mapping, runs_root) -> list[str]:
    """Markdown: for each metric, the average ranks over ``spec``'s data sets of the methods that ran on all of them on
    both boards (``other_spec``'s board restricted to those data sets and methods, ranked among them alone), side by
    side, and Kendall's tau between the two orders (``scipy.stats.kendalltau``, tau-b): whether the ranking moves when
    the protocol changes (``leaderboard.compare_with``: the same board at twice the epochs); then the pairs of
    methods that the paired tests order on each board (:func:`significant_orders`) and those they order oppositely."""
    datasets = list(spec["datasets"])
    alpha = float(spec["leaderboard"].get("alpha", 0.05))
    label_of = method_labels(spec)
    mine = {metric: average_ranks(df, metric, datasets).dropna() for metric in spec["leaderboard"]["metrics"]}
    common = sorted(set.intersection(*(set(a.index) for a in mine.values()))) if mine else []
    if len(common) < 2:
        return []
    other = build_leaderboard({**other_spec, "datasets": datasets,
                               "leaderboard": {**other_spec["leaderboard"], "open": False}}, runs_root, common)
    out = [f"## Against {other_spec['name']}'s ranking", "",
           f"Average ranks over {', '.join(d.split('/')[-1] for d in datasets)} of the methods that ran on both "
           f"boards (ranked among them alone), here and in {other_spec['name']}; Kendall's tau between the orders "
           "(1: the same order).", ""]
    for metric, m in spec["leaderboard"]["metrics"].items():
        theirs = average_ranks(other, metric, datasets).reindex(common)
        ours = average_ranks(build_leaderboard({**spec, "leaderboard": {**spec["leaderboard"], "open": False}},
                                               runs_root, common), metric, datasets).reindex(common)
        keep = ours.notna() & theirs.notna()
        if keep.sum() < 2:
            continue
        tau, p = stats.kendalltau(ours[keep], theirs[keep])
        out += [f"### {m.get('label', metric)}: Kendall's tau = {tau:.2f} (p = {p:.2g}, {int(keep.sum())} methods)", "",
                f"| method | here | {other_spec['name']} |", "|---|--:|--:|"]
        for lab in ours[keep].sort_values().index:
            out.append(f"| {label_of[lab]} | {ours[lab]:.2f} | {theirs[lab]:.2f} |")
        flips = significant_orders(spec, other_spec, runs_root, list(ours[keep].index), metric)
        n = {k: sum(len(v) for v in flips[k].values()) for k in flips}
        out += ["", f"Pairs of methods per data set ordered by the paired Wilcoxon test at alpha = {alpha}: "
                    f"{n['kept']} in the same order on both boards, **{n['reversed']} in the opposite order**, "
                    f"{n['lost']} separated here only, {n['gained']} in {other_spec['name']} only."]
        out += [f"- reversed on {ds.split('/')[-1]}: " + ", ".join(f"{label_of[a]} ahead of "
                                                                   f"{label_of[b]} here" for a, b in pairs)
                for ds, pairs in flips["reversed"].items() if pairs]
        out.append("")
    return out


def significant_orders(spec: Mapping, other_spec: Mapping, runs_root, labels: list[str],
                       metric: str) -> dict[str, dict[str, list[tuple[str, str]]]]:
    """The pairs (a, b) of ``labels`` on each of ``spec``'s data sets that a paired two-sided Wilcoxon signed-rank test
    over the shared splits orders at ``alpha`` (the score's mean difference gives the direction), compared between
    the two boards: ``kept`` (the same order on both), ``reversed`` (a ahead here, b ahead on ``other_spec``),
    ``lost`` (ordered here only), ``gained`` (there only). Pairs with a diverged run are left out. The finer reading
    of "the ranking does not change": a rank that moves between methods the test does not separate is not a change
    the board claims."""
    alpha = float(spec["leaderboard"].get("alpha", 0.05))
    score = _score(spec["leaderboard"]["metrics"][metric])
    mine, theirs = (per_split({**s, "datasets": list(spec["datasets"])}, Path(runs_root), labels)
                    for s in (spec, other_spec))
    out = {k: {ds: [] for ds in spec["datasets"]} for k in ("kept", "reversed", "lost", "gained")}

    def order(values, a, b, ds):
        """+1: a ahead of b, -1: b ahead, 0: not separated at alpha."""
        sa, sb = score(values[(a, ds, metric)]), score(values[(b, ds, metric)])
        return 0 if _paired_p(sa, sb) >= alpha else int(np.sign((sa - sb).mean()))

    for ds in spec["datasets"]:
        have = [lab for lab in labels if (lab, ds, metric) in mine and (lab, ds, metric) in theirs]
        for i, a in enumerate(have):
            for b in have[i + 1:]:
                here, there = order(mine, a, b, ds), order(theirs, a, b, ds)
                if here and there:
                    out["kept" if here == there else "reversed"][ds].append((a, b) if here > 0 else (b, a))
                elif here or there:
                    out["lost" if here else "gained"][ds].append((a, b) if (here or there) > 0 else (b, a))
    return out


def write_leaderboard(spec: Mapping, runs_root, out_dir, labels: list[str] | None = None) -> dict[str, Path]:
    df = build_leaderboard(spec, runs_root, labels)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / f"{spec['name']}.md", "csv": out_dir / f"{spec['name']}.csv"}
    text = render_leaderboard(df, spec)
    if spec["leaderboard"].get("compare_with"):
        from bnnbench.run.config import experiment_spec
        text += "\n".join(rank_stability(df, spec, experiment_spec(spec["leaderboard"]["compare_with"]), runs_root))
    atomic_write_text(paths["md"], text)
    atomic_write_text(paths["csv"], df.to_csv(index=False))
    return paths
