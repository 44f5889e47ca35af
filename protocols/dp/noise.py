"""Noise of :class:`~protocols.dp.GaussianDP`: exact discrete Gaussian noise on a lattice
(:mod:`protocols.dp.sampler`) and the distributed-mode share sizing of Kairouz, Liu & Steinke
(2021, "The Distributed Discrete Gaussian Mechanism", Thm 1)."""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from .sampler import round_up_variance, sample_discrete_gaussian_batch

FINE = 2.0**-20  # lattice step relative to sigma in central/local modes


RNGS = ("system", "seeded")
_SALT = b"securefkm/dp-noise/v1"


def keystream(seed: int, label: str):
    """A byte source (n -> n bytes) for the sampler: the ChaCha20 keystream under the key
    HKDF-SHA256(seed, salt, info=label) (RFC 5869; RFC 8439), zero nonce.

    For ``GaussianDP(rng="seeded")``: every (run, round, owner, field) gets its own label, so the
    noise is a deterministic function of the fit's seed and of *what* is noised, never of the
    order in which clients are processed. Anyone who knows the seed can recompute the noise and
    subtract it: for reproducible studies only, never for deployments.
    """
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    ikm = int(seed).to_bytes(16, "big", signed=True)
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT, info=label.encode()).derive(ikm)
    # ChaCha20 in `cryptography` takes a 16-byte nonce: 4-byte counter + 12-byte nonce, all zero
    # (each key is used for one stream only).
    encryptor = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    return lambda n: encryptor.update(bytes(n))


def on_lattice(values: list, steps: list, sigma2s: list[Fraction], sources: list) -> list[np.ndarray]:
    """Each ``values[i]`` rounded to the lattice ``steps[i] Z`` plus N_Z(0, sigma2s[i]) lattice
    units of noise from ``sources[i]`` (None: the OS CSPRNG); every request in one pass of the
    sampler, each getting what it would get alone (:func:`~protocols.dp.sampler.sample_discrete_gaussian_batch`)."""
    lattices = [np.rint(np.asarray(v, dtype=np.float64) / step) for v, step in zip(values, steps)]
    noise = sample_discrete_gaussian_batch(sigma2s, [x.size for x in lattices], sources)
    return [(x + z.reshape(x.shape)) * step for x, z, step in zip(lattices, noise, steps)]


def noise_on_lattice_many(values: list, sigmas: list, steps: list, sources: list) -> list[np.ndarray]:
    """:func:`noise_on_lattice` of every (value, sigma, step, source) at once."""
    return on_lattice(values, steps, [round_up_variance((sig / step) ** 2) for sig, step in zip(sigmas, steps)], sources)


def noise_on_lattice(val: np.ndarray, sigma: float, step: float, source=None) -> np.ndarray:
    """``val`` rounded to the lattice ``step Z`` plus discrete Gaussian noise of standard
    deviation >= sigma (variance rounded up in lattice units)."""
    return noise_on_lattice_many([val], [sigma], [step], [source])[0]


@functools.lru_cache(maxsize=1024)
def kls21_tau(share_variance: float, m: int) -> float:
    """KLS21 Thm 1 tau: distance of a sum of m N_Z(0, s^2) shares from N_Z(0, m s^2) (a pure
    function of public parameters, asked for every field of every round: cached)."""
    if m <= 1:
        return 0.0
    k = np.arange(1, m, dtype=np.float64)  # one vector op: m is the cohort (millions of clients)
    return 10.0 * float(np.exp(-2 * math.pi**2 * share_variance * k / (k + 1)).sum())


@functools.lru_cache(maxsize=256)
def min_share_variance(m: int, tau: float = 1e-6) -> float:
    """Smallest per-client lattice variance s^2 with kls21_tau(s^2, m) <= tau (bisection).

    A pure function of public parameters, asked by every client of every round: cached (the
    bisection costs ~50 sums of m terms, more than a client's whole update at m = 100)."""
    if m <= 1:
        return 0.0
    lo, hi = 0.0, 1.0
    while kls21_tau(hi, m) > tau:
        hi *= 2
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if kls21_tau(mid, m) <= tau else (mid, hi)
    return hi
