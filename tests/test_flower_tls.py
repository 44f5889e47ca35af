"""The key authority over TLS with client certificates, and its per-run sessions.

Fast: no Flower processes. Certificates are made with ``cryptography`` (securefkm.flower.tls);
the service runs in a thread of this process with small test-only Paillier keys.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import ssl

import phe
import pytest

from protocols.paillier import AuthorityRefusal, homomorphic_sum, sign_contribution
from securefkm.exceptions import InputError
from securefkm.flower import authority_service as svc
from securefkm.flower import tls
from securefkm.flower.authority_client import AuthorityUnavailable, RemoteAuthority
from securefkm.flower.provision import load_node_key, provision_local


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    run = tls.create_run_pki(root)
    other_ca = tls.create_ca(root / "other-ca", "someone else's CA")
    past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=10)
    return {
        "run": run,
        "stranger": tls.issue(other_ca, root / "stranger", tls.SERVERAPP_NAME, server=False),
        "expired": tls.issue(run.client_ca, root / "expired", tls.SERVERAPP_NAME, server=False, not_before=past, days=1),
        "wrong_name": tls.issue(run.client_ca, root / "intruder", "some-supernode", server=False),
    }


@pytest.fixture
def deployment(tmp_path, pki):
    """(authority url, directory, node signing keys, AuthorityService) over TLS on loopback."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    nodes = provision_local(tmp_path, 3)
    identity = Ed25519PrivateKey.generate()
    directory = nodes.directory.with_authority(identity.public_key().public_bytes_raw())
    service = svc.AuthorityService(identity.private_bytes_raw(), directory, key_size=1024, allow_weak_key=True,
                                   keygen=lambda bits: phe.generate_paillier_keypair(n_length=bits))
    run = pki["run"]
    server = svc.make_server(service, "127.0.0.1", 0, cert=run.authority.cert, key=run.authority.key,
                             client_ca=run.client_ca.cert, quiet=True)
    thread, port = svc.start_in_thread(server)
    try:
        yield f"https://127.0.0.1:{port}", directory, [load_node_key(p) for p in nodes.node_keys], service
    finally:
        server.should_exit = True
        thread.join(10)


def _remote(url, directory, pki, client="serverapp"):
    run = pki["run"]
    files = getattr(run, client, None) or pki[client]
    return RemoteAuthority(url, directory, timeout=10, allow_weak_key=True, ca=run.ca.cert, cert=files.cert, key=files.key)


def _decrypt_once(remote, signing, round_=0):
    bundle = remote.public_bundle()
    t = remote.open_round(0, round_, b"D" * 32, n_ciphertexts=1, max_clients=3)
    cons = [sign_contribution(signing[c], bundle.fingerprint, c, t.nonce, t.digest, [bundle.public_key().raw_encrypt(v)])
            for c, v in ((0, 5), (1, 7))]
    return t, cons, remote.decrypt_aggregate(t.nonce, cons, homomorphic_sum(remote.public_key, [c.ciphertexts for c in cons]))


def test_serverapp_certificate_is_admitted_and_decrypts(deployment, pki):
    url, directory, signing, _ = deployment
    _, _, dec = _decrypt_once(_remote(url, directory, pki), signing)
    assert dec.plaintexts == (12,) and dec.contributors == (0, 1)


@pytest.mark.parametrize("client", [None, "stranger", "expired", "wrong_name"])
def test_other_clients_are_refused_and_the_service_keeps_serving(deployment, pki, client):
    url, directory, signing, service = deployment
    run = pki["run"]
    if client is None:  # trusts the server, presents no certificate
        remote = RemoteAuthority(url, directory, timeout=10, allow_weak_key=True, ca=run.ca.cert)
    else:
        remote = _remote(url, directory, pki, client)
    with pytest.raises(AuthorityUnavailable, match="TLS handshake"):
        remote.public_bundle()
    assert service.open_sessions == 0  # nothing reached the authority
    _, _, dec = _decrypt_once(_remote(url, directory, pki), signing)
    assert dec.plaintexts == (12,)


def test_client_refuses_a_server_outside_the_run_ca(deployment, pki):
    url, directory, _, _ = deployment
    # trusting only another CA: the authority's certificate does not verify
    remote = RemoteAuthority(url, directory, timeout=10, allow_weak_key=True, ca=pki["run"].client_ca.cert,
                             cert=pki["run"].serverapp.cert, key=pki["run"].serverapp.key)
    with pytest.raises(AuthorityUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        remote.public_bundle()


def _tls_request(url, pki, raw: bytes) -> bytes:
    """Send raw bytes over an authenticated TLS connection; the raw answer."""
    run = pki["run"]
    ctx = tls.client_context(run.ca.cert, run.serverapp.cert, run.serverapp.key)
    host, port = url.removeprefix("https://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock, \
            ctx.wrap_socket(sock, server_hostname=host) as s:
        s.sendall(raw)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ssl.SSLError, ConnectionError):
                break
            if not chunk:
                break
            out += chunk
        return out


def test_malformed_and_oversized_requests_get_4xx(deployment, pki):
    url, directory, signing, _ = deployment
    assert _tls_request(url, pki, b"\x00\x01garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    big = b"POST /v1/session HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (svc.MAX_BODY + 1)
    assert _tls_request(url, pki, big).startswith(b"HTTP/1.1 413")
    bad = b"POST /v1/session HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n{nope"
    answer = _tls_request(url, pki, bad)
    assert answer.startswith(b"HTTP/1.1 400") and b"not JSON" in answer
    _, _, dec = _decrypt_once(_remote(url, directory, pki), signing)  # still serving
    assert dec.plaintexts == (12,)


def test_streamed_body_over_the_limit_gets_413(tmp_path):
    import asyncio

    app = svc.AuthorityApp(service=None, max_body=10)
    chunks = [{"type": "http.request", "body": b"x" * 6, "more_body": True},
              {"type": "http.request", "body": b"x" * 6, "more_body": False}]
    sent = []

    async def receive():
        return chunks.pop(0)

    async def send(msg):
        sent.append(msg)

    asyncio.run(app({"type": "http", "method": "POST", "path": "/v1/session", "headers": []}, receive, send))
    assert sent[0]["status"] == 413 and json.loads(sent[1]["body"])["error"] == "too_large"


def test_sessions_rotate_keys_and_ended_sessions_are_refused(deployment, pki):
    url, directory, signing, service = deployment
    first = _remote(url, directory, pki)
    t, cons, dec = _decrypt_once(first, signing)
    old_n, old_session = first.public_bundle().n, first.session
    second = _remote(url, directory, pki)  # a second run on the same long-lived authority
    assert second.public_bundle().n != old_n and second.session != old_session
    assert second.public_bundle().authority_key == first.public_bundle().authority_key  # same pinned identity
    ticket = first.open_round(0, 1, b"D" * 32, n_ciphertexts=1, max_clients=3)
    with service.lock:
        authority = service.authority(old_session)
    first.end_session()
    assert authority._private_key is None and service.open_sessions == 1
    # the finished run's ticket (and session) is refused, even replayed by hand
    first.session, first._bundle = old_session, second.public_bundle()
    with pytest.raises(AuthorityRefusal, match="has ended"):
        first.decrypt_aggregate(ticket.nonce, cons)
    with pytest.raises(AuthorityRefusal, match="has ended"):
        first.open_round(0, 2, b"D" * 32, n_ciphertexts=1, max_clients=3)
    assert _decrypt_once(second, signing)[2].plaintexts == (12,)  # the other run is unaffected
    second.end_session()
    assert service.open_sessions == 0


def test_insecure_only_on_loopback_and_tls_files_required(tmp_path, pki):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    d = provision_local(tmp_path, 2).directory
    service = svc.AuthorityService(Ed25519PrivateKey.generate().private_bytes_raw(), d)
    with pytest.raises(InputError, match="only on a loopback"):
        svc.make_server(service, "0.0.0.0", 0, insecure=True)
    with pytest.raises(InputError, match="--client-ca"):
        svc.make_server(service, "127.0.0.1", 0, cert=pki["run"].authority.cert, key=pki["run"].authority.key)
    with pytest.raises(InputError, match="--cert"):
        svc.make_server(service, "127.0.0.1", 0)
    with pytest.raises(InputError, match="use https"):
        RemoteAuthority("http://127.0.0.1:1", d, ca=pki["run"].ca.cert)
    from securefkm.cli import main

    assert main(["authority", "serve", "--keys", str(tmp_path), "--directory", "x.json", "--insecure",
                 "--cert", "c.pem"]) == 2


def test_remote_authority_is_shared_by_layer_copies_and_pickles(tmp_path, pki):
    """clone_layers deep-copies the Paillier layer: the copy must use the same session
    handle; pickling drops the SSLContext and rebuilds it from the file paths."""
    import copy
    import pickle

    d = provision_local(tmp_path, 2).directory
    run = pki["run"]
    remote = RemoteAuthority("https://127.0.0.1:1", d, ca=run.ca.cert, cert=run.serverapp.cert, key=run.serverapp.key)
    assert copy.deepcopy({"a": remote})["a"] is remote
    clone = pickle.loads(pickle.dumps(remote))
    assert clone._ssl is None and clone._tls == remote._tls
    with pytest.raises(AuthorityUnavailable, match="unreachable"):  # rebuilt context, then a refused connection
        clone.public_bundle()
    with pytest.raises(InputError, match="authority-ca"):
        RemoteAuthority("https://127.0.0.1:1", d)  # https without the CA file


def test_idle_sessions_expire(tmp_path):
    """A ServerApp killed mid-run never ends its session: the TTL does, destroying the key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    now = [0.0]
    d = provision_local(tmp_path, 2).directory
    keypair = phe.generate_paillier_keypair(n_length=1024)
    service = svc.AuthorityService(Ed25519PrivateKey.generate().private_bytes_raw(), d, key_size=1024,
                                   allow_weak_key=True, keygen=lambda bits: keypair, session_ttl=60,
                                   clock=lambda: now[0])
    stale, _ = service.begin_session()
    now[0] = 50.0
    live, _ = service.begin_session()
    with service.lock:
        service.authority(live)  # used: its clock restarts
    now[0] = 100.0
    assert service.expire_idle() == [stale] and service.open_sessions == 1
    with service.lock, pytest.raises(AuthorityRefusal, match="has ended"):
        service.authority(stale)
