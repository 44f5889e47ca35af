"""FuzzyEquationSolver: exact records of small clients from FCM messages; nothing under masking."""

import numpy as np
import pytest
from sklearn.datasets import make_blobs

from attacks.fuzzy import FuzzyEquationSolver, _client_systems, _residuals, size_bounds
from securefkm.exceptions import InputError
from securefkm.registry import make_estimator

pytest.importorskip("protocols")


@pytest.fixture(scope="module")
def fuzzy_clients():
    X, _ = make_blobs(200, centers=3, cluster_std=0.5, random_state=2)
    return [X[:1], X[1:3], X[3:60], X[60:130], X[130:]]  # a one-record and a two-record client


def _fit(alg, clients, protection=()):
    kw = {"init_bounds": (-12.0, 12.0)} if protection else {}
    est = make_estimator(alg, protection=list(protection), n_clusters=3, max_rounds=15, random_state=0, **kw)
    return est.fit(clients)


def test_fedavg_fcm_small_clients_recovered_exactly(fuzzy_clients):
    est = _fit("fcm-fedavg", fuzzy_clients)
    r = FuzzyEquationSolver().evaluate(est.transcript_, fuzzy_clients)
    assert r.extra["clients_solved"] == [0, 1]  # the big clients are not guessed
    assert r.records_recovered == 3 and r.precision == 1.0
    assert np.max(r.reconstruction_error) < 1e-9
    # one fedavg round is enough for the one-record client: S_j / W_j is the record
    sys0 = _client_systems(est.transcript_)[0]
    S, W = sys0["fedavg"][0][2], sys0["fedavg"][0][3]
    assert np.allclose(S[0] / W[0], fuzzy_clients[0][0], rtol=0, atol=1e-12)


def test_residual_is_zero_at_the_truth_and_not_elsewhere(fuzzy_clients):
    est = _fit("fcm-fedavg", fuzzy_clients)
    sys1 = _client_systems(est.transcript_)[1]
    assert np.max(np.abs(_residuals(fuzzy_clients[1], sys1, 10.0))) == 0.0
    assert np.max(np.abs(_residuals(fuzzy_clients[1] + 1e-4, sys1, 10.0))) > 1e-6


def test_fedfcm_local_centres_and_validity_round(fuzzy_clients):
    """k-means averaging: local FCM centres (set-fields) + the FedFuzzDB shares."""
    est = _fit("fcm", fuzzy_clients)
    r = FuzzyEquationSolver().evaluate(est.transcript_, fuzzy_clients)
    assert r.records_recovered == 3 and r.precision == 1.0


def test_masking_leaves_nothing_for_fedavg(fuzzy_clients):
    est = _fit("fcm-fedavg", fuzzy_clients, protection=["masking"])
    r = FuzzyEquationSolver().evaluate(est.transcript_, fuzzy_clients)
    assert r.n_claims == 0 and r.records_recovered == 0
    assert r.extra["clients_with_plain_messages"] == 0


def test_bad_parameters():
    with pytest.raises(InputError, match="max_records"):
        FuzzyEquationSolver(max_records=0)
    with pytest.raises(InputError, match="transcript"):
        FuzzyEquationSolver().evaluate("nope", [np.zeros((2, 2))])


def test_size_bounds_hold_the_true_size_and_prune_big_clients(fuzzy_clients):
    """size_bounds: every client's true N lies in [lo, hi] (the conditions are necessary);
    on fedavg messages the weights bound N from both sides (K^(1-m) <= sum_j u^m <= 1)."""
    est = _fit("fcm-fedavg", fuzzy_clients)
    systems = _client_systems(est.transcript_)
    for c, X in enumerate(fuzzy_clients):
        lo, hi = size_bounds(systems[c])
        assert lo <= len(X) <= hi
    lo, hi = size_bounds(systems[2])  # 57 records: far above max_records, nothing to try
    assert lo > 3 and FuzzyEquationSolver()._sizes(systems[2]) == []
    assert size_bounds(systems[1])[0] == 2  # two records: the anchors span a line


def test_anchor_rank_prunes_clients_in_high_dimension():
    """k-means averaging sends only local centres (no counts): in 12-d, the local centres of a
    20-record client span more than a plane, so no size <= 3 is tried (no solver call); a
    2-record client is still solved exactly."""
    rng = np.random.default_rng(0)
    clients = [rng.normal(size=(2, 12)), rng.normal(size=(20, 12)) + 3, rng.normal(size=(30, 12)) - 3]
    est = make_estimator("fcm", n_clusters=4, max_rounds=4, random_state=0).fit(clients)
    systems = _client_systems(est.transcript_)
    assert size_bounds(systems[1])[0] >= 4 and size_bounds(systems[2])[0] >= 4
    assert FuzzyEquationSolver()._sizes(systems[1]) == []
    r = FuzzyEquationSolver().evaluate(est.transcript_, clients)
    assert r.extra["clients_solved"] == [0] and r.records_recovered == 2


def test_noisy_weights_leave_no_size():
    """A negative or non-finite weight cannot come from real memberships: no exact solution."""
    C = np.zeros((2, 2))
    sys_ = {"fedavg": [(C, 2.0, np.ones((2, 2)), np.array([0.5, -0.1]))], "local": [], "validity": []}
    lo, hi = size_bounds(sys_)
    assert hi < lo


def test_perturbed_messages_leave_only_the_closed_forms(fuzzy_clients):
    """The transcript says whether the stack perturbs each client's messages (public protocol
    knowledge); under Rounding the solver tries only one-record closed forms, and the flag
    follows the layers (central DP noises on the server: the clients' messages stay exact)."""
    from protocols import GaussianDP, Rounding

    rounded = _fit("fcm", fuzzy_clients, protection=[Rounding(decimals=1)])
    assert rounded.transcript_.meta["client_messages_exact"] is False
    calls = []
    solver = FuzzyEquationSolver()
    orig = solver._fit
    solver._fit = lambda X0, *a: calls.append(len(X0)) or orig(X0, *a)
    r = solver.evaluate(rounded.transcript_, fuzzy_clients)
    assert r.extra["exact_messages"] is False and set(calls) <= {1}
    assert r.records_recovered == 0  # a rounded record is not the record
    assert _fit("fcm", fuzzy_clients).transcript_.meta["client_messages_exact"] is True
    central = _fit("fcm-fedavg", fuzzy_clients, protection=[GaussianDP(1.0, 1e-5, bounds=(-12, 12), mode="central")])
    assert central.transcript_.meta["client_messages_exact"] is True
    local = _fit("fcm-fedavg", fuzzy_clients, protection=[GaussianDP(1.0, 1e-5, bounds=(-12, 12), mode="local")])
    assert local.transcript_.meta["client_messages_exact"] is False


def test_evaluation_budget_gives_up_a_client_and_says_so(fuzzy_clients):
    est = _fit("fcm-fedavg", fuzzy_clients)
    r = FuzzyEquationSolver(max_evaluations=1).evaluate(est.transcript_, fuzzy_clients)
    assert r.records_recovered == 0 and r.extra["clients_over_budget"] == [0, 1]
    with pytest.raises(InputError, match="max_evaluations"):
        FuzzyEquationSolver(max_evaluations=0)
