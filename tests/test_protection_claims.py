"""Every declared protection protects what it claims, or the stack is refused up front.

Over every algorithm (plain and secure modes) x every layer, the fit's transcript -- what the
server saw -- is checked against the claim of each declared layer: a secure aggregator
(PairwiseMasking, Paillier, distributed DP under masking) leaves no client's sum-fields and
no set-fields in plain; local DP leaves no exact client value; central DP noises what the
server releases; MinClusterSize leaves no small cluster; Rounding leaves only rounded counts;
ParticipationCap keeps every client within its cap. A stack that could not keep its claim
is refused with ProtectionConfigError before any client is contacted, naming the fix; the
explicit opt-in ``allow_plain_set_fields=True`` runs and says so in the report.
"""

import warnings

import numpy as np
import phe
import pytest
from _algos import ALGOS
from sklearn.datasets import make_blobs

from protocols import (
    GaussianDP,
    KeyAuthority,
    MinClusterSize,
    Paillier,
    PairwiseMasking,
    ParticipationCap,
    Rounding,
)
from securefkm.exceptions import NoParticipantsError, ProtectionConfigError
from securefkm.registry import make_estimator

SET_FIELDS = {"aligning", "kfed", "child-parent", "fcm"}  # local centres sent per client
SECURE_AGGREGATION = {"masking", "paillier", "dp-distributed", "masking-allow-plain", "paillier-allow-plain"}
BOX = (-2.0, 7.0)


@pytest.fixture(scope="module")
def keypair():
    return phe.generate_paillier_keypair(n_length=1024)  # test-only size


def stacks(keypair):
    def paillier(**kw):
        return Paillier(authority=KeyAuthority(*keypair, min_clients=2, allow_weak_key=True), **kw)

    return {
        "none": lambda: [],
        "masking": lambda: [PairwiseMasking()],
        "masking-allow-plain": lambda: [PairwiseMasking(allow_plain_set_fields=True)],
        "paillier": lambda: [paillier()],
        "paillier-allow-plain": lambda: [paillier(allow_plain_set_fields=True)],
        "dp-central": lambda: [GaussianDP(5.0, 1e-5, bounds=BOX)],
        "dp-distributed": lambda: [GaussianDP(5.0, 1e-5, bounds=BOX, mode="distributed"), PairwiseMasking()],
        "dp-local": lambda: [GaussianDP(5.0, 1e-5, bounds=BOX, mode="local")],
        "rounding": lambda: [Rounding(count_multiple=4)],
        "cap": lambda: [ParticipationCap(max_rounds=3)],
        "min-cluster": lambda: [MinClusterSize(p=3)],
    }


@pytest.fixture(scope="module")
def clients():
    X, _ = make_blobs(240, centers=[[0, 0], [5, 5], [0, 5]], cluster_std=0.5, random_state=0)
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 6)
    return [X[p] for p in parts]


def _fit(algo, stack, make, clients):
    name, params = ALGOS[algo]
    est = make_estimator(name, n_clusters=3, protection=make(), random_state=0, init_bounds=BOX,
                         max_rounds=4, **params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(clients)


def _plain_arrays(record):
    """Every per-client array the server received in plain in one round: (client, name, array)."""
    out = []
    for c, sums in record.plain_sums().items():
        out += [(c, f"sum:{k}", np.asarray(v)) for k, v in sums.items()]
    for c, items in record.items.items():
        out += [(c, f"item:{k}", np.asarray(v)) for k, v in items.items()]
    update = record.stage("update")
    if update is not None:
        for c, items in update.received.items():
            out += [(c, f"item:{k}", np.asarray(v)) for k, v in (items or {}).items()]
    return out


def check_claims(stack, est, algo):
    """The transcript against the claims of ``stack``; returns a list of violations."""
    bad = []
    rounds = list(est.transcript_)
    assert rounds, "the fit ran no round"
    opt_in = stack.endswith("allow-plain")
    for r in rounds:
        plain = _plain_arrays(r)
        if stack in SECURE_AGGREGATION:
            for c, name, _ in plain:
                if name.startswith("sum:") or not opt_in:
                    bad.append(f"round {r.round}: client {c}'s {name} in plain under {stack}")
        if stack == "min-cluster":
            for c, name, arr in plain:
                if name in ("item:sizes", "sum:counts") and np.any((arr > 0) & (arr < 3)):
                    bad.append(f"round {r.round}: client {c} sent a cluster of {arr} < 3 records")
        if stack == "rounding":
            for c, name, arr in plain:
                count_like = name == "item:sizes" or any(s.name == name[4:] and s.kind == "count" for s in r.specs)
                if count_like and np.any(np.mod(arr, 4) != 0):
                    bad.append(f"round {r.round}: client {c}'s {name} {arr} not a multiple of 4")
    if stack == "cap":
        used: dict[int, int] = {}
        for r in rounds:
            for c in r.contributors:
                used[c] = used.get(c, 0) + 1
        bad += [f"client {c} contributed to {n} > 3 rounds" for c, n in used.items() if n > 3]
    return bad


def _exact_round0(algo, clients):
    """Round 0's per-client values of the unprotected fit (same seeds, same start)."""
    plain = _fit(algo, "none", lambda: [], clients)
    return {(c, name): arr for c, name, arr in _plain_arrays(plain.transcript_.rounds[0])}


def expected(algo, stack):
    if algo in SET_FIELDS and stack in ("masking", "paillier", "dp-distributed"):
        return "refused"  # the aggregator cannot hide set-fields
    if stack in ("dp-central", "dp-distributed", "dp-local") and algo in SET_FIELDS:
        return "refused"  # plain set-fields have no record-level bound (secure modes: record-level sums)
    if stack == "cap" and algo.endswith("-secure") and algo != "fcm-secure":
        return "exhausted"  # the secure server k-means needs more than 3 rounds
    return "ok"


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_declared_protection_is_kept_or_refused(algo, clients, keypair):
    exact0 = None
    for stack, make in stacks(keypair).items():
        want = expected(algo, stack)
        if want == "refused":
            with pytest.raises(ProtectionConfigError) as exc:
                _fit(algo, stack, make, clients)
            msg = str(exc.value)
            if stack in ("masking", "paillier"):
                # the fix is named: the secure mode, and the explicit opt-in
                assert "secure_mode=True" in msg and "allow_plain_set_fields=True" in msg, msg
                assert "--param secure_mode=true" in exc.value.for_cli()
            continue
        if want == "exhausted":
            with pytest.raises(NoParticipantsError):
                _fit(algo, stack, make, clients)
            continue
        est = _fit(algo, stack, make, clients)
        assert check_claims(stack, est, algo) == [], (algo, stack)
        report = est.protection_report_
        if stack.endswith("allow-plain") and algo in SET_FIELDS:
            assert report.plain_set_fields and "in plain" in report.summary()
            assert "allow_plain_set_fields=True" in report.summary()
        if stack == "dp-local":
            # no value the server received in round 0 equals the client's exact value
            exact0 = exact0 if exact0 is not None else _exact_round0(algo, clients)
            seen = {(c, name): arr for c, name, arr in _plain_arrays(est.transcript_.rounds[0])}
            assert seen, (algo, "local DP sent nothing in plain to check")
            same = [key for key, arr in seen.items()
                    if key in exact0 and arr.shape == exact0[key].shape and np.array_equal(arr, exact0[key])]
            assert same == [], (algo, same)


def test_the_checker_catches_a_leak(clients, keypair):
    """The claim check itself can fail: a plain fit judged as if it were masked."""
    est = _fit("dwf", "none", lambda: [], clients)
    assert check_claims("masking", est, "dwf")
    est = _fit("kfed", "masking-allow-plain", stacks(keypair)["masking-allow-plain"], clients)
    assert check_claims("masking", est, "kfed")  # without the opt-in these set-fields are a violation


def test_central_dp_report_says_the_server_sees_updates(clients):
    est = _fit("dwf", "dp-central", lambda: [GaussianDP(1.0, 1e-5, bounds=BOX)], clients)
    summary = est.protection_report_.summary()
    assert "every client's exact sum-fields in plain" in summary
    assert "no protection against a curious server" in summary
    assert est.privacy_spent_ is not None and est.privacy_spent_[0] <= 1.0


def test_privacy_spent_is_none_without_dp(clients):
    est = _fit("dwf", "masking", lambda: [PairwiseMasking()], clients)
    assert est.privacy_spent_ is None
    assert repr(est.protection_report_) == "ProtectionReport(PairwiseMasking: one masked vector per client)"
    assert "masked vector per client" in est.protection_report_["PairwiseMasking"]["server_sees"]
