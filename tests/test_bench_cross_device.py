"""The cross-device benchmark's pieces run and report what they claim (not its figures)."""

from __future__ import annotations

import numpy as np

from benchmarks import cross_device


def test_one_round_reports_the_cohort_and_prices_real_cryptography():
    ideal = cross_device._one_round(60, "ideal", 0, warm_up=False)
    assert ideal["n"] == 60 and 50 <= ideal["contributors"] <= 60 and "crypto" not in ideal
    real = cross_device._one_round(60, "real", 0, warm_up=False)
    assert real["crypto"] > 0 and real["round"] > 0 and real["peak"] > 0


def test_cost_model_is_the_least_squares_line():
    a, b = cross_device.fit_line([1, 2, 3], [3.0, 5.0, 7.0])
    assert np.isclose(a, 1.0) and np.isclose(b, 2.0)


def test_study_fits_a_streamed_population():
    r = cross_device._study(3_000, 300)
    assert r["rounds"] >= 1 and r["spent"][0] <= 1.0 and r["gap"] < 1.0
