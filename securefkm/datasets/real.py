"""Real data sets shipped with scikit-learn, scaled into [-1, 1]^d by public, fixed ranges.

Clustering under DP (and any declared ``init_bounds``) needs a box that is fixed before the
fit; standardising by the pooled mean and variance would use the clients' records outside any
privacy accounting. These loaders therefore scale each feature by a range fixed in advance:

* ``digits-unit``: the 8x8 digits' pixel intensities, whose range 0..16 is part of the data
  format (Alpaydin & Kaynak, UCI optdigits), mapped affinely to [-1, 1];
* ``wine`` and ``breast-cancer``: the per-feature Min/Max ranges published in the data sets'
  documentation (the "Summary Statistics" table of scikit-learn's ``DESCR``, from the UCI
  description), widened by 10% of the range on each side, mapped to [-1, 1]. They play the
  part of a public schema (declared domain per feature). Honest caveat: those published
  ranges were computed from the same records, so this is the usual public-domain assumption
  of the DP-clustering literature, not a bound derived independently of the data; records
  outside the box (none here) would be clipped by a DP layer's ``bounds``.

The declared box of all three is therefore ``(-1, 1)`` per feature (:data:`UNIT_BOX`).
"""

from __future__ import annotations

import re

import numpy as np

UNIT_BOX = (-1.0, 1.0)
_MARGIN = 0.10
_ROW = re.compile(r"^\s*([A-Za-z][^:]*):\s+(-?[0-9.]+)\s+(-?[0-9.]+)")


def published_ranges(descr: str, n_features: int) -> np.ndarray:
    """(n_features, 2) Min/Max rows of the "Summary Statistics" table of a scikit-learn DESCR."""
    start = descr.index("Summary Statistics")
    rows = []
    for line in descr[start:].splitlines():
        m = _ROW.match(line)
        if m:
            rows.append((float(m.group(2)), float(m.group(3))))
        if len(rows) == n_features:
            break
    if len(rows) != n_features:  # pragma: no cover - a changed DESCR format
        raise RuntimeError(f"expected {n_features} published feature ranges, parsed {len(rows)}.")
    return np.asarray(rows, dtype=np.float64)


def scale_to_unit(X: np.ndarray, ranges: np.ndarray, margin: float = _MARGIN) -> np.ndarray:
    """Affine map of each feature's ``[lo - margin*w, hi + margin*w]`` onto [-1, 1]."""
    lo, hi = ranges[:, 0], ranges[:, 1]
    w = hi - lo
    lo, hi = lo - margin * w, hi + margin * w
    return 2.0 * (np.asarray(X, dtype=np.float64) - lo) / (hi - lo) - 1.0


def _published(loader):
    bunch = loader()
    X = np.asarray(bunch.data, dtype=np.float64)
    return scale_to_unit(X, published_ranges(bunch.DESCR, X.shape[1])), np.asarray(bunch.target, dtype=np.int64)


def wine():
    """UCI wine (178 x 13, 3 classes), scaled by its published feature ranges into [-1, 1]."""
    from sklearn.datasets import load_wine

    return _published(load_wine)


def breast_cancer():
    """UCI breast cancer Wisconsin (569 x 30, 2 classes), scaled by its published ranges."""
    from sklearn.datasets import load_breast_cancer

    return _published(load_breast_cancer)


def digits_unit():
    """scikit-learn's digits (1797 x 64, 10 classes), pixel range 0..16 mapped to [-1, 1]."""
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return np.asarray(X, dtype=np.float64) / 8.0 - 1.0, np.asarray(y, dtype=np.int64)
