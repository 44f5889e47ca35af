"""protocols.influence: the per-round bounds on what malicious clients can do to DWF's centres,
checked against the in-range attacks run through the client-policy harness."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_blobs

from attacks.poisoning import PoisoningPolicy
from protocols.influence import (box_diameter, influence_report, mean_shift_bound, median_interval,
                                 median_shift_bound)
from securefkm.algorithms.dwf import histogram_quantile
from securefkm.exceptions import InputError
from securefkm.registry import make_estimator

LOW, HIGH = np.zeros(3), np.ones(3)
BOX = (LOW, HIGH)
K, BINS = 3, 32


def _clients(n_clients, seed):
    X, y = make_blobs(40 * n_clients, centers=K, n_features=3, cluster_std=0.07, center_box=(0.25, 0.75),
                      random_state=seed)
    X = np.clip(X, 0.0, 1.0)
    order = np.random.default_rng(seed).permutation(len(X))
    return np.array_split(X[order], n_clients)


def _start(clients):
    from sklearn.cluster import KMeans

    return KMeans(K, n_init=10, random_state=0).fit(np.vstack(clients)).cluster_centers_


def _one_round(clients, start, aggregation, policies=None):
    est = make_estimator("dwf", n_clusters=K, init=start, init_bounds=BOX, max_rounds=1, random_state=0,
                         aggregation=aggregation, vote_bins=BINS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(clients, client_policies=policies or {}).cluster_centers_


def _honest_round(honest, start):
    """Counts, means and vote histograms of the honest clients under the broadcast ``start``,
    computed here from the definitions (nearest centre; one vote per coordinate in its bin)."""
    counts, sums, votes = np.zeros(K), np.zeros((K, 3)), np.zeros((K, 3, BINS))
    for X in honest:
        lab = np.argmin(((X[:, None, :] - start[None]) ** 2).sum(-1), axis=1)
        for j in range(K):
            Xj = X[lab == j]
            if len(Xj):
                counts[j] += len(Xj)
                sums[j] += Xj.sum(0)
                b = np.clip(np.floor(Xj.mean(0) * BINS), 0, BINS - 1).astype(int)
                votes[j, np.arange(3), b] += 1
    means = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], start)
    return counts, means, votes


CASES = [(n, m) for n in (10, 20) for m in (1, 3, 5)]


@pytest.mark.parametrize("n_clients, m", CASES)
def test_mean_shift_never_exceeds_the_bound_and_the_adaptive_attack_attains_it(n_clients, m):
    clients = _clients(n_clients, seed=n_clients + m)
    start = _start(clients)
    bad = sorted(np.random.default_rng(m).choice(n_clients, m, replace=False).tolist())
    honest = [X for i, X in enumerate(clients) if i not in bad]
    counts, means, _ = _honest_round(honest, start)
    M = sum(len(clients[i]) for i in bad)
    bound = mean_shift_bound(M, counts, BOX, means)
    ref = _one_round(honest, start, "mean")
    np.testing.assert_allclose(ref, means, atol=1e-12)  # the honest round is what the bound is centred on
    ratios = []
    for kind in ("adaptive", "robust-adaptive"):
        poisoned = _one_round(clients, start, "mean", {i: PoisoningPolicy(kind, box=BOX) for i in bad})
        moved = np.linalg.norm(poisoned - ref, axis=1)
        assert np.all(moved <= bound + 1e-12), (kind, moved, bound)
        ratios.append(np.max(moved / bound))
    assert ratios[0] >= 0.95  # attained within 5% by the adaptive attack: the bound is not loose
    # the data-free form is the diameter's: never smaller
    assert np.all(mean_shift_bound(M, counts, BOX) >= bound - 1e-12)


@pytest.mark.parametrize("n_clients, m", CASES)
def test_median_shift_stays_in_the_honest_order_statistics(n_clients, m):
    clients = _clients(n_clients, seed=n_clients + m)
    start = _start(clients)
    bad = sorted(np.random.default_rng(m).choice(n_clients, m, replace=False).tolist())
    honest = [X for i, X in enumerate(clients) if i not in bad]
    _, _, votes = _honest_round(honest, start)
    ref = _one_round(honest, start, "median")
    np.testing.assert_allclose(ref, histogram_quantile(votes, LOW, HIGH, votes.sum(-1) / 2), atol=1e-12)
    lo, hi = median_interval(m, votes, BOX)
    bound = median_shift_bound(m, votes, BOX)
    for kind in ("adaptive", "robust-adaptive"):
        poisoned = _one_round(clients, start, "median", {i: PoisoningPolicy(kind, box=BOX) for i in bad})
        assert np.all(poisoned >= lo - 1e-12) and np.all(poisoned <= hi + 1e-12), kind
        assert np.all(np.linalg.norm(poisoned - ref, axis=1) <= bound + 1e-12), kind
    # robust-adaptive puts m votes in the far bin of every coordinate: where the honest votes
    # outnumber them, the median lands exactly on the honest left quantile at mass (h + m)/2
    # (pushed up) or (h - m)/2 (pushed down); with m >= h it passes every honest vote (the lower
    # median of a tie m = h stops at the largest honest vote going up, in the first bin going down)
    h = votes.sum(-1)
    up = np.abs(start - LOW) <= np.abs(start - HIGH)
    expect = histogram_quantile(votes, LOW, HIGH, np.where(up, h + m, h - m) / 2)
    inside = (h > m) & (expect > 1 / BINS) & (expect < 1 - 1 / BINS)
    np.testing.assert_allclose(poisoned[inside], expect[inside], atol=1e-12)
    top = histogram_quantile(votes, LOW, HIGH, h)  # the right end of the largest honest vote's bin
    assert np.all(np.where(up, poisoned >= top - 1e-12, poisoned <= 1 / BINS)[h <= m])
    assert inside.sum() >= (3 * K if m < n_clients / 4 else 0)
    if 2 * m < n_clients:  # a minority of votes: the median's bound is the tighter one
        counts, means, _ = _honest_round(honest, start)
        assert bound.max() < mean_shift_bound(sum(len(clients[i]) for i in bad), counts, BOX, means).max()


def test_histogram_quantile_by_hand():
    v = np.array([[[1.0, 2.0, 3.0, 4.0]]])  # bins of width 0.25 on [0, 1]
    lo, hi = np.zeros(1), np.ones(1)
    assert histogram_quantile(v, lo, hi, 5.0)[0, 0] == pytest.approx(0.5 + 0.25 * 2 / 3, abs=1e-15)
    assert histogram_quantile(v, lo, hi, 0.0)[0, 0] == 0.0
    assert histogram_quantile(v, lo, hi, 10.0, "right")[0, 0] == 1.0
    gap = np.array([[[2.0, 0.0, 0.0, 2.0]]])  # flat between the bins: left and right ends differ
    assert histogram_quantile(gap, lo, hi, 2.0)[0, 0] == 0.25
    assert histogram_quantile(gap, lo, hi, 2.0, "right")[0, 0] == 0.75
    l2, h2 = median_interval(2, v, (0.0, 1.0))
    assert (l2[0, 0], h2[0, 0]) == (pytest.approx(0.5 + 0.25 / 3), 0.75)
    assert median_shift_bound(2, v, (0.0, 1.0))[0] == pytest.approx(0.75 - (0.5 + 0.25 * 2 / 3))
    whole = median_interval(10, v, (0.0, 1.0))  # m >= h: anywhere in the box
    assert whole[0][0, 0] == 0.0 and whole[1][0, 0] == 1.0


def test_mean_bound_by_hand_and_the_report():
    # M = 3 against C = (10, 20) in the unit square: 3/13 and 3/23 of the farthest-corner distance
    b = mean_shift_bound(3, [10, 20], (0.0, 1.0), [[0.5, 0.5], [0.2, 0.9]])
    np.testing.assert_allclose(b, [3 / 13 * np.sqrt(0.5), 3 / 23 * np.hypot(0.8, 0.9)], rtol=1e-15)
    np.testing.assert_allclose(mean_shift_bound(3, [10, 0], BOX), [3 / 13 * np.sqrt(3), np.sqrt(3)], rtol=1e-15)
    assert mean_shift_bound(0, [0, 5], BOX).tolist() == [0.0, 0.0]
    r = influence_report(3, 120, [600, 400, 500], (np.full(2, -1.0), np.full(2, 1.0)))
    assert r["max"] == pytest.approx(120 / 520 * np.sqrt(8)) and r["box_diameter"] == pytest.approx(np.sqrt(8))
    assert r["lines"] == ["3 malicious clients of declared 120 records move a centre by at most 0.65 per round "
                          "(box diameter 2.8)"]
    v = np.zeros((3, 2, 4))
    v[:, :, 1] = 5.0
    r = influence_report(1, 40, [50, 50, 50], (np.zeros(2), np.ones(2)), honest_votes=v, learning_rate=0.5)
    # 5 honest votes in [0.25, 0.5): median 0.375, one vote more on either side 0.4 or 0.35
    assert r["median_max"] == pytest.approx(0.5 * np.hypot(0.025, 0.025))
    assert "aggregation='median': at most 0.018 per round (1 malicious vote per coordinate" in r["lines"][1]
    assert box_diameter((0.0, 2.0), 4) == 4.0


def test_bad_input_names_the_argument():
    with pytest.raises(InputError, match="malicious_records=-1"):
        mean_shift_bound(-1, [1, 2], BOX)
    with pytest.raises(InputError, match="honest_counts"):
        mean_shift_bound(1, [[1, 2]], BOX)
    with pytest.raises(InputError, match="honest_centres"):
        mean_shift_bound(1, [1, 2], BOX, np.zeros((3, 3)))
    with pytest.raises(InputError, match="init_bounds"):
        mean_shift_bound(1, [1, 2], (1.0, 0.0), np.zeros((2, 3)))
    with pytest.raises(InputError, match="honest_votes"):
        median_interval(1, np.zeros((2, 3)), BOX)
    with pytest.raises(InputError, match="n_malicious"):
        influence_report(1.5, 3, [1], BOX)
