"""Stopping rules for iterative federated algorithms.

Two rules, both from Holzer et al. (DWF k-means), section 2.3 and 3.4:

* the Frobenius movement ``||C^(t) - C^(t-1)||_F`` of the centres is below ``tol``;
* the movement "did not decrease over the last N steps" (``patience``): the smallest
  movement of the last ``patience`` rounds is not smaller than the smallest before them.
"""

from __future__ import annotations

import numpy as np


def frobenius_movement(old: np.ndarray, new: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(new) - np.asarray(old)))


def has_converged(movements: list[float], tol: float, patience: int | None) -> bool:
    """Apply both stopping rules to the list of per-round movements so far."""
    if not movements:
        return False
    if movements[-1] < tol:
        return True
    if patience is not None and len(movements) > patience:
        recent = min(movements[-patience:])
        before = min(movements[:-patience])
        if recent >= before:
            return True
    return False
