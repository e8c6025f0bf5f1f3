"""Convergence figures from stored run histories (no retraining).

For each data set of an experiment and each metric, the mean over splits and a band of one
standard error (std(ddof=0)/sqrt(n)) against epochs, one line per method (the experiment's
``figure.methods``, else its table methods).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def load_history(run_dir: Path) -> dict | None:
    p = Path(run_dir) / "history.json"
    if not p.exists() or not (Path(run_dir) / "record.json").exists():
        return None
    return json.loads(p.read_text())


def convergence_figure(spec: dict, runs_root: Path, out: Path, metrics=("rmse", "loglik_joint")) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = spec["datasets"]
    fig_spec = spec.get("figure") or {}
    methods = list(fig_spec.get("methods") or spec["methods"])
    names = {**{m: v.get("paper_method", m) for m, v in spec["methods"].items()}, **(fig_spec.get("labels") or {})}
    labels = {k: v.get("label", k) for k, v in spec.get("metrics", {}).items()}
    fig, axes = plt.subplots(len(metrics), len(datasets), figsize=(2.6 * len(datasets), 2.3 * len(metrics)),
                             squeeze=False)
    drawn, legend_ax = 0, None
    for j, ds in enumerate(datasets):
        for m in methods:
            h = load_history(Path(runs_root) / spec["name"] / m / ds.replace("/", "__"))
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
    fig.suptitle(f"{spec['name']}: test metrics during training (mean +- se over splits)", fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)
    return out
