"""Convergence diagnostics of Markov chains: R-hat and effective sample size (ESS) as Stan and ArviZ compute them.

Draws are arrays ``[..., M, n]``: M chains of n draws of one scalar quantity (leading axes: many quantities at
once). Definitions as in Gelman et al., Bayesian Data Analysis (3rd ed., 2013, sec. 11.4-11.5), the Stan Reference
Manual ("Posterior Analysis": "Potential scale reduction", "Effective sample size") and, for the rank-normalised
versions, Vehtari, Gelman, Simpson, Carpenter & Buerkner (2021), "Rank-normalization, folding, and localization: an
improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2), 667-718. The numbers equal ArviZ's
(``arviz_stats``: ``rhat(method="rank")``, ``ess(method="bulk" | "tail" | "mean")``; tests/core/test_mcmc.py).

Every diagnostic splits each chain in halves first (m = 2M chains of n' = floor(n / 2) draws; an odd n's middle
draw dropped). With chain means theta_j and variances s_j^2 (divisor n' - 1),

    B = n' / (m - 1) sum_j (theta_j - theta)^2,   W = (1/m) sum_j s_j^2,
    var+ = (n' - 1) / n' W + B / n',              R-hat = sqrt(var+ / W)                 (BDA3 eq. 11.3-11.4).

ESS (Vehtari et al. sec. 3.2, eq. 9-10; Stan Reference Manual; Geyer 1992, "Practical Markov chain Monte Carlo",
Statistical Science 7(4), sec. 3.3). The autocorrelation at lag t, from each chain's autocovariance
gamma_jt = (1/n') sum_{i < n' - t} (x_ji - theta_j)(x_j,i+t - theta_j), is

    rho_t = 1 - (W - (1/m) sum_j gamma_jt) / var+,      rho_0 = 1,

and with S = m n' draws, ESS = S / tau where the integrated autocorrelation time tau is estimated from the sums of
adjacent pairs P_k = rho_2k + rho_2k+1, k = 0, 1, ..., K = max(floor((n' - 3) / 2), 0):

* Geyer's initial positive sequence: L = the first k with P_k <= 0, or K if there is none (L = 0 when P_0 <= 0);
* Geyer's initial monotone sequence: P'_k = min(P_0, ..., P_k) for k < L;
* tau = -1 + 2 sum_{k < L} P'_k + rho_2L (the even autocorrelation of the pair that stopped the sum, added where it
  is positive, or where P_L >= 0: Stan's "improve estimation" step; rho_0 = 1 when L = 0);
* the cap tau >= 1 / log10(S), i.e. ESS <= S log10 S (Stan, ArviZ): antithetic chains may have ESS > S, never an
  unbounded or negative one.

Draws that do not vary (max - min below float resolution) have ESS = S; where any draw is NaN, R-hat and ESS are
NaN, and also where fewer than 4 draws per chain leave less than one pair of lags (n' < 2).

Rank normalisation (Vehtari et al. eq. 14): z = Phi^-1((r - 3/8) / (S + 1/4)), r the rank of a draw among all S
draws of its quantity (average ranks for ties); folding: |x - median(x)|.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri
from scipy.stats import rankdata

from bnnbench.core.metrics import pearson

TAIL_PROBS = (0.05, 0.95)   # the quantiles of tail ESS (Vehtari et al. sec. 4.3)


def split_chains(x: np.ndarray) -> np.ndarray:
    """``[..., M, n]`` -> ``[..., 2M, floor(n / 2)]``: each chain's first and second half (the middle draw of an odd
    n dropped)."""
    x = np.asarray(x, dtype=float)
    h = x.shape[-1] // 2
    return np.concatenate([x[..., :h], x[..., x.shape[-1] - h:]], axis=-2)


def _var_plus(x: np.ndarray):
    """(var+, W) of chains ``[..., m, n]``."""
    n = x.shape[-1]
    W = x.var(axis=-1, ddof=1).mean(axis=-1)
    B = n * x.mean(axis=-1).var(axis=-1, ddof=1)
    return (n - 1) / n * W + B / n, W


def _rhat_of_chains(y: np.ndarray) -> np.ndarray:
    """sqrt(var+ / W) of chains ``[..., m, n]`` taken as they are (no splitting)."""
    var_plus, W = _var_plus(y)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(var_plus / W)


def split_rhat(x: np.ndarray) -> np.ndarray:
    """Split R-hat (BDA3; ArviZ's ``method="split"``) of draws ``[..., M, n]``, per quantity ``[...]``: inf where no
    chain moved but they differ (W = 0), nan where all draws are equal."""
    return _rhat_of_chains(split_chains(x))


def rank_normalise(x: np.ndarray) -> np.ndarray:
    """z = Phi^-1((r - 3/8) / (S + 1/4)), r the rank of a draw among all S = M n draws of its quantity (average
    ranks for ties; Vehtari et al. eq. 14)."""
    x = np.asarray(x, dtype=float)
    lead, (M, n) = x.shape[:-2], x.shape[-2:]
    r = rankdata(x.reshape(*lead, M * n), axis=-1)
    return ndtri((r - 0.375) / (M * n + 0.25)).reshape(x.shape)


def rhat(x: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat (Vehtari et al. 2021, sec. 4.2; ArviZ's default ``method="rank"``): with y the
    split chains, the larger of the R-hats of the rank-normalised y (location, "bulk") and of the rank-normalised
    folded |y - median(y)| (scale, "tail"). Unlike ArviZ it is also computed for a single chain (its two halves)."""
    y = split_chains(x)
    folded = np.abs(y - np.median(y, axis=(-2, -1), keepdims=True))
    out = np.maximum(_rhat_of_chains(rank_normalise(y)), _rhat_of_chains(rank_normalise(folded)))
    return np.where(np.isnan(y).any(axis=(-2, -1)), np.nan, out)


def autocovariance(x: np.ndarray) -> np.ndarray:
    """gamma_t = (1/n) sum_{i < n - t} (x_i - mean)(x_{i+t} - mean) along the last axis, t = 0..n-1 (by FFT)."""
    n = x.shape[-1]
    d = x - x.mean(axis=-1, keepdims=True)
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(d, n=size, axis=-1)
    return np.fft.irfft(f * np.conj(f), n=size, axis=-1)[..., :n] / n


def _ess_of_chains(y: np.ndarray) -> np.ndarray:
    """ESS S / tau of chains ``[..., m, n]`` taken as they are (the module docstring's tau; ArviZ's ``_ess``)."""
    y = np.asarray(y, dtype=float)
    m, n = y.shape[-2:]
    S = m * n
    lead = y.shape[:-2]
    if n < 2:
        return np.full(lead, np.nan)
    var_plus, W = _var_plus(y)
    gamma = autocovariance(y).mean(axis=-2)                     # [..., n], averaged over chains
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1 - (W[..., None] - gamma) / var_plus[..., None]
    rho[..., 0] = 1.0
    K = max((n - 3) // 2, 0)
    even = rho[..., 0:2 * K + 1:2]                                # rho_2k, k = 0..K
    P = even + rho[..., 1:2 * K + 2:2]                            # P_k
    stop = P <= 0
    L = np.where(stop.any(axis=-1), stop.argmax(axis=-1), K)      # initial positive sequence: pairs k < L
    monotone = np.minimum.accumulate(P, axis=-1)                  # P'_k (only k < L is used: all P_k > 0 there)
    summed = np.concatenate([np.zeros((*lead, 1)), np.cumsum(monotone, axis=-1)], axis=-1)
    take = lambda a: np.take_along_axis(a, L[..., None], axis=-1)[..., 0]  # noqa: E731
    rho_L, P_L = take(even), take(P)
    tau = -1 + 2 * take(summed) + np.where((rho_L > 0) | (P_L >= 0), rho_L, 0.0)
    tau = np.maximum(tau, 1 / np.log10(S))
    out = np.where(np.isnan(rho).any(axis=-1), np.nan, S / tau)
    flat = y.reshape(*lead, S)
    with np.errstate(invalid="ignore"):
        out = np.where(flat.max(axis=-1) - flat.min(axis=-1) < np.finfo(float).resolution, float(S), out)
    return np.where(np.isnan(flat).any(axis=-1), np.nan, out)


def ess(x: np.ndarray) -> np.ndarray:
    """ESS of draws ``[..., M, n]`` for the mean, from the split chains (module docstring; ArviZ's
    ``method="mean"``), per quantity ``[...]``: the number of independent draws whose mean is as precise."""
    return _ess_of_chains(split_chains(x))


def ess_bulk(x: np.ndarray) -> np.ndarray:
    """Bulk ESS: the ESS of the rank-normalised split chains (Vehtari et al. 2021, sec. 4.3; ArviZ's
    ``method="bulk"``), per quantity ``[...]``."""
    return _ess_of_chains(rank_normalise(split_chains(x)))


def ess_tail(x: np.ndarray, probs: tuple[float, float] = TAIL_PROBS) -> np.ndarray:
    """Tail ESS: the smaller of the ESS of the indicators I(x <= q_0.05) and I(x <= q_0.95), q_p the p-quantile of
    all M n draws (linear interpolation, numpy's default), from the split chains (Vehtari et al. 2021, sec. 4.3;
    ArviZ's ``method="tail"``), per quantity ``[...]``."""
    x = np.asarray(x, dtype=float)
    lead = x.shape[:-2]
    flat = x.reshape(*lead, -1)
    out = []
    for p in probs:
        q = np.quantile(flat, p, axis=-1)
        below = (x <= q[..., None, None]).astype(float)
        out.append(_ess_of_chains(split_chains(below)))
    return np.where(np.isnan(flat).any(axis=-1), np.nan, np.minimum(*out))


def predvar_agreement(f: np.ndarray, second: np.ndarray, valid: np.ndarray) -> dict:
    """Whether the reference has converged for a comparison of predictive variances (the noisy natural gradient
    paper's Table 4): per replica, the Pearson correlation over its test rows between the predictive variances
    Var[y_t] = E[f_t^2 + 1/tau] - E[f_t]^2 of the first and the second half of the chains
    (``predvar_corr_chain_halves``: two independent runs of C/2 chains), and between those of the first half of
    the kept draws and of all of them (``predvar_corr_first_half``: the run at half its length). ``f``, ``second``:
    ``[R, T, C, k]``; ``valid``: ``[R, T]``."""
    def var(sel_f, sel_s):
        return sel_s.mean((-2, -1)) - sel_f.mean((-2, -1)) ** 2

    C, k = f.shape[-2:]
    full = var(f, second)
    out = {}
    if C >= 2:
        a, b = var(f[..., :C // 2, :], second[..., :C // 2, :]), var(f[..., C // 2:, :], second[..., C // 2:, :])
        out["predvar_corr_chain_halves"] = [pearson(a[r][valid[r]], b[r][valid[r]]) for r in range(len(a))]
    if k >= 2:
        h = var(f[..., : k // 2], second[..., : k // 2])
        out["predvar_corr_first_half"] = [pearson(h[r][valid[r]], full[r][valid[r]]) for r in range(len(h))]
    return out
