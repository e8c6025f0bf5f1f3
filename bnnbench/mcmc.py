"""Convergence diagnostics of Markov chains: split R-hat and effective sample size.

Draws are arrays ``[..., M, n]``: M chains of n draws of one scalar quantity (leading axes: many quantities at
once). Definitions as in Gelman et al., Bayesian Data Analysis (3rd ed., 2013, sec. 11.4-11.5) and, for the
rank-normalised versions, Vehtari, Gelman, Simpson, Carpenter & Buerkner (2021), "Rank-normalization, folding,
and localization: an improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2).

With the chains split in halves (m = 2M chains of n' = floor(n / 2) draws, chain means theta_j, variances s_j^2),

    B = n' / (m - 1) sum_j (theta_j - theta)^2,   W = (1/m) sum_j s_j^2,
    var+ = (n' - 1) / n' W + B / n',              R-hat = sqrt(var+ / W)                 (BDA3 eq. 11.3-11.4),

and, from the autocorrelations rho_t = 1 - (W - (1/m) sum_j gamma_jt) / var+ (gamma_jt chain j's autocovariance at
lag t), the effective sample size m n' / tau with tau = -1 + 2 sum_{k <= K} P'_k, P_k = rho_2k + rho_2k+1 truncated
at the first negative pair and made monotone, P'_k = min(P_0, ..., P_k) (Geyer's initial monotone sequence,
BDA3 eq. 11.8 and Vehtari et al. eq. 10).
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri
from scipy.stats import rankdata


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


def split_rhat(x: np.ndarray) -> np.ndarray:
    """Split R-hat (BDA3) of draws ``[..., M, n]``, per quantity ``[...]``: inf where no chain moved but they differ
    (W = 0), nan where all draws are equal."""
    var_plus, W = _var_plus(split_chains(x))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt(var_plus / W)


def rank_normalise(x: np.ndarray) -> np.ndarray:
    """z = Phi^-1((r - 3/8) / (S + 1/4)), r the rank of a draw among all S = M n draws of its quantity (average
    ranks for ties; Vehtari et al. eq. 14)."""
    x = np.asarray(x, dtype=float)
    lead, (M, n) = x.shape[:-2], x.shape[-2:]
    r = rankdata(x.reshape(*lead, M * n), axis=-1)
    return ndtri((r - 0.375) / (M * n + 0.25)).reshape(x.shape)


def rhat(x: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat (Vehtari et al. 2021): the larger of the split R-hats of the rank-normalised
    draws (location) and of the rank-normalised folded draws |x - median| (scale)."""
    x = np.asarray(x, dtype=float)
    folded = np.abs(x - np.median(x, axis=(-2, -1), keepdims=True))
    return np.maximum(split_rhat(rank_normalise(x)), split_rhat(rank_normalise(folded)))


def autocovariance(x: np.ndarray) -> np.ndarray:
    """gamma_t = (1/n) sum_{i < n - t} (x_i - mean)(x_{i+t} - mean) along the last axis, t = 0..n-1 (by FFT)."""
    n = x.shape[-1]
    d = x - x.mean(axis=-1, keepdims=True)
    size = 1 << (2 * n - 1).bit_length()
    f = np.fft.rfft(d, n=size, axis=-1)
    return np.fft.irfft(f * np.conj(f), n=size, axis=-1)[..., :n] / n


def ess(x: np.ndarray) -> np.ndarray:
    """Effective sample size of draws ``[..., M, n]`` from the split chains (module docstring), per quantity."""
    y = split_chains(x)
    m, n = y.shape[-2:]
    var_plus, W = _var_plus(y)
    gamma = autocovariance(y).mean(axis=-2)                    # [..., n], averaged over chains
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = 1 - (W[..., None] - gamma) / var_plus[..., None]
    rho[..., 0] = 1.0
    n_pairs = n // 2
    P = rho[..., 0:2 * n_pairs:2] + rho[..., 1:2 * n_pairs:2]  # [..., n_pairs]
    positive = np.cumprod(P > 0, axis=-1).astype(bool)          # the initial positive sequence
    monotone = np.minimum.accumulate(np.where(positive, P, np.inf), axis=-1)
    tau = -1 + 2 * np.where(positive, monotone, 0.0).sum(axis=-1)
    return m * n / tau


def ess_bulk(x: np.ndarray) -> np.ndarray:
    """Bulk effective sample size: the ESS of the rank-normalised draws (Vehtari et al. 2021, sec. 4.3)."""
    return ess(rank_normalise(x))
