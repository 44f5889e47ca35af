"""Differential privacy for federated clustering: exact discrete Gaussian noise, accounting,
and the :class:`GaussianDP` layer. Importing this package does not import torch/opacus."""

from .accounting import (
    PrivacyAccountant,
    epsilon_for,
    epsilon_for_history,
    gdp_epsilon,
    noise_multiplier_for,
    noise_multiplier_for_schedule,
)
from .layer import (
    CentralDPWarning,
    DeltaWarning,
    GaussianDP,
    check_seeded_noise,
    refuse_seeded_noise,
)
from .noise import kls21_tau
from .sampler import lattice_gaussian, sample_discrete_gaussian, sample_discrete_laplace

__all__ = [
    "GaussianDP",
    "CentralDPWarning",
    "DeltaWarning",
    "refuse_seeded_noise",
    "check_seeded_noise",
    "kls21_tau",
    "PrivacyAccountant",
    "epsilon_for",
    "gdp_epsilon",
    "noise_multiplier_for",
    "noise_multiplier_for_schedule",
    "epsilon_for_history",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
    "lattice_gaussian",
]
