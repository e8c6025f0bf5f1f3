"""Metrics between two runs' predictive distributions on the same test rows (``protocol.save_predictive``).

The noisy natural gradient paper's Table 4 (Zhang et al., ICML 2018, Sec. 5.3 and App. C.3, eq. 27) scores a method
by the Pearson correlation between its predictive variances and HMC's on each trial's held-out rows,

    rho(X, Y) = E[(X - mu_X)(Y - mu_Y)] / (sigma_X sigma_Y),

X_t = Var_q[y_t | x_t], Y_t = Var_HMC[y_t | x_t] (epistemic plus noise variance: with a noise variance shared by all
rows of a run, the correlation is that of the epistemic parts), one value per trial; the table gives their mean and
standard error over trials.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bnnbench.core.metrics import pearson
from bnnbench.run.results import load_predictive

__all__ = ["pearson", "predvar", "predvar_correlation", "PAIRED_METRICS"]


def predvar(pred: dict) -> list[np.ndarray]:
    """Each split's predictive variance Var[y_t] = var_f + noise_var at its (unpadded) test rows."""
    total = pred["var_f"] + pred["noise_var"]
    return [total[i, :n] for i, n in enumerate(pred["n_test"])]


def _check_same_rows(a: dict, b: dict, what: str) -> None:
    if a["y"].shape != b["y"].shape or not np.array_equal(a["n_test"], b["n_test"]) or not np.allclose(
            a["x"], b["x"]):
        raise ValueError(f"{what}: the two runs were not evaluated on the same test rows (different splits)")


def predvar_correlation(run_dir, against_dir) -> list[float] | None:
    """Per split, the Pearson correlation between the predictive variances of the run in ``run_dir`` and of the one
    in ``against_dir`` at the same test rows; ``None`` when either has no stored predictive."""
    a, b = load_predictive(Path(run_dir)), load_predictive(Path(against_dir))
    if a is None or b is None:
        return None
    _check_same_rows(a, b, f"{run_dir} against {against_dir}")
    return [pearson(u, v) for u, v in zip(predvar(a), predvar(b))]


PAIRED_METRICS = {"predvar_corr": predvar_correlation}
