"""scikit-learn's estimator checks for the five estimators.

The instances use few rounds so the ~50 checks per estimator stay fast; a pooled array
without ``groups`` is one client (documented in securefkm.estimators.base). The only checks
expected to fail are declared, with their reason, next to the estimator they concern
(``SKLEARN_EXPECTED_FAILED_CHECKS``) and reported as xfail, never skipped silently.
"""

from __future__ import annotations

from sklearn.utils.estimator_checks import parametrize_with_checks

from securefkm import (
    AligningFederatedKMeans,
    FederatedFuzzyCMeans,
    MiniBatchFederatedKMeans,
    OneShotFederatedKMeans,
    WeightedFederatedKMeans,
)
from securefkm.estimators import fuzzy

ESTIMATORS = [
    WeightedFederatedKMeans(n_clusters=3, max_rounds=10, random_state=0),
    MiniBatchFederatedKMeans(n_clusters=3, max_rounds=10, random_state=0),
    AligningFederatedKMeans(n_clusters=3, max_rounds=5, server_n_init=2, random_state=0),
    OneShotFederatedKMeans(n_clusters=3, server_n_init=2, random_state=0),
    FederatedFuzzyCMeans(n_clusters=3, max_rounds=5, random_state=0),
]


def _expected_failed_checks(estimator):
    if isinstance(estimator, FederatedFuzzyCMeans):
        return fuzzy.SKLEARN_EXPECTED_FAILED_CHECKS
    return {}


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected_failed_checks)
def test_sklearn_compatible_estimator(estimator, check):
    check(estimator)
