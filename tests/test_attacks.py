"""Attacks: scorer, passive reconstruction, active (malicious server) attacks, defences."""

import numpy as np
import pytest

from attacks import (
    ActiveAggregateDifferencing,
    AggregateDifferencing,
    CraftedCentroids,
    Differencing,
    LeakageReport,
    ModelInconsistency,
    SmallClusterDisclosure,
    Sybil,
    score_reconstructions,
)
from attacks.active import SlabSearch, slab_positions
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.estimators.dwf import WeightedFederatedKMeans
from securefkm.exceptions import InputError
from securefkm.federation import Federation

protocols = pytest.importorskip("protocols")
masking = pytest.importorskip("protocols.masking")


# ------------------------------------------------------------------ scorer
def test_scorer_exact_matches_precision_and_exposure():
    rng = np.random.default_rng(0)
    clients = [rng.normal(size=(10, 3)) for _ in range(4)]
    claims = [(0, clients[0][3]), (0, clients[0][3] + 1e-9), (1, clients[1][0] + 0.5), (2, clients[2][9])]
    r = score_reconstructions(claims, clients, tol_approx=0.5)
    assert r.records_recovered == 2  # the duplicate claim counts once, client 1's is off
    assert r.records_recovered_approx == 3
    assert r.precision == pytest.approx(3 / 4)
    assert r.clients_exposed == pytest.approx(2 / 4)
    assert r.fraction_recovered == pytest.approx(2 / 40)
    assert r.reconstruction_error.shape == (4,)
    d = r.to_dict()
    assert d["records_recovered"] == 2 and d["reconstruction_error"]["max"] > 0.1
    t = score_reconstructions(claims, clients, targets=[0])
    assert t.n_records == 10 and t.records_recovered == 1 and t.clients_exposed == 1.0


def test_scorer_rejects_bad_input():
    clients = [np.zeros((3, 2)), np.ones((3, 2))]
    with pytest.raises(InputError, match="claims"):
        score_reconstructions([(5, np.zeros(2))], clients)
    with pytest.raises(InputError, match="targets"):
        score_reconstructions([], clients, targets=[7])
    with pytest.raises(InputError, match="tol_exact"):
        score_reconstructions([], clients, tol_exact=-1)
    with pytest.raises(InputError, match="dataset"):
        score_reconstructions([], "nope")
    with pytest.raises(InputError, match="transcript"):
        SmallClusterDisclosure().evaluate("nope", clients)
    with pytest.raises(InputError, match="target"):
        CraftedCentroids(target=99).evaluate(WeightedFederatedKMeans(2), clients)
    assert isinstance(LeakageReport(), LeakageReport)


def test_slab_positions_realise_thresholds():
    rng = np.random.default_rng(1)
    for _ in range(200):
        t = np.sort(rng.normal(size=rng.integers(1, 5)))
        p = slab_positions(t)
        if p is None:
            continue
        assert np.allclose((p[:-1] + p[1:]) / 2, t)
        assert np.all(np.diff(p) > 0)
    assert slab_positions(np.array([0.0, 1.0, 11.0, 12.0])) is None  # gaps 1, 10, 1: infeasible


def test_slab_search_isolates_every_record_offline():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(60, 3))
    X[5] = X[6]  # a duplicate record is returned twice
    s = SlabSearch(3, 5, rng)
    rounds = 0
    while not s.done and rounds < 100:
        p = s.propose()
        C = p[:, None] * s.v[None]
        lab = np.argmin(((X[:, None] - C[None]) ** 2).sum(-1), axis=1)
        s.observe(np.bincount(lab, minlength=len(C)), np.array([X[lab == j].sum(0) for j in range(len(C))]))
        rounds += 1
    assert s.done and len(s.records) == 60
    assert rounds <= 40
    R = np.vstack(s.records)
    assert np.max(np.min(np.linalg.norm(R[:, None] - X[None], axis=2), axis=1)) < 1e-9


# ------------------------------------------------------------------ passive, plain DWF
@pytest.fixture(scope="module")
def plain_dwf(blobs_noniid):
    _, clients = blobs_noniid
    algo = WeightedFederatedKMeansAlgorithm(5, init="k-means++", learning_rate=1.0)
    fed = Federation(algo, clients, max_rounds=100, random_state=0)
    fed.run()
    return fed.transcript, clients


def test_passive_attacks_recover_records_exactly_on_plain_dwf(plain_dwf):
    transcript, clients = plain_dwf
    small = SmallClusterDisclosure().evaluate(transcript, clients)
    diff = Differencing().evaluate(transcript, clients)
    assert small.records_recovered >= 10 and small.precision > 0.99
    assert small.extra["seeding_records_claimed"] == 5  # k-means++ seeding sends 5 raw records
    assert diff.records_recovered >= 25 and diff.precision > 0.99
    assert diff.records_recovered > small.records_recovered  # peeling adds to singletons
    assert diff.clients_exposed >= 0.12


@pytest.mark.slow
def test_passive_differencing_paper_settings(blobs_noniid):
    """DWF paper settings (eta=0.01, mu=0.8, one local step, 300 rounds) on the paper's own
    blob data: 4.8% of records exactly, 41% of clients (measured; the research prototype's
    6.5% / 90% is not reached, see docs/attacks/reconstruction.md)."""
    _, clients = blobs_noniid
    algo = WeightedFederatedKMeansAlgorithm(5, init="k-means++", learning_rate=0.01, momentum=0.8)
    fed = Federation(algo, clients, max_rounds=300, random_state=0)
    fed.run()
    r = Differencing().evaluate(fed.transcript, clients)
    assert r.fraction_recovered >= 0.045 and r.precision > 0.99 and r.clients_exposed >= 0.40


# ------------------------------------------------------------------ active, plaintext
def test_crafted_centroids_recover_every_record_of_target(blobs_noniid):
    _, clients = blobs_noniid
    est = WeightedFederatedKMeans(5, random_state=0)
    for target in (0, 42):
        r = CraftedCentroids(target).evaluate(est, clients)
        n = len(clients[target])
        assert r.records_recovered == n and r.precision == 1.0 and r.extra["completed"]
        assert r.rounds_used <= n // 2  # (n - 1) is the worst case; ~n / (k - 1) in practice
        assert r.clients_exposed == 1.0 and r.n_clients == 1


def test_crafted_centroids_decoys_need_more_rounds(blobs_noniid):
    _, clients = blobs_noniid
    est = WeightedFederatedKMeans(5, random_state=0)
    full = CraftedCentroids(3).evaluate(est, clients)
    few = CraftedCentroids(3, n_usable=2).evaluate(est, clients)
    assert few.records_recovered == len(clients[3])
    assert few.rounds_used > full.rounds_used


# ------------------------------------------------------------------ secure aggregation
@pytest.fixture(scope="module")
def ten_clients(blobs_noniid):
    _, clients = blobs_noniid
    return clients[:10]


def _masked(bind=True, extra=()):
    from protocols import PairwiseMasking

    return WeightedFederatedKMeans(
        5, init_bounds=(-2, 2), protection=[*extra, PairwiseMasking(bind_broadcast=bind)], random_state=0
    )


def test_masking_defeats_per_client_passive_attacks(ten_clients):
    est = _masked().set_params(max_rounds=15)
    est.fit(ten_clients)
    for attack in (SmallClusterDisclosure(), Differencing()):
        r = attack.evaluate(est.transcript_, ten_clients)
        assert r.records_recovered == 0 and r.n_claims == 0


def test_model_inconsistency_needs_unbound_masks(ten_clients):
    r = ModelInconsistency(target=3).evaluate(_masked(bind=False), ten_clients)
    assert r.records_recovered == len(ten_clients[3]) and r.precision == 1.0
    bound = ModelInconsistency(target=3).evaluate(_masked(bind=True), ten_clients)
    assert bound.records_recovered == 0 and bound.n_claims == 0
    assert bound.extra["detected"] and "inconsistent broadcasts" in bound.extra["abort_reasons"][0]


def test_aggregate_differencing_under_masking(ten_clients):
    r = ActiveAggregateDifferencing(target=2).evaluate(_masked(), ten_clients)
    assert r.records_recovered == len(ten_clients[2]) and r.precision == 1.0


def test_passive_aggregate_differencing_reads_pairs_in_a_plain_transcript(plain_dwf):
    """Pairs are found from contributors and broadcast digests alone (here: none repeat)."""
    transcript, clients = plain_dwf
    r = AggregateDifferencing().evaluate(transcript, clients)
    assert r.records_recovered == 0 and r.extra["isolated_clients"] == []


@pytest.mark.slow  # GaussianDP calibration (opacus accountant) dominates
def test_aggregate_differencing_fails_with_min_participants_and_dp(ten_clients):
    from protocols import GaussianDP

    dp = GaussianDP(epsilon=1.0, delta=1e-5, clip=2.0, mode="distributed", min_clients=10)
    r = ActiveAggregateDifferencing(target=2, max_rounds=20).evaluate(_masked(extra=[dp]), ten_clients)
    assert r.records_recovered == 0


def test_the_run_floor_defeats_a_few_sybils(ten_clients):
    """Target + 3 sybils is far below the clients' run floor (the declared cohort less the
    dropout allowance): every client refuses such a round and nothing is recovered."""
    r = Sybil(target=4, n_sybils=3).evaluate(_masked(bind=True), ten_clients)
    assert r.records_recovered == 0 and r.rounds_used == 0


@pytest.mark.slow  # 90 sybil clients under real masking: about 45 s
def test_sybils_that_fill_the_run_floor_defeat_broadcast_binding(ten_clients):
    """With sybils making up the floor (here 90 of 100 declared clients) the server can still
    surround the target with clients it controls: the floor raises the attack's cost, it does
    not remove it (client admission the server does not control does)."""
    r = Sybil(target=4, n_sybils=90).evaluate(_masked(bind=True), ten_clients)
    assert r.records_recovered == len(ten_clients[4]) and r.precision == 1.0


# ------------------------------------------------------------------ MinClusterSize, DP
def test_min_cluster_size_stops_size_one_disclosure_not_active_attacks(blobs_noniid):
    from protocols import MinClusterSize

    _, clients = blobs_noniid
    est = WeightedFederatedKMeans(5, init_bounds=(-2, 2), protection=[MinClusterSize(2)], max_rounds=30, random_state=0)
    est.fit(clients)
    r = SmallClusterDisclosure().evaluate(est.transcript_, clients)
    assert r.records_recovered == 0
    act = CraftedCentroids(0, max_rounds=200).evaluate(est, clients)
    assert act.records_recovered >= 0.5 * len(clients[0])  # MinClusterSize does not stop it


@pytest.mark.slow  # GaussianDP calibration (opacus accountant) dominates
def test_local_dp_at_epsilon_one_no_exact_record(blobs_noniid):
    from protocols import GaussianDP

    _, clients = blobs_noniid
    est = WeightedFederatedKMeans(
        5, init_bounds=(-2, 2), protection=[GaussianDP(1.0, 1e-5, clip=2.0, mode="local")], max_rounds=4, random_state=0
    )
    est.fit(clients)
    assert SmallClusterDisclosure().evaluate(est.transcript_, clients).records_recovered == 0
    assert CraftedCentroids(0, max_rounds=8).evaluate(est, clients).records_recovered == 0
