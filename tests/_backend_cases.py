"""Fits compared across backends (tests/test_backends.py, tests/test_backends_ray.py).

Each case is a fit on fixed seeds; :func:`outcome` reduces it to what must not depend on
where the clients run: the centres, everything the server obtained per round (what the
attacks read: sampled clients, broadcasts, contributors, aggregate, set-fields, centres,
per-stage dropouts and refusals, the abort message), the privacy spent and the passive
attacks' reports. Masked vectors and ciphertexts are fresh OS randomness on every run, on
every backend, so they are not compared; what they decode to is.
"""

from __future__ import annotations

import warnings

import numpy as np
import phe
from sklearn.datasets import make_blobs

from attacks import AggregateDifferencing, Differencing, SmallClusterDisclosure
from protocols import GaussianDP, KeyAuthority, Paillier, PairwiseMasking
from protocols.validated import ValidatedAggregation
from securefkm.datasets import FederatedDataset
from securefkm.exceptions import RoundAbortedError
from securefkm.registry import make_estimator

BOX = (-2.0, 7.0)


def make_clients(n_clients=12, n=360):
    X, _ = make_blobs(n, centers=[[0, 0], [5, 5], [0, 5]], cluster_std=0.6, random_state=1)
    parts = np.array_split(np.random.default_rng(1).permutation(len(X)), n_clients)
    return [X[p] for p in parts]


_KEYPAIR = []


def keypair():
    if not _KEYPAIR:
        _KEYPAIR.append(phe.generate_paillier_keypair(n_length=1024))  # test-only size
    return _KEYPAIR[0]


def seeded_dp_available() -> bool:
    try:
        GaussianDP(1.0, 1e-5, bounds=BOX, mode="distributed", rng="seeded")
    except TypeError:
        return False
    return True


#: name -> (estimator, params, protection factory, dropout_rate, expect an abort)
CASES = {
    "dwf-plain": ("dwf", {}, lambda: [], 0.2, False),
    "dwf-masking-dropouts": (
        "dwf", {}, lambda: [PairwiseMasking()],
        {1: {"masked_input": [3], "update": [7]}, 2: {"share": [0, 11]}, 3: {"unmask": [5]}}, False),
    "dwf-sparse-masking-rate": ("dwf", {}, lambda: [PairwiseMasking(graph="sparse", neighbours=4)], 0.1, False),  # aborts retried
    "kfed-plain-set-fields": ("kfed", {}, lambda: [], 0.15, False),
    "kfed-secure-masking": ("kfed", {"secure_mode": True}, lambda: [PairwiseMasking()], {2: [4]}, False),
    "dwf-paillier": (
        "dwf", {}, lambda: [Paillier(authority=KeyAuthority(*keypair(), min_clients=3, allow_weak_key=True),
                                     min_clients=3)], {1: [2]}, False),
    "dwf-masking-threshold-abort": (
        # the aborted round is retried: both backends abort it and then agree
        "dwf", {}, lambda: [PairwiseMasking()], {2: {"unmask": [0, 1, 2, 3, 4, 5, 6]}}, False),
    "dwf-dp-seeded-masking": (  # one data domain: DP's bounds also serve the start
        "dwf", {"init_bounds": (-5.0, 10.0)}, lambda: [GaussianDP(2.0, 1e-5, bounds=(-5.0, 10.0), mode="distributed", rng="seeded", min_clients=8),
                      PairwiseMasking()],
        {1: {"masked_input": [2]}, 3: [6]}, False),
    "dwf-validated-dp-seeded": (  # Prio3 reports, the Helper's noise, a dropped report
        "dwf", {"init_bounds": (-5.0, 10.0)},
        lambda: [GaussianDP(2.0, 1e-5, mode="central", rng="seeded"), ValidatedAggregation()],
        {1: {"validated_input": [4]}, 2: [9]}, False),
}


def _arrays(d):
    return {k: np.asarray(v).tobytes() for k, v in sorted((d or {}).items())}


def released(transcript):
    """What the server obtained per round, in comparable form."""
    return [
        (
            r.run, r.round, r.action, tuple(r.sampled),
            tuple(sorted((c, b.digest()) for c, b in r.broadcasts.items())),
            tuple(r.contributors), _arrays(r.aggregate),
            {c: _arrays(v) for c, v in sorted(r.items.items())},
            None if r.centres_after is None else r.centres_after.tobytes(),
            r.aborted,
            tuple((s.stage, tuple(sorted(s.sent)), tuple(sorted(s.dropped)), tuple(sorted(s.refused.items())))
                  for s in r.stages),
            {c: _arrays(v) for c, v in r.plain_sums().items()},
        )
        for r in transcript
    ]


def outcome(case, backend, *, n_workers=2, clients=None, max_rounds=5, seed=0, data=None, **extra):
    """Fit ``case`` on ``backend``; everything that must not depend on the backend.
    ``data``: the records the attacks' reports read (default: ``clients``); ``extra``:
    further estimator parameters."""
    name, params, protection, dropout, _ = CASES[case]
    clients = make_clients() if clients is None else clients
    params = {"init_bounds": BOX, **params, **extra}
    est = make_estimator(name, n_clusters=3, protection=protection(), random_state=seed,
                         max_rounds=max_rounds, dropout_rate=dropout, backend=backend, n_workers=n_workers, **params)
    fed, _ = est.make_federation(clients)
    error, state = None, None
    with fed, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            state = fed.run(0)
        except RoundAbortedError as exc:
            error = (type(exc).__name__, exc.round, exc.stage, str(exc))
    data = FederatedDataset(clients) if data is None else data
    return {
        "error": error,
        "centres": None if state is None else np.asarray(state.centres).tobytes(),
        "released": released(fed.transcript),
        "privacy": fed.privacy_spent(),
        "aborts": [(a.round, a.attempt, a.cause, a.stage) for a in fed.transcript.aborts],
        "reports": [repr(a.evaluate(fed.transcript, data).to_dict())
                    for a in (SmallClusterDisclosure(), Differencing(), AggregateDifferencing())],
    }
