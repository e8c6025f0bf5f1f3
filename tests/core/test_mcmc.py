"""The chain diagnostics (bnnbench/core/mcmc.py) against ArviZ's (arviz-stats, a test dependency: the dev extra), which
follow the Stan Reference Manual and Vehtari et al. (2021): rank-normalised split R-hat, bulk, tail and mean ESS with
Geyer's initial positive and monotone sequences and the S log10 S cap, on independent, positively correlated and
antithetic AR(1) chains. Fast: about a second."""

import math

import numpy as np
import pytest
from arviz_stats.base import array_stats as az
from scipy.signal import lfilter

from bnnbench.core import mcmc


def ar1(phi, shape, n, seed):
    """Stationary AR(1) chains x_t = phi x_{t-1} + e_t ``[*shape, n]`` (a burn-in of 200 draws dropped)."""
    e = np.random.default_rng(seed).normal(size=(*shape, n + 200))
    return lfilter([1.0], [1.0, -phi], e, axis=-1)[..., 200:]


@pytest.mark.parametrize("phi", [0.0, 0.6, 0.95, -0.5, -0.8, -0.9])   # independent, correlated, antithetic
@pytest.mark.parametrize("n", [1000, 101])                               # an odd n: its middle draw is dropped
def test_rhat_and_ess_equal_arviz(phi, n):
    x = ar1(phi, (20, 4), n, seed=int(100 * abs(phi)) + n)
    x[:5] += np.arange(4)[:, None] * 0.3               # some quantities whose chains sit at different means
    x[5:10] = np.exp(x[5:10])                           # and skewed ones (rank normalisation, folding)
    cases = [(mcmc.rhat(x), az.rhat(x, method="rank")), (mcmc.split_rhat(x), az.rhat(x, method="split")),
             (mcmc.ess(x), az.ess(x, method="mean")), (mcmc.ess_bulk(x), az.ess(x, method="bulk")),
             (mcmc.ess_tail(x), az.ess(x, method="tail", prob=0.05))]
    for ours, ref in cases:
        assert ours.shape == (20,)
        np.testing.assert_allclose(ours, ref, rtol=1e-8, atol=0)


def test_antithetic_chains_have_a_positive_ess_capped_at_s_log10_s():
    """AR(1) at phi = -0.9: tau = (1 + phi) / (1 - phi) = 1/19, so S / tau = 19 S exceeds the cap S log10 S, which
    every estimate then equals (the summed autocorrelations without Stan's handling of the first pair and the cap
    gave a negative ESS in 200 of these 200 repeats); at phi = -0.3 the estimates lie below the cap, near S / tau."""
    x = ar1(-0.9, (200, 4), 1000, seed=0)
    S = 4000
    for ess in (mcmc.ess(x), mcmc.ess_bulk(x)):
        assert np.all(ess > 0)
        np.testing.assert_allclose(ess, S * math.log10(S), rtol=1e-12)
    x = ar1(-0.3, (200, 4), 1000, seed=1)               # S / tau = S 1.3 / 0.7, below the cap: estimated
    ess = mcmc.ess(x)
    assert np.all(ess > 0) and np.all(ess < S * math.log10(S))
    # Geyer's truncated sum is biased upwards on antithetic chains (+0.9 % here, 1.7 standard errors)
    assert abs(ess.mean() / (S * 1.3 / 0.7) - 1) < 0.03, ess.mean()


@pytest.mark.filterwarnings("ignore::RuntimeWarning:arviz_stats.base.diagnostics")   # ArviZ's own 0 / 0
def test_constant_and_missing_draws_as_arviz():
    """A quantity that never moves has ESS = S (the split draws' number) and R-hat NaN; one with a NaN draw, NaN."""
    x = np.random.default_rng(0).normal(size=(3, 4, 10))
    x[1] = 2.5
    x[2, 0, 3] = np.nan
    for ours, ref in [(mcmc.ess(x), az.ess(x, method="mean")), (mcmc.ess_bulk(x), az.ess(x, method="bulk")),
                      (mcmc.ess_tail(x), az.ess(x, method="tail", prob=0.05)), (mcmc.rhat(x), az.rhat(x))]:
        np.testing.assert_allclose(ours, ref, rtol=1e-8, atol=0, equal_nan=True)
    assert mcmc.ess(x)[1] == 40 and np.isnan(mcmc.ess(x)[2]) and np.isnan(mcmc.rhat(x)[1:]).all()
