"""Figures from stored run records (no retraining).

Convergence: for each data set of an experiment and each metric (the experiment's ``figure.metrics``,
default RMSE and joint test LL), the mean over splits and a band of one standard error
(std(ddof=0)/sqrt(n)) against epochs, one line per method (``figure.methods``, else the table's).
``figure.columns: setting`` gives each setting of the methods (e.g. a prior) its own column, one line per paper
method in the same colour in every column (Ober & Aitchison's Fig. 7); ``figure.ylim`` fixes a metric's axis range.

Covariance (SLANG Figure 1, ``figure.covariance``): for the first split of one data set, the
off-diagonal covariance of the Full-Gaussian Exact posterior beside that of each low-rank method
(heatmaps, one colour scale), and the mean and variance of every weight for all of them.

Boxes (Vadam Figure 2, ``figure.boxes``): the final metric of every split or restart, one box per method.

Final values (``figure.final_table``, for figures whose paper prints no numbers): a Markdown table beside the figure
with each run's last value of the figure's metrics (mean +- se over splits), read from its record.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bnnbench.judge.reference import column_dataset
from bnnbench.run.results import atomic_write, load_history, load_posterior, load_record, run_dir


def _method_names(spec: dict) -> dict[str, str]:
    return {m: v.get("paper_method", m) + (f" ({v['setting']})" if v.get("setting") else "")
            for m, v in spec["methods"].items()}


def _save(fig, out: Path) -> Path:
    import matplotlib.pyplot as plt
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return out


def convergence_figure(spec: dict, runs_root: Path, out: Path, metrics=None) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = spec["datasets"]
    fig_spec = spec.get("figure") or {}
    metrics = list(metrics or fig_spec.get("metrics") or ("rmse", "loglik_joint"))
    methods = list(fig_spec.get("methods") or spec["methods"])
    names = {**_method_names(spec), **(fig_spec.get("labels") or {})}
    labels = {**{k: v.get("label", k) for k, v in spec.get("metrics", {}).items()},
              **(fig_spec.get("metric_labels") or {})}
    by_setting = fig_spec.get("columns") == "setting"
    if by_setting:   # columns (data set, setting); a line per paper method, one colour each across the columns
        settings = list(dict.fromkeys(spec["methods"][m].get("setting", "") for m in methods))
        columns = [(ds, st) for ds in datasets for st in settings]
        family = {m: spec["methods"][m].get("paper_method", m) for m in methods}
        families = list(dict.fromkeys(family.values()))
        colour = {f: f"C{k % 10}" for k, f in enumerate(families)}
        style = {m: {"label": family[m], "color": colour[family[m]]} for m in methods}
    else:   # figure.methods may name runs outside the table (Vadam's Vprop)
        columns = [(ds, None) for ds in datasets]
        style = {m: {"label": names.get(m, m)} for m in methods}
    fig, axes = plt.subplots(len(metrics), len(columns), figsize=(max(2.6 * len(columns), 4.2), 2.3 * len(metrics)),
                             squeeze=False)
    drawn, legend_ax = 0, None
    for j, (ds, setting) in enumerate(columns):
        for m in methods:
            if by_setting and spec["methods"][m].get("setting", "") != setting:
                continue
            h = load_history(run_dir(runs_root, spec["name"], m, column_dataset(spec["methods"].get(m), ds)))
            if h is None:
                continue
            ep = np.asarray(h["epochs"])
            for i, key in enumerate(metrics):
                v = np.array([e[key] for e in h["metrics"]])  # [evals, splits]
                mean, se = v.mean(1), v.std(1) / np.sqrt(v.shape[1])
                ax = axes[i, j]
                line, = ax.plot(ep, mean, **style[m])
                ax.fill_between(ep, mean - se, mean + se, alpha=0.25, color=line.get_color())
                drawn += 1
                legend_ax = legend_ax or ax
        title = ds.split("/")[-1]
        axes[0, j].set_title(f"{title}, {setting}" if by_setting and setting else title, fontsize=9)
        axes[-1, j].set_xlabel("epoch")
    for i, key in enumerate(metrics):
        axes[i, 0].set_ylabel(labels.get(key, key))
        for ax in axes[i]:
            if key in (fig_spec.get("log_metrics") or []):   # e.g. an ELBO whose early values span decades
                ax.set_yscale("symlog", linthresh=1.0)
            if key in (fig_spec.get("ylim") or {}):
                ax.set_ylim(*fig_spec["ylim"][key])
    if not drawn:
        plt.close(fig)
        return None
    if by_setting:   # one legend for the figure: every column has the same families
        handles = [plt.Line2D([], [], color=colour[f], label=f) for f in families]
        fig.legend(handles=handles, loc="lower center", ncol=len(families), fontsize=8, frameon=False)
    else:
        legend_ax.legend(fontsize=7)
    fig.suptitle(f"{spec['name']}: metrics during training (mean +- se over splits)", fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1) if by_setting else None)
    return _save(fig, out)


def covariance_figure(spec: dict, runs_root: Path, out: Path) -> Path | None:
    """SLANG Figure 1 from the ``posterior.npz`` of each run (first split, design order: bias first)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = (spec.get("figure") or {}).get("covariance")
    if not cs:
        return None
    names = _method_names(spec)
    post = {m: load_posterior(run_dir(runs_root, spec["name"], m, cs["dataset"]))
            for m in [cs["reference"], *cs["methods"], *cs.get("lines", [])]}
    post = {m: p for m, p in post.items() if p is not None}
    if cs["reference"] not in post:
        return None
    heat = [m for m in [cs["reference"], *cs["methods"]] if m in post]
    fig, axes = plt.subplots(2, max(len(heat), 2), figsize=(3.0 * max(len(heat), 2), 5.8), squeeze=False)

    def offdiag(c):
        c = c[1:, 1:].copy()  # weights only
        np.fill_diagonal(c, np.nan)
        return c

    ref = offdiag(post[cs["reference"]][1])
    lim = np.nanmax(np.abs(ref))
    for j, m in enumerate(heat):
        im = axes[0, j].imshow(offdiag(post[m][1]), cmap="RdBu_r", vmin=-lim, vmax=lim)
        axes[0, j].set_title(names.get(m, m), fontsize=8)
        axes[0, j].set_xticks([]), axes[0, j].set_yticks([])
    fig.colorbar(im, ax=list(axes[0, :len(heat)]), shrink=0.8)
    for j in range(len(heat), axes.shape[1]):
        axes[0, j].axis("off")
    order = np.argsort(post[cs["reference"]][0][1:])
    for m in [cs["reference"], *cs["methods"], *cs.get("lines", [])]:
        if m not in post:
            continue
        mean, cov = post[m]
        axes[1, 0].plot(mean[1:][order], lw=0.8, label=names.get(m, m))
        axes[1, 1].plot(np.diag(cov)[1:][order], lw=0.8, label=names.get(m, m))
    axes[1, 0].set_title("mean per weight (sorted by the exact mean)", fontsize=8)
    axes[1, 1].set_title("variance per weight", fontsize=8)
    axes[1, 1].set_yscale("log")
    axes[1, 1].legend(fontsize=6)
    for j in range(2, axes.shape[1]):
        axes[1, j].axis("off")
    fig.suptitle(f"{spec['name']}: posterior covariance on {cs['dataset']}, first split", fontsize=9)
    return _save(fig, out)


def box_figure(spec: dict, runs_root: Path, out: Path) -> Path | None:
    """Box plots of per-split (per-restart) final metrics from the records, one panel per
    (``figure.boxes`` entry, metric), one box per method (Vadam Figure 2(b, c))."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (spec.get("figure") or {}).get("boxes") or []
    names = _method_names(spec)
    labels = {k: v.get("label", k) for k, v in spec.get("metrics", {}).items()}
    cells = [(p, key) for p in panels for key in p["metrics"]]
    if not cells:
        return None
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 3.4), squeeze=False)
    drawn = 0
    for ax, (p, key) in zip(axes[0], cells):
        values, ticks = [], []
        for m in p["methods"]:
            r = load_record(run_dir(runs_root, spec["name"], m, p["dataset"]))
            if r is None or r.get("status") != "ok" or key not in r["metrics"][0]:
                continue
            values.append([row[key] for row in r["metrics"]])
            ticks.append(names.get(m, m))
        if values:
            ax.boxplot(values)
            ax.set_xticks(range(1, len(ticks) + 1), ticks, rotation=30, fontsize=7, ha="right")
            drawn += 1
        ax.set_title(f"{p.get('title', p['dataset'])}\n{labels.get(key, key)}", fontsize=8)
    if not drawn:
        plt.close(fig)
        return None
    fig.suptitle(f"{spec['name']}: final values per split / restart", fontsize=9)
    fig.tight_layout()
    return _save(fig, out)


def predictive_figure(spec: dict, runs_root: Path, out: Path) -> Path | None:
    """Ober & Aitchison (2020) Fig. 1 from each run's ``predictive.npz`` (protocol ``save_predictive``): one panel per
    method on a 1-D data set, the training points, the predictive mean and bands of one standard deviation of the
    function (dark) and of y (light), first split."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bnnbench.core.data import load_dataset
    from bnnbench.run.results import load_predictive

    ds_name = spec["datasets"][0]
    methods = list((spec.get("figure") or {}).get("methods") or spec["methods"])
    names = _method_names(spec)
    preds = {m: load_predictive(run_dir(runs_root, spec["name"], m, ds_name)) for m in methods}
    preds = {m: p for m, p in preds.items() if p is not None}
    if not preds:
        return None
    ds = load_dataset(ds_name)
    tr = ds.splits[0].train
    fig, axes = plt.subplots(1, len(preds), figsize=(3.2 * len(preds), 2.8), sharey=True, squeeze=False)
    for ax, (m, p) in zip(axes[0], preds.items()):
        n = int(p["n_test"][0])
        x, mean = p["x"][0, :n, 0], p["mean"][0, :n]
        sd_f, sd_y = np.sqrt(p["var_f"][0, :n]), np.sqrt(p["var_f"][0, :n] + p["noise_var"][0, :n])
        order = np.argsort(x)
        x, mean, sd_f, sd_y = x[order], mean[order], sd_f[order], sd_y[order]
        ax.fill_between(x, mean - sd_y, mean + sd_y, alpha=0.15, color="C0")
        ax.fill_between(x, mean - sd_f, mean + sd_f, alpha=0.35, color="C0")
        ax.plot(x, mean, color="C0")
        ax.scatter(ds.X[tr, 0], ds.y[tr], s=6, color="k", zorder=3)
        ax.set_title(names.get(m, m), fontsize=9)
        ax.set_xlabel("x")
    axes[0, 0].set_ylabel("y")
    fig.suptitle(f"{spec['name']}: predictive mean, +-1 sd of f (dark) and of y (light)", fontsize=9)
    fig.tight_layout()
    return _save(fig, out)


def elbo_depth_figure(spec: dict, runs_root: Path, out: Path) -> Path | None:
    """Ober & Aitchison (2020) Fig. 2: the ELBO per data point of each family against depth, one panel per width,
    beside the exact log evidence per data point of the generating linear model (mean over the data draws, error
    bars one standard error). Run labels are ``<family>_d<depth>_w<width>`` (``figure.elbo_depth``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bnnbench.core.data import load_dataset
    from bnnbench.core.data.synthetic import log_evidence

    ed = spec["figure"]["elbo_depth"]
    ds_name = spec["datasets"][0]
    ds = load_dataset(ds_name)
    ev = np.array([log_evidence(ds.X[s.train], ds.y[s.train], ds.meta["weight_var"], ds.meta["noise_var"])
                   / len(s.train) for s in ds.splits])
    names = {**_method_names(spec), **(ed.get("labels") or {})}
    widths, depths = list(ed["widths"]), list(ed["depths"])
    fig, axes = plt.subplots(1, len(widths), figsize=(3.4 * len(widths), 3.0), sharey=True, squeeze=False)
    drawn = 0
    for ax, w in zip(axes[0], widths):
        ax.axhline(ev.mean(), color="k", ls="--", lw=1, label="log evidence (true model)")
        for fam in ed["families"]:
            pts = []
            for d in depths:
                rec = load_record(run_dir(runs_root, spec["name"], f"{fam}_d{d}_w{w}", ds_name))
                if rec is None:
                    continue
                e = np.array([m["elbo"] for m in rec["metrics"]])
                pts.append((d, e.mean(), e.std() / np.sqrt(len(e))))
            if pts:
                d_, m_, s_ = map(np.array, zip(*pts))
                ax.errorbar(d_, m_, yerr=s_, marker="o", ms=3, label=names.get(fam, fam))
                drawn += 1
        ax.set_title(f"width {w}", fontsize=9)
        ax.set_xlabel("hidden layers")
    if not drawn:
        plt.close(fig)
        return None
    axes[0, 0].set_ylabel("ELBO per data point")
    axes[0, -1].legend(fontsize=7)
    fig.suptitle(f"{spec['name']}: deep linear networks, ELBO against depth", fontsize=9)
    fig.tight_layout()
    return _save(fig, out)


def final_values_table(spec: dict, runs_root: Path, out: Path) -> Path | None:
    """Markdown: one row per run of ``spec`` that has a record, its final figure metrics, device and wall time."""
    fig_spec = spec.get("figure") or {}
    metrics = list(fig_spec.get("metrics") or ("rmse", "loglik_joint"))
    labels = {**{k: v.get("label", k) for k, v in spec.get("metrics", {}).items()},
              **(fig_spec.get("metric_labels") or {})}
    names = _method_names(spec)
    rows = []
    for ds in spec["datasets"]:
        for m in spec["methods"]:
            rec = load_record(run_dir(runs_root, spec["name"], m, ds))
            if rec is None:
                rows.append(f"| {ds} | {names.get(m, m)} |" + " not run |" * len(metrics) + " | |")
                continue
            cells = []
            for key in metrics:
                v = np.array([r[key] if key in r else np.nan for r in rec["metrics"]], dtype=float)
                if key == "train_objective" and "elbo" in rec["metrics"][0]:   # the record keeps the final -ELBO/N
                    v = -np.array([r["elbo"] for r in rec["metrics"]], dtype=float)
                se = v.std() / np.sqrt(len(v))
                cells.append(f"{v.mean():.4g}" + (f" ± {se:.2g}" if len(v) > 1 else ""))
            rows.append(f"| {ds} | {names.get(m, m)} | " + " | ".join(cells)
                        + f" | {rec.get('device', '')} | {rec['wall_time_s']:.0f} |")
    if all("not run" in r for r in rows):
        return None
    head = (f"# {spec.get('title', spec['name'])}: final values\n\nGenerated by `bnnbench plot {spec['name']}` from the"
            " run records (the paper prints no numbers for this figure).\n\n"
            "| data | method | " + " | ".join(labels.get(k, k) for k in metrics) + " | device | wall s |\n"
            "|" + " --- |" * (len(metrics) + 4) + "\n")
    atomic_write(out, lambda f: f.write((head + "\n".join(rows) + "\n").encode()))
    return out


def cd_cliques(ranks: list[float], cd: float) -> list[tuple[int, int]]:
    """The maximal runs ``(i, j)`` of methods, sorted by average rank, whose ranks differ by less than ``cd``
    (positions in ``sorted(ranks)``; a run of one method is no clique): the bars of a critical-difference diagram."""
    r = sorted(ranks)
    out: list[tuple[int, int]] = []
    for i in range(len(r)):
        j = max(k for k in range(i, len(r)) if r[k] - r[i] < cd)
        if j > i and not any(a <= i and j <= b for a, b in out):
            out.append((i, j))
    return out


def critical_difference_figure(spec: dict, runs_root: Path, out: Path) -> Path | None:
    """Demsar's (2006) critical-difference diagram of a leaderboard, a panel per metric: each method at its average
    rank over the data sets that the most of the board's methods have run on (``ranked_datasets``: all of them once
    the board is complete; a method added with ``--label`` is drawn where it ran on all of those), the Nemenyi
    critical difference CD = q_alpha sqrt(k (k + 1) / (6 n)) as a bar, and a thick line joining each maximal group of
    methods whose average ranks differ by less than CD."""
    import math

    import matplotlib.pyplot as plt

    from bnnbench.judge.leaderboard import (average_ranks, build_leaderboard, method_labels, q_nemenyi,
                                            ranked_datasets)
    df = build_leaderboard(spec, runs_root)
    if df.empty:
        return None
    lb = spec["leaderboard"]
    label_of = method_labels(spec)
    alpha = float(lb.get("alpha", 0.05))
    panels = []
    for metric, m in lb["metrics"].items():
        used = ranked_datasets(df, spec, metric)
        avg = average_ranks(df, metric, used).dropna().sort_values()
        if len(avg) >= 2 and len(used) >= 2:
            panels.append((m.get("label", metric), avg, len(used)))
    if not panels:
        return None
    k_max = max(len(a) for _, a, _ in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, (0.9 + 0.22 * k_max) * len(panels)), squeeze=False)
    for ax, (title, avg, n) in zip(axes[:, 0], panels):
        k = len(avg)
        cd = q_nemenyi(k, alpha) * math.sqrt(k * (k + 1) / (6 * n))
        ax.set_xlim(1, k)
        ax.set_ylim(-(k // 2 + 1.5), 2.2)
        ax.axhline(0, color="k", lw=1)
        ax.set_xticks(range(1, k + 1))
        ax.tick_params(axis="x", top=True, bottom=False, labeltop=True, labelbottom=False)
        ax.set_yticks([])
        for side in ("left", "right", "bottom"):
            ax.spines[side].set_visible(False)
        ax.plot([1, 1 + cd], [1.6, 1.6], color="k", lw=2)
        ax.text(1 + cd / 2, 1.75, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=8)
        half = (k + 1) // 2
        for i, (lab, r) in enumerate(avg.items()):
            left = i < half
            y = -(i + 1) if left else -(k - i)
            x_end = 1 if left else k
            ax.plot([r, r, x_end], [0, y, y], color="0.3", lw=0.8)
            ax.text(x_end - 0.05 if left else x_end + 0.05, y, f"{label_of[lab]} ({r:.2f})",
                    ha="right" if left else "left", va="center", fontsize=8)
        for j, (a, b) in enumerate(cd_cliques(list(avg.values), cd)):
            y = -0.3 - 0.25 * j
            ax.plot([avg.iloc[a] - 0.03, avg.iloc[b] + 0.03], [y, y], color="k", lw=3, solid_capstyle="round")
        ax.set_title(f"{title}: average ranks over {n} data sets (1 = best), Nemenyi alpha = {alpha}", fontsize=9,
                     pad=18)
    fig.tight_layout()
    return _save(fig, out)
