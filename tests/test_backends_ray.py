"""backend="ray" on a two-node Ray cluster started on this machine.

``ray.cluster_utils.Cluster`` starts a head node and a second node (one CPU each), so the
actors are spread over two nodes and the multi-node code path runs without a real
cluster. Ray is in the ``test`` extra; without it these tests are skipped.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from _backend_cases import CASES, make_clients, outcome, seeded_dp_available

from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.registry import make_estimator

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]')")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.ray


# first: it needs a process not yet connected to Ray
def test_unreachable_address_is_an_input_error(monkeypatch):
    if ray.is_initialized():
        pytest.skip("a Ray instance is already connected in this process")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    est = make_estimator("dwf", n_clusters=3, random_state=0, backend="ray", n_workers=1)
    start = time.monotonic()
    with pytest.raises(InputError, match="RAY_ADDRESS='127.0.0.1:1'.*ray start --head"):
        est.fit(make_clients())
    assert time.monotonic() - start < 120
    assert not ray.is_initialized()
    assert os.environ["RAY_ADDRESS"] == "127.0.0.1:1"


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    # the workers import the test helpers (client policies are pickled into the actors)
    tests = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(address=c.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def test_two_nodes_host_the_pool_and_results_equal_local(cluster):
    from securefkm.federation import Federation  # noqa: F401  (import check)

    local = outcome("dwf-masking-dropouts", "local")
    on_ray = outcome("dwf-masking-dropouts", "ray", n_workers=2)
    assert on_ray == local
    est = make_estimator("dwf", n_clusters=3, random_state=0, max_rounds=3, backend="ray", n_workers=2)
    fed, _ = est.make_federation(make_clients())
    with fed:
        nodes = {s["node"] for s in fed.transport.worker_stats()}
    assert len(nodes) == 2, "the two actors should sit on the two nodes"
    assert ray.is_initialized(), "a cluster the user joined is left running"


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_ray_equals_local(cluster, case):
    if "dp-seeded" in case and not seeded_dp_available():
        pytest.skip("GaussianDP(rng='seeded') is not available")
    assert outcome(case, "ray", n_workers=2) == outcome(case, "local")


def test_killed_actor_drops_its_clients_or_aborts_naming_them(cluster):
    from protocols import PairwiseMasking

    est = make_estimator("dwf", n_clusters=3, random_state=0, init_bounds=(-2.0, 7.0), protection=[PairwiseMasking()],
                         backend="ray", n_workers=2)
    fed, _ = est.make_federation(make_clients())
    with fed:
        state = fed.algorithm.init(fed.n_clients, 2, np.random.default_rng(0))
        state = fed.run_round(state, round=0)
        ray.kill(fed.transport.pool.actors[1], no_restart=True)
        start = time.monotonic()
        with pytest.raises(RoundAbortedError, match=r"lost clients \[6, 7, 8, 9, 10, 11\] with worker 1"):
            fed.run_round(state, round=1)  # masking needs 2/3 of the clients: half is too few
        assert time.monotonic() - start < 60
        record = list(fed.transcript)[-1]
        assert not record.aggregate and record.centres_after is None


def test_client_policies_act_on_ray_as_in_process(cluster):
    """Malicious clients (malformed, poisoning, refusing) on Ray actors: the same centres,
    released transcript, faults, exclusions and aborts as in process."""
    import warnings

    from _client_policies import Poison, Refuse, Replace

    from protocols import PairwiseMasking

    policies = {1: Replace("masked_input", b"x", rounds={0, 2}), 6: Poison(2.0), 10: Refuse("unmask")}

    def run(backend):
        est = make_estimator("dwf", n_clusters=3, random_state=0, init_bounds=(-2.0, 7.0), backend=backend,
                             protection=[PairwiseMasking()], n_workers=2, max_rounds=4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(make_clients(), client_policies=policies)
        t = est.transcript_
        return (est.cluster_centers_.tobytes(), [r.faults for r in t],
                [(e.client, e.round, e.attempt) for e in t.exclusions], [a.describe() for a in t.aborts],
                [{k: v.tobytes() for k, v in (r.aggregate or {}).items()} for r in t])

    local = run("local")
    assert any(local[1]), "the case must produce faults to compare"
    assert run("ray") == local


def test_streamed_population_on_two_ray_nodes_equals_resident(cluster):
    from securefkm.datasets import FederatedDataset, blob_population

    population = blob_population(12, records=30, n_centres=3, random_state=1)
    clients = [population[i] for i in range(12)]
    resident = outcome("dwf-masking-dropouts", "local", clients=clients)
    streamed = outcome("dwf-masking-dropouts", "ray", n_workers=2, clients=population, data=FederatedDataset(clients))
    assert streamed == resident
