"""The Paillier key authority as its own long-lived process: HTTPS with client certificates.

In a deployment the authority must not be the aggregating server (together they decrypt
any client's ciphertext), so it runs as a separate process, normally on another machine
under another operator::

    securefkm authority init  --keys DIR          # once: the Ed25519 identity (pinned in the directory)
    securefkm authority serve --keys DIR --directory directory.json --host 0.0.0.0 --port 8471 \\
        --cert authority.pem --key authority.key --client-ca authority-client-ca.pem

**Sessions (key rotation).** The long-lived secret on disk is only the Ed25519 identity
that signs public bundles. Every run opens a *session*: the service generates a fresh
Paillier keypair for it in memory (never written to disk), enrolls the directory's nodes
and returns the signed bundle; the ServerApp ends the session after the run and the
service drops that private key. A ticket, decryption or round of an ended (or unknown)
session is refused with 403, so nothing of a finished run can be decrypted later.

==============================  ====================================================
``GET  /v1/identity``            the authority's Ed25519 verify key (hex)
``POST /v1/session``             a new session: ``{session, bundle}`` with a fresh keypair
``POST /v1/end_session``         destroy the session's private key
``POST /v1/open_round``          a fresh single-use round ticket (``session`` + KeyAuthority args)
``POST /v1/close_round``         burn a ticket without decrypting
``POST /v1/decrypt_aggregate``   verify signed contributions, recompute the sum, decrypt it
==============================  ====================================================

Everything else is refused (404/405), bodies over the body limit with 413 (before reading
them when ``Content-Length`` says so), malformed JSON or a field of the wrong type with 400
naming the field, and every refusal of :class:`KeyAuthority` with 403 and its reason (the
ticket is burned all the same). The checks themselves are KeyAuthority's, not
re-implemented here. The wire is JSON only (:mod:`.authority_wire`): nothing received in
either direction is unpickled or otherwise able to run code.

**Limits** (:class:`Limits`, ``securefkm authority serve --help``): the body limit is the
largest legitimate decryption request for the declared sizes (every directory node,
``--max-ciphertexts`` ciphertexts each, at the key size; see
:func:`~securefkm.flower.authority_wire.request_body_limit`); a connection must send its
headers within ``--header-timeout`` and its body within ``--body-timeout`` seconds; one client
certificate holds at most ``--max-connections-per-client`` connections and one request body
at a time, so it cannot starve the others; the memory of a large request is handed back to
the OS once it is answered.

**Transport.** The HTTP server is uvicorn (maintained, already installed with Flower) with
the standard library's :mod:`ssl`: TLS >= 1.2, a client certificate signed by
``--client-ca`` is *required* (no certificate, another CA's or an expired one fails the
handshake), and the certificate's common name must be one of ``--client-name`` (default
:data:`~securefkm.flower.tls.SERVERAPP_NAME`), checked when the connection is made. Plain
HTTP needs ``--insecure`` and is refused on any address but loopback. Why not gRPC: see
docs/deployment.md ("Key authority over TLS").
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..exceptions import InputError
from .authority_wire import (
    API,
    MAX_BODY,
    MAX_CIPHERTEXTS,
    BadRequest,
    as_int,
    bundle_to_json,
    contribution_from_json,
    field,
    hex_bytes,
    hex_int,
    loads,
    request_body_limit,
    ticket_to_json,
)
from .directory import Directory
from .tls import SERVERAPP_NAME, is_loopback, peer_common_name, server_context

IDENTITY_FILE = "identity.pem"
VERIFY_FILE = "authority.pub"


# ------------------------------------------------------------------ the identity on disk
def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def init_authority_keys(keys_dir, *, key_size: int = 2048, exist_ok: bool = True) -> bytes:
    """Create the authority's Ed25519 identity in ``keys_dir``; return its verify key.

    Files: ``identity.pem`` (private, mode 0600, in a 0700 directory) and ``authority.pub``
    (the verify key as hex: put it into the directory). Paillier keys are *not* stored:
    each session gets a fresh pair (``key_size`` is accepted for compatibility and
    checked). With ``exist_ok`` an existing identity is kept.
    """
    from protocols.paillier.authority import KEY_SIZES

    keys_dir = Path(keys_dir)
    if (keys_dir / IDENTITY_FILE).exists():
        if not exist_ok:
            raise InputError(f"{keys_dir} already holds authority keys; refusing to overwrite them.")
        return load_identity(keys_dir).public_key().public_bytes_raw()
    if key_size not in KEY_SIZES:
        raise InputError(f"key_size must be one of {KEY_SIZES} bits, got {key_size!r}.")
    keys_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(keys_dir, 0o700)
    identity = Ed25519PrivateKey.generate()
    _write_private(keys_dir / IDENTITY_FILE, identity.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    verify = identity.public_key().public_bytes_raw()
    (keys_dir / VERIFY_FILE).write_text(verify.hex() + "\n")
    return verify


def load_identity(keys_dir) -> Ed25519PrivateKey:
    path = Path(keys_dir) / IDENTITY_FILE
    if not path.is_file():
        raise InputError(f"{path} does not exist; create the authority's keys with `securefkm authority init --keys {keys_dir}`.")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{path} is not an Ed25519 private key.")
    return key


# ------------------------------------------------------------------ sessions: one keypair per run
class AuthorityService:
    """A long-lived authority: one :class:`KeyAuthority` (fresh Paillier keys) per session.

    ``identity`` is the raw Ed25519 private key every session's bundle is signed with;
    ``directory`` enrolls client ``i`` = the directory's ``i``-th node in every session.
    ``keygen(key_size)`` (tests) replaces ``phe.generate_paillier_keypair``. A session
    unused for ``session_ttl`` seconds is ended like any other (a ServerApp that was
    killed never ends its own session). ``max_ciphertexts`` is the most ciphertexts per
    contribution a round may declare (``open_round``); with the directory's size and the key
    size it fixes the largest legitimate request (:meth:`request_limit`).
    """

    def __init__(self, identity: bytes, directory: Directory, *, key_size: int = 2048, min_clients: int = 2,
                 allow_weak_key: bool = False, max_sessions: int = 16, keygen=None,
                 session_ttl: float = 6 * 3600.0, clock=time.monotonic, max_ciphertexts: int = MAX_CIPHERTEXTS):
        from protocols.paillier.authority import KEY_SIZES

        if key_size not in KEY_SIZES and not allow_weak_key:
            raise InputError(f"key_size must be one of {KEY_SIZES} bits, got {key_size!r}.")
        verify = Ed25519PrivateKey.from_private_bytes(identity).public_key().public_bytes_raw()
        if directory.authority_key is not None and directory.authority_key != verify:
            raise InputError(
                f"the directory pins authority key {directory.authority_key.hex()[:16]}... but this authority's "
                f"identity is {verify.hex()[:16]}...; put its authority.pub into the directory "
                "(`securefkm provision directory --authority`)."
            )
        self._identity = identity
        self.verify_key = verify
        self.directory = directory
        self.key_size = int(key_size)
        self.min_clients = int(min_clients)
        self.allow_weak_key = bool(allow_weak_key)
        self.max_sessions = int(max_sessions)
        if type(max_ciphertexts) is not int or max_ciphertexts < 1:
            raise InputError(f"max_ciphertexts must be a positive int, got {max_ciphertexts!r}.")
        self.max_ciphertexts = max_ciphertexts
        self._keygen = keygen
        self._sessions: dict[str, object] = {}
        self._ended: set[str] = set()
        self._last_used: dict[str, float] = {}
        self.session_ttl = float(session_ttl)
        self._clock = clock
        self.lock = threading.Lock()

    @classmethod
    def from_keys(cls, keys_dir, directory: Directory, **kwargs) -> AuthorityService:
        return cls(load_identity(keys_dir).private_bytes_raw(), directory, **kwargs)

    def _check_room(self) -> None:
        """Refuse a new session when ``max_sessions`` are open (idle ones expired first)."""
        from protocols.paillier import AuthorityRefusal
        from protocols.paillier.authority import STAGE

        self.expire_idle()
        with self.lock:
            if len(self._sessions) >= self.max_sessions:
                raise AuthorityRefusal(f"{len(self._sessions)} sessions are open (max_sessions={self.max_sessions}); "
                                       "end finished runs first", stage=STAGE)

    def _register(self, party) -> str:
        """Enroll the directory's nodes (client i = node i) with ``party`` and open its session."""
        for cid, key in enumerate(self.directory.nodes):
            party.enroll(cid, key)
        sid = secrets.token_hex(16)
        with self.lock:
            self._sessions[sid] = party
            self._last_used[sid] = self._clock()
        return sid

    def begin_session(self) -> tuple[str, object]:
        """``(session id, signed public bundle)`` of a new session with a fresh keypair."""
        from phe import paillier

        from protocols.paillier import KeyAuthority

        self._check_room()
        keygen = self._keygen or (lambda bits: paillier.generate_paillier_keypair(n_length=bits))
        public, private = keygen(self.key_size)  # seconds for 2048 bits: outside the lock
        authority = KeyAuthority(public, private, min_clients=self.min_clients, allow_weak_key=self.allow_weak_key,
                                 identity_key=self._identity)
        return self._register(authority), authority.public_bundle()

    def begin_helper_session(self) -> tuple[str, object]:
        """``(session id, the Helper)`` of a new validation-Helper session: a
        :class:`~protocols.validated.ValidationHelper` with a fresh HPKE key, its bundle signed
        with this service's identity (the nodes' trusted key), the directory's nodes enrolled."""
        from protocols.validated import ValidationHelper

        self._check_room()
        helper = ValidationHelper(min_clients=self.min_clients, identity=self._identity)
        return self._register(helper), helper

    def expire_idle(self) -> list[str]:
        """End every session unused for ``session_ttl`` seconds; their ids."""
        now = self._clock()
        with self.lock:
            idle = [sid for sid, t in self._last_used.items() if now - t > self.session_ttl]
        for sid in idle:
            self.end_session(sid)
        return idle

    def authority(self, session) -> object:
        """The session's KeyAuthority (call with ``self.lock`` held); 403 if ended or unknown."""
        from protocols.paillier import AuthorityRefusal
        from protocols.paillier.authority import STAGE

        if not isinstance(session, str):
            raise BadRequest("session must be a string")
        if session in self._ended:
            raise AuthorityRefusal(f"session {session[:8]}... has ended: its private key is destroyed", stage=STAGE)
        if session not in self._sessions:
            raise AuthorityRefusal(f"unknown session {session[:8]}...", stage=STAGE)
        self._last_used[session] = self._clock()
        return self._sessions[session]

    def end_session(self, session) -> None:
        """Drop the session's keypair; its tickets are refused from now on (idempotent)."""
        with self.lock:
            authority = self.authority(session) if session not in self._ended else None
            self._sessions.pop(session, None)
            self._last_used.pop(session, None)
            self._ended.add(session)
        if authority is not None and hasattr(authority, "_private_key"):
            # Drop every reference to the private key. CPython cannot wipe the big ints
            # themselves; the key only ever lived in this process's memory.
            authority._private_key = None
            authority._open.clear()
        elif authority is not None:  # a Helper: its HPKE key and every open round
            authority._hpke = None
            authority._rounds.clear()

    def request_limit(self) -> int:
        """Bytes of the largest legitimate request for this service's declared sizes
        (:func:`~securefkm.flower.authority_wire.request_body_limit`): a decryption request
        of every directory node, ``max_ciphertexts`` ciphertexts each, at this key size."""
        return request_body_limit(max(1, len(self.directory)), self.max_ciphertexts, self.key_size)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)


# ------------------------------------------------------------------ operations (KeyAuthority's own)
def _op_open_round(body, authority) -> dict:
    ticket = authority.open_round(
        as_int(field(body, "run"), "run"), as_int(field(body, "round"), "round"),
        hex_bytes(field(body, "digest"), "digest"),
        n_ciphertexts=as_int(field(body, "n_ciphertexts"), "n_ciphertexts"),
        max_clients=as_int(field(body, "max_clients"), "max_clients"),
    )
    return ticket_to_json(ticket)


def _op_close_round(body, authority) -> dict:
    authority.close_round(hex_bytes(field(body, "nonce"), "nonce"))
    return {"ok": True}


def _op_decrypt_aggregate(body, authority) -> dict:
    nonce = hex_bytes(field(body, "nonce"), "nonce")
    raw = field(body, "contributions")
    try:
        if not isinstance(raw, list):
            raise BadRequest("contributions must be a list")
        contributions = [contribution_from_json(c, i) for i, c in enumerate(raw)]
        claimed = body.get("claimed_sum")
        if claimed is not None:
            if not isinstance(claimed, list):
                raise BadRequest("claimed_sum must be a list of hex strings or null")
            claimed = [hex_int(x, "claimed_sum") for x in claimed]
    except BadRequest:
        authority.close_round(nonce)  # a malformed attempt burns the ticket like any other
        raise
    dec = authority.decrypt_aggregate(nonce, contributions, claimed)
    return {"plaintexts": [format(int(p), "x") for p in dec.plaintexts], "contributors": list(dec.contributors)}


_SESSION_OPS = {"open_round": _op_open_round, "close_round": _op_close_round,
                "decrypt_aggregate": _op_decrypt_aggregate}


# ------------------------------------------------------------------ operations (the validation Helper's own)
def _op_helper_open_round(body, helper) -> dict:
    from .helper_wire import noise_from_json, ticket_to_json

    votes = body.get("votes")
    if votes is not None and (not isinstance(votes, list) or len(votes) != 2):
        raise BadRequest("votes must be [coordinates, bins] or null")
    widths = field(body, "widths")
    if not isinstance(widths, list) or len(widths) > 1 << 16:
        raise BadRequest("widths must be a list of integers")
    ticket, verify_key = helper.open_round(
        as_int(field(body, "run"), "run"), as_int(field(body, "round"), "round"),
        as_int(field(body, "attempt"), "attempt"), hex_bytes(field(body, "digest"), "digest"),
        as_int(field(body, "k"), "k"), [as_int(w, "widths") for w in widths],
        as_int(field(body, "frac_bits"), "frac_bits"), noise_from_json(body.get("noise")),
        None if votes is None else tuple(as_int(v, "votes") for v in votes))
    return {"ticket": ticket_to_json(ticket), "verify_key": verify_key.hex()}


def _op_helper_verify(body, helper) -> dict:
    from .helper_wire import reports_from_json

    messages, refused = helper.verify(hex_bytes(field(body, "nonce"), "nonce", size=16),
                                      reports_from_json(field(body, "reports")))
    return {"messages": {str(c): m.hex() for c, m in messages.items()},
            "refused": {str(c): why for c, why in refused.items()}}


def _op_helper_aggregate(body, helper) -> dict:
    from .helper_wire import share_to_json

    accepted = field(body, "accepted")
    if not isinstance(accepted, list) or len(accepted) > 1 << 20:
        raise BadRequest("accepted must be a list of client ids")
    share = helper.aggregate(hex_bytes(field(body, "nonce"), "nonce", size=16), [as_int(c, "accepted") for c in accepted])
    return {"share": share_to_json(share)}


def _op_helper_close_round(body, helper) -> dict:
    helper.close_round(hex_bytes(field(body, "nonce"), "nonce", size=16))
    return {"ok": True}


_HELPER_OPS = {"helper_open_round": _op_helper_open_round, "helper_verify": _op_helper_verify,
               "helper_aggregate": _op_helper_aggregate, "helper_close_round": _op_helper_close_round}


def handle(service: AuthorityService, method: str, path: str, body: bytes | None) -> tuple[int, dict]:
    """One request -> ``(status, JSON body)``. Synchronous (runs in a worker thread)."""
    from protocols.paillier import AuthorityRefusal

    if not path.startswith(API + "/"):
        return 404, {"error": "not_found", "message": f"no such operation {path!r}"}
    name = path[len(API) + 1:]
    if name not in {"identity", "session", "end_session", "helper_session", "helper_end_session", *_SESSION_OPS,
                    *_HELPER_OPS}:
        return 404, {"error": "not_found", "message": f"no such operation {path!r}"}
    want = "GET" if name == "identity" else "POST"
    if method != want:
        return 405, {"error": "method_not_allowed", "message": f"{path} needs {want}"}
    if name == "identity":
        return 200, {"authority_key": service.verify_key.hex()}
    try:
        obj = loads(body or b"")
        if isinstance(body, bytearray):
            body.clear()  # the parsed object is all that is needed from here on
        if not isinstance(obj, dict):
            raise BadRequest("body must be a JSON object")
        if name == "session":
            sid, bundle = service.begin_session()
            return 200, {"session": sid, "bundle": bundle_to_json(bundle)}
        if name == "helper_session":
            from .helper_wire import bundle_to_json as helper_bundle_json

            sid, helper = service.begin_helper_session()
            return 200, {"session": sid, "bundle": helper_bundle_json(helper.public_bundle()),
                         "min_clients": helper.min_clients}
        if name in ("end_session", "helper_end_session"):
            service.end_session(field(obj, "session"))
            return 200, {"ok": True}
        with service.lock:
            authority = service.authority(field(obj, "session"))
            from protocols.validated import HelperRefusal, ValidationHelper

            if (name in _HELPER_OPS) != isinstance(authority, ValidationHelper):
                raise AuthorityRefusal(f"session {str(field(obj, 'session'))[:8]}... is not a "
                                       f"{'validation Helper' if name in _HELPER_OPS else 'Paillier'} session",
                                       stage="authority")
            if name in _HELPER_OPS:
                try:
                    return 200, _HELPER_OPS[name](obj, authority)
                except HelperRefusal as exc:
                    raise AuthorityRefusal(str(exc), stage="authority") from None
                except BadRequest:
                    raise
                except (ValueError, TypeError) as exc:  # e.g. circuit parameters the Helper cannot build
                    raise BadRequest(f"{name}: {exc}") from None
            if name == "open_round":
                n_ct = as_int(field(obj, "n_ciphertexts"), "n_ciphertexts")
                if n_ct > service.max_ciphertexts:
                    raise BadRequest(
                        f"field n_ciphertexts={n_ct} exceeds this authority's max_ciphertexts="
                        f"{service.max_ciphertexts} (its decryption request would be over the body limit); "
                        f"restart the authority with --max-ciphertexts {n_ct} or more")
            return 200, _SESSION_OPS[name](obj, authority)
    except BadRequest as exc:
        return 400, {"error": "bad_request", "message": str(exc)}
    except AuthorityRefusal as exc:
        return 403, {"error": "refused", "message": str(exc)}
    except InputError as exc:
        return 400, {"error": "bad_request", "message": str(exc)}
    except Exception as exc:  # never leak a traceback to the peer
        sys.stderr.write(f"authority: internal error in {name}: {type(exc).__name__}: {exc}\n")
        return 500, {"error": "internal", "message": type(exc).__name__}


# ------------------------------------------------------------------ limits
@dataclass(frozen=True)
class Limits:
    """What one client certificate may hold of the service, and for how long.

    ``max_body``: bytes of one request body (default: :meth:`AuthorityService.request_limit`,
    the largest legitimate decryption request for the declared sizes); larger bodies get
    413, before they are read when ``Content-Length`` says so. ``header_timeout``: seconds
    a connection has to send a request's full headers (from when it is opened, or from the
    end of its previous response); ``body_timeout``: seconds from the end of the headers
    to the end of the body; a connection that misses either is closed.
    ``per_identity``: connections one client certificate (its SHA-256 fingerprint; without
    TLS, one peer address) may hold open at once; one more is answered 503 and closed, so
    one client cannot take the others' share. One identity also buffers at most
    ``max_body`` bytes of bodies at a time (a second large body while one is read gets
    503). ``max_connections``: all identities together (uvicorn's ``limit_concurrency``).
    ``max_header_bytes``: request line and headers (h11's ``max_incomplete_event_size``).
    """

    max_body: int | None = None
    header_timeout: float = 5.0
    body_timeout: float = 60.0
    per_identity: int = 4
    max_connections: int = 64
    max_header_bytes: int = 8192

    def __post_init__(self):
        for name in ("header_timeout", "body_timeout"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise InputError(f"authority limit {name} must be a positive number of seconds, got {v!r}.")
        for name in ("per_identity", "max_connections", "max_header_bytes") + (
                ("max_body",) if self.max_body is not None else ()):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise InputError(f"authority limit {name} must be a positive int, got {v!r}.")
        if self.per_identity > self.max_connections:
            raise InputError(f"authority limit per_identity={self.per_identity} exceeds "
                             f"max_connections={self.max_connections}; lower it.")


#: a body this large is followed by returning freed heap memory to the OS
_TRIM_AFTER = 1 << 20


def _release_memory() -> None:
    """Give freed heap pages back to the OS (glibc's ``malloc_trim``; nothing elsewhere).

    A large JSON body becomes many small strings and ints; once freed, glibc keeps their
    pages in its arenas (one per worker thread) and the process stays large.
    """
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


# ------------------------------------------------------------------ the ASGI app + uvicorn
#: the ASGI scope key under which the connection's identity reaches the app
IDENTITY_KEY = "securefkm.identity"


class AuthorityApp:
    """A minimal ASGI app around :func:`handle` (bounded bodies; work off the event loop).

    Bodies are read into one buffer of the declared length (no list of chunks joined into a
    second copy); a client identity (``scope[IDENTITY_KEY]``, set by the protocol) buffers at
    most ``max_body`` bytes at a time.
    """

    def __init__(self, service: AuthorityService, *, max_body: int = MAX_BODY):
        self.service = service
        self.max_body = int(max_body)
        self._buffered: dict[object, int] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        status, out = await self._respond(scope, receive)
        data = json.dumps(out).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        if status in (408, 413, 503):
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    def _reserve(self, who, size: int) -> bool:
        held = self._buffered.get(who, 0)
        if held and held + size > self.max_body:
            return False
        self._buffered[who] = held + size
        return True

    def _release(self, who, size: int) -> None:
        left = self._buffered.get(who, 0) - size
        if left > 0:
            self._buffered[who] = left
        else:
            self._buffered.pop(who, None)

    async def _respond(self, scope, receive) -> tuple[int, dict]:
        too_large = 413, {"error": "too_large", "message": f"request body over {self.max_body} bytes"}
        busy = 503, {"error": "busy", "message": "this client already has a request body in flight; send one "
                                                 "request at a time"}
        headers = dict(scope.get("headers") or ())
        length = headers.get(b"content-length")
        if length is not None:
            try:
                length = int(length)
            except ValueError:
                return 400, {"error": "bad_request", "message": "bad Content-Length"}
            if length > self.max_body:
                return too_large  # refused before reading; the server closes the connection
        who = scope.get(IDENTITY_KEY)
        reserved = 0
        try:
            if length is not None:
                if not self._reserve(who, length):
                    return busy
                reserved = length
            body = bytearray(length or 0)
            size, more = 0, True
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return 400, {"error": "bad_request", "message": "client disconnected"}
                chunk = msg.get("body", b"")
                if length is None:  # chunked: reserve as it comes
                    if size + len(chunk) > self.max_body:
                        return too_large
                    if not self._reserve(who, len(chunk)):
                        return busy
                    reserved += len(chunk)
                    body += chunk
                else:
                    if size + len(chunk) > length:
                        return 400, {"error": "bad_request", "message": "body longer than its Content-Length"}
                    body[size:size + len(chunk)] = chunk
                size += len(chunk)
                more = msg.get("more_body", False)
                del msg, chunk
            if size != len(body):
                return 400, {"error": "bad_request", "message": "body shorter than its Content-Length"}
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self._handle, scope["method"], scope["path"], body)
        finally:
            body = None
            if reserved:
                self._release(who, reserved)

    def _handle(self, method, path, body: bytearray):
        large = len(body) >= _TRIM_AFTER
        try:
            return handle(self.service, method, path, body)
        finally:
            body.clear()
            if large:
                _release_memory()


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
         b"content-length: %d\r\n\r\n%s")


def _busy_response(message: str) -> bytes:
    data = json.dumps({"error": "busy", "message": message}).encode()
    return _BUSY % (len(data), data)


def _protocol(allowed_names, limits: Limits):
    """uvicorn's h11 protocol with the service's connection rules.

    * TLS connections whose client certificate's common name is not admitted are closed;
    * at most ``limits.per_identity`` open connections per identity (one more: 503, closed);
    * a connection must send a request's headers within ``limits.header_timeout`` seconds
      and its body within ``limits.body_timeout`` more, or it is closed (uvicorn itself
      bounds only the idle time between requests, and any byte resets that timer).
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    allowed = None if allowed_names is None else frozenset(allowed_names)
    open_per_identity: dict[str, int] = {}

    class AuthorityH11Protocol(H11Protocol):
        identity: str | None = None
        _timer = None
        _phase = None

        def connection_made(self, transport):
            super().connection_made(transport)
            ssl_object = transport.get_extra_info("ssl_object")
            if ssl_object is not None:
                name = peer_common_name(ssl_object.getpeercert())
                if allowed is not None and name not in allowed:
                    transport.abort()  # the handshake verified the chain; the name is not one we admit
                    return
                der = ssl_object.getpeercert(binary_form=True) or b""
                identity = f"{name} {hashlib.sha256(der).hexdigest()[:16]}"
            else:
                identity = f"address {self.client[0] if self.client else '?'}"
            if open_per_identity.get(identity, 0) >= limits.per_identity:
                self.logger.warning("authority: refusing a connection of %s: it holds %d already", identity,
                                    limits.per_identity)
                transport.write(_busy_response(
                    f"this client certificate already holds {limits.per_identity} connections "
                    "(the authority's per-client limit); close one first"))
                transport.close()
                return
            open_per_identity[identity] = open_per_identity.get(identity, 0) + 1
            self.identity = identity
            app = self.app

            async def tagged(scope, receive, send):
                scope[IDENTITY_KEY] = identity
                return await app(scope, receive, send)

            self.app = tagged
            self._await("headers", limits.header_timeout)

        def connection_lost(self, exc):
            self._cancel()
            if self.identity is not None:
                left = open_per_identity.get(self.identity, 1) - 1
                if left > 0:
                    open_per_identity[self.identity] = left
                else:
                    open_per_identity.pop(self.identity, None)
                self.identity = None
            super().connection_lost(exc)

        def data_received(self, data):
            super().data_received(data)
            if self.identity is None or self.transport.is_closing():
                return
            state = self.conn.their_state
            if state is h11.SEND_BODY and self._phase == "headers":
                self._await("body", limits.body_timeout)
            elif state is not h11.IDLE and state is not h11.SEND_BODY and self._phase is not None:
                self._cancel()  # the request is in: the app answers it

        def on_response_complete(self):
            super().on_response_complete()
            if self.identity is not None and not self.transport.is_closing():
                self._await("headers", limits.header_timeout)  # the next request's

        def _await(self, phase, seconds):
            self._cancel()
            self._phase = phase
            self._timer = self.loop.call_later(seconds, self._expired, phase, seconds)

        def _cancel(self):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._phase = None

        def _expired(self, phase, seconds):
            self._timer = None
            if self._phase == phase and not self.transport.is_closing():
                self.logger.warning("authority: closing a connection of %s: its request %s did not arrive "
                                    "within %g s", self.identity, phase, seconds)
                self.transport.abort()

    return AuthorityH11Protocol


def make_server(service: AuthorityService, host: str = "127.0.0.1", port: int = 0, *, cert=None, key=None,
                client_ca=None, client_names=(SERVERAPP_NAME,), insecure: bool = False, quiet: bool = False,
                max_body: int | None = None, limits: Limits | None = None):
    """A ``uvicorn.Server`` for ``service`` (not started: ``run()`` it, or in a thread).

    TLS with a required client certificate unless ``insecure`` (loopback only). ``limits``
    (:class:`Limits`) bound what each client certificate may hold; ``max_body`` overrides
    ``limits.max_body``; without either the body limit is ``service.request_limit()``.
    """
    import uvicorn

    if insecure:
        if not is_loopback(host):
            raise InputError(f"--insecure serves plain HTTP and is refused on {host!r}: only on a loopback "
                             "address (127.0.0.1, ::1, localhost). Give --cert, --key and --client-ca instead.")
        ssl_context = None
    else:
        ssl_context = server_context(cert, key, client_ca)
    limits = limits or Limits()
    if max_body is not None:
        limits = replace(limits, max_body=max_body)
    if limits.max_body is None:
        limits = replace(limits, max_body=service.request_limit())
    config = uvicorn.Config(
        AuthorityApp(service, max_body=limits.max_body), host=host, port=port,
        http=_protocol(client_names if ssl_context else None, limits),
        lifespan="on", access_log=not quiet, log_level="warning" if quiet else "info",
        ws="none", limit_concurrency=limits.max_connections, timeout_keep_alive=min(5, limits.header_timeout),
        h11_max_incomplete_event_size=limits.max_header_bytes, server_header=False,
    )
    config.load()
    config.ssl = ssl_context  # ours (TLS >= 1.2, CERT_REQUIRED), not uvicorn's defaults
    server = uvicorn.Server(config)
    server.limits = limits
    return server


def start_in_thread(server, timeout: float = 10.0) -> tuple[threading.Thread, int]:
    """Start a :func:`make_server` server in a daemon thread; ``(thread, bound port)``."""
    import time

    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the key authority service did not start")
        time.sleep(0.02)
    return thread, server.servers[0].sockets[0].getsockname()[1]


def serve(keys_dir, directory_path, *, host: str = "127.0.0.1", port: int = 8471, min_clients: int = 2,
          key_size: int = 2048, cert=None, key=None, client_ca=None, client_names=(SERVERAPP_NAME,),
          insecure: bool = False, quiet: bool = False, session_ttl: float = 6 * 3600.0,
          max_ciphertexts: int = MAX_CIPHERTEXTS, limits: Limits | None = None, out=print) -> None:
    """Run the authority service until interrupted (``securefkm authority serve``)."""
    directory = Directory.load(directory_path)
    service = AuthorityService.from_keys(keys_dir, directory, key_size=key_size, min_clients=min_clients,
                                         session_ttl=session_ttl, max_ciphertexts=max_ciphertexts)
    server = make_server(service, host, port, cert=cert, key=key, client_ca=client_ca, client_names=client_names,
                         insecure=insecure, quiet=quiet, limits=limits)
    lim = server.limits
    scheme = "http" if insecure else "https"
    out(f"securefkm key authority: {key_size}-bit Paillier keys per session, {len(directory)} enrolled node(s), "
        f"min_clients={min_clients}, verify key {service.verify_key.hex()}")
    out(f"listening on {scheme}://{host}:{port}{API}" + (
        " (plain HTTP, loopback only: --insecure)" if insecure else f" (TLS; admitting client certificates of "
        f"{client_ca} named {', '.join(client_names)})"))
    out(f"limits: bodies up to {lim.max_body} bytes ({len(directory)} node(s) x {max_ciphertexts} ciphertexts), "
        f"headers within {lim.header_timeout:g} s, bodies within {lim.body_timeout:g} s, "
        f"{lim.per_identity} connection(s) per client certificate, {lim.max_connections} in all")
    sys.stdout.flush()
    server.run()


# ------------------------------------------------------------------ CLI (securefkm authority ...)
def add_cli(sub) -> None:
    p = sub.add_parser("authority", help="the Paillier key authority service (a separate process from the server)")
    ps = p.add_subparsers(dest="authority", required=True)
    i = ps.add_parser("init", help="create the authority's Ed25519 identity in --keys DIR; prints the verify key")
    i.add_argument("--keys", required=True, metavar="DIR", help="directory to create the keys in")
    i.add_argument("--key-size", type=int, default=2048, choices=(2048, 3072), help=argparse.SUPPRESS)
    s = ps.add_parser("serve", help="serve the authority over HTTPS with client certificates (mTLS)")
    s.add_argument("--keys", required=True, metavar="DIR", help="the directory written by 'authority init'")
    s.add_argument("--directory", required=True, help="the public directory JSON (enrolled node keys)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=8471, help="TCP port")
    s.add_argument("--min-clients", type=int, default=2, help="fewest distinct signers per decryption")
    s.add_argument("--key-size", type=int, default=2048, choices=(2048, 3072), help="Paillier modulus bits per session")
    s.add_argument("--cert", help="this service's TLS certificate (PEM)")
    s.add_argument("--key", dest="tls_key", help="its private key (PEM)")
    s.add_argument("--client-ca", help="the CA that signs the certificates of admitted clients (the ServerApp's)")
    s.add_argument("--client-name", action="append", default=None, metavar="CN",
                   help=f"admitted client certificate common name (repeatable; default {SERVERAPP_NAME!r})")
    s.add_argument("--session-ttl", type=float, default=6 * 3600.0,
                   help="seconds after which an unused session (a run's keypair) is ended")
    s.add_argument("--max-ciphertexts", type=int, default=MAX_CIPHERTEXTS,
                   help="most ciphertexts per contribution a round may declare; with the directory's size and "
                        "the key size it sets the body limit")
    s.add_argument("--max-body", type=int, default=None, metavar="BYTES",
                   help="request body limit (default: the largest decryption request for the declared sizes, "
                        "+25%% and 64 KiB)")
    s.add_argument("--header-timeout", type=float, default=Limits.header_timeout,
                   help="seconds a connection has to send a request's headers")
    s.add_argument("--body-timeout", type=float, default=Limits.body_timeout,
                   help="seconds a connection has to send a request's body after its headers")
    s.add_argument("--max-connections-per-client", type=int, default=Limits.per_identity,
                   help="open connections one client certificate may hold")
    s.add_argument("--max-connections", type=int, default=Limits.max_connections,
                   help="open connections of all clients together")
    s.add_argument("--insecure", action="store_true", help="plain HTTP, loopback addresses only (debugging)")
    s.add_argument("--quiet", action="store_true", help="no per-request log lines")


def run_cli(args, out=print) -> None:
    if args.authority == "init":
        out(init_authority_keys(args.keys, key_size=args.key_size).hex())
    elif args.authority == "serve":
        if args.insecure and (args.cert or args.tls_key or args.client_ca):
            raise InputError("--insecure and --cert/--key/--client-ca contradict each other; drop one.")
        serve(args.keys, args.directory, host=args.host, port=args.port, min_clients=args.min_clients,
              key_size=args.key_size, cert=args.cert, key=args.tls_key, client_ca=args.client_ca,
              client_names=tuple(args.client_name or (SERVERAPP_NAME,)), insecure=args.insecure,
              quiet=args.quiet, session_ttl=args.session_ttl, max_ciphertexts=args.max_ciphertexts,
              limits=Limits(max_body=args.max_body, header_timeout=args.header_timeout,
                            body_timeout=args.body_timeout, per_identity=args.max_connections_per_client,
                            max_connections=args.max_connections), out=out)
