"""Leakage metrics shared by every attack, and the scorer that matches claims to records.

An attack produces *claims*: ``(client, vector)`` pairs it believes are one of that
client's records. :func:`score_reconstructions` matches each claim to the nearest true
record **of the same client** (vectorised squared distances) and fills a
:class:`LeakageReport`. Ground truth is used only here, to score the attack; attacks
themselves read only the transcript (passive) or act through the server policy (active).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from securefkm.kernels import sq_distances
from securefkm.exceptions import InputError


@dataclass(repr=False)
class LeakageReport:
    """What an attack learnt, against the ground truth.

    Record recovery (reconstruction attacks):

    * ``records_recovered``: distinct true records matched by a claim within
      ``tol_exact`` (relative to the data range, default 1e-6);
    * ``records_recovered_approx``: the same within the user tolerance ``tol_approx``;
    * ``fraction_recovered``: ``records_recovered / n_records`` where ``n_records`` counts
      the records of the attacked clients (all clients for a passive attack, the targets
      for an attack aimed at chosen clients);
    * ``clients_exposed``: fraction of attacked clients with at least one record recovered;
    * ``reconstruction_error``: distance from each claim to its nearest true record (array,
      one entry per claim, in data units);
    * ``precision``: fraction of claims that are exact reconstructions.

    Membership inference: ``membership_advantage`` (max TPR - FPR), ``auc``,
    ``tpr_at_1pct_fpr``. Auditing: ``epsilon_lower_bound``. Fields that do not apply are
    ``None``. ``rounds_used`` is the number of rounds the attack read or ran; ``extra``
    holds attack-specific facts (e.g. means of small clusters revealed, detection).

    ``repr()`` is one line, :meth:`summary` a table, :meth:`to_dict` JSON-able data.
    """

    attack: str = ""
    n_records: int = 0
    n_clients: int = 0
    n_claims: int = 0
    records_recovered: int = 0
    records_recovered_approx: int = 0
    fraction_recovered: float = 0.0
    clients_exposed: float = 0.0
    reconstruction_error: np.ndarray = field(default_factory=lambda: np.zeros(0))
    precision: float | None = None
    membership_advantage: float | None = None
    auc: float | None = None
    tpr_at_1pct_fpr: float | None = None
    epsilon_lower_bound: float | None = None
    rounds_used: int = 0
    tol_exact: float = 1e-6
    tol_approx: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-able summary (the error array is summarised by mean / median / max)."""
        d = asdict(self)
        err = np.asarray(self.reconstruction_error, dtype=float)
        d["reconstruction_error"] = {
            "mean": float(err.mean()) if err.size else None,
            "median": float(np.median(err)) if err.size else None,
            "max": float(err.max()) if err.size else None,
        }
        d["extra"] = {k: _jsonable(v) for k, v in self.extra.items()}
        return d

    def _headline(self) -> list[str]:
        parts = [f"recovered {self.records_recovered}/{self.n_records} records exactly "
                 f"({100 * self.fraction_recovered:.2f}%)", f"clients exposed {100 * self.clients_exposed:.1f}%"]
        if self.precision is not None:
            parts.append(f"precision {100 * self.precision:.2f}%")
        if self.auc is not None:
            parts.append(f"AUC {self.auc:.3f}, advantage {self.membership_advantage:.3f}, "
                         f"TPR@1%FPR {self.tpr_at_1pct_fpr:.3f}")
        if self.epsilon_lower_bound is not None:
            parts.append(f"empirical epsilon >= {self.epsilon_lower_bound:.3f}")
        parts.append(f"rounds used {self.rounds_used}")
        return parts

    def __repr__(self) -> str:
        """One line; the per-claim arrays stay behind their attributes."""
        return f"LeakageReport({self.attack or 'attack'}: {', '.join(self._headline())})"

    def summary(self) -> str:
        """A two-column table of every metric that applies (``None`` fields are left out)."""
        err = np.asarray(self.reconstruction_error, dtype=float)
        rows = [
            ("attack", self.attack or "-"),
            ("records recovered (exact)", f"{self.records_recovered} / {self.n_records}"
                                          f" ({100 * self.fraction_recovered:.2f}%)"),
            ("records recovered (approx)", f"{self.records_recovered_approx}"
                                           + (f" (tol {self.tol_approx:g})" if self.tol_approx is not None else "")),
            ("clients exposed", f"{100 * self.clients_exposed:.1f}% of {self.n_clients}"),
            ("claims", f"{self.n_claims}"),
        ]
        if err.size:
            rows.append(("reconstruction error", f"median {np.median(err):.3g}, max {err.max():.3g}"))
        for label, value, fmt in (("precision", self.precision, "{:.2%}"),
                                  ("membership advantage", self.membership_advantage, "{:.3f}"),
                                  ("AUC", self.auc, "{:.3f}"), ("TPR at 1% FPR", self.tpr_at_1pct_fpr, "{:.3f}"),
                                  ("empirical epsilon >=", self.epsilon_lower_bound, "{:.3f}")):
            if value is not None:
                rows.append((label, fmt.format(value)))
        rows.append(("rounds used", f"{self.rounds_used}"))
        rows += [(str(k), _short(v)) for k, v in self.extra.items()]
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def _short(v, limit: int = 60) -> str:
    """A value in one short cell: arrays by their shape, long text cut."""
    if isinstance(v, np.ndarray):
        return f"array{v.shape}"
    text = str(_jsonable(v))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def client_arrays(dataset, name: str = "dataset") -> list[np.ndarray]:
    """Per-client arrays of a FederatedDataset (``.clients``) or a list of 2-D arrays."""
    clients = getattr(dataset, "clients", dataset)
    if not isinstance(clients, (list, tuple)) or not clients:
        raise InputError(f"{name} must be a FederatedDataset or a non-empty list of client arrays.")
    out = []
    for i, X in enumerate(clients):
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise InputError(f"{name}: client {i} must be a 2-D array, got shape {X.shape}.")
        out.append(X)
    return out


def data_range(clients: list[np.ndarray]) -> float:
    """Largest per-feature range of the pooled data (the unit of the relative tolerance)."""
    nonempty = [X for X in clients if len(X)]
    pooled = np.vstack(nonempty)
    r = float(np.max(pooled.max(axis=0) - pooled.min(axis=0)))
    return r if r > 0 else 1.0


def score_reconstructions(
    claims,
    dataset,
    *,
    attack: str = "",
    targets=None,
    tol_exact: float = 1e-6,
    tol_approx: float | None = None,
    rounds_used: int = 0,
    extra: dict | None = None,
) -> LeakageReport:
    """Match claimed reconstructions to true records and build a :class:`LeakageReport`.

    ``claims``: iterable of ``(client, vector)``. Each claim is matched to the nearest true
    record of its client; a record counts as recovered (once) if some claim lies within
    ``tol_exact * range`` of it, where ``range`` is the largest per-feature range of the
    pooled data. ``targets``: client ids the attack aimed at (default: all clients).
    """
    clients = client_arrays(dataset)
    if not (isinstance(tol_exact, (int, float)) and tol_exact >= 0):
        raise InputError(f"tol_exact must be a non-negative number, got {tol_exact!r}.")
    if tol_approx is not None and not (isinstance(tol_approx, (int, float)) and tol_approx >= 0):
        raise InputError(f"tol_approx must be a non-negative number or None, got {tol_approx!r}.")
    n_clients = len(clients)
    if targets is None:
        targets = list(range(n_clients))
    targets = sorted({int(t) for t in targets})
    if any(t < 0 or t >= n_clients for t in targets):
        raise InputError(f"targets must be client ids in [0, {n_clients}), got {targets}.")
    scale = data_range(clients)
    by_client: dict[int, list[np.ndarray]] = {}
    for c, v in claims:
        c = int(c)
        if c < 0 or c >= n_clients:
            raise InputError(f"claims: client id {c} out of range [0, {n_clients}).")
        by_client.setdefault(c, []).append(np.asarray(v, dtype=np.float64).ravel())
    errors, exact_flags = [], []
    recovered = approx = 0
    exposed = 0
    target_set = set(targets)
    for c in sorted(by_client):
        V = np.vstack(by_client[c])
        X = clients[c]
        if V.shape[1] != X.shape[1]:
            raise InputError(f"claims for client {c} have {V.shape[1]} features, the data {X.shape[1]}.")
        if len(X) == 0:
            d = np.full(len(V), np.inf)
            nearest = np.zeros(len(V), dtype=int)
        else:
            D = sq_distances(V, X)
            nearest = np.argmin(D, axis=1)
            # recompute the winning distance directly (the expanded form loses precision)
            d = np.linalg.norm(V - X[nearest], axis=1)
        ok = d <= tol_exact * scale
        errors.append(d)
        exact_flags.append(ok)
        if c in target_set:
            rec = np.unique(nearest[ok]).size
            recovered += rec
            exposed += rec > 0
            if tol_approx is not None:
                approx += np.unique(nearest[d <= tol_approx * scale]).size
            else:
                approx += rec
    n_records = int(sum(len(clients[t]) for t in targets))
    err = np.concatenate(errors) if errors else np.zeros(0)
    flags = np.concatenate(exact_flags) if exact_flags else np.zeros(0, dtype=bool)
    return LeakageReport(
        attack=attack,
        n_records=n_records,
        n_clients=len(targets),
        n_claims=int(err.size),
        records_recovered=int(recovered),
        records_recovered_approx=int(approx),
        fraction_recovered=recovered / n_records if n_records else 0.0,
        clients_exposed=exposed / len(targets) if targets else 0.0,
        reconstruction_error=err,
        precision=float(flags.mean()) if flags.size else None,
        rounds_used=int(rounds_used),
        tol_exact=tol_exact,
        tol_approx=tol_approx,
        extra=dict(extra or {}),
    )
