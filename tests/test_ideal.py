"""``crypto="ideal"`` releases exactly what the real protocol releases.

Over a matrix -- every algorithm that runs under a secure aggregator; pairwise masking on the
complete graph, the sparse graph, with signed keys and the consistency check, with a lower
threshold; Paillier; no dropouts, dropouts at every protocol stage, dropouts heavy enough to
abort -- the same seeds give, under the real protocol and under its ideal functionality, the
same outcome: bit-identical aggregates, contributors, centres and set-fields in every round,
the same clients dropped and refused at every stage, and the same aborts (stage and reason).
Passive and active attacks report the same on both. The one deliberate difference: an abort
on the check slot cannot quote the random value the real check slot read.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import phe
import pytest
from sklearn.datasets import make_blobs

from attacks import (
    AggregateDifferencing,
    CraftedCentroids,
    Differencing,
    ModelInconsistency,
    SmallClusterDisclosure,
)
from protocols import GaussianDP, KeyAuthority, Paillier, PairwiseMasking
from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.registry import make_estimator

BOX = (-2.0, 7.0)
ALGOS = {
    "dwf": ("dwf", {}),
    "ewf": ("ewf", {}),
    "minibatch": ("minibatch", {}),
    "aligning-secure": ("aligning", {"secure_mode": True}),
    "kfed-secure": ("kfed", {"secure_mode": True}),
    "child-parent-secure": ("child-parent", {"secure_mode": True}),
    "fcm-secure": ("fcm", {"secure_mode": True}),
    "fcm-fedavg": ("fcm-fedavg", {}),
}


@pytest.fixture(scope="module")
def keypair():
    return phe.generate_paillier_keypair(n_length=1024)  # test-only size


def aggregators(keypair):
    return {
        "masking": lambda: [PairwiseMasking()],
        "masking-sparse": lambda: [PairwiseMasking(graph="sparse", neighbours=4)],
        "masking-signed": lambda: [PairwiseMasking(sign_keys=True)],
        "masking-t0.5": lambda: [PairwiseMasking(threshold=0.5, allow_insecure_threshold=True)],
        "paillier": lambda: [Paillier(authority=KeyAuthority(*keypair, min_clients=3, allow_weak_key=True),
                                      min_clients=3)],
    }


@pytest.fixture(scope="module")
def clients():
    X, _ = make_blobs(360, centers=[[0, 0], [5, 5], [0, 5]], cluster_std=0.6, random_state=1)
    parts = np.array_split(np.random.default_rng(1).permutation(len(X)), 12)
    return [X[p] for p in parts]


def _normalise(reason):
    return None if reason is None else re.sub(r"check slot (reads \d+ instead of|does not read) the", "check slot ~", reason)


def _arrays(d):
    return {k: np.asarray(v).tobytes() for k, v in sorted((d or {}).items())}


def released(transcript):
    """Everything the server obtained, in comparable form (not the protocol's own messages)."""
    out = []
    for r in transcript:
        out.append((
            r.run, r.round, r.action, tuple(r.sampled),
            tuple(sorted((c, b.digest()) for c, b in r.broadcasts.items())),
            tuple(r.contributors), _arrays(r.aggregate),
            {c: _arrays(v) for c, v in sorted(r.items.items())},
            None if r.centres_after is None else r.centres_after.tobytes(),
            _normalise(r.aborted),
            tuple((s.stage, tuple(sorted(s.dropped)), tuple(sorted(s.refused))) for s in r.stages),
            {c: _arrays(v) for c, v in r.plain_sums().items()},
        ))
    return out


def run(algo, make, clients, crypto, *, dropout=None, seed=0, max_rounds=5, init_bounds=BOX):
    name, params = ALGOS[algo]
    est = make_estimator(name, n_clusters=3, protection=make(), random_state=seed, init_bounds=init_bounds,
                         max_rounds=max_rounds, dropout_rate=dropout, crypto=crypto, **params)
    fed, _ = est.make_federation(clients)
    error = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            state = fed.run(0)
        except RoundAbortedError as exc:
            error, state = (type(exc).__name__, exc.stage, _normalise(str(exc))), None
    centres = None if state is None else np.asarray(state.centres).tobytes()
    aborts = [(a.round, a.attempt, a.cause, a.stage, a.released) for a in fed.transcript.aborts]
    return {"error": error, "centres": centres, "released": released(fed.transcript),
            "privacy": fed.privacy_spent(), "crypto": fed.transcript.meta["crypto"], "aborts": aborts}


SLOW = {"aligning-secure", "fcm-secure"}  # same secure-sum path as kfed-secure, many more rounds


@pytest.mark.parametrize("algo", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW else a for a in sorted(ALGOS)])
def test_ideal_equals_real_over_the_matrix(algo, clients, keypair):
    outcomes = {"completed": 0, "aborted": 0}
    for agg, make in aggregators(keypair).items():
        # heavy dropouts abort masking rounds; under Paillier (no threshold beyond min_clients)
        # they make the secure server k-means of the set-field algorithms wander for its whole
        # round cap, which costs minutes of real Paillier and shows nothing new
        heavy = () if agg == "paillier" else ((0.3, 3),)
        for dropout, seed in ((None, 0), (0.12, 1), (0.12, 2), *heavy):
            real = run(algo, make, clients, "real", dropout=dropout, seed=seed)
            ideal = run(algo, make, clients, "ideal", dropout=dropout, seed=seed)
            assert (real["crypto"], ideal["crypto"]) == ("real", "ideal")
            for key in ("error", "centres", "privacy", "released", "aborts"):
                assert real[key] == ideal[key], (algo, agg, dropout, key)
            assert not any(r[-1] for r in ideal["released"]), "the ideal server saw a plain client sum"
            # an aborted round is retried: count fits that had an aborted attempt
            outcomes["aborted" if real["error"] or real["aborts"] else "completed"] += 1
    # the matrix exercised both outcomes
    assert outcomes["completed"] >= 5 and outcomes["aborted"] >= 1, outcomes


def test_dropouts_at_every_stage_are_exercised(clients, keypair):
    """Scheduled dropouts at each masking stage (with and without the consistency check):
    same survivors, refusals and release."""
    stages = ("advertise", "share", "masked_input", "consistency_check", "unmask")
    for graph in ({}, {"graph": "sparse", "neighbours": 4}):
        for stage in stages:
            for who in ([3], [0, 5, 7], [1, 2, 4, 6, 8]):
                def make(graph=graph):
                    return [PairwiseMasking(sign_keys=True, **graph)]
                sched = {1: {stage: who}, 2: {"update": [9], stage: who[:1]}}
                real = run("dwf", make, clients, "real", dropout=sched, seed=4)
                ideal = run("dwf", make, clients, "ideal", dropout=sched, seed=4)
                assert real == {**ideal, "crypto": "real"}, (graph, stage, who)


def test_sparse_graph_refusals_match(clients):
    """On a sparse graph with a high threshold some clients refuse (too few neighbours
    survived): the ideal functionality drops the very same clients."""
    make = lambda: [PairwiseMasking(graph="sparse", neighbours=4, threshold=4)]  # noqa: E731
    refused_any = False
    for seed in range(6):
        real = run("dwf", make, clients, "real", dropout=0.2, seed=seed)
        ideal = run("dwf", make, clients, "ideal", dropout=0.2, seed=seed)
        assert real == {**ideal, "crypto": "real"}, seed
        refused_any |= any(refused for r in real["released"] for (_, _, refused) in r[-2])
    assert refused_any


def test_passive_attack_reports_are_equal(clients):
    from securefkm.datasets import FederatedDataset

    data = FederatedDataset(clients)
    for make in (lambda: [PairwiseMasking()], lambda: [PairwiseMasking(graph="sparse", neighbours=4)]):
        reports = {}
        for crypto in ("real", "ideal"):
            est = make_estimator("dwf", n_clusters=3, protection=make(), random_state=0, init_bounds=BOX,
                                 max_rounds=6, crypto=crypto, dropout_rate={2: [0], 4: [5]}).fit(clients)
            reports[crypto] = [repr(a.evaluate(est.transcript_, data).to_dict())
                               for a in (SmallClusterDisclosure(), Differencing(), AggregateDifferencing())]
        assert reports["real"] == reports["ideal"]


@pytest.mark.parametrize("attack", [CraftedCentroids, ModelInconsistency])
@pytest.mark.parametrize("layer", ["masking", "paillier"])
def test_active_attack_reports_are_equal(attack, layer, clients, keypair):
    """Active attacks (crafted centres; different broadcasts to different clients, caught by
    the binding / the authority's ticket) report the same, aborts included."""
    from securefkm.datasets import FederatedDataset

    data = FederatedDataset(clients[:6])
    make = aggregators(keypair)[layer]
    reports = {}
    for crypto in ("real", "ideal"):
        est = make_estimator("dwf", n_clusters=3, protection=make(), random_state=0, init_bounds=BOX,
                             max_rounds=4, crypto=crypto)
        rep = attack(target=0, max_rounds=4, random_state=0).evaluate(est, data).to_dict()
        rep["extra"] = {k: v for k, v in rep.get("extra", {}).items() if k != "abort_reasons"} | {
            "abort_reasons": [_normalise(r) for r in rep.get("extra", {}).get("abort_reasons", [])]}
        reports[crypto] = repr(rep)
    assert reports["real"] == reports["ideal"]
    if attack is ModelInconsistency:
        assert "'detected': True" in reports["ideal"]


def test_distributed_dp_real_equals_ideal(clients):
    """Distributed noise is drawn by the clients; with the seeded noise stream both runs add
    the same noise, so even the noisy release is bit-identical."""
    try:
        GaussianDP(1.0, 1e-5, bounds=BOX, mode="distributed", rng="seeded")
    except TypeError:
        pytest.skip("GaussianDP(rng='seeded') is not available")
    make = lambda: [GaussianDP(2.0, 1e-5, bounds=(-4.0, 9.0), mode="distributed", rng="seeded"), PairwiseMasking()]  # noqa: E731
    for dropout, seed in ((None, 0), (0.1, 1)):
        # the domain is declared once, on GaussianDP (a different init_bounds would be refused)
        real = run("dwf", make, clients, "real", dropout=dropout, seed=seed, init_bounds=None)
        ideal = run("dwf", make, clients, "ideal", dropout=dropout, seed=seed, init_bounds=None)
        assert real == {**ideal, "crypto": "real"}
        assert real["privacy"] is not None


def test_crypto_argument_is_checked(clients):
    est = make_estimator("dwf", n_clusters=3, protection=[PairwiseMasking()], init_bounds=BOX, crypto="fake")
    with pytest.raises(InputError, match="crypto must be 'real'.*'ideal'"):
        est.fit(clients)


def test_ideal_keeps_layer_names_and_reprs(clients):
    est = make_estimator("dwf", n_clusters=3, protection=[PairwiseMasking(graph="sparse", neighbours=4)],
                         init_bounds=BOX, max_rounds=2, random_state=0, crypto="ideal").fit(clients)
    assert est.transcript_.meta["protection"] == (repr(PairwiseMasking(graph="sparse", neighbours=4)),)
    assert list(est.protection_report_) == ["PairwiseMasking"]
    # the transcript holds no readable input: masked_input carries emptied handles
    for r in est.transcript_:
        st = r.stage("masked_input")
        if st is not None:
            assert all("held by the ideal functionality" in repr(m) for m in st.received.values())


def test_foreign_broadcasts_abort_exactly_where_the_masks_fail(clients):
    """A server whose clients all received one broadcast other than its own (every client
    binds its masks to that digest) decodes fine without dropouts, but cannot remove a
    dropped client's masks (it uses its own digest): both worlds abort then, and only then."""
    from dataclasses import replace

    from securefkm.federation import ServerPolicy

    class SameForeign(ServerPolicy):
        def plan(self, state, round, broadcast, sampled, n_clients):
            other = replace(broadcast, params={**broadcast.params, "tag": 1})
            return sampled, {c: other for c in sampled}

    class OddForeign(ServerPolicy):  # two groups with different broadcasts: masks between them fail
        def plan(self, state, round, broadcast, sampled, n_clients):
            other = replace(broadcast, params={**broadcast.params, "tag": 1})
            return sampled, {c: (other if c % 2 else broadcast) for c in sampled}

    graphs = ({}, {"graph": "sparse", "neighbours": 4})
    cases = [(g, SameForeign, dropout, aborts) for g in graphs
             for dropout, aborts in ((None, False), ({1: {"masked_input": [2]}}, True))]
    cases += [(g, OddForeign, None, True) for g in graphs]
    for graph, policy, dropout, aborts in cases:
        outcome = {}
        for crypto in ("real", "ideal"):
            est = make_estimator("dwf", n_clusters=3, protection=[PairwiseMasking(**graph)], random_state=0,
                                 init_bounds=BOX, max_rounds=3, dropout_rate=dropout, crypto=crypto)
            fed, _ = est.make_federation(clients, server_policy=policy())
            try:  # a failed check slot without signatures is an unattributed abort, retried
                fed.run(0)
                outcome[crypto] = (None, [(a.cause, a.stage, _normalise(a.message)) for a in fed.transcript.aborts])
            except RoundAbortedError as exc:
                # (the message quotes each abort cut to a length, so the random check slot shifts the cut)
                outcome[crypto] = ((type(exc).__name__, exc.stage, [(a.cause, a.stage) for a in getattr(exc, "aborts", ())]), [])
        assert outcome["real"] == outcome["ideal"]
        assert (outcome["real"][0] is not None or bool(outcome["real"][1])) == aborts, (graph, policy, outcome)
