"""Reading per-cell counts and sums out of sum-fields (shared by the reconstruction attacks).

Every crisp federated k-means in securefkm returns, per cluster j, a count field (kind
``"count"``, shape (k,)) and a coordinate-sum field (shape (k, d)): DWF's ``weights`` and
``weighted_centres``, Triebe's (Lambda, Gamma). The pairing is read from the round's
:class:`~securefkm.messages.FieldSpec` s, so the attacks do not hard-code field names.
"""

from __future__ import annotations

import numpy as np

from securefkm.kernels import assign

SEEDING_RAW_ACTIONS = ("init.kmeans++", "init.random")


def cell_fields(specs) -> tuple[str, str] | None:
    """(count field, sum field) of a round, or None if the round has no such pair."""
    counts = [s for s in specs if s.kind == "count" and len(s.shape) == 1 and s.shape[0] > 1]
    for c in counts:
        k = c.shape[0]
        sums = [s for s in specs if len(s.shape) == 2 and s.shape[0] == k and s.kind in ("sum", "value")]
        if not sums:
            continue
        preferred = [s for s in sums if s.kind == "sum"] or [s for s in sums if s.name != "centres"] or sums
        return c.name, preferred[0].name
    return None


def full_data_round(record) -> bool:
    """True if every client's records all enter the round's cells (so a known record can be
    placed in its cell from the public centres): a one-step crisp training round."""
    b = next(iter(record.broadcasts.values()), None)
    if b is None or b.centres is None or b.action != "train":
        return False
    p = b.params
    if int(p.get("max_local_steps", 1)) != 1:
        return False
    return not any("batch" in str(key) for key in p)


def integer_counts(n: np.ndarray) -> np.ndarray:
    """What an attacker does with (possibly noisy) counts: round them to integers."""
    return np.rint(np.asarray(n, dtype=np.float64))


def verify_cells(X: np.ndarray, centres: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Mask of candidates that do lie in the cell they were read from."""
    if len(X) == 0:
        return np.zeros(0, dtype=bool)
    return assign(X, centres)[0] == cells


def dedup(X: np.ndarray, tol: float) -> np.ndarray:
    """Rows of X with near-duplicates (within tol) removed, first occurrence kept."""
    if len(X) <= 1:
        return X
    keep = np.ones(len(X), dtype=bool)
    order = np.lexsort(X.T[::-1])
    Xs = X[order]
    same = np.all(np.abs(np.diff(Xs, axis=0)) <= tol, axis=1)
    keep_sorted = np.concatenate([[True], ~same])
    keep[order] = keep_sorted
    return X[keep]
