"""The two views of the key authority outside its own process.

* :class:`RemoteAuthority` -- the ServerApp's handle on ``securefkm authority serve``:
  :class:`~protocols.paillier.KeyAuthority`'s interface over HTTPS with a client
  certificate (mutual TLS). One instance is one *session* of the long-lived service: the
  first :meth:`~RemoteAuthority.public_bundle` call opens it (the service makes a fresh
  Paillier keypair for it), :meth:`~RemoteAuthority.end_session` has the service destroy
  that private key; tickets of an ended session are refused.
* :class:`BundleView` -- a client node's read-only view: the signed public bundle it
  verified against the authority key in its *own* directory file.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

from ..exceptions import InputError, SecureFKMError
from .authority_wire import (
    API,
    MAX_REPLY,
    BadRequest,
    as_int,
    bundle_from_json,
    contribution_to_json,
    field,
    hex_bytes,
    hex_int,
    loads,
    ticket_from_json,
)
from .directory import Directory
from .tls import client_context


class AuthorityUnavailable(SecureFKMError, RuntimeError):
    """The key authority service could not be reached or answered something unexpected."""


class RemoteAuthority:
    """The ServerApp's handle on the authority service (one session = one run's keys).

    ``verify_key`` answers from the server's copy of the directory (public data); refusals
    of the service raise :class:`AuthorityRefusal` exactly like an in-process authority.
    The session's public bundle is checked against the directory's authority key.

    ``https://`` URLs need ``ca`` (the CA that signed the authority's certificate) and the
    ServerApp's client certificate ``cert`` / ``key``; ``http://`` is for an authority
    started with ``--insecure`` on loopback.
    """

    def __init__(self, url: str, directory: Directory, *, timeout: float = 60.0, allow_weak_key: bool = False,
                 ca=None, cert=None, key=None):
        url = str(url or "").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise InputError(
                f"authority-url {url!r} must be an http(s):// address of `securefkm authority serve`, "
                "e.g. 'https://127.0.0.1:8471'."
            )
        self._tls = (ca, cert, key)
        self._ssl: ssl.SSLContext | None = None
        if url.startswith("https://"):
            self._ssl = client_context(ca, cert, key)  # checks the files now
        elif ca or cert or key:
            raise InputError(f"authority-url {url!r} is plain http but TLS files were given; use https://.")
        self.url = url
        self.directory = directory
        self.timeout = float(timeout)
        self.allow_weak_key = bool(allow_weak_key)
        self.n_decryptions = 0
        self.session: str | None = None
        self._bundle = None

    def __deepcopy__(self, memo):
        # a handle on an external service: copies of the layers share it (one session per run)
        return self

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_ssl"] = None  # SSLContext does not pickle; rebuilt from the file paths
        return state

    def _call(self, method: str, op: str, body: dict | None = None) -> dict:
        from protocols.paillier import AuthorityRefusal
        from protocols.paillier.authority import STAGE

        if self._ssl is None and self.url.startswith("https://"):
            self._ssl = client_context(*self._tls)

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{API}/{op}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._ssl) as resp:
                raw = resp.read(MAX_REPLY + 1)
            if len(raw) > MAX_REPLY:
                raise BadRequest(f"the reply is over {MAX_REPLY} bytes")
            out = loads(raw, "reply")
            if not isinstance(out, dict):
                raise BadRequest("reply is not a JSON object")
            return out
        except BadRequest as exc:
            raise AuthorityUnavailable(f"key authority at {self.url} sent a malformed reply to {op}: {exc}") from None
        except urllib.error.HTTPError as exc:
            try:
                err = loads(exc.read(1 << 16), "error")
                message = str(err.get("message", ""))[:2000]
            except (BadRequest, AttributeError):
                message = exc.reason
            if exc.code == 403:
                raise AuthorityRefusal(message, stage=STAGE) from None
            raise AuthorityUnavailable(f"key authority at {self.url} answered {exc.code} to {op}: {message}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise AuthorityUnavailable(
                f"key authority at {self.url} is unreachable or refused the TLS handshake ({exc}); start it with "
                "`securefkm authority serve`, set the run config 'authority-url' to its address and give the "
                "ServerApp the certificate the authority admits ('authority-cert' / 'authority-key' / 'authority-ca')."
            ) from None

    def _session_call(self, op: str, body: dict) -> dict:
        self.public_bundle()  # opens the session if needed
        return self._call("POST", op, {"session": self.session, **body})

    # -- the session
    #: the operation that opens a session, and what the service is called in errors
    _session_op, _what = "session", "key authority"

    def _decode_bundle(self, obj):
        if not isinstance(obj, dict):
            raise BadRequest("field bundle must be an object")
        return bundle_from_json(obj)

    def _read_session_extra(self, out: dict) -> None:
        """Fields of the session reply besides the id and the bundle (none here)."""

    def _open(self, op: str, body: dict) -> dict:
        return self._call("POST", op, body)

    def public_bundle(self):
        if self._bundle is None:
            out = self._open(self._session_op, {})
            try:
                session = field(out, "session")
                if not isinstance(session, str) or not 0 < len(session) <= 256:
                    raise BadRequest("field session must be a short string")
                bundle = self._decode_bundle(field(out, "bundle"))
                self._read_session_extra(out)
            except BadRequest as exc:
                raise AuthorityUnavailable(f"{self._what} at {self.url} sent a malformed session: {exc}") from None
            if self.directory.authority_key is None:
                raise InputError(
                    "the directory has no authority key; add the authority's verify key "
                    "(`securefkm provision directory --authority KEYS/authority.pub`)."
                )
            try:
                bundle.verify(self.directory.authority_key)
            except ValueError as exc:
                raise InputError(f"{self._what} at {self.url}: {exc} (its key is not the directory's authority "
                                 "key).") from None
            self.session, self._bundle = str(session), bundle
        return self._bundle

    def end_session(self) -> None:
        """Have the service destroy this session's private key (idempotent; best effort)."""
        if self.session is not None:
            session, self.session, self._bundle = self.session, None, None
            self._call("POST", "end_session", {"session": session})

    # -- KeyAuthority's interface
    @property
    def key_size(self) -> int:
        return self.public_bundle().n.bit_length()

    @property
    def public_key(self):
        return self.public_bundle().public_key()

    def verify_key(self, client_id: int) -> bytes | None:
        return self.directory.as_dict().get(int(client_id))

    def enroll(self, client_id: int, verify_key: bytes) -> None:
        raise InputError("enrollment is out of band in a deployment: add the node's key to the directory.")

    def open_round(self, run: int, round: int, digest: bytes, *, n_ciphertexts: int, max_clients: int):
        out = self._session_call("open_round", {"run": int(run), "round": int(round), "digest": bytes(digest).hex(),
                                                "n_ciphertexts": int(n_ciphertexts), "max_clients": int(max_clients)})
        try:
            ticket = ticket_from_json(out)
            if (ticket.run, ticket.round, ticket.digest, ticket.n_ciphertexts, ticket.max_clients) != (
                    int(run), int(round), bytes(digest), int(n_ciphertexts), int(max_clients)):
                raise BadRequest("the ticket is not for the round asked for")
            if len(ticket.nonce) != 16:
                raise BadRequest("field nonce must be 16 bytes")
            return ticket
        except BadRequest as exc:
            raise AuthorityUnavailable(f"key authority at {self.url} sent a malformed ticket: {exc}") from None

    def close_round(self, nonce: bytes) -> None:
        self._session_call("close_round", {"nonce": bytes(nonce).hex()})

    def decrypt_aggregate(self, nonce: bytes, contributions, claimed_sum=None):
        from protocols.paillier import DecryptedAggregate

        contributions = list(contributions)
        out = self._session_call("decrypt_aggregate", {
            "nonce": bytes(nonce).hex(),
            "contributions": [contribution_to_json(c) for c in contributions],
            "claimed_sum": None if claimed_sum is None else [format(int(c), "x") for c in claimed_sum],
        })
        try:
            plaintexts, contributors = field(out, "plaintexts"), field(out, "contributors")
            want = len(contributions[0].ciphertexts) if contributions else 0
            if not isinstance(plaintexts, list) or len(plaintexts) != want:
                raise BadRequest(f"field plaintexts must be a list of {want} hex strings")
            n = self.public_bundle().n
            plaintexts = tuple(hex_int(p, f"plaintexts[{i}]") for i, p in enumerate(plaintexts))
            if not all(p < n for p in plaintexts):
                raise BadRequest("field plaintexts holds a value not below the modulus n")
            if not isinstance(contributors, list):
                raise BadRequest("field contributors must be a list of client ids")
            contributors = tuple(as_int(c, f"contributors[{i}]") for i, c in enumerate(contributors))
            if contributors != tuple(sorted({int(c.client_id) for c in contributions})):
                raise BadRequest("field contributors is not the set of clients whose contributions were sent")
        except BadRequest as exc:
            raise AuthorityUnavailable(f"key authority at {self.url} sent a malformed result: {exc}") from None
        self.n_decryptions += 1
        return DecryptedAggregate(plaintexts=plaintexts, contributors=contributors)


class BundleView:
    """A client node's read-only view of the authority: the signed public bundle it verified.

    Built from the bundle the server relayed in the ``identify`` message; the bundle is
    verified against the authority key in the node's *own* directory, so a server cannot
    substitute a key it can decrypt.
    """

    n_decryptions = 0

    def __init__(self, bundle, directory: Directory):
        if directory.authority_key is None:
            raise InputError(
                "this node's directory has no authority key, so it cannot check the Paillier public key; "
                "add the authority's verify key to the directory file."
            )
        bundle.verify(directory.authority_key)  # ValueError if not signed by the pinned authority
        self._bundle = bundle
        self._directory = directory

    def public_bundle(self):
        return self._bundle

    @property
    def key_size(self) -> int:
        return self._bundle.n.bit_length()

    def verify_key(self, client_id: int) -> bytes | None:
        return self._directory.as_dict().get(int(client_id))

    def _never(self, *args, **kwargs):
        raise RuntimeError("a client node never talks to the key authority")

    open_round = close_round = decrypt_aggregate = enroll = _never


class RemoteHelper(RemoteAuthority):
    """The ServerApp's handle on the validation Helper hosted by the key authority service
    (one session = one run's Helper: fresh HPKE key, the directory's nodes enrolled).

    :class:`~protocols.validated.ValidationHelper`'s interface over the service's JSON API;
    its refusals raise :class:`~protocols.validated.HelperRefusal` as in process. The
    session's bundle is checked against the directory's authority key, the key the nodes
    trust. Same ``url`` and TLS files as :class:`RemoteAuthority`.
    """

    def __init__(self, url: str, directory: Directory, **kwargs):
        super().__init__(url, directory, **kwargs)
        self.n_aggregates = 0
        self._min_clients = None

    _session_op, _what = "helper_session", "validation helper"

    def _open(self, op: str, body: dict) -> dict:
        from protocols.paillier import AuthorityRefusal
        from protocols.validated import HelperRefusal
        from protocols.validated.helper import STAGE

        try:
            return self._call("POST", op, body)
        except AuthorityRefusal as exc:
            raise HelperRefusal(str(exc), stage=STAGE) from None

    def _helper_call(self, op: str, body: dict) -> dict:
        self.public_bundle()
        return self._open(op, {"session": self.session, **body})

    def _decode_bundle(self, obj):
        from .helper_wire import bundle_from_json as helper_bundle

        return helper_bundle(obj)

    def _read_session_extra(self, out: dict) -> None:
        self._min_clients = as_int(field(out, "min_clients"), "min_clients")

    def end_session(self) -> None:
        if self.session is not None:
            session, self.session, self._bundle = self.session, None, None
            self._call("POST", "helper_end_session", {"session": session})

    @property
    def identity_key(self) -> bytes:
        return self.public_bundle().helper_key

    @property
    def min_clients(self) -> int:
        self.public_bundle()
        return int(self._min_clients)

    def vdaf(self, ticket, n_max: int):
        from protocols.validated.helper import make_vdaf

        return make_vdaf(ticket.k, tuple(ticket.widths), int(n_max), ticket.votes)

    def open_round(self, run, round, attempt, digest, k, widths, frac_bits, noise=None, votes=None):
        from .helper_wire import noise_to_json, ticket_from_json

        out = self._helper_call("helper_open_round", {
            "run": int(run), "round": int(round), "attempt": int(attempt), "digest": bytes(digest).hex(), "k": int(k),
            "widths": [int(w) for w in widths], "frac_bits": int(frac_bits), "noise": noise_to_json(noise),
            "votes": None if votes is None else [int(v) for v in votes]})
        try:
            ticket = ticket_from_json(field(out, "ticket"))
            verify_key = hex_bytes(field(out, "verify_key"), "verify_key", max_size=64)
            asked = (int(run), int(round), int(attempt), bytes(digest), int(k), tuple(int(w) for w in widths),
                     int(frac_bits), noise, None if votes is None else tuple(int(v) for v in votes))
            if (ticket.run, ticket.round, ticket.attempt, ticket.digest, ticket.k, ticket.widths, ticket.frac_bits,
                    ticket.noise, ticket.votes) != asked:
                raise BadRequest("the ticket is not for the round asked for")
        except BadRequest as exc:
            raise AuthorityUnavailable(f"validation helper at {self.url} sent a malformed ticket: {exc}") from None
        return ticket, verify_key

    def close_round(self, nonce: bytes) -> None:
        self._helper_call("helper_close_round", {"nonce": bytes(nonce).hex()})

    def verify(self, nonce: bytes, reports: dict):
        from .helper_wire import report_to_json

        out = self._helper_call("helper_verify", {
            "nonce": bytes(nonce).hex(), "reports": [report_to_json(c, r) for c, r in reports.items()]})
        try:
            msgs, refused = field(out, "messages"), field(out, "refused")
            if not isinstance(msgs, dict) or not isinstance(refused, dict):
                raise BadRequest("fields messages and refused must be objects")
            sent = {int(c) for c in reports}
            messages = {int(c): hex_bytes(v, "messages", max_size=1 << 16) for c, v in msgs.items()}
            why = {int(c): str(v)[:500] for c, v in refused.items()}
            if not set(messages) | set(why) <= sent or set(messages) & set(why):
                raise BadRequest("the verdicts name clients whose reports were not sent, or one client twice")
        except (BadRequest, ValueError) as exc:
            raise AuthorityUnavailable(f"validation helper at {self.url} sent malformed verdicts: {exc}") from None
        return messages, why

    def aggregate(self, nonce: bytes, accepted, noise_sources=None):
        from .helper_wire import share_from_json

        if noise_sources is not None:
            raise InputError("a deployment's Helper draws its noise itself (GaussianDP(rng='seeded') is refused).")
        out = self._helper_call("helper_aggregate", {"nonce": bytes(nonce).hex(),
                                                     "accepted": [int(c) for c in accepted]})
        try:
            share = share_from_json(field(out, "share"))
        except BadRequest as exc:
            raise AuthorityUnavailable(f"validation helper at {self.url} sent a malformed share: {exc}") from None
        self.n_aggregates += 1
        return share

    def enroll(self, client_id: int, verify_key: bytes) -> None:
        raise InputError("enrollment is out of band in a deployment: add the node's key to the directory.")
