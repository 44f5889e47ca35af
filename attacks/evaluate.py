"""One entry point for every attack: ``attacks.evaluate(attack, estimator, data)``.

The attacks take different first arguments: a passive attack reads the fit's transcript
(``attack.evaluate(estimator.transcript_, data)``), an active one re-runs the federation
with a malicious server (``attack.evaluate(estimator, data)``), membership inference reads
the released centres and needs candidate records known to be in and out of the training
data. :func:`evaluate` takes a fitted estimator and the data it was fitted on for all of
them and makes the right call; :func:`membership_candidates` builds the two candidate sets
from the training data and records held out of the fit, and :func:`hold_out` makes that
split before the fit.

This module imports numpy and the attacks only when called, so ``import attacks`` stays fast.
"""

from __future__ import annotations

from securefkm.exceptions import InputError

#: keyword arguments :func:`evaluate` reads for :class:`~attacks.membership.MembershipInference`
_MEMBERSHIP_KW = ("candidates_in", "candidates_out", "held_out", "n", "random_state", "fit")


def _kinds():
    """(passive attack classes, active attack classes, the membership attack class)."""
    from .active import CraftedCentroids
    from .fuzzy import FuzzyEquationSolver
    from .membership import MembershipInference
    from .passive import AggregateDifferencing, Differencing, SmallClusterDisclosure
    from .poisoning import Poisoning

    # ModelInconsistency, ActiveAggregateDifferencing and Sybil subclass CraftedCentroids; Poisoning
    # refits with malicious clients, called the same way
    return (SmallClusterDisclosure, Differencing, AggregateDifferencing, FuzzyEquationSolver), \
        (CraftedCentroids, Poisoning), MembershipInference


def _check_fitted(estimator):
    if not hasattr(estimator, "_make_algorithm") or not hasattr(estimator, "get_params"):
        raise InputError(
            f"estimator must be a fitted securefkm estimator (e.g. WeightedFederatedKMeans(...).fit(data)), "
            f"got {type(estimator).__name__}."
        )
    if getattr(estimator, "cluster_centers_", None) is None or getattr(estimator, "transcript_", None) is None:
        raise InputError(
            f"estimator: this {type(estimator).__name__} is not fitted; call estimator.fit(data) first "
            "with the data passed here."
        )


def _check_data(estimator, data):
    from .report import client_arrays

    clients = client_arrays(data, "data")
    d = getattr(estimator, "n_features_in_", None)
    if d is not None and clients[0].shape[1] != d:
        raise InputError(
            f"data: the clients' records have {clients[0].shape[1]} features, the estimator was fitted on {d}; "
            "pass the data the estimator was fitted on."
        )
    return clients


def evaluate(attack, estimator, data, **kw):
    """Run ``attack`` against a fitted ``estimator`` and return the attack's own report.

    Parameters
    ----------
    attack : an attack of this library
        Passive (``SmallClusterDisclosure``, ``Differencing``, ``AggregateDifferencing``,
        ``FuzzyEquationSolver``): run on ``estimator.transcript_``. Active
        (``CraftedCentroids``, ``ModelInconsistency``, ``ActiveAggregateDifferencing``,
        ``Sybil``): run with the estimator's algorithm and protection and the attack's
        malicious server. ``MembershipInference``: run on ``estimator.cluster_centers_``.
    estimator : a fitted securefkm estimator
    data : FederatedDataset or list of per-client arrays
        The data the estimator was fitted on (the attacks score their claims against it).
    **kw
        Only for ``MembershipInference``: either ``held_out=`` (records kept out of the
        fit; the candidates are built by :func:`membership_candidates`, with its ``n=`` and
        ``random_state=``), or ``candidates_in=`` and ``candidates_out=`` directly; and
        ``fit=`` (LiRA's shadow-fit factory).

    Returns
    -------
    LeakageReport
        What ``attack.evaluate(...)`` called directly returns.

    Raises
    ------
    InputError
        ``attack`` is not an attack of this library, ``estimator`` is not fitted, ``data``
        is not client data of the estimator's feature count, or the keyword arguments do
        not fit the attack.
    """
    passive, active, membership = _kinds()
    if not isinstance(attack, (*passive, *active, membership)):
        known = ", ".join(c.__name__ for c in (*passive, *active, membership))
        raise InputError(
            f"attack must be an attack object of this library ({known}, or their subclasses), "
            f"got {type(attack).__name__}."
        )
    _check_fitted(estimator)
    _check_data(estimator, data)
    if isinstance(attack, membership):
        return _membership(attack, estimator, data, kw)
    if kw:
        raise InputError(f"{type(attack).__name__} takes no keyword arguments here, got {', '.join(sorted(kw))} "
                         "(set the attack's options on the attack object).")
    if isinstance(attack, passive):
        return attack.evaluate(estimator.transcript_, data)
    return attack.evaluate(estimator, data)


def _membership(attack, estimator, data, kw):
    unknown = sorted(set(kw) - set(_MEMBERSHIP_KW))
    if unknown:
        raise InputError(f"MembershipInference: unknown keyword argument(s) {', '.join(unknown)}; "
                         f"known: {', '.join(_MEMBERSHIP_KW)}.")
    given = [k for k in ("candidates_in", "candidates_out") if k in kw]
    if "held_out" in kw:
        if given:
            raise InputError("MembershipInference: pass held_out= or candidates_in= and candidates_out=, not both.")
        cin, cout = membership_candidates(data, kw["held_out"], n=kw.get("n"), random_state=kw.get("random_state"))
    elif len(given) == 2:
        extra = [k for k in ("n", "random_state") if k in kw]
        if extra:
            raise InputError(f"MembershipInference: {', '.join(extra)} apply only with held_out=.")
        cin, cout = kw["candidates_in"], kw["candidates_out"]
    else:
        raise InputError(
            "MembershipInference needs candidate records: held_out=<records kept out of the fit> "
            "(attacks.hold_out makes the split; attacks.membership_candidates builds both sets), or "
            "candidates_in= and candidates_out=."
        )
    return attack.evaluate(estimator, data, cin, cout, fit=kw.get("fit"))


def membership_candidates(data, held_out, *, n: int | None = None, random_state=None):
    """``(candidates_in, candidates_out)`` for :class:`~attacks.membership.MembershipInference`.

    ``candidates_out`` are records of ``held_out`` (never seen by the fit), ``candidates_in``
    as many records of the training ``data`` drawn at random without replacement.

    Parameters
    ----------
    data : FederatedDataset or list of per-client arrays
        The training data (the fit's clients).
    held_out : array of shape (m, d), list of arrays or FederatedDataset
        Records of the same distribution kept out of the fit (:func:`hold_out`).
    n : int or None
        Candidates per side: at most ``n`` records of each (the held-out ones drawn at
        random too); None: every held-out record, and as many members.
    random_state : int, Generator or None
        Draws the members (then, with ``n``, the held-out subset).
    """
    import numpy as np

    from securefkm.validation import check_random_state

    from .report import client_arrays

    pooled = np.vstack(client_arrays(data, "data"))
    held = _records(held_out, pooled.shape[1])
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1):
        raise InputError(f"n must be an int >= 1 or None, got {n!r}.")
    rng = check_random_state(random_state)
    n_out = len(held) if n is None else min(int(n), len(held))
    members = pooled[rng.choice(len(pooled), size=min(n_out, len(pooled)), replace=False)]
    if n_out < len(held):
        held = held[np.sort(rng.choice(len(held), size=n_out, replace=False))]
    return members, held


def _records(held_out, d):
    import numpy as np

    rows = getattr(held_out, "clients", held_out)
    try:
        if isinstance(rows, (list, tuple)) and rows and all(np.ndim(x) == 2 for x in rows):
            held = np.vstack([np.asarray(x, dtype=np.float64) for x in rows])
        else:
            held = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError("held_out must be a 2-D array of records, a list of them or a FederatedDataset.") from None
    if held.ndim != 2 or held.shape[0] == 0 or held.shape[1] != d or not np.all(np.isfinite(held)):
        raise InputError(f"held_out must hold finite records of shape (m, {d}) with m >= 1, got shape {held.shape}.")
    return held


def split_held_out(clients, labels, rng, fraction: float = 0.1):
    """(training clients, their labels or None, held-out records): about ``fraction`` of each
    client's records (never its last) drawn out with ``rng``."""
    import numpy as np

    out, out_y, held = [], [], []
    for i, X in enumerate(clients):
        X = np.asarray(X, dtype=np.float64)
        take = rng.random(len(X)) < fraction
        if take.all():
            take[rng.integers(len(X))] = False
        out.append(X[~take])
        held.append(X[take])
        if labels is not None:
            out_y.append(np.asarray(labels[i])[~take])
    return out, (out_y if labels is not None else None), np.vstack(held)


def hold_out(data, fraction: float = 0.1, *, random_state=None):
    """``(training FederatedDataset, held-out records)``: about ``fraction`` of every client's
    records (never a client's last) kept out of the fit, the non-members of
    :func:`membership_candidates`. Labels, client ids and the name follow the training part."""
    from securefkm.datasets import FederatedDataset
    from securefkm.validation import check_random_state

    from .report import client_arrays

    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise InputError(f"fraction must be a number in (0, 1), got {fraction!r}.")
    clients = client_arrays(data, "data")
    labels = getattr(data, "labels", None)
    train, train_y, held = split_held_out(clients, labels, check_random_state(random_state), fraction)
    if len(held) == 0:
        raise InputError(f"hold_out: no record was held out at fraction={fraction}; use a larger fraction.")
    return FederatedDataset(train, labels=train_y, client_ids=getattr(data, "client_ids", None),
                            name=getattr(data, "name", None)), held
