"""Poisoning: malicious clients that lie about their own data to move the shared centres.

The attacks act only through :class:`~securefkm.federation.ClientPolicy` (the client-side
harness of the simulation): each malicious client computes its honest update and then
rewrites its sum-fields before its client-side layers (clipping, DP noise, encoding), so
the lie passes through every protection exactly as an honest update would. Fields are
found by their declared kind (:class:`~securefkm.messages.FieldSpec`): the ``count`` fields
and the ``sum`` fields ``weighted_by`` them, so the same attack runs on DWF, mini-batch, the
secure modes of the set-valued algorithms and FedAvg fuzzy c-means.

Attacks (``Poisoning(kind=...)``):

``"count-inflation"``
    adds ``amount`` (default 1e6) to the count of one cluster: a cluster weighted as if it
    held that many records, its mean pulled towards the liar's sum.
``"sum-scaling"``
    multiplies the coordinate sums by ``amount`` (default 1e4): centres thrown far out of
    the data's range.
``"inconsistent"``
    counts 0 and coordinate sums ``amount`` x the honest ones plus ``amount`` (default 100):
    a sum no record set could produce, over weights that say there is none.
``"adaptive"``
    stays inside every check a validating aggregator could make: counts are whole numbers in
    [0, n_i] (the client's own record count) summing to n_i, and each cluster's sum lies within
    count x the declared ``box``. The attacker knows the defence and maximises drift: all n_i
    records claimed for one target cluster, placed on the corner of the box farthest from that
    cluster's broadcast centre. Range checks and count caps cannot tell it from the truth.
``"robust-adaptive"``
    the strongest in-range attack on DWF's robust option (``aggregation="median"``): it knows
    the defence and that a median moves only by the rank of the votes added
    (:mod:`protocols.influence`), so it casts every vote it may (one per cluster and
    coordinate, whole counts: one record claimed in every other cluster, the rest in
    ``target``) in the extreme bin of the box on the side farthest from that cluster's
    broadcast centre, per coordinate, and places its sums on the same corner. With
    ``vote_weight="records"`` all its records vote in ``target``. Under the mean it acts as
    ``"adaptive"`` spread over every cluster.
``"vote-stuffing"``
    ``"robust-adaptive"`` with every vote weighing ``amount`` (default 100) instead of 1 (or
    its count): a malformed vote histogram. The median's bound assumes each client's votes in
    a row total at most 1 (its count with ``vote_weight="records"``); pairwise masking and
    Paillier carry whatever a client sends, and this kind shows what follows when nothing
    checks it.

``Poisoning(...).evaluate(estimator, data)`` refits the estimator's configuration with the
malicious clients (``n_malicious`` of them, drawn with ``random_state``, or ``clients=``) and
compares with the honest fit: the largest and mean displacement of the matched centres,
the utility (honest inertia over poisoned inertia on all records), the ARI of the poisoned
labels against the honest ones, which clients the protocol detected (faults), excluded
or saw refuse, and in how many rounds the malicious clients had a (count, sum) pair to rewrite
(``attacked_rounds``: 0 means the fit sends none, e.g. only ``value`` fields, and the attack
did nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securefkm.exceptions import InputError
from securefkm.federation import ClientPolicy
from securefkm.messages import Update

KINDS = ("count-inflation", "sum-scaling", "inconsistent", "adaptive", "robust-adaptive", "vote-stuffing")
_DEFAULT_AMOUNT = {"count-inflation": 1e6, "sum-scaling": 1e4, "inconsistent": 100.0, "adaptive": 0.0,
                   "robust-adaptive": 0.0, "vote-stuffing": 100.0}
_IN_RANGE = ("adaptive", "robust-adaptive", "vote-stuffing")  # the kinds that need the declared box


def _farthest_corners(ref: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Per row of ``ref``, the box corner farthest from it (ties: ``high``)."""
    return np.where(np.abs(ref - low) > np.abs(ref - high), low, high)


def _robust_lie(c, s, votes, n, j, low, high, ref, weight, scale=1.0):
    """``robust-adaptive``'s counts, sums and votes (in place), each vote times ``scale``
    (``vote-stuffing``); see the module docstring."""
    k = len(c)
    corners = _farthest_corners(ref, low, high)  # (k, d)
    c[:] = 0.0
    if weight == "records" or n < k:
        c[j] = round(n)
    else:
        c[:] = 1.0
        c[j] = round(n) - (k - 1)
    s[:] = c[:, None] * corners
    if votes is not None:
        bins = votes.shape[-1]
        votes[:] = 0.0
        side = np.where(corners == high, bins - 1, 0)  # the extreme bin on the far side
        rows = np.flatnonzero(c > 0)
        w = np.ones(rows.size) if weight == "client" else c[rows]
        votes[rows[:, None], np.arange(votes.shape[1])[None, :], side[rows]] = scale * w[:, None]


def _pairs(specs):
    """(count field, sum field) pairs of a round's specs: the sums declared ``weighted_by`` a count."""
    by_name = {s.name: s for s in specs}
    out = []
    for s in specs:
        w = by_name.get(getattr(s, "weighted_by", None) or "")
        if s.kind == "sum" and w is not None and w.kind == "count" and len(s.shape) == 2:
            out.append((w.name, s.name))
    return out


class PoisoningPolicy(ClientPolicy):
    """A malicious client's rewrite of its (count, sum) fields; see the module docstring."""

    def __init__(self, kind: str, amount: float | None = None, box=None, target: int = 0, actions=None):
        if kind not in KINDS:
            raise InputError(f"kind={kind!r}: choose one of {', '.join(KINDS)}.")
        if actions is not None and (isinstance(actions, str) or not all(isinstance(a, str) for a in actions)):
            raise InputError(f"actions={actions!r}: pass None (every round) or a tuple of broadcast actions, "
                             "e.g. ('train',).")
        self.actions = None if actions is None else tuple(actions)
        self.kind = kind
        self.amount = float(_DEFAULT_AMOUNT[kind] if amount is None else amount)
        self.box = box
        self.target = int(target)

    def update(self, update, ctx):
        rc = ctx.round_context
        pairs = _pairs(getattr(rc, "specs", ()) or ())
        if not pairs or not update.sums or (self.actions is not None and getattr(rc, "action", None) not in self.actions):
            return update
        sums = {k: np.array(v, dtype=np.float64, copy=True) for k, v in update.sums.items()}
        n_records = float(getattr(getattr(ctx.client, "context", None), "n_records", 0) or 0)
        broadcast = getattr(rc, "broadcast", None)
        centres = getattr(broadcast, "centres", None)
        weight = (getattr(broadcast, "params", None) or {}).get("vote_weight", "client")
        for count, total in pairs:
            if count not in sums or total not in sums:
                continue
            c, s = sums[count], sums[total]
            j = self.target % len(c)
            if self.kind == "count-inflation":
                c[j] += self.amount
            elif self.kind == "sum-scaling":
                s *= self.amount
            elif self.kind == "inconsistent":
                c[:] = 0.0
                s[:] = s * self.amount + self.amount
            else:  # in range: the declared box, the broadcast centres
                low, high = self.box
                d = s.shape[1]
                low, high = np.broadcast_to(np.asarray(low, float), (d,)), np.broadcast_to(np.asarray(high, float), (d,))
                n = n_records if n_records > 0 else float(c.sum())
                refs = (np.asarray(centres, float) if centres is not None and np.shape(centres) == s.shape
                        else np.broadcast_to((low + high) / 2, s.shape))
                if self.kind in ("robust-adaptive", "vote-stuffing"):
                    votes = sums.get("votes")
                    _robust_lie(c, s, votes if votes is not None and votes.shape[:2] == s.shape else None,
                                n, j, low, high, refs, weight,
                                self.amount if self.kind == "vote-stuffing" else 1.0)
                    sums[count], sums[total] = c, s
                    continue
                ref = (np.asarray(centres, float)[j] if centres is not None and np.ndim(centres) == 2
                       else (low + high) / 2)
                corner = _farthest_corners(ref, low, high)  # adaptive: all records on one corner
                c[:] = 0.0
                s[:] = 0.0
                c[j] = round(n)
                s[j] = c[j] * corner
            sums[count], sums[total] = c, s
        return Update(sums=sums, items=update.items)


@dataclass
class PoisoningReport:
    """What ``m`` malicious clients did to the fit, against the honest fit of the same configuration."""

    kind: str
    malicious: tuple[int, ...]
    honest_centres: np.ndarray
    poisoned_centres: np.ndarray
    displacement_max: float  #: largest distance between matched honest and poisoned centres
    displacement_mean: float
    utility: float  #: honest inertia / poisoned inertia on all records (1: no damage)
    ari: float  #: poisoned labels against honest labels on all records
    detected: tuple[int, ...] = ()  #: clients with a fault in any round (the protocol named them)
    excluded: tuple[int, ...] = ()
    refused: tuple[int, ...] = ()  #: clients whose message a check or their own encoder refused
    #: rounds of the poisoned fit that declared a (count, sum) pair the malicious clients lied in
    #: (``actions`` permitting); 0: the attack had nothing to rewrite and the fit is the honest one
    attacked_rounds: int = 0

    def summary(self) -> str:
        return (f"poisoning {self.kind!r} by {len(self.malicious)} client(s) {list(self.malicious)}: centres moved "
                f"up to {self.displacement_max:.4g} (mean {self.displacement_mean:.4g}), utility {self.utility:.3f}, "
                f"ARI vs honest {self.ari:.3f}; detected {list(self.detected)}, excluded {list(self.excluded)}, "
                f"refused {list(self.refused)}; lied in {self.attacked_rounds} round(s)")


class Poisoning:
    """``m`` malicious clients run :class:`PoisoningPolicy` ``kind``; see the module docstring.

    ``box``: the declared data box the adaptive attacker stays inside (default: the
    estimator's ``init_bounds`` or its GaussianDP ``bounds``).
    """

    def __init__(self, kind: str = "adaptive", n_malicious: int = 1, *, amount: float | None = None, box=None,
                 target: int = 0, clients=None, random_state: int | None = 0, actions=None):
        PoisoningPolicy(kind, amount, box, target, actions)  # checks kind and actions
        self.actions = actions
        if clients is None and (not isinstance(n_malicious, (int, np.integer)) or n_malicious < 1):
            raise InputError(f"n_malicious={n_malicious!r}: pass a positive int (or clients=[ids]).")
        self.kind, self.n_malicious, self.amount, self.box, self.target = kind, n_malicious, amount, box, target
        self.clients = None if clients is None else tuple(int(c) for c in clients)
        self.random_state = random_state

    def _box(self, estimator):
        if self.box is not None:
            return self.box
        box = getattr(estimator, "init_bounds", None)
        if box is None:
            for layer in getattr(estimator, "protection", None) or ():
                declared = layer.declared_domain() if hasattr(layer, "declared_domain") else None
                box = declared if declared is not None else box
        if box is None and self.kind in _IN_RANGE:
            raise InputError(f"Poisoning(kind={self.kind!r}) needs the declared box: pass box=(low, high), or fit the "
                             "estimator with init_bounds=(low, high).")
        return box

    def malicious(self, n_clients: int) -> tuple[int, ...]:
        if self.clients is not None:
            bad = [c for c in self.clients if not 0 <= c < n_clients]
            if bad:
                raise InputError(f"clients={list(self.clients)}: ids {bad} are outside 0..{n_clients - 1}.")
            return self.clients
        if self.n_malicious >= n_clients:
            raise InputError(f"n_malicious={self.n_malicious} leaves no honest client among {n_clients}.")
        rng = np.random.default_rng(self.random_state)
        return tuple(sorted(int(c) for c in rng.choice(n_clients, self.n_malicious, replace=False)))

    def evaluate(self, estimator, data) -> PoisoningReport:
        import warnings

        from sklearn.base import clone
        from sklearn.metrics import adjusted_rand_score

        from securefkm.kernels import assign

        from .report import client_arrays

        clients = client_arrays(data, "data")
        honest = getattr(estimator, "cluster_centers_", None)
        if honest is None:
            raise InputError("estimator: not fitted; fit it on data first (it is the honest reference).")
        malicious = self.malicious(len(clients))
        policy = PoisoningPolicy(self.kind, self.amount, self._box(estimator), self.target, self.actions)
        poisoned_est = clone(estimator)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            poisoned_est.fit(clients, client_policies={c: policy for c in malicious})
        poisoned = poisoned_est.cluster_centers_
        X = np.vstack(clients)
        lab_h, d_h = assign(X, honest)
        lab_p, d_p = assign(X, poisoned)
        moved = _matched_distances(honest, poisoned)
        t = poisoned_est.transcript_
        detected = sorted({c for r in t for c in (r.faults or {})})
        refused = sorted({c for r in t for s in r.stages for c in (s.refused or {})})
        excluded = sorted(getattr(poisoned_est, "excluded_clients_", None) or [])
        attacked = sum(1 for r in t if _pairs(getattr(r, "specs", ()) or ())
                       and (self.actions is None or getattr(r, "action", None) in self.actions))
        return PoisoningReport(
            kind=self.kind, malicious=malicious, honest_centres=np.asarray(honest), poisoned_centres=poisoned,
            displacement_max=float(moved.max()), displacement_mean=float(moved.mean()),
            utility=float(np.sum(d_h) / max(np.sum(d_p), 1e-300)), ari=float(adjusted_rand_score(lab_h, lab_p)),
            detected=tuple(detected), excluded=tuple(excluded), refused=tuple(refused), attacked_rounds=attacked,
        )


def _matched_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distances between the centres of ``a`` and ``b`` matched one to one (Hungarian)."""
    from scipy.optimize import linear_sum_assignment

    cost = np.linalg.norm(np.asarray(a)[:, None, :] - np.asarray(b)[None, :, :], axis=2)
    rows, cols = linear_sum_assignment(cost)
    return cost[rows, cols]


def figures(protections=("none", "masking"), m_values=(1, 5), random_state: int = 0,
            kinds=tuple(k for k in KINDS if k != "vote-stuffing")) -> list[dict]:
    """The table of docs/attacks/poisoning.md: DWF (k=5, the mean) on the non-IID DWF blob set
    (100 clients), every attack kind with ``m`` malicious clients under each protection
    (``vote-stuffing`` acts as ``robust-adaptive`` on a fit without votes: left out)."""
    import warnings

    from securefkm.datasets import load_dataset
    from securefkm.registry import make_estimator

    data = load_dataset("dwf-blobs", split="non-iid", random_state=random_state)  # a reproducible split
    rows = []
    for prot in protections:
        # one data-independent start for every protection: the rows differ only by the attack
        est = make_estimator("dwf", n_clusters=5, init="uniform", init_bounds=(-2.0, 2.0), random_state=random_state,
                             crypto="ideal", protection=[] if prot == "none" else [prot])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(data)
        for kind in kinds:
            for m in m_values:
                r = Poisoning(kind, m, random_state=random_state).evaluate(est, data)
                rows.append({"protection": prot, "kind": kind, "m": m, "displacement_max": r.displacement_max,
                             "utility": r.utility, "ari": r.ari, "detected": len(r.detected) + len(r.excluded)})
    return rows


if __name__ == "__main__":  # python -m attacks.poisoning: the docs' table
    print("| protection | attack | malicious | largest centre move | utility | ARI vs honest | detected |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in figures():
        print(f"| {row['protection']} | {row['kind']} | {row['m']} | {row['displacement_max']:.3g} | "
              f"{row['utility']:.3f} | {row['ari']:.3f} | {row['detected']} |")
