"""The Flower app: wire format, run spec, ClientApp/transport over a fake Grid (fast, no
processes) and a real local deployment (SuperLink + 3 SuperNodes on 127.0.0.1, marked
``flower``).

The deployment cases share one module-scoped deployment; every process it starts is
stopped by PID in a finalizer, also when a case fails.
"""

from __future__ import annotations

import os
import pickle
import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict  # noqa: E402

from securefkm.exceptions import InputError  # noqa: E402
from securefkm.flower import _wire, clientapp  # noqa: E402
from securefkm.flower.clientapp import read_client_csv  # noqa: E402
from securefkm.flower.deploy import LocalDeployment, write_client_csvs  # noqa: E402
from securefkm.flower.spec import RunSpec  # noqa: E402
from securefkm.flower.transport import FlowerTransport  # noqa: E402

PARAMS = {"n_clusters": 3, "init_bounds": [-12.0, 12.0], "max_rounds": 2, "tol": 0.0}


@pytest.fixture(autouse=True)
def _flower_env(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path_factory.mktemp("flwr_home")))
    monkeypatch.setenv("FLWR_DISABLE_UPDATE_CHECK", "1")
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")


@pytest.fixture(scope="module")
def clients():
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(240, centers=3, cluster_std=0.6, random_state=7)
    return [X[i::3].copy() for i in range(3)]


def in_process(spec: RunSpec, arrays):
    """The same spec fitted in process (what a deployment must reproduce)."""
    est = spec.estimator()
    return est.fit([np.asarray(a) for a in arrays])


def assert_same_structure(transcript, reference):
    assert len(transcript) == len(reference)
    for r, q in zip(transcript, reference):
        assert (r.run, r.round, r.action) == (q.run, q.round, q.action)
        assert [s.stage for s in r.stages] == [s.stage for s in q.stages]
        assert r.sampled == q.sampled and r.contributors == q.contributors
        assert r.protection == q.protection and r.specs == q.specs
        assert sorted(r.plain_sums()) == sorted(q.plain_sums())
        for c, sums in q.plain_sums().items():
            for k, v in sums.items():
                np.testing.assert_array_equal(r.plain_sums()[c][k], v)
        assert set(r.aggregate) == set(q.aggregate)
        for k in q.aggregate:
            np.testing.assert_allclose(r.aggregate[k], q.aggregate[k], rtol=1e-12, atol=1e-9)


# ---------------------------------------------------------------- wire & spec
def test_wire_refuses_code():
    import subprocess

    data = _wire.encode("masked_input", "reply", np.arange(3, dtype=np.uint64))
    assert _wire.decode("masked_input", "reply", data).dtype == np.uint64
    for obj in (subprocess.Popen, LocalDeployment, {"a": np.arange(3, dtype=np.uint64)}):
        with pytest.raises(_wire.WireError, match="malformed masked_input reply.*bad magic"):
            _wire.decode("masked_input", "reply", pickle.dumps(obj))
    with pytest.raises(_wire.WireError, match="malformed"):
        _wire.decode("masked_input", "reply", b"\x80\x05garbage")


def test_runspec_roundtrip_and_errors():
    spec = RunSpec("dwf", {**PARAMS, "init": np.zeros((3, 2))}, ["masking", {"name": "dp", "epsilon": 1.0, "delta": 1e-5, "clip": 5.0}], 3)
    again = RunSpec.from_json(spec.to_json())
    assert again.to_json() == spec.to_json()
    assert isinstance(again.estimator().init, np.ndarray)
    with pytest.raises(InputError, match="algorithm"):
        RunSpec("nope")
    with pytest.raises(InputError, match="random_state"):
        RunSpec("dwf", {"random_state": 1})
    with pytest.raises(InputError, match="layer specs"):
        RunSpec("dwf", {}, [object()])
    with pytest.raises(InputError, match="JSON"):
        RunSpec.from_json("{not json")
    # Paillier and signed-key masking are accepted; a deployment without provisioning is refused
    from securefkm.flower.spec import PlaceholderTransport, build_federation

    for protection in (["paillier"], [{"name": "masking", "sign_keys": True}]):
        spec = RunSpec("dwf", PARAMS, protection)
        assert spec.requirements().identity
        with pytest.raises(InputError, match="'directory'"):
            build_federation(spec, 3, 2, PlaceholderTransport(3))


def test_read_client_csv_errors(tmp_path):
    good = tmp_path / "good.csv"
    good.write_text("a,b\n1,2\n3.5,-4e1\n")
    np.testing.assert_array_equal(read_client_csv(str(good)), [[1, 2], [3.5, -40]])
    text = tmp_path / "text.csv"
    text.write_text("a,b\n1,2\n3,hello\n")
    with pytest.raises(InputError, match=r"line 3 column 2 is 'hello'"):
        read_client_csv(str(text))
    nan = tmp_path / "nan.csv"
    nan.write_text("1,2\nnan,4\n")
    with pytest.raises(InputError, match="NaN"):
        read_client_csv(str(nan))
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("1,2\n3\n")
    with pytest.raises(InputError, match="columns"):
        read_client_csv(str(ragged))
    with pytest.raises(InputError, match="does not exist"):
        read_client_csv(str(tmp_path / "missing.csv"))


def test_transport_rejects_bad_arguments():
    with pytest.raises(InputError, match="node id"):
        FlowerTransport(object(), [])
    with pytest.raises(InputError, match="stage_timeout"):
        FlowerTransport(object(), [1, 2], stage_timeout=0)


# ---------------------------------------------------------------- fake Grid (no processes)
class _FakeGrid:
    """A Grid whose nodes run the real ClientApp handler in this process, each message as
    in a fresh ClientApp process (caches cleared, state only in context.state)."""

    def __init__(self, paths_by_node: dict[int, str], run_config: dict, node_configs: dict | None = None):
        node_configs = node_configs or {}
        self.contexts = {
            nid: Context(run_id=1, node_id=nid, node_config={"data-path": p, **node_configs.get(nid, {})},
                         state=RecordDict(), run_config=run_config)
            for nid, p in paths_by_node.items()
        }
        self.replies = {}
        self.dead: set[int] = set()
        self.kill_at = None  # (round, stage, node id)
        self.crash_at = None  # (round, stage): the ServerApp process dies there

    class Crash(BaseException):
        """The ServerApp died (BaseException: nothing in the runtime may catch it)."""

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = m.object_id
            m.metadata.__dict__["_message_id"] = mid
            rec = m.content[_wire.RECORD_KEY]
            nid = m.metadata.dst_node_id
            if self.crash_at == (rec["round"], rec["stage"]):
                raise _FakeGrid.Crash(self.crash_at)
            if self.kill_at == (rec["round"], rec["stage"], nid):
                self.dead.add(nid)
            if nid not in self.dead:
                clientapp._FED_CACHE.clear()
                clientapp._DATA_CACHE.clear()
                self.replies[mid] = clientapp.handle_message(m, self.contexts[nid])
            ids.append(mid)
        return ids

    def pull_messages(self, ids):
        return [self.replies.pop(i) for i in list(ids) if i in self.replies]


@pytest.fixture
def task_identity():
    from flwr.supercore.task_identity import TaskIdentity

    old = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = old


def _fake_run(tmp_path, clients, spec, *, extra_csv=None, kill=None, stage_timeout=0.5, node_configs=None, crash=None,
              **provisioned):
    """``node_configs[i]`` extends the node config of ``paths[i]``; ``provisioned``: directory=, authority_url=."""
    from securefkm.flower.serverapp import run_federation

    paths = [str(p) for p in write_client_csvs(clients, tmp_path)]
    if extra_csv is not None:
        paths.append(str(extra_csv))
    node_ids = [900 - 37 * i for i in range(len(paths))]  # unsorted on purpose
    run_config = {"spec": spec.to_json(), "num-nodes": len(paths), "n-features": clients[0].shape[1]}
    grid = _FakeGrid(dict(zip(node_ids, paths)), run_config,
                     None if node_configs is None else dict(zip(node_ids, node_configs)))
    if kill is not None:
        rnd, stage, which = kill
        grid.kill_at = (rnd, stage, node_ids[which])
    grid.crash_at = crash
    result = run_federation(grid, spec, n_nodes=len(paths), n_features=clients[0].shape[1],
                            stage_timeout=stage_timeout, suspect_timeout=0.1, poll_interval=0.01, **provisioned)
    order = [None if n is None else node_ids.index(n) for n in result["node_ids"]]  # client c <- paths[order[c]]
    return result, order


@pytest.mark.parametrize("protection", [[], ["masking"]])
def test_fake_grid_equals_in_process(tmp_path, clients, task_identity, protection):
    spec = RunSpec("dwf", PARAMS, protection, random_state=11)
    result, order = _fake_run(tmp_path, clients, spec)
    ref = in_process(spec, [clients[i] for i in order])
    np.testing.assert_array_equal(result["centres"], ref.cluster_centers_)
    assert_same_structure(result["transcript"], ref.transcript_)
    assert result["errors"] == {}
    # the aggregator's first stage rides on the update message: one exchange fewer per
    # round than the transcript's stages (which still lists it, with its own replies)
    first = "advertise" if protection else "input"
    exchanged = [stage for _, stage, *_ in result["timings"]]
    assert first not in exchanged and "update" in exchanged
    for rec in result["transcript"]:
        if rec.specs:
            stages = [s.stage for s in rec.stages]
            assert stages[:2] == ["update", first] and len(rec.stages[1].received) == len(clients)


def test_nodes_read_their_records_only_for_update_stages(tmp_path, clients, task_identity, monkeypatch):
    """Each message is a fresh process: a node parses its CSV for the stages that compute on
    the records (``update``), not for the masking stages; the result is unchanged."""
    reads, stages = [], []
    real_read, real_handle = clientapp.read_client_csv, clientapp.handle_message
    monkeypatch.setattr(clientapp, "read_client_csv", lambda path: reads.append(path) or real_read(path))

    def handle(msg, context):
        stages.append(str(msg.content[_wire.RECORD_KEY]["stage"]))
        return real_handle(msg, context)

    monkeypatch.setattr(clientapp, "handle_message", handle)
    spec = RunSpec("dwf", PARAMS, ["masking"], random_state=11)
    result, order = _fake_run(tmp_path, clients, spec)
    ref = in_process(spec, [clients[i] for i in order])
    np.testing.assert_array_equal(result["centres"], ref.cluster_centers_)
    assert {"update", "share", "masked_input", "unmask"} <= set(stages)
    assert len(reads) == stages.count("update") < len(stages)


def test_fake_grid_dropout_is_recovered(tmp_path, clients, task_identity):
    # threshold 2 of 3: one client may drop after sharing its keys
    spec = RunSpec("dwf", PARAMS, [{"name": "masking", "threshold": 2}], random_state=5)
    result, order = _fake_run(tmp_path, clients, spec, kill=(1, "masked_input", 0))
    dead = order.index(0)
    r0, r1 = result["transcript"][0], result["transcript"][1]
    assert r0.contributors == (0, 1, 2)
    assert r1.aborted is None
    assert dead in r1.stage("masked_input").dropped
    assert set(r1.contributors) == {0, 1, 2} - {dead}
    ref = in_process(spec, [clients[i] for i in order])
    # round 0 is identical; round 1 sums the two survivors
    np.testing.assert_array_equal(r0.centres_after, ref.transcript_[0].centres_after)
    alive = [clients[order[c]] for c in r1.contributors]
    C = r0.centres_after
    from securefkm.algorithms._kmeans import assign

    w = sum(np.bincount(assign(X, C)[0], minlength=3) for X in alive)
    np.testing.assert_array_equal(r1.aggregate["weights"], w)


def test_fake_grid_malformed_node_reports_and_others_finish(tmp_path, clients, task_identity):
    bad = tmp_path / "bad.csv"
    bad.write_text("x0,x1\n1.0,2.0\nNaN,3.0\n")
    spec = RunSpec("dwf", PARAMS, ["masking"], random_state=5)
    result, order = _fake_run(tmp_path, clients[:3], spec, extra_csv=bad)
    bad_client = order.index(3)
    assert "NaN" in result["errors"][bad_client] and "bad.csv" in result["errors"][bad_client]
    for r in result["transcript"]:
        assert r.aborted is None
        assert bad_client in r.stage("update").refused
        assert set(r.contributors) == {0, 1, 2, 3} - {bad_client}


# ---------------------------------------------------------------- provisioned identities (fake Grid)
UNIFORM = {**PARAMS, "init": "uniform"}  # the same start with and without protection


@pytest.fixture
def authority_service(tmp_path):
    """(LocalPKI, URL): 3 provisioned nodes and the key authority served from a thread."""
    from securefkm.flower.authority_service import AuthorityService, make_server, start_in_thread
    from securefkm.flower.provision import provision_local
    from securefkm.flower.tls import create_run_pki

    pki = provision_local(tmp_path / "pki", 3)
    pki.ensure_authority(2048)
    certs = create_run_pki(tmp_path / "tls")
    service = AuthorityService.from_keys(pki.authority_dir, pki.directory)
    server = make_server(service, "127.0.0.1", 0, cert=certs.authority.cert, key=certs.authority.key,
                         client_ca=certs.client_ca.cert, quiet=True)
    thread, port = start_in_thread(server)
    tls = {"ca": str(certs.ca.cert), "cert": str(certs.serverapp.cert), "key": str(certs.serverapp.key)}
    try:
        yield pki, f"https://127.0.0.1:{port}", service, tls
    finally:
        server.should_exit = True
        thread.join(10)


def test_fake_grid_paillier_equals_in_process(tmp_path, clients, task_identity, authority_service):
    """Over mutual TLS to the authority, as `securefkm deploy` runs it."""
    pki, url, service, tls = authority_service
    spec = RunSpec("dwf", UNIFORM, ["paillier"], random_state=12)
    result, order = _fake_run(tmp_path, clients, spec, node_configs=[pki.node_config(i) for i in range(3)],
                              directory=str(pki.directory_path), authority_url=url, authority_tls=tls,
                              stage_timeout=10)
    assert order == [0, 1, 2]  # client i = the directory's i-th node, whatever the Flower node ids
    assert result["errors"] == {}
    ref = in_process(spec, clients)
    np.testing.assert_array_equal(result["centres"], ref.cluster_centers_)
    assert_same_structure(result["transcript"], ref.transcript_)
    encrypted = [r for r in result["transcript"] if [s.stage for s in r.stages][1:] == ["encrypted_input"]]
    assert encrypted and result["protection_report"]["Paillier"]["decryptions"] == len(encrypted)
    assert result["timings"][0][1] == "identify"
    plain = in_process(RunSpec("dwf", UNIFORM, [], random_state=12), clients)
    np.testing.assert_allclose(result["centres"], plain.cluster_centers_, atol=1e-6)
    assert service.open_sessions == 0  # the run ended its session: that key is destroyed


def test_fake_grid_validated_equals_in_process(tmp_path, clients, task_identity, authority_service):
    """ValidatedAggregation over Flower: the Helper is the key authority service's (mutual TLS),
    the nodes sign their reports with their directory keys and trust the directory's
    authority key as the Helper's; a lying node is named and left out, as in process."""
    pki, url, service, tls = authority_service
    box = [float(np.min(clients)) - 1.0, float(np.max(clients)) + 1.0]
    spec = RunSpec("dwf", {**UNIFORM, "init_bounds": box}, [{"name": "validated", "max_records": 80}], random_state=14)
    result, order = _fake_run(tmp_path, clients, spec, node_configs=[pki.node_config(i) for i in range(3)],
                              directory=str(pki.directory_path), authority_url=url, authority_tls=tls,
                              stage_timeout=20)
    assert order == [0, 1, 2] and result["errors"] == {}
    ref = in_process(spec, clients)
    np.testing.assert_array_equal(result["centres"], ref.cluster_centers_)
    assert_same_structure(result["transcript"], ref.transcript_)
    validated = [r for r in result["transcript"] if "validated_input" in [s.stage for s in r.stages]]
    assert validated and result["protection_report"]["ValidatedAggregation"]["helper_aggregates"] == len(validated)
    assert service.open_sessions == 0  # the run ended the Helper's session


def test_fake_grid_validated_with_the_helper_s_dp_noise(tmp_path, clients, task_identity, authority_service):
    """Central DP under validation over Flower: the Helper service adds the noise (its own
    CSPRNG) under the plan every node computes from the declared record count; the run spends
    at most its budget and no round is refused."""
    pki, url, service, tls = authority_service
    box = [float(np.min(clients)) - 1.0, float(np.max(clients)) + 1.0]
    spec = RunSpec("dwf", {"n_clusters": 3, "init_bounds": box}, [
        {"name": "dp", "epsilon": 2.0, "delta": 1e-5, "mode": "central", "n_records": 240},
        {"name": "validated", "max_records": 80}], random_state=15)
    result, order = _fake_run(tmp_path, clients, spec, node_configs=[pki.node_config(i) for i in range(3)],
                              directory=str(pki.directory_path), authority_url=url, authority_tls=tls,
                              stage_timeout=20)
    assert result["errors"] == {} and all(r.aborted is None for r in result["transcript"])
    eps = result["protection_report"]["GaussianDP"]["privacy_spent"][0]
    assert 0 < eps <= 2.0 + 1e-9
    assert "Helper" in result["protection_report"]["GaussianDP"]["server_sees"]


def test_fake_grid_signed_masking_equals_plain(tmp_path, clients, task_identity):
    from securefkm.flower.provision import provision_local

    pki = provision_local(tmp_path / "pki", 3)
    spec = RunSpec("dwf", UNIFORM, [{"name": "masking", "sign_keys": True}], random_state=13)
    result, order = _fake_run(tmp_path, clients, spec, node_configs=[pki.node_config(i) for i in range(3)],
                              directory=str(pki.directory_path))
    assert order == [0, 1, 2] and result["errors"] == {}
    adverts = result["transcript"][0].stage("advertise").received
    assert all(isinstance(a["sig"], bytes) for a in adverts.values())
    ref = in_process(spec, clients)
    np.testing.assert_array_equal(result["centres"], ref.cluster_centers_)
    plain = in_process(RunSpec("dwf", UNIFORM, [], random_state=13), clients)
    np.testing.assert_allclose(result["centres"], plain.cluster_centers_, atol=1e-6)


def test_fake_grid_provisioning_errors(tmp_path, clients, task_identity):
    from securefkm.flower.provision import create_node_key, provision_local

    pki = provision_local(tmp_path / "pki", 3)
    spec = RunSpec("dwf", PARAMS, [{"name": "masking", "sign_keys": True}], random_state=1)
    with pytest.raises(InputError, match="run config 'directory'"):
        _fake_run(tmp_path, clients, spec)
    with pytest.raises(InputError, match="'authority-url'"):
        _fake_run(tmp_path, clients, RunSpec("dwf", PARAMS, ["paillier"]), directory=str(pki.directory_path))
    # node 2 holds a key the directory does not enroll: identification names the missing entry
    create_node_key(tmp_path / "stranger.key")
    configs = [pki.node_config(0), pki.node_config(1),
               {"identity-key": str(tmp_path / "stranger.key"), "directory": str(pki.directory_path)}]
    with pytest.raises(InputError, match=r"node_2.*not enrolled"):
        _fake_run(tmp_path, clients, spec, node_configs=configs, directory=str(pki.directory_path))
    # a node without the node config keys says which keys to set
    with pytest.raises(InputError, match="node config 'identity-key' / 'directory'"):
        _fake_run(tmp_path, clients, spec, node_configs=[pki.node_config(0), pki.node_config(1), {}],
                  directory=str(pki.directory_path))
    # a server shipping another directory (its own keys) is refused by every node
    rogue = provision_local(tmp_path / "rogue", 3)
    with pytest.raises(InputError, match="differs from this node's directory"):
        _fake_run(tmp_path, clients, spec, node_configs=[pki.node_config(i) for i in range(3)],
                  directory=str(rogue.directory_path))


def test_fake_grid_enrolment_dropout_is_left_out(tmp_path, clients, task_identity):
    from securefkm.flower.provision import provision_local

    pki = provision_local(tmp_path / "pki", 3)
    spec = RunSpec("dwf", UNIFORM, [{"name": "masking", "sign_keys": True}], random_state=13)
    configs = [pki.node_config(i) for i in range(3)]
    # the node holding node_1's key disappears while identities are collected (round -1)
    result, _ = _fake_run(tmp_path, clients, spec, node_configs=configs, directory=str(pki.directory_path),
                          kill=(-1, "identify", 1))
    assert result["node_ids"][1] is None and None not in (result["node_ids"][0], result["node_ids"][2])
    assert result["errors"] == {} and len(result["transcript"]) > 1
    for record in result["transcript"]:  # never sampled, so every round is planned for the two present
        assert record.sampled == (0, 2) and record.contributors == (0, 2)
    # exactly the fit of the two survivors alone
    ref = in_process(RunSpec("dwf", UNIFORM, [], random_state=13), [clients[0], clients[2]])
    np.testing.assert_allclose(result["centres"], ref.cluster_centers_, atol=1e-6)
    # too few remain: the run refuses to start and says why
    with pytest.raises(InputError, match=r"only 2 of 3 nodes identified, the run needs at least 3 .*'min-nodes'.*node_1"):
        _fake_run(tmp_path, clients, spec, node_configs=configs, directory=str(pki.directory_path),
                  kill=(-1, "identify", 1), min_nodes=3)


@pytest.mark.parametrize("protection", [["masking"], [{"name": "dp", "epsilon": 2.0, "delta": 1e-5, "clip": 15.0},
                                                 "masking"]])
def test_fake_grid_server_crash_resumes_from_checkpoint(tmp_path, clients, task_identity, protection):
    """The ServerApp dies in the middle of round 2; a restarted one (a new Flower run: fresh
    ClientApp state) resumes from the checkpoint, redoes round 2 with fresh masks and ends
    exactly where an uninterrupted run ends; the DP budget continues and stays within target."""
    spec = RunSpec("dwf", {**UNIFORM, "max_rounds": 4}, protection, random_state=21)
    ref, _ = _fake_run(tmp_path / "ref", clients, spec, checkpoint_path=str(tmp_path / "ref.ckpt"))
    ckpt = tmp_path / "run.ckpt"
    with pytest.raises(_FakeGrid.Crash):
        _fake_run(tmp_path / "a", clients, spec, crash=(2, "masked_input"), checkpoint_path=str(ckpt))
    from securefkm.flower.checkpoint import Checkpoint

    saved = Checkpoint(ckpt, spec.to_json()).info
    assert saved["rounds_done"] == 2 and saved["t"] == 2  # rounds 0 and 1 completed, round 2 interrupted
    resumed, _ = _fake_run(tmp_path / "b", clients, spec, checkpoint_path=str(ckpt))
    assert resumed["resumed_from"] == 2 and resumed["run_id"] == saved["run_id"]
    assert len(resumed["transcript"]) == len(ref["transcript"])
    for r, q in zip(resumed["transcript"], ref["transcript"]):
        assert (r.round, r.action, r.sampled, r.contributors) == (q.round, q.action, q.sampled, q.contributors)
    # round 2 was redone with fresh masks: the masked inputs differ, the released sums do not
    redo, orig = resumed["transcript"][2].stage("masked_input").received, ref["transcript"][2].stage("masked_input").received
    assert any(not np.array_equal(np.asarray(redo[c]["y"] if isinstance(redo[c], dict) else redo[c]),
                                  np.asarray(orig[c]["y"] if isinstance(orig[c], dict) else orig[c])) for c in redo)
    if len(protection) == 1:  # masking alone is exact: the same result to the bit
        np.testing.assert_array_equal(resumed["centres"], ref["centres"])
        for r, q in zip(resumed["transcript"], ref["transcript"]):
            for k in q.aggregate:
                np.testing.assert_array_equal(r.aggregate[k], q.aggregate[k])
    else:  # DP: fresh noise in the redone round, but the budget continues from the checkpoint
        assert resumed["privacy_spent"] == pytest.approx(ref["privacy_spent"])
        assert resumed["privacy_spent"][0] <= 2.0 + 1e-9
    ref2, _ = _fake_run(tmp_path / "c", clients, spec, checkpoint_path=str(ckpt))  # a finished checkpoint: no rounds left
    assert ref2["resumed_from"] == len(ref["transcript"])


# ---------------------------------------------------------------- real deployment
@pytest.fixture(scope="module")
def deployment(clients, tmp_path_factory):
    base = tmp_path_factory.mktemp("deploy")
    paths = write_client_csvs(clients, base / "data")
    dep = LocalDeployment(paths, workdir=base / "flower", env={"FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0"})
    try:
        dep.start()
        yield dep
    finally:
        dep.stop()  # every process, by PID, even if a case failed


# a data-independent start (no seeding round) keeps the deployment cases to 2 rounds
DEP_PARAMS = {**PARAMS, "init": "uniform"}
STAGE_TIMEOUT = float(os.environ.get("SECUREFKM_TEST_STAGE_TIMEOUT", "60"))


@pytest.mark.flower
def test_deployment_masking_equals_in_process(deployment, clients):
    """Signed-key masking (node identities from the provisioned directory) equals the
    in-process fit and the plain centres. Unsigned masking runs in the DP and killed-node cases."""
    spec = RunSpec("dwf", DEP_PARAMS, [{"name": "masking", "sign_keys": True}], random_state=3)
    t0 = time.perf_counter()
    result = deployment.run(spec, stage_timeout=STAGE_TIMEOUT, timeout=900)
    print(f"deployment masking run: {time.perf_counter() - t0:.1f} s, {result.rounds_seconds:.1f} s in rounds")
    order = deployment.client_order()
    assert order == [0, 1, 2]  # client i = the directory's i-th node = the i-th CSV
    ref = in_process(spec, [clients[i] for i in order])
    np.testing.assert_array_equal(result.centres, ref.cluster_centers_)
    assert_same_structure(result.transcript, ref.transcript_)
    stages = [s.stage for s in result.transcript[0].stages]
    assert stages[:4] == ["update", "advertise", "share", "masked_input"] and stages[-1] == "unmask"
    assert all(isinstance(a["sig"], bytes) for a in result.transcript[0].stage("advertise").received.values())
    plain = in_process(RunSpec("dwf", DEP_PARAMS, [], random_state=3), [clients[i] for i in order])
    np.testing.assert_allclose(result.centres, plain.cluster_centers_, atol=1e-6)
    assert result.timings[0][1] == "identify" and result.errors == {}


@pytest.mark.flower
def test_deployment_is_secure_by_default(deployment):
    """TLS + SuperNode authentication: plain HTTP to the SuperLink fails, and neither a
    node with an unregistered key nor an --insecure node ever gets a node id."""
    import urllib.request

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from securefkm.flower.deploy import _entry_point, _stop_tree, free_port

    assert deployment.secure and deployment.tls.ca.cert.is_file()
    assert all(deployment._node_auth_key(i).is_file() for i in range(3))
    with pytest.raises(Exception):  # noqa: B017 - plain HTTP against a TLS port: any transport error
        urllib.request.urlopen(f"http://127.0.0.1:{deployment.port}/", timeout=5).read()
    rogue_key = deployment.workdir / "rogue_key"
    key = ec.generate_private_key(ec.SECP384R1())
    rogue_key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                            serialization.NoEncryption()))
    base = [_entry_point("flower-supernode"), "--superlink", f"127.0.0.1:{deployment.port}", "--host", "127.0.0.1"]
    rogues = [
        deployment._spawn([*base, "--port", str(free_port()), "--root-certificates", str(deployment.tls.ca.cert),
                           "--auth-supernode-private-key", str(rogue_key)], "rogue_unregistered.log"),
        deployment._spawn([*base, "--port", str(free_port()), "--insecure"], "rogue_insecure.log"),
    ]
    try:
        try:  # Flower refuses the unregistered key and exits (code 305); meanwhile the other retries
            rogues[0].wait(timeout=20)
        except Exception:  # noqa: BLE001 - still running: the log assertions below say why
            pass
        for name in ("rogue_unregistered.log", "rogue_insecure.log"):
            log = (deployment.workdir / "logs" / name).read_text(errors="replace")
            assert "SuperNode ID" not in log, log[-2000:]
        assert "Failed to activate SuperNode" in (deployment.workdir / "logs" / "rogue_unregistered.log").read_text()
    finally:
        for proc in rogues:
            _stop_tree(proc, grace=2.0)


@pytest.mark.flower
def test_deployment_paillier_equals_in_process(deployment, clients):
    """SuperLink + 3 SuperNodes + the key authority as its own process run DWF with Paillier."""
    from securefkm.flower.deploy import _alive

    spec = RunSpec("dwf", DEP_PARAMS, ["paillier"], random_state=10)
    authority_pids = []

    def on_progress(ev):
        if deployment.authority is not None and not authority_pids:
            authority_pids.append(deployment.authority.pid)

    t0 = time.perf_counter()
    result = deployment.run(spec, stage_timeout=STAGE_TIMEOUT, timeout=900, on_progress=on_progress)
    print(f"deployment paillier run: {time.perf_counter() - t0:.1f} s, {result.rounds_seconds:.1f} s in rounds")
    assert authority_pids and not _alive(authority_pids[0]) and deployment.authority is None
    order = deployment.client_order()
    assert order == [0, 1, 2]  # client i = the directory's i-th node = the i-th CSV
    ref = in_process(spec, [clients[i] for i in order])
    np.testing.assert_array_equal(result.centres, ref.cluster_centers_)
    assert_same_structure(result.transcript, ref.transcript_)
    plain = in_process(RunSpec("dwf", DEP_PARAMS, [], random_state=10), [clients[i] for i in order])
    np.testing.assert_allclose(result.centres, plain.cluster_centers_, atol=1e-6)  # codec resolution 2**-24
    assert result.timings[0][1] == "identify" and result.errors == {}
    assert result.protection_report["Paillier"]["decryptions"] == len(result.transcript)


@pytest.mark.flower
@pytest.mark.slow
def test_deployment_validated_equals_in_process(deployment, clients):
    """SuperLink + 3 SuperNodes + the key authority process hosting the Helper run DWF under
    ValidatedAggregation: the release equals the in-process fit's, the Helper's session ends."""
    box = [float(np.min(clients)) - 1.0, float(np.max(clients)) + 1.0]
    spec = RunSpec("dwf", {**DEP_PARAMS, "init_bounds": box}, ["validated"], random_state=16)
    result = deployment.run(spec, stage_timeout=STAGE_TIMEOUT, timeout=900)
    order = deployment.client_order()
    ref = in_process(spec, [clients[i] for i in order])
    np.testing.assert_array_equal(result.centres, ref.cluster_centers_)
    assert_same_structure(result.transcript, ref.transcript_)
    assert result.errors == {} and result.protection_report["ValidatedAggregation"]["helper_aggregates"] == len(
        result.transcript)
    assert deployment.authority is None  # stopped after the run


@pytest.mark.flower
def test_deployment_dp_reports_privacy_spent(deployment, clients):
    spec = RunSpec("dwf", {**DEP_PARAMS, "max_rounds": 1}, [{"name": "dp", "epsilon": 2.0, "delta": 1e-5, "clip": 15.0}, "masking"], random_state=4)
    result = deployment.run(spec, stage_timeout=STAGE_TIMEOUT, timeout=900)
    eps, delta = result.privacy_spent
    assert 0 < eps <= 2.0 + 1e-9 and delta <= 1e-5
    assert np.all(np.isfinite(result.centres))


@pytest.mark.flower
def test_deployment_plans_dp_as_the_fit_does(deployment, clients):
    """A budget-led DP spec (no max_rounds, no init): the deployment counts its CSVs' records,
    plans the same rounds, start and per-round budget as the in-process fit of the same spec,
    spends at most the target and reaches the same quality (ARI against the blobs' labels)."""
    from sklearn.datasets import make_blobs
    from sklearn.metrics import adjusted_rand_score

    spec = RunSpec("dwf", {"n_clusters": 3}, [{"name": "dp", "epsilon": 1.0, "delta": 1e-5, "bounds": [-12.0, 12.0],
                                               "mode": "distributed"}, "masking"], random_state=8)
    result = deployment.run(spec, stage_timeout=STAGE_TIMEOUT, timeout=900)
    order = deployment.client_order()
    ref = in_process(spec, [clients[i] for i in order])
    assert result.n_rounds == len(ref.transcript_) and result.n_rounds <= 8
    assert [r.action for r in result.transcript] == [r.action for r in ref.transcript_]
    assert 0 < result.privacy_spent[0] <= 1.0 + 1e-9
    assert result.privacy_spent[0] == pytest.approx(ref.privacy_spent_[0], rel=1e-9)
    assert result.protection_report["GaussianDP"]["plan"] == ref.dp_plan_.describe()
    X, y = make_blobs(240, centers=3, cluster_std=0.6, random_state=7)
    from securefkm.algorithms._kmeans import assign

    ari = adjusted_rand_score(y, assign(X, result.centres)[0])
    ari_ref = adjusted_rand_score(y, assign(X, ref.cluster_centers_)[0])
    # OS noise: over 30 in-process fits of this spec ARI was 1.0 in 26, 0.56-0.57 in 4 (two blobs
    # merged); the unplanned deployment this replaces gave 0.0
    assert ari >= 0.5 and ari_ref >= 0.5


@pytest.mark.flower
@pytest.mark.slow
def test_deployment_serverapp_killed_mid_fit_resumes(deployment, clients, tmp_path):
    """SIGKILL the ServerApp process in the middle of round 1 (between the masking stages);
    a new `flwr run` with the same checkpoint resumes and ends exactly where the in-process
    fit (= an uninterrupted run on the same seeds) ends."""
    from securefkm.flower.deploy import DeploymentError

    spec = RunSpec("dwf", {**DEP_PARAMS, "max_rounds": 3}, ["masking"], random_state=17)
    ckpt = tmp_path / "serverapp.ckpt"
    killed = []

    class ServerKilled(Exception):
        pass

    def on_progress(ev):
        if not killed and ev["event"] == "start" and ev["round"] == 1 and ev["stage"] == "share":
            killed.extend(deployment.kill_serverapp())
            raise ServerKilled

    with pytest.raises((ServerKilled, DeploymentError)):
        deployment.run(spec, stage_timeout=STAGE_TIMEOUT, timeout=600, on_progress=on_progress, checkpoint_path=ckpt)
    from securefkm.flower.checkpoint import Checkpoint

    assert killed and Checkpoint(ckpt, spec.to_json()).info["rounds_done"] == 1
    result = deployment.run(spec, stage_timeout=STAGE_TIMEOUT, timeout=900, checkpoint_path=ckpt)
    assert result.resumed_from == 1
    order = deployment.client_order()
    ref = in_process(spec, [clients[i] for i in order])
    np.testing.assert_array_equal(result.centres, ref.cluster_centers_)
    assert_same_structure(result.transcript, ref.transcript_)


@pytest.mark.flower
@pytest.mark.slow  # over a minute with every process; run by `pytest -m slow`
def test_deployment_killed_node_is_a_dropout(deployment, clients):
    """Runs last in this module: it kills one SuperNode of the shared deployment."""
    spec = RunSpec("dwf", DEP_PARAMS, [{"name": "masking", "threshold": 2}], random_state=6)
    killed = []

    def on_progress(ev):
        if not killed and ev["event"] == "start" and ev["round"] == 1 and ev["stage"] == "masked_input":
            deployment.kill_node(0)
            killed.append(time.time())

    result = deployment.run(spec, stage_timeout=min(STAGE_TIMEOUT, 45.0), timeout=900, on_progress=on_progress)
    assert killed
    dead = deployment.client_order().index(0)
    r1 = result.transcript[1]
    assert r1.aborted is None
    assert dead in r1.stage("masked_input").dropped
    assert dead not in r1.contributors and len(r1.contributors) == 2
    assert np.all(np.isfinite(result.centres))


def test_fake_grid_dp_reports_privacy_spent(tmp_path, clients, task_identity):
    spec = RunSpec("dwf", PARAMS, [{"name": "dp", "epsilon": 2.0, "delta": 1e-5, "clip": 15.0}, "masking"], random_state=8)
    result, _ = _fake_run(tmp_path, clients, spec)
    eps, delta = result["privacy_spent"]
    assert 0 < eps <= 2.0 + 1e-9 and delta <= 1e-5


@pytest.mark.flower
@pytest.mark.slow  # over a minute with every process; run by `pytest -m slow`
def test_deployment_malformed_node(clients, tmp_path):
    """Its own deployment: two good nodes and one whose CSV holds text."""
    paths = write_client_csvs(clients[:2], tmp_path / "data")
    bad = tmp_path / "data" / "client_bad.csv"
    bad.write_text("x0,x1\n1.0,2.0\n3.0,oops\n")
    spec = RunSpec("dwf", {**DEP_PARAMS, "max_rounds": 1}, [], random_state=9)
    with LocalDeployment([*paths, bad], workdir=tmp_path / "flower") as dep:
        result = dep.run(spec, stage_timeout=STAGE_TIMEOUT, timeout=900)
        bad_client = dep.client_order().index(2)
    assert "oops" in result.errors[bad_client] and "client_bad.csv" in result.errors[bad_client]
    assert all(r.aborted is None and len(r.contributors) == 2 for r in result.transcript)


def test_deploy_refuses_a_bad_spec_before_starting_processes(clients, monkeypatch):
    """A protected spec without a protected start fails in deploy() itself, with the fix in
    the message, and no SuperLink/SuperNode is started."""
    from securefkm.exceptions import ProtectionConfigError
    from securefkm.flower import deploy as deploy_mod

    started = []
    monkeypatch.setattr(deploy_mod.LocalDeployment, "start", lambda self: started.append(self))
    with pytest.raises(ProtectionConfigError, match="init_bounds"):
        deploy_mod.deploy(clients, params={"n_clusters": 3}, protection=["masking"], random_state=0)
    assert started == []


def test_deploy_and_serverapp_refuse_masking_on_plain_set_fields(clients, tmp_path, task_identity, monkeypatch):
    """k-FED's local centres cannot be masked: deploy() refuses before any process starts, and
    the ServerApp itself (fake grid) refuses before any message is sent, naming the fix."""
    from securefkm.exceptions import ProtectionConfigError
    from securefkm.flower import deploy as deploy_mod

    started = []
    monkeypatch.setattr(deploy_mod.LocalDeployment, "start", lambda self: started.append(self))
    params = {"n_clusters": 3, "init_bounds": [-5, 10]}
    with pytest.raises(ProtectionConfigError, match="secure_mode=True"):
        deploy_mod.deploy(clients, algorithm="kfed", params=params, protection=["masking"], random_state=0)
    assert started == []
    spec = RunSpec("kfed", params, ["masking"], random_state=0)
    with pytest.raises(ProtectionConfigError, match="set-fields"):
        _fake_run(tmp_path, clients, spec)


def test_flower_refuses_the_ideal_functionality():
    """crypto='ideal' trusts one process with every input: never over a network."""
    from securefkm.flower.spec import PlaceholderTransport, build_federation

    spec = RunSpec("dwf", {**PARAMS, "crypto": "ideal"}, ["masking"], random_state=0)
    with pytest.raises(InputError, match="crypto='ideal' is refused over Flower"):
        build_federation(spec, 3, 2, PlaceholderTransport(3))


def test_local_deployment_poll_interval_and_state(tmp_path, monkeypatch):
    """Idle polling scales with nodes per core (bounded), is passed to both SuperNode launcher
    and SuperExec, can be set, and a bad value names the argument; the SuperLink keeps its
    state in memory unless a database path is given."""
    from securefkm.exceptions import InputError
    from securefkm.flower import deploy as deploy_mod

    paths = deploy_mod.write_client_csvs([np.zeros((2, 2))] * 10, tmp_path / "data")
    monkeypatch.setattr(deploy_mod.os, "cpu_count", lambda: 2)
    monkeypatch.delenv("SECUREFKM_SUPERNODE_POLL", raising=False)
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", raising=False)
    auto = deploy_mod.LocalDeployment(paths, workdir=tmp_path / "a")
    assert auto.poll_interval == pytest.approx(0.5)
    env = auto.environ()
    assert env["SECUREFKM_SUPERNODE_POLL"] == env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.5"
    assert deploy_mod.LocalDeployment(paths[:2], workdir=tmp_path / "b").poll_interval == pytest.approx(0.1)
    assert deploy_mod.LocalDeployment(paths * 10, workdir=tmp_path / "c").poll_interval == pytest.approx(2.0)
    assert deploy_mod.LocalDeployment(paths, workdir=tmp_path / "d", poll_interval=0.2).environ()["SECUREFKM_SUPERNODE_POLL"] == "0.2"
    with pytest.raises(InputError, match="poll_interval"):
        deploy_mod.LocalDeployment(paths, poll_interval=0)
    with pytest.raises(InputError, match="database="):
        deploy_mod.LocalDeployment(paths, database=tmp_path / "missing" / "state.db")

    spawned = []
    monkeypatch.setattr(deploy_mod.LocalDeployment, "_spawn", lambda self, args, log: spawned.append(args) or None)
    monkeypatch.setattr(deploy_mod.LocalDeployment, "_wait", lambda self, *a: None)
    registered = []
    monkeypatch.setattr(deploy_mod.LocalDeployment, "_register_nodes", lambda self: registered.append(self))
    for dep, expect in ((deploy_mod.LocalDeployment(paths[:1], workdir=tmp_path / "e", provision=False), None),
                        (deploy_mod.LocalDeployment(paths[:1], workdir=tmp_path / "f", provision=False,
                                                    database=tmp_path / "s.db"), str(tmp_path / "s.db"))):
        spawned.clear()
        dep._start()
        superlink = spawned[0]
        assert ("--database" in superlink) == (expect is not None)
        if expect:
            assert superlink[superlink.index("--database") + 1] == expect
        # secure by default: TLS files from the run CA, SuperNode authentication, nodes registered
        assert "--insecure" not in superlink and "--enable-supernode-auth" in superlink
        assert superlink[superlink.index("--ssl-certfile") + 1] == str(dep.tls.superlink.cert)
        assert registered[-1] is dep and "--root-certificates" in spawned[1]
    spawned.clear()
    insecure = deploy_mod.LocalDeployment(paths[:1], workdir=tmp_path / "g", provision=False, secure=False)
    insecure._start()
    assert "--insecure" in spawned[0] and "--insecure" in spawned[1] and insecure.tls is None
    assert "insecure = true" in (insecure.flwr_home / "config.toml").read_text()


@pytest.mark.parametrize("algorithm, rounds", [("dwf", 300), ("minibatch", 200), ("fcm-fedavg", 100)])
def test_a_spec_without_max_rounds_gets_the_estimators_default(algorithm, rounds):
    """max_rounds=None is the estimators' default (it lets a simulated DP fit plan its rounds);
    a deployment spec without it must run the estimator's default, not fail on None."""
    from securefkm.flower.spec import PlaceholderTransport, build_federation

    _, fed = build_federation(RunSpec(algorithm, {"n_clusters": 3}), 3, 2, PlaceholderTransport(3))
    assert fed.max_rounds == rounds


# ---------------------------------------------------------------- checkpoints: every algorithm, integrity
SECURE = {"aligning", "kfed", "child-parent", "fcm"}  # set-valued: secure (sum-only) mode


def _checkpoint_spec(algorithm, protection):
    params = {**UNIFORM, "max_rounds": 3}
    if algorithm in SECURE:
        params["secure_mode"] = True
    if algorithm in {"kfed", "child-parent", "fcm", "fcm-fedavg"}:
        del params["tol"]
    return RunSpec(algorithm, params, protection, random_state=5)


@pytest.mark.parametrize("algorithm", ["dwf", "ewf", "minibatch", "aligning", "kfed", "child-parent", "fcm",
                                       "fcm-fedavg"])
@pytest.mark.parametrize("protection", [["masking"], [{"name": "cap", "max_rounds": 40},
                                                      {"name": "rounding", "decimals": 2}, "min-cluster", "masking"],
                                        [{"name": "dp", "epsilon": 2.0, "delta": 1e-5, "mode": "central",
                                          "bounds": [-12.0, 12.0]}]])
def test_checkpoint_resume_every_algorithm(tmp_path, clients, task_identity, algorithm, protection):
    """Every algorithm under every kind of layer: the ServerApp dies in the last round and a
    restarted one resumes from the code-free, authenticated checkpoint to the uninterrupted
    result: bit for bit without DP, with the budget continued under DP. Where the clients'
    lost memory is needed (secure modes), the rounds since the last resumable state are
    redone, and the transcript keeps both (the server saw both)."""
    from securefkm.flower.checkpoint import Checkpoint

    spec = _checkpoint_spec(algorithm, protection)
    ref, _ = _fake_run(tmp_path / "ref", clients, spec)
    rounds = ref["transcript"]
    last = rounds[len(rounds) - 1]
    ckpt = tmp_path / "run.ckpt"
    with pytest.raises(_FakeGrid.Crash):
        _fake_run(tmp_path / "a", clients, spec, crash=(last.round, "update"), checkpoint_path=str(ckpt))
    assert (tmp_path / "run.ckpt.key").stat().st_mode & 0o777 == 0o600
    if len(rounds) == 1:  # crashed in its only round: nothing was checkpointed
        assert not ckpt.exists()
        return
    info = Checkpoint(ckpt, spec.to_json()).info
    assert info["rounds_done"] == len(rounds) - 1 and info["t"] <= last.round
    resumed, _ = _fake_run(tmp_path / "b", clients, spec, checkpoint_path=str(ckpt))
    assert resumed["resumed_from"] == len(rounds) - 1
    redone = last.round - info["t"]  # completed rounds done again after the resume point
    got = resumed["transcript"]
    assert len(got) == len(rounds) + redone
    dp = isinstance(protection[0], dict) and protection[0]["name"] == "dp"
    if dp:
        assert resumed["privacy_spent"][0] >= ref["privacy_spent"][0] - 1e-12
        assert resumed["privacy_spent"][0] <= 2.0 + 1e-9
        if not redone:
            assert resumed["privacy_spent"] == pytest.approx(ref["privacy_spent"])
    else:
        np.testing.assert_array_equal(resumed["centres"], ref["centres"])
        assert_same_structure(list(got)[len(got) - (len(rounds) - info["t"]):], list(rounds)[info["t"]:])


def test_checkpoint_integrity(tmp_path, clients, task_identity):
    """A tampered, truncated, foreign, pickled or wrongly keyed checkpoint is refused before
    anything in it is parsed, with the file named and the fix; nothing resumes silently."""
    from securefkm.flower.checkpoint import MAGIC, Checkpoint

    spec = RunSpec("dwf", {**UNIFORM, "max_rounds": 3}, [{"name": "dp", "epsilon": 2.0, "delta": 1e-5,
                                                          "clip": 15.0}, "masking"], random_state=3)
    ckpt = tmp_path / "run.ckpt"
    with pytest.raises(_FakeGrid.Crash):
        _fake_run(tmp_path / "a", clients, spec, crash=(2, "masked_input"), checkpoint_path=str(ckpt))
    good = ckpt.read_bytes()
    assert b"pickle" not in good and good.startswith(MAGIC)
    assert Checkpoint(ckpt, spec.to_json()).info["rounds_done"] == 2

    def refused(data, match, **kw):
        ckpt.write_bytes(data)
        with pytest.raises(InputError, match=match) as info:
            Checkpoint(ckpt, spec.to_json(), **kw)
        assert str(ckpt) in str(info.value)
        ckpt.write_bytes(good)

    rng = np.random.default_rng(0)
    for pos in [len(MAGIC) + 3, len(MAGIC) + 40, len(good) // 2, len(good) - 5, *rng.integers(len(MAGIC), len(good), 20)]:
        flipped = bytearray(good)
        flipped[int(pos)] ^= 1 << int(rng.integers(8))
        refused(bytes(flipped), "fails its HMAC-SHA256 check.*remove it")
    refused(good[: len(good) // 3], "fails its HMAC-SHA256 check")
    refused(good[: len(MAGIC) + 10], "truncated")
    refused(good[:5], "truncated")
    refused(rng.bytes(4096), "is not a securefkm checkpoint")
    refused(pickle.dumps({"format": "securefkm-checkpoint/v1"}), "pickle format .* can run code")
    other = tmp_path / "other.key"
    other.write_text(os.urandom(32).hex())
    refused(good, "fails its HMAC-SHA256 check under .*other.key", key_path=other)
    other.write_text("not hex")
    refused(good, "checkpoint-key .* is not a checkpoint key", key_path=other)
    (tmp_path / "run.ckpt.key").rename(tmp_path / "moved.key")
    refused(good, "has no key: its key file .*run.ckpt.key.* is missing")
    # the key given explicitly: resumes, and the DP layer is bound to the restarted aggregator
    resumed, _ = _fake_run(tmp_path / "b", clients, spec, checkpoint_path=str(ckpt),
                           checkpoint_key=str(tmp_path / "moved.key"))
    assert resumed["resumed_from"] == 2 and resumed["privacy_spent"][0] <= 2.0 + 1e-9
    # refused before the run waits for a single node
    ckpt.write_bytes(good[:-1])
    with pytest.raises(InputError, match="fails its HMAC"):
        _fake_run(tmp_path / "c", clients, spec, checkpoint_path=str(ckpt), checkpoint_key=str(tmp_path / "moved.key"))


def test_fake_grid_encoder_refusal_is_a_named_refusal(tmp_path, clients, task_identity):
    """A node whose own encoder refuses its update (a value beyond the masking codec's range)
    answers the update stage with a refusal naming why, as a simulated client does; the
    server records it as that client's refusal and the others finish."""
    from securefkm.federation.client import ENCODER_REFUSAL

    big = tmp_path / "big.csv"
    big.write_text("x0,x1\n" + "".join(f"{v},1.0\n" for v in (1.0, 2.0, 3.0e17, 4.0)))
    spec = RunSpec("dwf", PARAMS, ["masking"], random_state=5)
    result, order = _fake_run(tmp_path, clients[:3], spec, extra_csv=big)
    bad = order.index(3)
    for r in result["transcript"]:
        assert r.aborted is None
        why = r.stage("update").refused.get(bad)
        assert why is not None and ENCODER_REFUSAL.strip() in why, why
        assert set(r.contributors) == {0, 1, 2, 3} - {bad}


def test_node_policy_pins_its_own_floor(tmp_path, clients, task_identity):
    """A node operator's floor in the node config, checked against the run config the server
    ships: too few clients per round, no DP or too large an epsilon, an insecure threshold."""
    from securefkm.flower.clientapp import check_node_policy
    from securefkm.flower.spec import PlaceholderTransport, build_federation
    from securefkm.layers import ProtocolRefusal

    def fed(protection, n=5, **params):
        spec = RunSpec("dwf", {**PARAMS, **params}, protection)
        return build_federation(spec, n, 2, PlaceholderTransport(n))[1]

    masking = fed(["masking"])
    check_node_policy({}, masking)
    check_node_policy({"min-clients-per-round": 5}, masking)
    with pytest.raises(ProtocolRefusal, match="samples 3 clients per round, below this node's min-clients-per-round=4"):
        check_node_policy({"min-clients-per-round": "4"}, fed(["masking"], clients_per_round=3))
    with pytest.raises(ProtocolRefusal, match="no differential privacy; this node requires epsilon <= 1"):
        check_node_policy({"max-epsilon": 1.0}, masking)
    dp = fed([{"name": "dp", "epsilon": 2.0, "delta": 1e-5, "bounds": [-12, 12], "mode": "distributed"}, "masking"])
    check_node_policy({"max-epsilon": 2.0}, dp)
    with pytest.raises(ProtocolRefusal, match="target epsilon 2 exceeds this node's max-epsilon=1"):
        check_node_policy({"max-epsilon": "1"}, dp)
    weak = fed([{"name": "masking", "threshold": 2, "allow_insecure_threshold": True}])
    with pytest.raises(ProtocolRefusal, match="below the secure floor.*allow-insecure-threshold=true"):
        check_node_policy({}, weak)
    check_node_policy({"allow-insecure-threshold": "true"}, weak)
    with pytest.raises(InputError, match="node config 'max-epsilon'='x' is not a number"):
        check_node_policy({"max-epsilon": "x"}, masking)
    # end to end: the pinned node refuses every round, naming its floor; the others finish
    spec = RunSpec("dwf", PARAMS, [], random_state=5)
    result, order = _fake_run(tmp_path, clients, spec, node_configs=[{}, {}, {"min-clients-per-round": 9}])
    pinned = order.index(2)
    for r in result["transcript"]:
        assert "min-clients-per-round=9" in r.stage("update").refused[pinned]
        assert pinned not in r.contributors


def test_fake_grid_dp_plan_needs_the_record_count(tmp_path, clients, task_identity):
    """Over the Flower app a budget-led DP spec plans from the declared record count, exactly as
    the in-process fit plans (same rounds, actions and spent budget); without a declared count
    it is refused, naming n_records and how to supply it."""
    dp = {"name": "dp", "epsilon": 1.0, "delta": 1e-5, "bounds": [-12.0, 12.0], "mode": "distributed"}
    with pytest.raises(InputError, match=r"GaussianDP\(n_records=N\).*'dp:\.\.\.:n_records=N'.*max_rounds="):
        _fake_run(tmp_path / "a", clients, RunSpec("dwf", {"n_clusters": 3}, [dp, "masking"], random_state=8))
    spec = RunSpec("dwf", {"n_clusters": 3}, [{**dp, "n_records": 240}, "masking"], random_state=8)
    result, order = _fake_run(tmp_path / "b", clients, spec)
    ref = in_process(spec, [clients[i] for i in order])
    assert [r.action for r in result["transcript"]] == [r.action for r in ref.transcript_]
    assert 1 < len(ref.transcript_) <= 8
    assert result["privacy_spent"][0] == pytest.approx(ref.privacy_spent_[0], rel=1e-9) and ref.privacy_spent_[0] <= 1.0
    # the CSVs' records counted by a local deployment: the declared spec
    from securefkm.flower.deploy import declare_records

    paths = write_client_csvs(clients, tmp_path / "c")
    declared = declare_records(RunSpec("dwf", {"n_clusters": 3}, [dp, "masking"], random_state=8), paths)
    assert declared.protection[0]["n_records"] == 240
    text = declare_records(RunSpec("dwf", {}, ["dp:epsilon=1:delta=1e-5:bounds=[-12,12]:mode=distributed",
                                               "masking"]), paths)
    assert text.protection[0] == {"name": "dp", "epsilon": 1, "delta": 1e-5, "bounds": [-12, 12],
                                  "mode": "distributed", "n_records": 240}


def test_run_config_is_one_typed_record():
    """The ServerApp's run config keys, types and defaults are written once (RunConfig), and
    the Flower app's pyproject.toml carries the same defaults; a mistyped key is named."""
    import dataclasses
    import tomllib

    from securefkm.flower.deploy import APP_DIR
    from securefkm.flower.run_config import RunConfig

    shipped = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    fields = {RunConfig.key(f.name): f for f in dataclasses.fields(RunConfig)}
    assert set(shipped) == set(fields)
    for key, f in fields.items():
        if f.default is not dataclasses.MISSING:
            assert shipped[key] == f.default, key
    cfg = RunConfig.from_flower(shipped)
    assert cfg.to_flower() == shipped and cfg.or_none("checkpoint_path") is None and cfg.or_none("min_nodes") is None
    with pytest.raises(InputError, match="run config 'num-nodes'='three' is not an int"):
        RunConfig.from_flower({**shipped, "num-nodes": "three"})
    with pytest.raises(InputError, match="run config 'spec' is missing"):
        RunConfig.from_flower({"num-nodes": 3})
