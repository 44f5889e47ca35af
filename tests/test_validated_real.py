"""Validated aggregation over the real protocol (Prio3 reports, HPKE, signatures, the Helper):
equal to its ideal functionality on the same seeds, and every tampered message named."""

import dataclasses
import warnings

import numpy as np
import pytest

from attacks.poisoning import PoisoningPolicy
from protocols.validated import HelperRefusal, ValidatedAggregation, ValidationHelper
from protocols.validated import helper as H
from securefkm import WeightedFederatedKMeans
from securefkm.federation import ClientPolicy

BOX = (0.0, 1.0)
START = np.array([[0.2, 0.2], [0.5, 0.8], [0.8, 0.3]])


def _clients(n=6, seed=0, d=2):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.2, 0.8, size=(3, d))
    return [np.clip(centres[rng.integers(3, size=8)] + rng.normal(scale=0.05, size=(8, d)), 0, 1) for _ in range(n)]


def _fit(crypto, policies=None, data=None, rounds=2, **kw):
    est = WeightedFederatedKMeans(3, init=START, init_bounds=BOX, max_rounds=rounds, random_state=0, crypto=crypto,
                                  protection=[ValidatedAggregation(**kw)], backend="local")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(data or _clients(), client_policies=policies)
    return est


def _faults(est):
    return [dict(r.faults) for r in est.transcript_.rounds]


@pytest.mark.parametrize("kind", [None, "sum-scaling", "count-inflation", "inconsistent", "adaptive", "coalition"])
def test_real_protocol_equals_its_ideal_functionality(kind):
    if kind == "coalition":  # three liars of different kinds in one round
        policies = {1: PoisoningPolicy("sum-scaling", box=BOX), 3: PoisoningPolicy("count-inflation", box=BOX),
                    4: PoisoningPolicy("inconsistent", box=BOX)}
    else:
        policies = None if kind is None else {1: PoisoningPolicy(kind, box=BOX)}
    real, ideal = _fit("real", policies), _fit("ideal", policies)
    np.testing.assert_array_equal(real.cluster_centers_, ideal.cluster_centers_)
    assert _faults(real) == _faults(ideal)
    assert [r.contributors for r in real.transcript_.rounds] == [r.contributors for r in ideal.transcript_.rounds]
    for a, b in zip(real.transcript_.rounds, ideal.transcript_.rounds):
        for name in a.aggregate:
            np.testing.assert_array_equal(a.aggregate[name], b.aggregate[name])
    if kind in ("sum-scaling", "count-inflation", "inconsistent"):
        assert set(real.transcript_.rounds[0].faults) == {1}
    if kind == "coalition":
        assert set(real.transcript_.rounds[0].faults) == {1, 3, 4}
        assert real.transcript_.rounds[0].contributors == (0, 2, 5)
    if kind in (None, "adaptive"):  # nothing out of range: nobody is blamed
        assert all(not f for f in _faults(real))


class _Tamper(ClientPolicy):
    """Replaces one field of the client's report (the reply it would send)."""

    def __init__(self, how):
        self.how = how
        self.previous = None

    def reply(self, stage, request, honest, ctx):
        if stage != H.STAGE or not isinstance(honest, H.ValidatedReport):
            return honest
        flip = lambda b: bytes([b[0] ^ 1]) + b[1:] if b else b"\x01"  # noqa: E731
        if self.how == "leader share":
            return dataclasses.replace(honest, leader_share=flip(honest.leader_share))
        if self.how == "sealed share":
            return dataclasses.replace(honest, sealed_helper_share=flip(honest.sealed_helper_share))
        if self.how == "signature":
            return dataclasses.replace(honest, signature=flip(honest.signature))
        if self.how == "public share":
            return dataclasses.replace(honest, public_share=flip(honest.public_share))
        if self.how == "replay":  # last round's report, sent again
            prev, self.previous = self.previous, honest
            return honest if prev is None else prev
        if self.how == "truncated":
            return dataclasses.replace(honest, leader_share=honest.leader_share[:-3])
        raise AssertionError(self.how)


@pytest.mark.parametrize("how", ["leader share", "sealed share", "signature", "public share", "truncated", "replay"])
def test_tampered_report_names_its_sender_and_the_round_completes(how):
    est = _fit("real", {2: _Tamper(how)}, rounds=2)
    rounds = est.transcript_.rounds
    hit = rounds[1] if how == "replay" else rounds[0]
    assert set(hit.faults) == {2}, hit.faults
    assert hit.aborted is None and 2 not in hit.contributors and len(hit.contributors) == 5


def test_the_helper_refuses_small_unverified_or_repeated_aggregates():
    helper = ValidationHelper(min_clients=3)
    ticket, _ = helper.open_round(0, 0, 0, b"d", 3, (65536, 65536), 16)
    with pytest.raises(HelperRefusal, match="no report the helper verified"):
        helper.aggregate(ticket.nonce, [0, 1, 2])
    with pytest.raises(HelperRefusal, match="no open round"):
        helper.aggregate(ticket.nonce, [0, 1, 2])  # burned
    with pytest.raises(HelperRefusal, match="not later"):
        helper.open_round(0, 0, 0, b"d", 3, (65536, 65536), 16)


def test_client_refuses_a_ticket_with_other_circuit_parameters():
    class WiderBox(ClientPolicy):
        pass

    helper = ValidationHelper()
    layer = ValidatedAggregation(helper=helper)
    from protocols.validated.layer import ValidatedClientSession
    from securefkm.layers import ProtocolRefusal

    sess = ValidatedClientSession(0, [1, 0, 0], [[0, 0], [0, 0], [0, 0]], 5, 3, (65536, 65536), 16, b"k" * 32,
                                  helper.identity_key, 0, 0, 0, b"d", 2)
    ticket, _ = helper.open_round(0, 0, 0, b"d", 3, (65536, 2 * 65536), 16)
    with pytest.raises(ProtocolRefusal, match="circuit parameters"):
        sess.respond(H.STAGE, H.ValidationRequest(helper.public_bundle(), ticket))
    other = ValidationHelper()
    ticket, _ = other.open_round(0, 0, 0, b"d", 3, (65536, 65536), 16)
    with pytest.raises(ProtocolRefusal, match="does not trust"):
        sess.respond(H.STAGE, H.ValidationRequest(other.public_bundle(), ticket))
    assert layer.min_clients == 2


def test_worker_backend_gives_the_same_release():
    serial = _fit("real", {1: PoisoningPolicy("sum-scaling")})
    est = WeightedFederatedKMeans(3, init=START, init_bounds=BOX, max_rounds=2, random_state=0, backend="processes",
                                  n_workers=2, protection=[ValidatedAggregation()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(_clients(), client_policies={1: PoisoningPolicy("sum-scaling")})
    np.testing.assert_array_equal(est.cluster_centers_, serial.cluster_centers_)
    assert _faults(est) == _faults(serial)


# ---------------------------------------------------------------- central DP noised by the Helper
def _dp_fit(crypto, policies=None, rounds=3, data=None, epsilon=2.0, record=None):
    from protocols import GaussianDP

    est = WeightedFederatedKMeans(3, init=START, init_bounds=BOX, max_rounds=rounds, random_state=0, crypto=crypto,
                                  backend="local", protection=[
                                      GaussianDP(epsilon=epsilon, delta=1e-5, mode="central", rng="seeded"),
                                      ValidatedAggregation()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(data or _clients(n=8), client_policies=policies)
    return est


def test_helper_noise_real_equals_ideal_and_the_liar_is_still_excluded():
    policies = {2: PoisoningPolicy("sum-scaling", box=BOX)}
    real, ideal = _dp_fit("real", policies), _dp_fit("ideal", policies)
    np.testing.assert_array_equal(real.cluster_centers_, ideal.cluster_centers_)
    for a, b in zip(real.transcript_.rounds, ideal.transcript_.rounds):
        assert dict(a.faults) == dict(b.faults)
        for name in a.aggregate:
            np.testing.assert_array_equal(a.aggregate[name], b.aggregate[name])
    assert set(real.transcript_.rounds[0].faults) == {2}
    assert real.privacy_spent_[0] <= 2.0 + 1e-9
    sees, trust = real.protection_report_["GaussianDP"]["server_sees"], real.protection_report_["GaussianDP"]["trust"]
    assert "Helper" in sees and "only the noisy sum" in sees and "Helper" in trust


def test_the_server_sees_the_helper_noise_once_at_the_calibrated_scale():
    """The noisy count the server decodes minus the exact count of the valid clients is the
    Helper's noise alone: integer, of the calibrated sigma (not sqrt(2) x: the server adds none)."""
    from protocols.validated.layer import ValidatedAggregation as VA

    seen = []
    orig = VA.noise_plan

    def spy(self, ctx, lay):
        plan = orig(self, ctx, lay)
        seen.append(plan)
        return plan

    data = _clients(n=8)
    resid = []
    VA.noise_plan = spy
    try:
        for seed in range(12):
            from protocols import GaussianDP

            est = WeightedFederatedKMeans(3, init=START, init_bounds=BOX, max_rounds=1, random_state=seed,
                                          crypto="ideal", protection=[
                                              GaussianDP(epsilon=1.0, delta=1e-5, mode="central", shrink=None,
                                                         project_means=False, rng="seeded"),
                                              ValidatedAggregation()])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(data)
            rnd = est.transcript_.rounds[-1]
            exact = np.zeros(3)
            for X in data:
                exact += np.bincount(np.argmin(((X[:, None] - START) ** 2).sum(-1), 1), minlength=3)
            resid.append(np.asarray(rnd.aggregate["weights"]) - exact)
    finally:
        VA.noise_plan = orig
    resid = np.concatenate(resid)
    sigma = seen[-1].count_sigma
    assert sigma > 1 and np.all(resid == np.rint(resid))
    assert 0.6 * sigma < resid.std() < 1.4 * sigma  # 36 draws: the server adds no second noise


def test_clients_refuse_a_ticket_whose_noise_is_lower_than_their_own_calibration():
    """A server that asks the Helper for less noise gets no report from an honest client."""
    import dataclasses as dc

    from protocols.validated.layer import _ValidatedServer

    orig = _ValidatedServer.__init__

    def weaker(self, layer, ctx):
        real_plan = layer.noise_plan

        def halved(c, lay):
            plan = real_plan(c, lay)
            return None if plan is None else dc.replace(plan, count_sigma=plan.count_sigma / 2)

        layer.noise_plan = halved
        try:
            orig(self, layer, ctx)
        finally:
            del layer.noise_plan

    _ValidatedServer.__init__ = weaker
    try:
        from securefkm.exceptions import TooManyAbortedRoundsError

        with pytest.raises(TooManyAbortedRoundsError, match=r"only 0 client\(s\) sent a valid report"):
            _dp_fit("real", rounds=1)
    finally:
        _ValidatedServer.__init__ = orig
    # the client's own reason
    from protocols.validated.layer import ValidatedClientSession
    from securefkm.layers import ProtocolRefusal

    helper = ValidationHelper()
    plan = H.NoisePlan("weights", 4.0, (H.NoiseField("weighted_centres", 9e5, 2),), (0,) * 6)
    sess = ValidatedClientSession(0, [1, 0, 0], [[0, 0], [0, 0], [0, 0]], 5, 3, (65536, 65536), 16, b"k" * 32,
                                  helper.identity_key, 0, 0, 0, b"d", 2, plan)
    ticket, _ = helper.open_round(0, 0, 0, b"d", 3, (65536, 65536), 16, dc.replace(plan, count_sigma=2.0))
    with pytest.raises(ProtocolRefusal, match="DP noise plan"):
        sess.respond(H.STAGE, H.ValidationRequest(helper.public_bundle(), ticket))


def test_verification_over_the_cores_equals_the_serial_loop(monkeypatch):
    """Reports checked in worker processes: the same release, faults and reasons."""
    from protocols.validated import _parallel

    policies = {1: PoisoningPolicy("sum-scaling", box=BOX), 2: _Tamper("sealed share"), 4: _Tamper("signature")}
    serial = _fit("real", policies, rounds=2)
    monkeypatch.setattr(_parallel, "MIN_REPORTS", 1)
    monkeypatch.setattr(_parallel, "cpus", lambda: 2)
    spread = _fit("real", {1: PoisoningPolicy("sum-scaling", box=BOX), 2: _Tamper("sealed share"),
                           4: _Tamper("signature")}, rounds=2)
    np.testing.assert_array_equal(spread.cluster_centers_, serial.cluster_centers_)
    assert _faults(spread) == _faults(serial)
    assert set(_faults(serial)[0]) == {1, 2, 4}


# ---------------------------------------------------------------- robust aggregation's votes, proven
def _vote_clients():
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(400, centers=3, n_features=2, cluster_std=0.05, center_box=(0.2, 0.8), random_state=4)
    X = np.clip(X, 0.0, 1.0)
    return np.array_split(X[np.random.default_rng(4).permutation(len(X))], 8)


def _kmeans_start():
    from sklearn.cluster import KMeans

    return KMeans(3, n_init=10, random_state=0).fit(np.vstack(_vote_clients())).cluster_centers_


def _median(crypto, protection, **kw):
    from securefkm.registry import make_estimator

    est = make_estimator("dwf", n_clusters=3, random_state=0, max_rounds=6, crypto=crypto, init=_kmeans_start(),
                         init_bounds=BOX, aggregation="median", vote_bins=16, protection=protection, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(_vote_clients())


def test_validated_votes_name_the_vote_stuffer_where_masking_carries_it():
    """Under validation every client's vote histogram is proven one-hot per cluster and
    coordinate: the client whose votes weigh 100 is named and left out, and the median moves
    no more than under the strongest well-formed attack; under masking it moves far."""
    from attacks.poisoning import Poisoning

    data = _vote_clients()
    validated = _median("real", [ValidatedAggregation()])
    stuffed = Poisoning("vote-stuffing", 1, random_state=1).evaluate(validated, data)
    well_formed = Poisoning("robust-adaptive", 1, random_state=1).evaluate(validated, data)
    assert stuffed.detected == stuffed.malicious and stuffed.attacked_rounds > 0
    assert stuffed.displacement_max <= well_formed.displacement_max + 1e-9
    masked = _median("real", ["masking"])
    carried = Poisoning("vote-stuffing", 1, random_state=1).evaluate(masked, data)
    assert carried.detected == () and carried.displacement_max > 5 * max(stuffed.displacement_max, 1e-3)


def test_validated_votes_real_equals_ideal_and_the_release_holds_the_histogram():
    policies = {2: PoisoningPolicy("robust-adaptive", box=BOX)}
    from securefkm.registry import make_estimator

    outs = []
    for crypto in ("real", "ideal"):
        est = make_estimator("dwf", n_clusters=3, random_state=0, max_rounds=3, crypto=crypto, init=_kmeans_start(),
                             init_bounds=BOX, aggregation="median", vote_bins=16,
                             protection=[ValidatedAggregation()], backend="local")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outs.append(est.fit(_vote_clients(), client_policies=policies))
    real, ideal = outs
    np.testing.assert_array_equal(real.cluster_centers_, ideal.cluster_centers_)
    for a, b in zip(real.transcript_.rounds, ideal.transcript_.rounds):
        for name in a.aggregate:
            np.testing.assert_array_equal(a.aggregate[name], b.aggregate[name])
    votes = real.transcript_.rounds[0].aggregate["votes"]
    counts = real.transcript_.rounds[0].aggregate["weights"]
    # one vote per client, cluster and coordinate where the client has records: at most 8 per row
    assert votes.shape == (3, 2, 16) and np.all(votes.sum(-1) <= 8) and np.all((votes.sum(-1) > 0) == (counts > 0)[:, None])


def test_record_weighted_votes_are_refused_by_validation_with_the_reason():
    from securefkm.exceptions import ProtectionConfigError

    with pytest.raises(ProtectionConfigError, match="votes"):
        _median("ideal", [ValidatedAggregation()], vote_weight="records")


def test_the_median_bound_with_proven_votes_is_reported_and_holds():
    """The protection report's median bound (one malicious client, its votes proven well
    formed) against the strongest well-formed attack's per-round moves on the same seeds."""
    from attacks.poisoning import Poisoning

    data = _vote_clients()
    est = _median("ideal", [ValidatedAggregation()])
    rep = est.protection_report_["ValidatedAggregation"]
    assert "votes proven well formed" in rep["influence"] and rep["influence_median_max"] > 0
    poisoned = Poisoning("robust-adaptive", 1, random_state=1).evaluate(est, data)
    assert poisoned.displacement_max <= est.protection_report_["ValidatedAggregation"]["influence_median_max"] * 6


def test_a_given_helper_is_the_one_the_fit_uses():
    """ValidatedAggregation(helper=...) survives the fit's copy of the layers (a service is
    shared, not copied): the given Helper releases every round's share."""
    helper = ValidationHelper()
    est = WeightedFederatedKMeans(3, init=START, init_bounds=BOX, max_rounds=2, random_state=0, backend="local",
                                  protection=[ValidatedAggregation(helper=helper)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(_clients())
    assert helper.n_aggregates == 2 == est.protection_report_["ValidatedAggregation"]["helper_aggregates"]
