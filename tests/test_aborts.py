"""Issue 19: a fit survives aborted rounds.

Seeded dropout schedules (:class:`securefkm.federation.sampling.Dropouts`, rounds counted as
round *attempts* from 0 over the fit) force aborts in chosen rounds. The fit completes, its
centres equal those of a fit in which the aborted attempts never happened (same seeds), and
privacy is charged only for what reached the server.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
from test_dp import CountSum, _clients

from protocols import GaussianDP, PairwiseMasking, ParticipationCap
from securefkm.estimators.dwf import WeightedFederatedKMeans
from securefkm.estimators.minibatch import MiniBatchFederatedKMeans
from securefkm.exceptions import (
    InputError,
    PrivacyBudgetExceededError,
    RoundAbortedError,
    ServerMisbehaviourError,
    TooManyAbortedRoundsError,
)
from securefkm.federation import Federation
from securefkm.federation.runtime import MAX_ABORTED_ROUNDS, ServerPolicy

BOX = (-10.0, 10.0)


@pytest.fixture(scope="module")
def data():
    """Six clients of 40 records from three blobs inside BOX."""
    rng = np.random.default_rng(0)
    centres = np.array([[-5.0, -4.0], [0.0, 5.0], [5.0, -3.0]])
    return [centres[rng.integers(0, 3, 40)] + rng.normal(0, 0.8, (40, 2)) for _ in range(6)]


def _dwf(**kw):
    base = dict(n_clusters=3, init_bounds=BOX, max_rounds=4, random_state=7,
                protection=[PairwiseMasking(threshold=4)])
    return WeightedFederatedKMeans(**{**base, **kw})


def _shift(schedule, by):
    """The same schedule, ``by`` attempts later (an aborted attempt uses up one attempt)."""
    return {r + by: v for r, v in schedule.items()}


# --------------------------------------------------------------------- retry, equality
@pytest.mark.parametrize("stage", ["update", "advertise", "share", "masked_input", "unmask"])
def test_abort_at_any_stage_is_retried_and_centres_equal_the_abort_free_fit(data, stage):
    """Three of six clients drop at ``stage`` of round 2 (threshold 4): the attempt aborts, the
    round is retried, and the fit ends with exactly the abort-free fit's centres."""
    free = _dwf(crypto="ideal").fit(data)
    est = _dwf(crypto="ideal", dropout_rate={2: {stage: [0, 2, 5]}}).fit(data)
    np.testing.assert_array_equal(est.cluster_centers_, free.cluster_centers_)
    assert est.n_aborted_rounds_ == 1 and free.n_aborted_rounds_ == 0
    (a,) = est.transcript_.aborts
    caught = "advertise" if stage == "update" else stage  # no update -> no advertised keys
    assert (a.run, a.round, a.attempt, a.cause, a.stage, a.released) == (0, 2, 0, "too_few_survivors", caught, False)
    rec = [r for r in est.transcript_ if r.aborted]
    assert len(rec) == 1 and rec[0].abort_cause == "too_few_survivors" and rec[0].aggregate is None
    retry = est.transcript_[est.transcript_.rounds.index(rec[0]) + 1]
    assert (retry.round, retry.attempt, retry.aborted) == (2, 1, None)
    assert est.n_iter_ == free.n_iter_


def test_real_masking_abort_in_the_seeding_round(data):
    """The private seeding round (its broadcast draws from a generator in the state) aborts and
    is retried under the real protocol: same centres as the abort-free fit."""
    kw = dict(init="private", max_rounds=2)
    free = _dwf(**kw).fit(data)
    est = _dwf(**kw, dropout_rate={0: {"masked_input": [1, 3, 4]}}).fit(data)
    np.testing.assert_array_equal(est.cluster_centers_, free.cluster_centers_)
    assert [(a.round, a.stage) for a in est.transcript_.aborts] == [(0, "masked_input")]
    assert est.transcript_[0].action == est.transcript_[1].action == "init.private"


def test_client_randomness_is_keyed_by_the_round_not_the_attempt(data):
    """Mini-batch k-means draws each client's batch from (run, round, client): a retried round
    draws the very batches the abort-free fit drew."""
    kw = dict(n_clusters=3, init_bounds=BOX, init="uniform", max_rounds=4, random_state=3,
              batch_size=10, crypto="ideal", protection=[PairwiseMasking(threshold=4)])
    free = MiniBatchFederatedKMeans(**kw).fit(data)
    est = MiniBatchFederatedKMeans(**kw, dropout_rate={1: [0, 1, 2], 2: {"share": [3, 4, 5]}}).fit(data)
    np.testing.assert_array_equal(est.cluster_centers_, free.cluster_centers_)
    assert [(a.round, a.attempt) for a in est.transcript_.aborts] == [(1, 0), (1, 1)]


def test_partial_participation_other_rounds_draw_the_same_samples(data):
    """Retries sample from their own stream: every completed first attempt samples exactly the
    clients of the abort-free fit; only the retried round has a fresh sample."""
    kw = dict(clients_per_round=5, crypto="ideal", protection=[PairwiseMasking(threshold=4)])
    free = _dwf(**kw).fit(data)
    est = _dwf(**kw, dropout_rate={1: {"masked_input": [0, 1, 2, 3, 4, 5]}}).fit(data)
    done_free = [r.sampled for r in free.transcript_ if r.aborted is None]
    done = [r for r in est.transcript_ if r.aborted is None]
    aborted = [r for r in est.transcript_ if r.aborted]
    assert [r.round for r in aborted] == [1] and aborted[0].sampled == done_free[1]
    assert [r.sampled for r in done if r.attempt == 0] == [s for i, s in enumerate(done_free) if i != 1]


# ----------------------------------------------------------------- bound and reporting
def test_too_many_aborts_raise_naming_rounds_and_causes(data):
    est = _dwf(crypto="ideal", max_aborted_rounds=2,
               dropout_rate={1: [0, 1, 2], 2: {"masked_input": [0, 1, 2]}, 3: {"share": [3, 4, 5]}})
    with pytest.raises(TooManyAbortedRoundsError) as info:
        est.fit(data)
    msg = str(info.value)
    assert "max_aborted_rounds=2" in msg and "3 round attempts aborted" in msg
    for part in ("round 1 attempt 0: too_few_survivors at stage 'advertise'",
                 "round 1 attempt 1: too_few_survivors at stage 'masked_input'",
                 "round 1 attempt 2: too_few_survivors at stage 'share'"):
        assert part in msg
    assert len(info.value.aborts) == 3 and isinstance(info.value, RoundAbortedError)
    with pytest.raises(TooManyAbortedRoundsError, match="max_aborted_rounds=0"):
        _dwf(crypto="ideal", max_aborted_rounds=0, dropout_rate={1: [0, 1, 2]}).fit(data)
    with pytest.raises(InputError, match="max_aborted_rounds"):
        _dwf(max_aborted_rounds=-1).fit(data)
    assert _dwf().get_params()["max_aborted_rounds"] == MAX_ABORTED_ROUNDS == 10


def test_aborts_are_counted_per_run(data):
    """The bound is per run: with n_init=2, one abort in each run fits under max_aborted_rounds=1."""
    kw = dict(crypto="ideal", n_init=2, max_rounds=2, max_aborted_rounds=1)
    free = _dwf(**kw).fit(data)
    n0 = sum(r.run == 0 for r in free.transcript_)  # attempts of run 0 without aborts
    # schedule keys count attempts over the fit: run 0 takes n0 + 1, run 1's round 1 is next-but-one
    est = _dwf(**kw, dropout_rate={0: [0, 1, 2], n0 + 2: [0, 1, 2]}).fit(data)
    assert est.n_aborted_rounds_ == 2 and [a.run for a in est.transcript_.aborts] == [0, 1]
    np.testing.assert_array_equal(est.cluster_centers_, free.cluster_centers_)


def test_transcript_summary_and_record_none_keep_the_abort_log(data):
    fed, _ = _dwf(crypto="ideal", dropout_rate={1: [0, 1, 2]}).make_federation(data)
    fed.transcript.level = "none"
    fed.run(0)
    assert len(fed.transcript) == 0 and len(fed.transcript.aborts) == 1 and fed.n_aborted_rounds == 1
    from securefkm.cli import fit_summary
    from securefkm.datasets import as_federated

    fitted = _dwf(crypto="ideal", dropout_rate={1: [0, 1, 2]}).fit(data)
    lines = "\n".join(fit_summary("dwf", as_federated(data), fitted.cluster_centers_, n_iter=fitted.n_iter_,
                                  privacy_spent=None, transcript=fitted.transcript_))
    assert "1 aborted round(s)" in lines and "aborted rounds (retried): 1 too_few_survivors" in lines


def test_progress_bar_shows_the_aborted_count(data, monkeypatch):
    from securefkm.federation import runtime

    shown = []

    class Bar:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            pass

        def set_postfix_str(self, s, refresh=True):
            shown.append(s)

    monkeypatch.setattr(runtime, "tqdm", Bar)
    _dwf(crypto="ideal", dropout_rate={1: [0, 1, 2], 3: [3, 4, 5]}).fit(data)
    assert shown == ["aborted=1", "aborted=2"]


# ------------------------------------------------------------------ server misbehaviour
class _InconsistentOnce(ServerPolicy):
    """Sends client 0 shifted centres in the first training round (the model-inconsistency
    attack), honest afterwards."""

    def __init__(self):
        self.done = False

    def plan(self, state, round, broadcast, sampled, n_clients):
        per = {c: broadcast for c in sampled}
        if broadcast.action == "train" and not self.done:
            self.done = True
            per[sampled[0]] = dataclasses.replace(broadcast, centres=broadcast.centres + 1.0)
        return sampled, per


@pytest.mark.parametrize("crypto", ["real", "ideal"])
def test_binding_check_without_signatures_is_unattributed_and_retried(data, crypto):
    """Without signed keys a failed check slot cannot tell a corrupted masked input from
    inconsistent broadcasts: the abort is unattributed and the round is retried."""
    est = _dwf(crypto=crypto, init="uniform", max_rounds=2)
    est.fit(data, server_policy=_InconsistentOnce())
    (a,) = est.transcript_.aborts
    assert (a.cause, a.stage) == ("unattributed_check_failure", "unmask") and "inconsistent broadcasts" in a.message


# ------------------------------------------------------------------------- accounting
def _dp(**kw):
    return GaussianDP(epsilon=2.0, delta=1e-5, clip=15.0, mode="distributed", rng="seeded", **kw)


def test_nothing_released_nothing_charged(data):
    """A round aborted before decoding (three of six drop at masked_input) charges nothing:
    privacy spent and centres equal the abort-free fit's (seeded DP noise keyed by the round)."""
    kw = dict(crypto="ideal", init="uniform", max_rounds=3)
    free = _dwf(**kw, protection=[_dp(min_clients=3), PairwiseMasking(threshold=4)]).fit(data)
    est = _dwf(**kw, protection=[_dp(min_clients=3), PairwiseMasking(threshold=4)],
               dropout_rate={1: {"masked_input": [0, 1, 2]}}).fit(data)
    assert est.n_aborted_rounds_ == 1 and not est.transcript_.aborts[0].released
    assert est.privacy_spent_ == free.privacy_spent_
    np.testing.assert_array_equal(est.cluster_centers_, free.cluster_centers_)


def test_masking_does_not_decode_fewer_survivors_than_distributed_dp_needs(data):
    """min_clients=5 > masking threshold 3, two of six drop at masked_input: PairwiseMasking
    takes GaussianDP's survivors_needed as its round's minimum, so it aborts before decoding
    the under-noised sum of four (nothing released, nothing charged) and the retry completes:
    privacy spent and centres equal the abort-free fit's. (Before, the sum was decoded, charged
    at its actual noise, and the budget then refused the retry.)"""
    kw = dict(crypto="ideal", init="uniform", max_rounds=2)
    free = _dwf(**kw, protection=[_dp(min_clients=5), PairwiseMasking(threshold=4)]).fit(data)
    est = _dwf(**kw, protection=[_dp(min_clients=5), PairwiseMasking(threshold=4)],
               dropout_rate={1: {"masked_input": [0, 1]}}).fit(data)
    (a,) = est.transcript_.aborts
    assert not a.released and a.stage == "masked_input" and a.round == 1
    assert est.privacy_spent_ == free.privacy_spent_
    np.testing.assert_array_equal(est.cluster_centers_, free.cluster_centers_)


def test_decoded_then_aborted_round_is_charged(data):
    """With an aggregator that does not honour survivors_needed (the masking's floor removed
    here), the sum of four is decoded, then GaussianDP aborts (under-noised sum). The runtime
    sees the release and the layer charges it, at the actual noise, to the four contributors;
    the round index is not reused. The budget, calibrated for the planned rounds, then refuses
    the retry (PrivacyBudgetExceededError is never retried): charged, then prevented."""
    kw = dict(crypto="ideal", init="uniform", max_rounds=2)
    fed, _ = _dwf(**kw, protection=[_dp(min_clients=5), PairwiseMasking(threshold=4)],
                  dropout_rate={1: {"masked_input": [0, 1]}}).make_federation(data)
    fed.aggregator._floor_layers = []  # an aggregator without the survivors_needed hook
    with pytest.raises(PrivacyBudgetExceededError) as info:
        fed.run(0)
    (a,) = fed.transcript.aborts
    assert a.released and a.stage == "server_aggregate" and a.round == 1
    assert info.value.round == 2  # the retry runs under a fresh round index
    dp = fed.layers[0]
    assert dict(dp.budget.counts) == {0: 1, 1: 1, 2: 2, 3: 2, 4: 2, 5: 2}  # the abort charged clients 2..5
    free, _ = _dwf(**kw, protection=[_dp(min_clients=5), PairwiseMasking(threshold=4)]).make_federation(data)
    free.run_round(free.algorithm.init(6, 2, np.random.default_rng(0)), round=0)
    assert fed.privacy_spent()[0] > free.privacy_spent()[0]  # round 0 + the charged abort > round 0


def test_distributed_dp_default_min_clients_tolerates_the_masking_dropout_fraction():
    """Defaults only: GaussianDP(mode="distributed") + PairwiseMasking() on 20 clients sizes the
    noise for 18 survivors (PairwiseMasking's dropout_fraction 10%); two clients dropping at
    masked_input then cost nothing (the sum of 18 carries the calibrated noise), and three
    make the masking abort before decoding, so the fit goes on within its budget. (Before,
    min_clients was all 20: one dropout after the shares released an under-noised sum and the
    fit ended with PrivacyBudgetExceededError.)"""
    rng = np.random.default_rng(0)
    X = np.clip(rng.normal(size=(2000, 2)) * 0.3 + rng.choice([-0.5, 0.5], size=(2000, 1)), -1, 1)
    clients = np.array_split(X, 20)
    for drops, aborted in (([3, 7], 0), ([3, 7, 11], 1)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = WeightedFederatedKMeans(
                2, protection=[GaussianDP(1.0, 1e-5, bounds=(-1.0, 1.0), mode="distributed"), PairwiseMasking()],
                crypto="ideal", random_state=0, dropout_rate={1: {"masked_input": drops}}).fit(clients)
        assert est.protection_report_["GaussianDP"]["min_clients"] == 18
        assert est.n_aborted_rounds_ == aborted and not any(a.released for a in est.transcript_.aborts)
        assert all("GaussianDP's min_clients" in a.message for a in est.transcript_.aborts)
        assert est.privacy_spent_[0] <= 1.0


def test_central_dp_abort_before_decoding_is_free_and_retry_matches(data):
    kw = dict(crypto="ideal", init="uniform", max_rounds=2)
    dp = lambda: GaussianDP(epsilon=2.0, delta=1e-5, clip=15.0, mode="central", rng="seeded")  # noqa: E731
    free = _dwf(**kw, protection=[dp(), PairwiseMasking(threshold=4)]).fit(data)
    est = _dwf(**kw, protection=[dp(), PairwiseMasking(threshold=4)], dropout_rate={1: {"unmask": [0, 1, 2]}}).fit(data)
    assert est.n_aborted_rounds_ == 1 and est.privacy_spent_ == free.privacy_spent_
    np.testing.assert_array_equal(est.cluster_centers_, free.cluster_centers_)


# ------------------------------------------------------------------ participation caps
def test_participation_cap_ignores_rounds_aborted_before_the_input_left():
    """Aborted at 'advertise' (before any masked input was sent): the cap is not used up and
    the three planned rounds complete."""
    fed = Federation(CountSum(rounds=3), _clients(n=4), max_rounds=3, crypto="ideal",
                     protection=[ParticipationCap(3), PairwiseMasking(threshold=3)],
                     dropout_rate={1: {"advertise": [0, 1]}})
    state = fed.run(0)
    assert state.round == 3 and fed.n_aborted_rounds == 1


def test_participation_cap_counts_rounds_aborted_after_the_input_left():
    """Aborted at 'unmask' (the survivors' masked inputs had been sent): the client cannot
    verify that nothing was learnt, so the round counts and the cap stops the run a round early."""
    fed = Federation(CountSum(rounds=3), _clients(n=4), max_rounds=3, crypto="ideal",
                     protection=[ParticipationCap(3), PairwiseMasking(threshold=3)],
                     dropout_rate={1: {"unmask": [0, 1]}})
    with pytest.warns(UserWarning, match="stopped after 2 rounds"):
        state = fed.run(0)
    assert state.round == 2 and fed.n_aborted_rounds == 1


def test_no_participants_still_ends_the_run_without_retries():
    fed = Federation(CountSum(rounds=5), _clients(n=3), protection=[ParticipationCap(2)], max_rounds=5)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        state = fed.run(0)
    assert state.round == 2 and fed.n_aborted_rounds == 0


# ------------------------------------------------------------------------------ Paillier
@pytest.fixture(scope="module")
def keypair():
    phe = pytest.importorskip("phe")
    return phe.generate_paillier_keypair(n_length=1024)  # test-only size


def test_paillier_minimum_abort_is_retried_with_a_fresh_ticket(data, keypair):
    """Below Paillier's min_clients nothing is decrypted; the retry (same round index) gets a
    fresh ticket from the authority and the centres equal the abort-free fit's."""
    from protocols import KeyAuthority, Paillier

    def stack():
        return [Paillier(authority=KeyAuthority(*keypair, min_clients=5, allow_weak_key=True), min_clients=5)]

    kw = dict(init="uniform", max_rounds=2)
    free = _dwf(**kw, protection=stack()).fit(data)
    est = _dwf(**kw, protection=stack(), dropout_rate={1: {"encrypted_input": [0, 4]}}).fit(data)
    (a,) = est.transcript_.aborts
    assert (a.round, a.cause, a.stage, a.released) == (1, "too_few_survivors", "encrypted_input", False)
    np.testing.assert_array_equal(est.cluster_centers_, free.cluster_centers_)
    assert est.protection_report_["Paillier"]["decryptions"] == free.protection_report_["Paillier"]["decryptions"] == 2


@pytest.mark.parametrize("crypto", ["real", "ideal"])
def test_paillier_does_not_decrypt_fewer_than_distributed_dp_needs(data, keypair, crypto):
    """GaussianDP(mode="distributed", min_clients=6) + Paillier(min_clients=2): one client drops
    at the encrypted input. Paillier takes the DP layer's survivors_needed as its minimum, so
    it decrypts nothing (before: it decrypted the under-noised sum of five, GaussianDP charged
    it and the budget then refused the retry); the retry completes and spends what the
    abort-free fit spends."""
    from protocols import KeyAuthority, Paillier

    def stack():
        return [_dp(min_clients=6),
                Paillier(authority=KeyAuthority(*keypair, min_clients=2, allow_weak_key=True), min_clients=2)]

    kw = dict(init="uniform", max_rounds=2, crypto=crypto)
    free = _dwf(**kw, protection=stack()).fit(data)
    est = _dwf(**kw, protection=stack(), dropout_rate={1: {"encrypted_input": [3]}}).fit(data)
    (a,) = est.transcript_.aborts
    assert (a.round, a.stage, a.released) == (1, "encrypted_input", False)
    assert "GaussianDP's min_clients=6" in a.message
    assert est.privacy_spent_ == free.privacy_spent_
