"""Poisoning attacks through malicious clients: what they do to the fit, under every protection."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_blobs

import attacks
from attacks.poisoning import KINDS, Poisoning, PoisoningPolicy
from securefkm.exceptions import InputError
from securefkm.registry import make_estimator

BOX = (-2.0, 2.0)


@pytest.fixture(scope="module")
def clients():
    X, y = make_blobs(1200, centers=4, cluster_std=0.4, random_state=3)
    X = X / np.abs(X).max() * 1.9
    return np.array_split(X[np.argsort(y, kind="stable")], 30)  # non-IID: a few blobs per client


def _start(clients):
    """A good start (scikit-learn's k-means on the pooled records): the honest fit stays at the
    optimum, so every loss of utility is the attack's."""
    from sklearn.cluster import KMeans

    return KMeans(4, n_init=10, random_state=0).fit(np.vstack(clients)).cluster_centers_


def _fit(clients, protection=(), **kw):
    est = make_estimator("dwf", n_clusters=4, init=_start(clients), init_bounds=BOX, random_state=0, max_rounds=8,
                         protection=list(protection), crypto="ideal", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(clients)


@pytest.mark.parametrize("kind, at_least", [("count-inflation", 0.3), ("sum-scaling", 50.0), ("inconsistent", 1.0),
                                            ("adaptive", 0.05)])
def test_every_attack_moves_the_centres_and_nothing_detects_it(clients, kind, at_least):
    honest = _fit(clients)
    report = Poisoning(kind, 1, random_state=1).evaluate(honest, clients)
    assert report.displacement_max >= at_least
    assert report.utility < 1.0
    assert report.detected == () and report.excluded == ()  # no defence today: nothing is noticed
    assert kind in report.summary() and str(list(report.malicious)) in report.summary()


def test_the_same_damage_through_secure_aggregation(clients):
    """The lie is applied before the client-side layers: masking carries it into the sum as it
    carries an honest update (the released centres agree to the codec's resolution)."""
    plain = Poisoning("adaptive", 2, random_state=1).evaluate(_fit(clients), clients)
    masked = Poisoning("adaptive", 2, random_state=1).evaluate(_fit(clients, ["masking"]), clients)
    np.testing.assert_allclose(masked.poisoned_centres, plain.poisoned_centres, atol=1e-6)
    assert masked.malicious == plain.malicious


def test_adaptive_attack_stays_inside_every_range_check(clients):
    """What a validating aggregator could check: whole counts in [0, n_i] summing to n_i, and
    each cluster's sum within count x the declared box. The adaptive lie passes all of them."""
    seen = []

    class Checked(PoisoningPolicy):
        def update(self, update, ctx):
            out = super().update(update, ctx)
            if "weights" in out.sums:
                seen.append((ctx.client.context.n_records, out.sums["weights"], out.sums["weighted_centres"]))
            return out

    est = make_estimator("dwf", n_clusters=4, init=_start(clients), init_bounds=BOX, random_state=0, max_rounds=5,
                         crypto="ideal")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients, client_policies={3: Checked("adaptive", box=BOX)})
    assert len(seen) >= 2
    for n, counts, sums in seen:
        assert np.all(counts == np.round(counts)) and np.all(counts >= 0) and counts.sum() == n
        for c, s in zip(counts, sums):
            assert np.all(s >= c * BOX[0] - 1e-9) and np.all(s <= c * BOX[1] + 1e-9)


def test_a_coalition_moves_the_centres_further(clients):
    honest = _fit(clients)
    one = Poisoning("adaptive", 1, random_state=2).evaluate(honest, clients)
    five = Poisoning("adaptive", 5, random_state=2).evaluate(honest, clients)
    assert len(five.malicious) == 5 and set(one.malicious) <= set(range(30))
    assert five.displacement_max > one.displacement_max
    assert five.utility < one.utility


def test_evaluate_entry_point_and_errors(clients):
    honest = _fit(clients)
    direct = Poisoning("count-inflation", clients=[4]).evaluate(honest, clients)
    via = attacks.evaluate(Poisoning("count-inflation", clients=[4]), honest, clients)
    assert via.malicious == direct.malicious == (4,)
    np.testing.assert_array_equal(via.poisoned_centres, direct.poisoned_centres)
    with pytest.raises(InputError, match="kind='bogus': choose one of"):
        Poisoning("bogus")
    with pytest.raises(InputError, match="n_malicious=30 leaves no honest client among 30"):
        Poisoning("adaptive", 30).evaluate(honest, clients)
    with pytest.raises(InputError, match=r"clients=\[40\]: ids \[40\] are outside 0..29"):
        Poisoning("adaptive", clients=[40]).evaluate(honest, clients)
    no_box = make_estimator("dwf", n_clusters=4, random_state=0, max_rounds=3).fit(clients)
    with pytest.raises(InputError, match="needs the declared box"):
        Poisoning("adaptive").evaluate(no_box, clients)
    assert set(KINDS) == {"count-inflation", "sum-scaling", "inconsistent", "adaptive", "robust-adaptive",
                          "vote-stuffing"}


def test_robust_adaptive_lie_is_in_range_and_votes_in_the_far_bin(clients):
    """robust-adaptive: whole counts summing to n_i (one record claimed in each other cluster),
    sums at each cluster's far corner, and per cluster and coordinate one vote in the extreme bin
    on the side farthest from the broadcast centre."""
    seen = []

    class Checked(PoisoningPolicy):
        def update(self, update, ctx):
            out = super().update(update, ctx)
            if "votes" in out.sums:
                seen.append((ctx.client.context.n_records, ctx.round_context.broadcast.centres, out.sums))
            return out

    est = make_estimator("dwf", n_clusters=4, init=_start(clients), init_bounds=BOX, random_state=0, max_rounds=3,
                         crypto="ideal", aggregation="median", vote_bins=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients, client_policies={3: Checked("robust-adaptive", box=BOX, target=2)})
    assert len(seen) >= 2
    for n, centres, sums in seen:
        counts, s, votes = sums["weights"], sums["weighted_centres"], sums["votes"]
        assert counts.tolist() == [1, 1, n - 3, 1]
        far_high = np.abs(centres - BOX[0]) <= np.abs(centres - BOX[1])
        np.testing.assert_array_equal(s, counts[:, None] * np.where(far_high, BOX[1], BOX[0]))
        np.testing.assert_array_equal(votes.sum(-1), np.ones((4, 2)))
        np.testing.assert_array_equal(np.argmax(votes, -1), np.where(far_high, 7, 0))


def test_actions_limits_the_rounds_a_client_lies_in(clients):
    """actions=('train',): a private seeding round is left honest, the training rounds are not."""
    lied = []

    class Seen(PoisoningPolicy):
        def update(self, update, ctx):
            out = super().update(update, ctx)
            lied.append((ctx.round_context.action, out is not update))
            return out

    est = make_estimator("dwf", n_clusters=4, init="private", init_bounds=BOX, random_state=0, max_rounds=3,
                         crypto="ideal", protection=["masking"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients, client_policies={3: Seen("adaptive", box=BOX, actions=("train",))})
    actions = {a for a, _ in lied}
    assert any(a.startswith("init.") for a in actions) and "train" in actions
    assert all(changed == (a == "train") for a, changed in lied)
    with pytest.raises(InputError, match="actions='train': pass None"):
        Poisoning("adaptive", actions="train")


def test_attacked_rounds_counts_the_rounds_with_a_pair_to_rewrite(clients):
    """DWF sends a (count, sum) pair every training round; k-FED's secure mode without DP sends
    'value' fields only, so the attack has nothing to rewrite and says so (0), with the honest fit."""
    est = _fit(clients)
    report = Poisoning("adaptive", 1, random_state=1).evaluate(est, clients)
    assert report.attacked_rounds >= 1 and report.displacement_max > 0
    assert "lied in" in report.summary()
    seeded = make_estimator("dwf", n_clusters=4, init="private", init_bounds=BOX, random_state=0, max_rounds=3,
                            crypto="ideal").fit(clients)
    every = Poisoning("adaptive", 1, random_state=1).evaluate(seeded, clients).attacked_rounds
    train_only = Poisoning("adaptive", 1, random_state=1, actions=("train",)).evaluate(seeded, clients).attacked_rounds
    assert every == train_only + 1  # the seeding round's bucket counts and sums are a pair too
    kfed = make_estimator("kfed", n_clusters=4, secure_mode=True, init_bounds=BOX, random_state=0, crypto="ideal")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kfed.fit(clients)
    nothing = Poisoning("adaptive", 1, random_state=1).evaluate(kfed, clients)
    assert nothing.attacked_rounds == 0 and nothing.displacement_max == 0.0


def test_attack_matrix_cell_numbers_or_not_applicable():
    """The attack benchmark's poisoning cell: numbers on DWF, 'not applicable' with the reason on a
    fit with no (count, sum) pair (k-FED's secure mode without DP) instead of a displacement of 0."""
    from attacks import matrix

    ds = {"name": "wine", "split": "iid", "n_clients": 10}
    data, k, box, held = matrix.load(ds, 0)
    cell = {"seed": 0}
    out = {}
    for alg in ("dwf", "kfed+secure"):
        est = matrix.make_fit(alg, ["masking"], k, box, 0, 5, "ideal", False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(data)
            out[alg] = matrix._attack("poisoning", est, data, cell, held, box)
    assert out["dwf"]["poison_displacement"] > 0.1 and "status" not in out["dwf"]
    assert out["kfed+secure"]["status"].startswith("not applicable: no round of this fit sends a (count, sum) pair")


def test_the_runtime_guard_counts_a_secure_mode_s_sub_rounds():
    """A poisoned secure mode runs each global round's secure k-means to server_max_iter (its
    movement never falls below tol): the runtime's guard against runs that never end allows
    for those sub-rounds (Algorithm.round_limit) instead of raising 'made N rounds without
    finishing' (aligning+secure in the attack benchmark under the adaptive attack did)."""
    from securefkm.algorithms.aligning import AligningFederatedKMeansAlgorithm

    algo = AligningFederatedKMeansAlgorithm(4, secure_mode=True, max_rounds=30, server_max_iter=300)
    assert algo.round_limit(30) >= 30 * (1 + 2 * 300)
    plain = AligningFederatedKMeansAlgorithm(4, max_rounds=30)
    assert plain.round_limit(30) == plain.planned_rounds(30)
