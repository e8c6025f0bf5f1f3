"""Evaluation metrics, computed per replica with masks for padded test points.

Test log-likelihood comes in two conventions (docs/protocols/README.md, item 2):

* per-point (Gal & Ghahramani 2016; noisy NG; global inducing points):
  ``LL_pp = (1/N*) sum_j log[(1/S) sum_s p(y_j | theta_s)]``
* joint over the test set (the SLANG and Vadam code, ``vi_lib``/``vadam.metrics``):
  ``LL_joint = (1/N*) [logsumexp_s sum_j log p(y_j | theta_s) - log S]``

Both are returned, named apart; every table states which one it compares.
"""

from __future__ import annotations

import math

import numpy as np
import torch

STDERR_CONVENTION = "std(ddof=0)/sqrt(n)"


def predictive_loglik(logp: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Both test log-likelihood conventions from ``logp [R, S, T]`` = log p(y_j | theta_s).

    ``mask [R, T]`` marks real (non-padding) test points. Returns ``[R]`` tensors.
    """
    S = logp.shape[1]
    m = mask.unsqueeze(1).to(logp.dtype)
    n = mask.sum(-1).to(logp.dtype)
    logp = logp * m  # padding contributes log p = 0 to the joint sum
    joint = (torch.logsumexp(logp.sum(-1), dim=1) - math.log(S)) / n
    per_point = torch.logsumexp(logp, dim=1) - math.log(S)  # [R, T]
    pointwise = (per_point * mask).sum(-1) / n
    return {"loglik_joint": joint, "loglik_pointwise": pointwise}


def regression_metrics(f: torch.Tensor, noise_prec: torch.Tensor, y: torch.Tensor,
                       mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """RMSE of the MC predictive mean, both test log-likelihoods and the calibration of the predictive, in the units
    of ``y``.

    ``f [R, S, T]`` predictive samples, ``noise_prec [R]`` (or ``[R, S]``) Gaussian noise precision in
    the same units, ``y [R, T]``, ``mask [R, T]``. ``coverage_50`` and ``coverage_90``: the fraction of test targets
    inside the predictive's central 50% and 90% intervals, y inside the central p interval of the mixture
    (1/S) sum_s N(f_s, 1/tau_s) iff |F(y) - 1/2| <= p/2, F(y) = (1/S) sum_s Phi(sqrt(tau_s) (y - f_s)) (its CDF).
    """
    n = mask.sum(-1).to(f.dtype)
    err = (f.mean(1) - y) * mask
    rmse = torch.sqrt((err * err).sum(-1) / n)
    tau = noise_prec if noise_prec.dim() == 2 else noise_prec.unsqueeze(1)
    logp = 0.5 * torch.log(tau.unsqueeze(-1)) - 0.5 * math.log(2 * math.pi) \
        - 0.5 * tau.unsqueeze(-1) * (y.unsqueeze(1) - f) ** 2
    cdf = torch.special.ndtr(tau.unsqueeze(-1).sqrt() * (y.unsqueeze(1) - f)).mean(1)      # [R, T]
    coverage = {f"coverage_{round(100 * p)}": (((cdf - 0.5).abs() <= p / 2) & mask).sum(-1).to(f.dtype) / n
                for p in (0.5, 0.9)}
    return {"rmse": rmse, **predictive_loglik(logp, mask), **coverage}


def classification_metrics(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
                           n_bins: int = 15) -> dict[str, torch.Tensor]:
    """Error (and accuracy = 1 - error), NLL (per-point predictive), joint log-likelihood and ECE from
    ``logits [R, S, T, K]``
    (``K = 1`` for a Bernoulli logit). Probabilities are averaged over samples before the argmax.
    ``error_se = sqrt(error (1 - error) / T)`` is the binomial standard error of the error rate on the
    T evaluation points: the uncertainty of a single run's error (SLANG Table 3 has one run per cell)."""
    if logits.shape[-1] == 1:
        logits = torch.cat([torch.zeros_like(logits), logits], dim=-1)
    logp_all = torch.log_softmax(logits, dim=-1)  # [R, S, T, K]
    idx = y.long().unsqueeze(1).expand(logp_all.shape[:-1]).unsqueeze(-1)
    logp = logp_all.gather(-1, idx)[..., 0]
    ll = predictive_loglik(logp, mask)
    probs = torch.logsumexp(logp_all, dim=1).exp() / logits.shape[1]  # [R, T, K]
    conf, pred = probs.max(-1)
    correct = (pred == y.long()).to(probs.dtype)
    n = mask.sum(-1).to(probs.dtype)
    error = 1.0 - (correct * mask).sum(-1) / n
    ece = torch.zeros_like(n)
    edges = torch.linspace(0, 1, n_bins + 1, dtype=probs.dtype, device=probs.device)
    for lo, hi in zip(edges[:-1], edges[1:]):
        inb = (conf > lo) & (conf <= hi) & mask
        cnt = inb.sum(-1).to(probs.dtype)
        gap = ((conf - correct) * inb).sum(-1).abs()
        ece = ece + torch.where(cnt > 0, gap, torch.zeros_like(gap)) / n
    return {"error": error, "error_se": torch.sqrt(error * (1 - error) / n), "accuracy": 1.0 - error,
            "nll": -ll["loglik_pointwise"], **ll, "ece": ece}


def summarise(values) -> dict:
    """Mean and standard error over splits, ``stderr = std(ddof=0) / sqrt(n)`` (the SLANG/Vadam code)."""
    v = np.asarray(values, dtype=float)
    return {"mean": float(v.mean()), "stderr": float(v.std(ddof=0) / math.sqrt(len(v))), "n": int(len(v))}


def kl_diag_gaussians(mean_q, var_q, mean_p, var_p) -> torch.Tensor:
    """KL(N(mean_q, diag var_q) || N(mean_p, diag var_p)), summed over the last axis."""
    return 0.5 * (torch.log(var_p / var_q) + (var_q + (mean_q - mean_p) ** 2) / var_p - 1.0).sum(-1)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson's correlation coefficient of two vectors (NaN when either is constant)."""
    x, y = np.asarray(x, float) - np.mean(x), np.asarray(y, float) - np.mean(y)
    den = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / den) if den > 0 else float("nan")
