"""The validation Helper as a service of the key authority process, over its JSON API.

Fast: no Flower processes. The service runs (plain HTTP on loopback) in a thread of this
process; the ServerApp's :class:`RemoteHelper` drives it from a simulated fit whose clients
sign with the directory's node keys, as the nodes of a deployment do.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from attacks.poisoning import PoisoningPolicy
from protocols.validated import HelperRefusal, ValidatedAggregation
from securefkm import WeightedFederatedKMeans
from securefkm.flower import authority_service as svc
from securefkm.flower.authority_client import RemoteHelper
from securefkm.flower.provision import load_node_key, provision_local

BOX = (0.0, 1.0)
START = np.array([[0.2, 0.2], [0.5, 0.8], [0.8, 0.3]])


def _clients(n=5, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.2, 0.8, size=(3, 2))
    return [np.clip(centres[rng.integers(3, size=8)] + rng.normal(scale=0.05, size=(8, 2)), 0, 1) for _ in range(n)]


@pytest.fixture
def service(tmp_path):
    """(RemoteHelper factory, the directory's node signing keys, the service)."""
    pki = provision_local(tmp_path, 5)
    signing = [load_node_key(p) for p in pki.node_keys]
    identity = Ed25519PrivateKey.generate()
    directory = pki.directory.with_authority(identity.public_key().public_bytes_raw())
    service = svc.AuthorityService(identity.private_bytes_raw(), directory, key_size=1024, allow_weak_key=True)
    server = svc.make_server(service, "127.0.0.1", 0, quiet=True, insecure=True)
    thread, port = svc.start_in_thread(server)
    try:
        yield (lambda: RemoteHelper(f"http://127.0.0.1:{port}", directory, timeout=30)), signing, service
    finally:
        server.should_exit = True
        thread.join(10)


class _NodeKeys(ValidatedAggregation):
    """Clients sign with their directory keys (what NodeProvisioning gives each node)."""

    signing: list = []

    def _enroll(self, client):
        state = {"helper": self.bundle.fingerprint, "signing_key": self.signing[client.client_id]}
        client.state["validated"] = state
        return state


def _fit(helper, signing, policies=None, crypto="real", **layer):
    _NodeKeys.signing = signing
    agg = _NodeKeys(max_records=8, **layer)
    if helper is not None:
        agg.use_helper(helper)
    est = WeightedFederatedKMeans(3, init=START, init_bounds=BOX, max_rounds=2, random_state=0, crypto=crypto,
                                  backend="local", protection=[agg])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(_clients(), client_policies=policies)
    return est


def test_remote_helper_gives_the_in_process_release_and_names_the_liar(service):
    make, signing, _ = service
    policies = {3: PoisoningPolicy("sum-scaling", box=BOX)}
    remote = _fit(make(), signing, policies)
    local = _fit(None, signing, policies, crypto="ideal")
    np.testing.assert_array_equal(remote.cluster_centers_, local.cluster_centers_)
    assert set(remote.transcript_.rounds[0].faults) == {3}
    assert [r.contributors for r in remote.transcript_.rounds] == [r.contributors for r in local.transcript_.rounds]
    assert remote.protection_report_["_NodeKeys"]["helper_aggregates"] == 2


def test_the_helper_service_refuses_what_the_in_process_helper_refuses(service):
    make, signing, service_obj = service
    helper = make()
    ticket, _ = helper.open_round(0, 0, 0, b"d" * 32, 3, (65536, 65536), 16)
    with pytest.raises(HelperRefusal, match="no report the helper verified"):
        helper.aggregate(ticket.nonce, [0, 1, 2])
    with pytest.raises(HelperRefusal, match="no open round"):
        helper.aggregate(ticket.nonce, [0, 1])  # burned
    with pytest.raises(HelperRefusal, match="not later"):
        helper.open_round(0, 0, 0, b"d" * 32, 3, (65536, 65536), 16)
    # a Paillier operation on a Helper session, and an ended session
    from protocols.paillier import AuthorityRefusal

    with pytest.raises(AuthorityRefusal, match="not a Paillier session"):
        helper._call("POST", "close_round", {"session": helper.session, "nonce": "00" * 16})
    helper.end_session()
    assert service_obj.open_sessions == 0


def test_the_helper_bundle_must_be_signed_by_the_directory_key(service, tmp_path):
    make, _, _ = service
    from securefkm.exceptions import InputError
    from securefkm.flower.provision import create_node_key

    helper = make()
    helper.directory = helper.directory.with_authority(create_node_key(tmp_path / "imposter.key"))
    with pytest.raises(InputError, match="not the directory's authority key"):
        helper.public_bundle()
