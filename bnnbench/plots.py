"""Figures from stored run records (no retraining).

Convergence: for each data set of an experiment and each metric (the experiment's ``figure.metrics``,
default RMSE and joint test LL), the mean over splits and a band of one standard error
(std(ddof=0)/sqrt(n)) against epochs, one line per method (``figure.methods``, else the table's).

Covariance (SLANG Figure 1, ``figure.covariance``): for the first split of one data set, the
off-diagonal covariance of the Full-Gaussian Exact posterior beside that of each low-rank method
(heatmaps, one colour scale), and the mean and variance of every weight for all of them.

Boxes (Vadam Figure 2, ``figure.boxes``): the final metric of every split or restart, one box per method.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bnnbench.results import atomic_write, load_history, load_posterior, load_record, run_dir


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
    fig, axes = plt.subplots(len(metrics), len(datasets), figsize=(max(2.6 * len(datasets), 4.2), 2.3 * len(metrics)),
                             squeeze=False)
    drawn, legend_ax = 0, None
    for j, ds in enumerate(datasets):
        for m in methods:
            h = load_history(run_dir(runs_root, spec["name"], m, ds))
            if h is None:
                continue
            ep = np.asarray(h["epochs"])
            for i, key in enumerate(metrics):
                v = np.array([e[key] for e in h["metrics"]])  # [evals, splits]
                mean, se = v.mean(1), v.std(1) / np.sqrt(v.shape[1])
                ax = axes[i, j]
                ax.plot(ep, mean, label=names.get(m, m))
                ax.fill_between(ep, mean - se, mean + se, alpha=0.25)
                drawn += 1
                legend_ax = legend_ax or ax
        axes[0, j].set_title(ds.split("/")[-1])
        axes[-1, j].set_xlabel("epoch")
    for i, key in enumerate(metrics):
        axes[i, 0].set_ylabel(labels.get(key, key))
    if not drawn:
        plt.close(fig)
        return None
    legend_ax.legend(fontsize=7)
    fig.suptitle(f"{spec['name']}: metrics during training (mean +- se over splits)", fontsize=9)
    fig.tight_layout()
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
