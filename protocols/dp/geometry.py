"""The declared domain of a :class:`~protocols.dp.GaussianDP` layer in d dimensions: the box
``bounds=(low, high)`` or the ball of radius ``clip`` about ``centre``, and the distances the
sensitivities are made of (docs/protocols/dp-mechanism.md, "Sensitivity")."""

from __future__ import annotations

import numpy as np


class DomainGeometry:
    """A box (``bounds``) or a ball (``clip`` about ``centre``, default the origin) in ``d``
    dimensions; exactly one of ``bounds`` and ``clip`` is given."""

    def __init__(self, d: int, bounds=None, clip: float | None = None, centre=None):
        self.d = d
        self.bounds = bounds
        self.clip = clip
        self.has_centre = centre is not None  # a ball about a declared point, not the origin
        if clip is not None:
            self.box = None
            c = np.zeros(d) if centre is None else np.broadcast_to(centre, (d,)).astype(np.float64)
        else:
            self.box = tuple(np.broadcast_to(b, (d,)) for b in bounds)
            low, high = self.box
            c = (low + high) / 2
        c.setflags(write=False)
        self.centre = c

    @property
    def radius(self) -> float:
        """The largest norm of a record of the domain (the sensitivity of an uncentred sum)."""
        if self.clip is not None:
            return float(np.linalg.norm(self.centre)) + self.clip
        low, high = self.box
        return float(np.linalg.norm(np.maximum(np.abs(low), np.abs(high))))

    @property
    def centred_radius(self) -> float:
        """The largest distance of a record from the domain's centre: the ball's radius, or the
        box's half-diagonal."""
        if self.clip is not None:
            return self.clip
        low, high = self.box
        return float(np.linalg.norm((high - low) / 2))

    @property
    def diameter(self) -> float:
        if self.clip is not None:
            return 2 * self.clip
        low, high = self.box
        return float(np.linalg.norm(high - low))

    def project_rows(self, arr: np.ndarray) -> np.ndarray:
        """Rows of width d projected into the domain (onto the ball, or clipped to the box)."""
        d = self.d
        rows = np.asarray(arr, dtype=np.float64).reshape(-1, d)
        if self.clip is not None:
            offset = rows - self.centre
            norms = np.linalg.norm(offset, axis=1)
            scale = np.minimum(1.0, self.clip / np.maximum(norms, 1e-300))
            rows = self.centre + offset * scale[:, None]
        else:
            low, high = self.bounds
            rows = np.clip(rows, low, high)
        return rows.reshape(np.shape(arr))

    def clip_to_ball(self, X: np.ndarray) -> np.ndarray:
        """Records farther than ``clip`` from the ball's centre moved radially onto its surface
        (``X`` itself when none is)."""
        c = self.centre if self.has_centre else 0.0  # about the origin: x R / ||x|| exactly
        offset = X - c
        norms = np.linalg.norm(offset, axis=1)
        over = norms > self.clip
        if not np.any(over):
            return X
        X = np.array(X, dtype=np.float64, copy=True)
        X[over] = c + offset[over] * (self.clip / norms[over])[:, None]
        return X
