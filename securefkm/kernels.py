"""Public numerical kernels of securefkm: what ``protocols`` and ``attacks`` (and users) may
build on without reaching into the algorithms' private modules.

k-means:

* :func:`sq_distances` -- squared Euclidean distances ``(n, k)`` of records to centres.
* :func:`assign` -- each record's nearest centre and its squared distance.
* :func:`segment_sums` / :func:`cluster_sums` -- per-segment (per-cluster) coordinate sums
  and weights, the sum-fields of every crisp algorithm (Holzer et al. 2023, Eq. 2-3).
* :func:`per_client_cell_sums` -- the same for many clients at once (the pooled kernel).
* :func:`shutdown_pools` -- stop the pooled kernel's kept threads.

Fuzzy c-means (Bezdek's update, as Stallmann & Wilbik 2022, Eq. 1-3, use it):

* :func:`exact_sq_distances`, :func:`fuzzy_memberships`, :func:`memberships_from_sq_distances`,
  :func:`membership_weights` (``u^m``), :func:`weighted_sums`, :func:`local_fcm`,
  :func:`fcm_objective`.

Shrinkage of noisy means (the DP post-processing):

* :func:`shrink_means` (positive-part James-Stein) and :func:`shrink_coordinates`
  (coordinate-wise empirical Bayes).

These names are stable; the modules they are implemented in are not.
"""

from __future__ import annotations

from .algorithms._fcm import (
    exact_sq_distances,
    fcm_objective,
    fuzzy_memberships,
    local_fcm,
    membership_weights,
    memberships_from_sq_distances,
    weighted_sums,
)
from .algorithms._kmeans import (
    assign,
    cluster_sums,
    per_client_cell_sums,
    segment_sums,
    sq_distances,
)
from .algorithms._block_pool import shutdown_pools
from .algorithms._seeding import shrink_coordinates, shrink_means

__all__ = [
    "assign",
    "cluster_sums",
    "exact_sq_distances",
    "fcm_objective",
    "fuzzy_memberships",
    "local_fcm",
    "membership_weights",
    "memberships_from_sq_distances",
    "per_client_cell_sums",
    "segment_sums",
    "shrink_coordinates",
    "shrink_means",
    "shutdown_pools",
    "sq_distances",
    "weighted_sums",
]
