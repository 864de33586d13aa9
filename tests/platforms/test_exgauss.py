"""The ex-Gaussian (platforms.exgauss): its two fits, its draws, and its distribution functions agreeing."""

from __future__ import annotations

import numpy as np
import pytest

from platforms import ExGauss, load_profile


def test_fit_recovers_its_parameters() -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(1.0, 0.1, 4000) + rng.exponential(0.5, 4000)
    fit = ExGauss.fit(x.tolist())
    assert fit.mu == pytest.approx(1.0, rel=0.05)
    assert fit.sigma == pytest.approx(0.1, rel=0.15)
    assert fit.tau == pytest.approx(0.5, rel=0.08)


def test_fit_needs_samples() -> None:
    with pytest.raises(ValueError, match="at least 3 round trips"):
        ExGauss.fit([1.0, 1.1, float("nan")])
    same = ExGauss.fit([2.0] * 5)
    assert (same.mu, same.sigma, same.tau) == (2.0, 0.0, 0.0)


def test_moments_recover_parameters() -> None:
    rng = np.random.default_rng(0)
    x = 3.0 + rng.normal(0, 0.5, 20000) + rng.exponential(2.0, 20000)
    fit = ExGauss.from_moments(x)
    assert fit.mu == pytest.approx(3.0, abs=0.2) and fit.tau == pytest.approx(2.0, rel=0.1)
    assert fit.sigma == pytest.approx(0.5, abs=0.2)
    assert ExGauss.from_moments([4.0, 4.0]) == ExGauss(4.0, 0.0, 0.0)


def test_draws_follow_the_distribution() -> None:
    d = ExGauss(2.0, 0.3, 3.0)
    rng = np.random.default_rng(1)
    x = np.array([d.draw(rng) for _ in range(20000)])
    assert x.mean() == pytest.approx(d.mean, rel=0.03)
    assert np.quantile(x, 0.99) == pytest.approx(d.quantile(0.99), rel=0.05)
    assert float(d.sf(np.array(d.quantile(0.9)))) == pytest.approx(0.1, abs=1e-6)
    # a degenerate distribution takes nothing from the generator
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    assert ExGauss(1.5, 0.0, 0.0).draw(a) == 1.5 and a.random() == b.random()


def test_profiles_hold_one() -> None:
    lat = load_profile("aws-lambda").invoke_latency
    assert isinstance(lat, ExGauss) and lat.mean == lat.mu + lat.tau > 0
