"""Noise of :class:`~protocols.dp.GaussianDP`: exact discrete Gaussian noise on a lattice
(:mod:`protocols.dp.sampler`) and the distributed-mode share sizing of Kairouz, Liu & Steinke
(2021, "The Distributed Discrete Gaussian Mechanism", Thm 1)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .sampler import round_up_variance, sample_discrete_gaussian

FINE = 2.0**-20  # lattice step relative to sigma in central/local modes


def lattice_noise(sigma2_lattice: Fraction, size: int) -> np.ndarray:
    """``size`` draws of N_Z(0, sigma2_lattice) as floats (lattice units)."""
    return sample_discrete_gaussian(sigma2_lattice, size).astype(np.float64)


def noise_on_lattice(val: np.ndarray, sigma: float, step: float) -> np.ndarray:
    """``val`` rounded to the lattice ``step Z`` plus discrete Gaussian noise of standard
    deviation >= sigma (variance rounded up in lattice units)."""
    lattice = np.rint(np.asarray(val, dtype=np.float64) / step)
    noise = lattice_noise(round_up_variance((sigma / step) ** 2), lattice.size).reshape(lattice.shape)
    return (lattice + noise) * step


def kls21_tau(share_variance: float, m: int) -> float:
    """KLS21 Thm 1 tau: distance of a sum of m N_Z(0, s^2) shares from N_Z(0, m s^2)."""
    return 10.0 * sum(math.exp(-2 * math.pi**2 * share_variance * k / (k + 1)) for k in range(1, m))


def min_share_variance(m: int, tau: float = 1e-6) -> float:
    """Smallest per-client lattice variance s^2 with kls21_tau(s^2, m) <= tau (bisection)."""
    if m <= 1:
        return 0.0
    lo, hi = 0.0, 1.0
    while kls21_tau(hi, m) > tau:
        hi *= 2
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if kls21_tau(mid, m) <= tau else (mid, hi)
    return hi
