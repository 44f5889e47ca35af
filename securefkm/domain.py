"""A data domain declared as a ball: the records lie within ``radius`` of ``centre``.

:class:`Ball` is also the pair ``(low, high)`` of its bounding box, so every consumer of a
declared box (``init_bounds``) keeps working on it unchanged; the consumers that can use the
tighter ball (the data-free starts, the private seeding, the DP layer's clipping, sensitivity
and projection) test ``isinstance(domain, Ball)``.
"""

from __future__ import annotations

import numpy as np

from .exceptions import InputError


def check_centre(centre, name: str = "centre", n_features: int | None = None):
    """``None``, or ``centre`` as a finite float scalar or 1-D array (of ``n_features`` entries)."""
    if centre is None:
        return None
    try:
        c = np.asarray(centre, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number or a 1-D array of n_features numbers, got {centre!r}.") from None
    if c.ndim > 1 or not np.all(np.isfinite(c)):
        raise InputError(f"{name} must be a finite number or a 1-D array of n_features numbers, got {centre!r}.")
    if n_features is not None and c.ndim == 1 and c.shape[0] != n_features:
        raise InputError(f"{name} has {c.shape[0]} entries but the data has n_features={n_features}; "
                         f"pass one number per feature (or a single number for every feature).")
    return c


class Ball(tuple):
    """The ball of ``radius`` about ``centre`` (a number or a per-feature vector), which is also
    the pair ``(low, high)`` of its bounding box ``centre -+ radius``."""

    centre: np.ndarray
    radius: float

    def __new__(cls, centre, radius: float):
        c = check_centre(0.0 if centre is None else centre)
        r = float(radius)
        if not np.isfinite(r) or r <= 0:
            raise InputError(f"a ball's radius must be a finite number > 0, got {radius!r}.")
        low, high = c - r, c + r
        self = super().__new__(cls, (low.tolist(), high.tolist()))
        self.centre, self.radius = c, r
        return self

    def __reduce__(self):
        return (Ball, (self.centre, self.radius))

    def __repr__(self) -> str:
        return f"Ball(centre={self.centre.tolist()!r}, radius={self.radius!r})"

    def centre_in(self, d: int) -> np.ndarray:
        """The centre as a length-``d`` vector."""
        return np.broadcast_to(self.centre, (d,)).astype(np.float64)

    def project(self, rows: np.ndarray) -> np.ndarray:
        """Rows (n, d) moved radially onto the ball when outside it (a new array)."""
        rows = np.asarray(rows, dtype=np.float64)
        c = self.centre_in(rows.shape[-1])
        offset = rows - c
        norms = np.linalg.norm(offset, axis=-1, keepdims=True)
        scale = np.minimum(1.0, self.radius / np.maximum(norms, 1e-300))
        return c + offset * scale

    def sample(self, k: int, d: int, rng: np.random.Generator, fraction: float = 1.0) -> np.ndarray:
        """k points uniform in the concentric ball of ``fraction * radius`` (data independent)."""
        v = rng.standard_normal((k, d))
        v /= np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-300)
        return self.centre_in(d) + v * (fraction * self.radius * rng.random((k, 1)) ** (1.0 / d))
