"""Provisioning (node keys, directory) and the key authority as an HTTP service.

Fast: no Flower processes. The service runs (plain HTTP, ``insecure`` on loopback) in a
thread of this process with small test-only keys, and is shut down in a finalizer. TLS and
client-certificate admission: tests/test_flower_tls.py.
"""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.request

import phe
import pytest

from protocols.paillier import AuthorityRefusal, homomorphic_sum, sign_contribution
from securefkm.exceptions import InputError
from securefkm.flower import authority_service as svc
from securefkm.flower.authority_client import AuthorityUnavailable, RemoteAuthority
from securefkm.flower.provision import (
    Directory,
    NodeProvisioning,
    create_node_key,
    load_node_key,
    provision_local,
    public_key_of,
    requirements,
)


# ---------------------------------------------------------------- provisioning
def test_node_key_is_private_idempotent_and_enrolled(tmp_path):
    path = tmp_path / "node" / "id.key"
    pub = create_node_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (tmp_path / "node" / "id.key.pub").read_text().strip() == pub.hex()
    assert create_node_key(path) == pub  # kept, not replaced
    with pytest.raises(InputError, match="overwrite"):
        create_node_key(path, exist_ok=False)
    assert public_key_of(load_node_key(path)) == pub
    with pytest.raises(InputError, match="securefkm provision node-key"):
        load_node_key(tmp_path / "missing.key")


def test_directory_roundtrip_and_node_config_errors(tmp_path):
    pki = provision_local(tmp_path, 3)
    d = pki.directory
    assert len(d) == 3 and d.authority_key is None
    assert Directory.from_json(d.to_json()) == d and Directory.from_json(d.to_json()).digest == d.digest
    node = NodeProvisioning.from_node_config(pki.node_config(2))
    assert node.client_id == 2 and node.public == d.nodes[2]
    with pytest.raises(InputError, match="'identity-key' / 'directory'"):
        NodeProvisioning.from_node_config({"data-path": "x.csv"})
    stranger = create_node_key(tmp_path / "stranger.key")
    del stranger
    with pytest.raises(InputError, match="not enrolled"):
        NodeProvisioning.from_node_config({"identity-key": str(tmp_path / "stranger.key"),
                                           "directory": str(pki.directory_path)})
    with pytest.raises(InputError, match="twice"):
        Directory((d.nodes[0], d.nodes[0]))
    assert requirements(["paillier"]).authority
    assert requirements([{"name": "masking", "sign_keys": True}]).identity
    assert not requirements(["masking", {"name": "dp"}])


def test_authority_keys_on_disk(tmp_path):
    pki = provision_local(tmp_path, 2)
    verify = pki.ensure_authority(2048)
    assert pki.directory.authority_key == verify
    assert stat.S_IMODE((pki.authority_dir / svc.IDENTITY_FILE).stat().st_mode) == 0o600
    assert not (pki.authority_dir / "paillier.json").exists()  # Paillier keys live per session, in memory
    assert pki.ensure_authority(2048) == verify  # kept
    service = svc.AuthorityService.from_keys(pki.authority_dir, pki.directory, key_size=1024, allow_weak_key=True,
                                             keygen=lambda bits: phe.generate_paillier_keypair(n_length=bits))
    sid, bundle = service.begin_session()
    assert bundle.authority_key == verify and bundle.n.bit_length() == 1024
    with service.lock:
        assert service.authority(sid).verify_key(1) == pki.directory.nodes[1]
    other = Directory(pki.directory.nodes, authority_key=create_node_key(tmp_path / "imposter.key"))
    with pytest.raises(InputError, match="pins authority key"):
        svc.AuthorityService.from_keys(pki.authority_dir, other)


# ---------------------------------------------------------------- the HTTP service
@pytest.fixture(scope="module")
def small_keypair():
    return phe.generate_paillier_keypair(n_length=1024)  # test-only size


def start_service(service, **kwargs):
    """(url, stop) of ``service`` served in a thread on 127.0.0.1."""
    server = svc.make_server(service, "127.0.0.1", 0, quiet=True, **kwargs)
    thread, port = svc.start_in_thread(server)

    def stop():
        server.should_exit = True
        thread.join(10)

    return port, stop


@pytest.fixture
def service(tmp_path, small_keypair):
    """(RemoteAuthority with an open session, that session's KeyAuthority, node signing keys)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pki = provision_local(tmp_path, 3)
    signing = [load_node_key(p) for p in pki.node_keys]
    identity = Ed25519PrivateKey.generate()
    directory = pki.directory.with_authority(identity.public_key().public_bytes_raw())
    service = svc.AuthorityService(identity.private_bytes_raw(), directory, key_size=1024, allow_weak_key=True,
                                   keygen=lambda bits: small_keypair)
    port, stop = start_service(service, insecure=True)
    try:
        remote = RemoteAuthority(f"http://127.0.0.1:{port}", directory, timeout=10, allow_weak_key=True)
        remote.public_bundle()
        with service.lock:
            authority = service.authority(remote.session)
        yield remote, authority, signing
    finally:
        stop()


def _contributions(remote, signing, clients, values, ticket):
    bundle = remote.public_bundle()
    pk = bundle.public_key()
    out = []
    for c in clients:
        cts = [pk.raw_encrypt(v) for v in values[c]]
        out.append(sign_contribution(signing[c], bundle.fingerprint, c, ticket.nonce, ticket.digest, cts))
    return out


def test_service_decrypts_a_valid_aggregate(service):
    remote, authority, signing = service
    assert remote.key_size == 1024 and remote.verify_key(0) == authority.verify_key(0)
    ticket = remote.open_round(0, 0, b"D" * 32, n_ciphertexts=2, max_clients=3)
    values = {0: [5, 7], 1: [11, 13], 2: [17, 19]}
    cons = _contributions(remote, signing, [0, 1, 2], values, ticket)
    claimed = homomorphic_sum(remote.public_key, [c.ciphertexts for c in cons])
    dec = remote.decrypt_aggregate(ticket.nonce, cons, claimed)
    assert dec.plaintexts == (33, 39) and dec.contributors == (0, 1, 2)
    assert remote.n_decryptions == 1 and authority.n_decryptions == 1


def test_service_refuses_one_client_replay_and_unenrolled_signer(service):
    remote, authority, signing = service
    values = {0: [1], 1: [2], 2: [3]}
    # one client only: below min_clients
    t = remote.open_round(0, 0, b"D", n_ciphertexts=1, max_clients=3)
    with pytest.raises(AuthorityRefusal, match="min_clients"):
        remote.decrypt_aggregate(t.nonce, _contributions(remote, signing, [0], values, t))
    # replayed ticket: the first attempt burned it (valid contributions this time)
    t = remote.open_round(0, 1, b"D", n_ciphertexts=1, max_clients=3)
    cons = _contributions(remote, signing, [0, 1], values, t)
    assert remote.decrypt_aggregate(t.nonce, cons).plaintexts == (3,)
    with pytest.raises(AuthorityRefusal, match="already used"):
        remote.decrypt_aggregate(t.nonce, cons)
    # stale round id after a decryption
    with pytest.raises(AuthorityRefusal, match="not after"):
        remote.open_round(0, 1, b"D", n_ciphertexts=1, max_clients=3)
    # a signer the directory does not enroll (client id 7, own fresh key)
    t = remote.open_round(0, 2, b"D", n_ciphertexts=1, max_clients=3)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    rogue = Ed25519PrivateKey.generate().private_bytes_raw()
    cons = _contributions(remote, signing, [0], values, t)
    pk, fp = remote.public_key, remote.public_bundle().fingerprint
    cons.append(sign_contribution(rogue, fp, 7, t.nonce, t.digest, [pk.raw_encrypt(4)]))
    with pytest.raises(AuthorityRefusal, match="client 7 is not enrolled"):
        remote.decrypt_aggregate(t.nonce, cons)
    # ... nor one forging an enrolled client's id with its own key
    t = remote.open_round(0, 3, b"D", n_ciphertexts=1, max_clients=3)
    cons = _contributions(remote, signing, [0], values, t)
    cons.append(sign_contribution(rogue, fp, 1, t.nonce, t.digest, [pk.raw_encrypt(4)]))
    with pytest.raises(AuthorityRefusal, match="signature does not verify"):
        remote.decrypt_aggregate(t.nonce, cons)
    assert authority.n_decryptions == 1


def _raw(url, method="GET", body=None):
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_service_refuses_everything_else(service):
    remote, authority, _ = service
    base = remote.url
    assert _raw(f"{base}/v1/private_key")[0] == 404
    assert _raw(f"{base}/v1/enroll", "POST", b"{}")[0] == 404
    assert _raw(f"{base}/v1/decrypt_aggregate")[0] == 405
    assert _raw(f"{base}/v1/identity", "POST", b"{}")[0] == 405
    assert _raw(f"{base}/v1/identity", "DELETE")[0] == 405
    code, err = _raw(f"{base}/v1/open_round", "POST", b"not json")
    assert code == 400 and err["error"] == "bad_request"
    code, err = _raw(f"{base}/v1/open_round", "POST", json.dumps({"session": remote.session, "run": "0"}).encode())
    assert code == 400
    code, err = _raw(f"{base}/v1/open_round", "POST", json.dumps({"session": "nope", "run": 0}).encode())
    assert code == 403 and "unknown session" in err["message"]
    # a malformed decryption request burns its ticket too
    t = remote.open_round(0, 0, b"D", n_ciphertexts=1, max_clients=3)
    body = {"session": remote.session, "nonce": t.nonce.hex(), "contributions": [{"client_id": 0, "nonce": "zz"}]}
    assert _raw(f"{base}/v1/decrypt_aggregate", "POST", json.dumps(body).encode())[0] == 400
    assert t.nonce not in authority._open
    code, ident = _raw(f"{base}/v1/identity")
    assert code == 200 and bytes.fromhex(ident["authority_key"]) == remote.directory.authority_key


def test_remote_authority_checks_the_pinned_key(service, tmp_path):
    remote, _, _ = service
    imposter = Directory(remote.directory.nodes, authority_key=create_node_key(tmp_path / "x.key"))
    with pytest.raises(InputError, match="does not trust"):
        RemoteAuthority(remote.url, imposter).public_bundle()
    with pytest.raises(AuthorityUnavailable, match="unreachable"):
        RemoteAuthority("http://127.0.0.1:9", remote.directory, timeout=2).public_bundle()
    with pytest.raises(InputError, match="authority-url"):
        RemoteAuthority("127.0.0.1:8471", remote.directory)


def test_cli_provision_and_authority_init(tmp_path, capsys):
    from securefkm.cli import main

    assert main(["provision", "node-key", str(tmp_path / "a.key")]) == 0
    assert main(["provision", "node-key", str(tmp_path / "b.key")]) == 0
    assert main(["authority", "init", "--keys", str(tmp_path / "auth")]) == 0
    out = capsys.readouterr().out.split()
    assert all(len(h) == 64 for h in out)
    assert main(["provision", "directory", "--node", str(tmp_path / "a.key.pub"), "--node", out[1],
                 "--authority", str(tmp_path / "auth" / "authority.pub"), "-o", str(tmp_path / "dir.json")]) == 0
    d = Directory.load(tmp_path / "dir.json")
    assert d.nodes == (bytes.fromhex(out[0]), bytes.fromhex(out[1])) and d.authority_key == bytes.fromhex(out[2])
    assert main(["provision", "directory", "--node", "nothex", "-o", str(tmp_path / "bad.json")]) == 2
