"""A ClientPopulation is streamed round by round: the same fit as the resident clients.

The streamed federation makes a client's runtime when a round first needs it and drops it
when the next round begins (keeping only persistent client state). On the same seeds the
centres, everything the server obtained per round, the privacy spent and the passive
attacks' reports must equal the resident simulation's, with dropouts at every stage,
aborted and retried rounds, client memory (a secure mode) and real and ideal masking.
"""

from __future__ import annotations

import tracemalloc
import warnings

import numpy as np
import pytest
from _backend_cases import BOX, CASES, make_clients, outcome

from protocols import GaussianDP, PairwiseMasking
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.datasets import ClientPopulation, FederatedDataset, blob_population
from securefkm.exceptions import InputError
from securefkm.federation import Federation, StreamedRuntimes
from securefkm.registry import make_estimator

STREAMED_CASES = ["dwf-plain", "dwf-masking-dropouts", "dwf-sparse-masking-rate", "kfed-secure-masking",
                  "dwf-masking-threshold-abort", "dwf-dp-seeded-masking"]


def population_of(clients) -> ClientPopulation:
    arrays = [np.array(c, copy=True) for c in clients]
    return ClientPopulation(lambda i: arrays[i].copy(), [len(a) for a in arrays], arrays[0].shape[1])


def run_case(case, clients, **extra):
    """``outcome`` in process; a population's attack reports read the same records as a list."""
    data = FederatedDataset(_resident(clients)) if isinstance(clients, ClientPopulation) else None
    return outcome(case, "local", clients=clients, data=data, **extra)


def _resident(population):
    return [population[i] for i in range(len(population))]


@pytest.mark.parametrize("case", STREAMED_CASES)
def test_streamed_population_equals_resident_clients(case):
    clients = make_clients()
    resident, streamed = run_case(case, clients), run_case(case, population_of(clients))
    assert streamed == resident
    assert resident["released"], "the case ran no round"


@pytest.mark.parametrize("crypto", ["real", "ideal"])
def test_streamed_sampled_cohorts_with_dp_equal_resident(crypto):
    clients = make_clients(40, 800)
    resident = run_case("dwf-dp-seeded-masking", clients, crypto=crypto, clients_per_round=16)
    streamed = run_case("dwf-dp-seeded-masking", population_of(clients), crypto=crypto, clients_per_round=16)
    assert streamed == resident
    assert len({r[3] for r in resident["released"]}) > 1  # the rounds sampled different cohorts


def test_streamed_runtimes_hold_one_round_and_keep_persistent_state():
    name, params, protection, dropout, _ = CASES["kfed-secure-masking"]
    est = make_estimator(name, n_clusters=3, protection=protection(), random_state=0, max_rounds=5,
                         dropout_rate=dropout, backend="local", init_bounds=BOX, **params)
    fed, _ = est.make_federation(population_of(make_clients()))
    with fed, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fed.run(0)
    runtimes = fed.transport.clients
    assert isinstance(runtimes, StreamedRuntimes) and 0 < runtimes.resident <= 12
    runtimes.end_round()
    assert runtimes.resident == 0
    # the secure mode's local centres are the clients' memory: kept between rounds
    assert set(runtimes._states) == set(range(12))


def _peak_of_fit(n_clients: int, cohort: int, resident: bool = False) -> int:
    """Peak traced memory of building the federation and running a 3-round fit."""
    population = blob_population(n_clients, records=10, random_state=3)
    clients = [population[i] for i in range(n_clients)] if resident else population
    algo = WeightedFederatedKMeansAlgorithm(5, init=np.array(population[0][:5]), tol=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tracemalloc.start()
        fed = Federation(algo, clients, protection=[GaussianDP(1.0, 1e-6, bounds=(-6, 6), mode="distributed"),
                                                    PairwiseMasking()],
                         clients_per_round=cohort, max_rounds=3, random_state=0, record="aggregates", crypto="ideal",
                         dropout_rate=0.05, backend="local")
        fed.run(0)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def test_peak_memory_follows_the_cohort_not_the_population():
    small, large = _peak_of_fit(2_000, 200), _peak_of_fit(200_000, 200)
    # 100 times the clients: what grows is the declared sizes and the sampler's draw, about
    # 6 bytes a client; resident clients' runtimes cost about 400 bytes each (checked below)
    assert large - small < 198_000 * 20, (small, large)
    resident = _peak_of_fit(20_000, 200, resident=True)
    assert resident - _peak_of_fit(2_000, 200, resident=True) > 18_000 * 200, resident


def test_population_refuses_bad_input():
    with pytest.raises(InputError, match="load"):
        ClientPopulation("not callable", [3], 2)
    with pytest.raises(InputError, match="sizes"):
        ClientPopulation(lambda i: np.zeros((3, 2)), [3, 0], 2)
    pop = ClientPopulation(lambda i: np.zeros((2, 2)), [3, 3], 2)
    with pytest.raises(InputError, match=r"load\(1\) returned shape \(2, 2\)"):
        pop[1]
    with pytest.raises(InputError, match="never pooled"):
        pop.pooled()
    with pytest.raises(InputError, match="box must be > 2"):
        blob_population(10, box=1.5)
    with pytest.raises(InputError, match="records must be >= 1"):
        blob_population(10, records=0)


def test_blob_population_makes_each_client_alone_and_the_same_each_time():
    a, b = blob_population(1000, random_state=5), blob_population(50, random_state=5)
    np.testing.assert_array_equal(a[7], b[7])  # independent of the population's size
    np.testing.assert_array_equal(a[7], a[7])
    assert not np.array_equal(a[7], a[8])
    assert np.abs(a[3]).max() <= 6.0 and a.n_samples == 10_000


def _listed_sample(rng, n, count, excluded):
    """The sampler over an explicit list of the remaining ids (what sample_clients computes
    without listing them)."""
    out = set(excluded)
    remaining = [c for c in range(n) if c not in out]
    if count >= len(remaining):
        return tuple(remaining)
    picks = rng.choice(len(remaining), size=count, replace=False)
    return tuple(sorted(remaining[i] for i in picks.tolist()))


def test_sampling_around_excluded_clients_draws_as_the_listed_sampler():
    from securefkm.federation.sampling import sample_clients

    r = np.random.default_rng(0)
    for _ in range(500):
        n = int(r.integers(2, 200))
        excluded = r.choice(n, int(r.integers(1, n)), replace=False).tolist()
        count, seed = int(r.integers(1, n + 2)), int(r.integers(1 << 30))
        got = sample_clients(np.random.default_rng(seed), n, count, excluded)
        assert got == _listed_sample(np.random.default_rng(seed), n, count, excluded)
        assert not set(got) & set(excluded)
    # ten million clients with exclusions: no list of the remaining ids is built
    tracemalloc.start()
    got = sample_clients(np.random.default_rng(1), 10_000_000, 1_000, [3, 10, 9_999_999])
    assert tracemalloc.get_traced_memory()[1] < 5_000_000
    tracemalloc.stop()
    assert len(got) == 1_000 and not {3, 10, 9_999_999} & set(got)


@pytest.mark.parametrize("case", ["dwf-masking-dropouts", "kfed-secure-masking", "dwf-dp-seeded-masking"])
def test_streamed_population_on_worker_processes_equals_resident(case):
    """Each worker makes its shard's sampled clients per round (provisioned when first made):
    the same fit as resident shards and as the streamed population in process."""
    population = blob_population(12, records=30, n_centres=3, random_state=1)
    clients = _resident(population)
    data = FederatedDataset(clients)
    resident = outcome(case, "processes", clients=clients)
    assert outcome(case, "processes", clients=population, data=data) == resident
    assert outcome(case, "local", clients=population, data=data) == resident


def test_worker_backends_need_a_picklable_loader():
    population = population_of(make_clients())  # its load is a closure
    algo = WeightedFederatedKMeansAlgorithm(2, init=np.zeros((2, 2)))
    with pytest.raises(InputError, match="cannot be pickled.*module level"):
        Federation(algo, population, protection=[PairwiseMasking()], backend="processes")


def test_streamed_runtimes_keep_any_non_empty_state_and_drop_empty_memories():
    made = []

    def make(i, state):
        from securefkm.federation.client import ClientRuntime

        made.append((i, state))
        return ClientRuntime(i, np.zeros((2, 2)), None, [], None, None, state=state)

    runtimes = StreamedRuntimes(make, range(4))
    runtimes[0].context.state["algorithm"] = {}           # an unused memory: nothing to keep
    runtimes[1].context.state["weights"] = np.arange(3.0)  # an array: kept
    runtimes[2].context.state["algorithm"] = {"local": 1}
    runtimes.end_round()
    assert sorted(runtimes._states) == [1, 2]
    runtimes[1]
    assert made[-1][0] == 1 and made[-1][1]["weights"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(KeyError):
        runtimes[4]


def test_an_estimator_fits_a_population_without_pooling_it():
    from securefkm import WeightedFederatedKMeans

    population = blob_population(1_000, random_state=4)
    est = WeightedFederatedKMeans(n_clusters=5, init_bounds=(-6, 6), clients_per_round=100, random_state=0,
                                  backend="local")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(population)
    assert not hasattr(est, "labels_") and not hasattr(est, "inertia_")
    assert est.n_features_in_ == 2 and est.predict(population[3]).shape == (10,)
    truth = population.load.centres
    gap = np.sqrt(((est.cluster_centers_[:, None] - truth[None]) ** 2).sum(-1)).min(1)
    assert gap.max() < 0.5  # every fitted centre next to a generating one
    with pytest.raises(InputError, match="groups"):
        est.fit(population, groups=[0])
