"""Issue 4 must-show: passive attacks on unprotected DWF (5-blob set, 100 non-IID clients,
one local step, learning rate 0.01, momentum 0.8, k-means++ seeding, Federation seed 0)."""

import numpy as np
import pytest

from attacks import Differencing
from securefkm.algorithms._kmeans import assign
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.federation import Federation


def _paper_transcript(clients, rounds):
    algo = WeightedFederatedKMeansAlgorithm(5, init="k-means++", learning_rate=0.01, momentum=0.8)
    fed = Federation(algo, clients, max_rounds=rounds, random_state=0)
    fed.run()
    return fed.transcript


def test_differencing_paper_settings_100_rounds(blobs_noniid):
    """CI-sized: the first 100 of the paper's rounds. Measured 402 records (3.98%), 39% of
    clients, precision 100%; the pairwise peeling of the previous release got 330."""
    _, clients = blobs_noniid
    r = Differencing().evaluate(_paper_transcript(clients, 100), clients)
    assert r.records_recovered >= 380 and r.precision > 0.99 and r.clients_exposed >= 0.38


def _linear_ceiling(transcript, clients):
    """Records whose value follows linearly from a client's per-round cell sums even when
    the cell of every record in every round is known (ground truth, scoring only): no
    passive attack on these messages recovers a record outside this set exactly."""
    rounds = [r for r in transcript if r.action == "train"]
    n_rec = n_cli = 0
    for c, X in enumerate(clients):
        rows = np.array([assign(X, r.broadcasts[c].centres)[0] == j for r in rounds for j in range(5)], dtype=float)
        rows = np.unique(rows, axis=0)
        _, s, vt = np.linalg.svd(rows)
        null = vt[int(np.sum(s > 1e-9)) :]
        rec = np.linalg.norm(null, axis=0) < 1e-8 if len(null) else np.ones(len(X), bool)
        n_rec += int(rec.sum())
        n_cli += bool(rec.any())
    return n_rec, n_cli


@pytest.mark.slow
def test_differencing_paper_settings_must_show(blobs_noniid):
    """300 rounds (paper settings): at least 6.5% of records exactly, precision > 99%.
    Measured 665 records (6.58%), 41% of clients, precision 100%.

    The issue's 90% of clients is not reachable on this split: even knowing every record's
    cell in every round, only 42 of the 100 clients have a record determined by their
    messages (51 clients stay in one cell for all 300 rounds: the server learns their count
    and mean only). See docs/attacks/reconstruction.md."""
    _, clients = blobs_noniid
    transcript = _paper_transcript(clients, 300)
    r = Differencing().evaluate(transcript, clients)
    assert r.fraction_recovered >= 0.065 and r.precision > 0.99 and r.clients_exposed >= 0.40
    n_rec, n_cli = _linear_ceiling(transcript, clients)
    assert r.records_recovered <= n_rec + 5  # + the 5 raw k-means++ seeding records
    assert n_cli < 90


@pytest.mark.slow
def test_differencing_paper_settings_iid_must_show():
    """The same paper settings on the IID split of the 5-blob set (the DWF paper's first
    setting): the issue's full target, >= 6.5% of records and >= 90% of clients exactly,
    precision > 99%. Measured 1123 records (11.1%), 100% of clients, precision 100%
    (ceiling 1280 records in 100 clients); ~5 min on the shared 2-core machine."""
    from securefkm.datasets import load_dataset

    clients = load_dataset("dwf-blobs", split="iid", n_clients=100, random_state=0).clients
    r = Differencing().evaluate(_paper_transcript(clients, 300), clients)
    assert r.fraction_recovered >= 0.065 and r.clients_exposed >= 0.90 and r.precision > 0.99


def test_region_test_with_witness_points_agrees_with_the_linear_programme():
    """In d > 2 the peeling's emptiness test answers from stored points when one lies in the
    region, and caches answers; on random Voronoi-cell intersections it must give exactly the
    plain LP's answer (both empty and non-empty regions occur)."""
    from scipy.optimize import linprog

    from attacks.passive import _cell_halfspaces, _Region, _shrunk, _Witnesses

    rng = np.random.default_rng(3)
    T, k, d = 6, 4, 4
    C = rng.normal(size=(k, d))[None] + 0.4 * rng.normal(size=(T, k, d))
    low, high = -3 * np.ones(d), 3 * np.ones(d)
    pool = _Witnesses(C)
    pool.add(rng.uniform(-3, 3, size=(300, d)))
    answers = []
    for _ in range(150):
        cells = [(int(t), int(rng.integers(k))) for t in rng.choice(T, size=int(rng.integers(1, 4)), replace=False)]
        region = _Region(C, low, high, pool)
        got = region.nonempty(cells)
        A = np.vstack([_cell_halfspaces(C[t], j)[0] for t, j in cells])
        b = np.concatenate([_cell_halfspaces(C[t], j)[1] for t, j in cells])
        want = linprog(np.zeros(d), A_ub=A, b_ub=_shrunk(b), bounds=list(zip(low, high)), method="highs").status == 0
        assert got == want, cells
        assert region.nonempty(cells) == want  # the cached answer
        answers.append(want)
    assert 10 < sum(answers) < 140  # both kinds were tested
