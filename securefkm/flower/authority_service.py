"""The Paillier key authority as its own process: a small HTTP service around KeyAuthority.

In a deployment the authority must not be the aggregating server (together they decrypt
any client's ciphertext), so it runs as a separate process, normally on another machine
under another operator::

    securefkm authority init  --keys DIR                 # once: Paillier keypair + Ed25519 identity
    securefkm authority serve --keys DIR --directory directory.json --host 127.0.0.1 --port 8471

``serve`` loads the private key, enrolls the Ed25519 keys of the directory's nodes (client
``i`` = ``i``-th node) and answers exactly the operations :class:`KeyAuthority` has, as
JSON over HTTP (stdlib ``http.server``; no pickle on this wire):

==========================  ====================================================
``GET  /v1/bundle``          the signed public bundle (modulus, verify key, signature)
``POST /v1/open_round``      a fresh single-use round ticket
``POST /v1/close_round``     burn a ticket without decrypting
``POST /v1/decrypt_aggregate``  verify signed contributions, recompute the sum, decrypt it
==========================  ====================================================

Everything else is refused (404/405), bodies over ``MAX_BODY`` bytes with 413, malformed
JSON with 400, and every refusal of :meth:`KeyAuthority.decrypt_aggregate` /
:meth:`KeyAuthority.open_round` with 403 and the authority's reason (the ticket is burned
all the same). The checks themselves are KeyAuthority's, not re-implemented here.

The ServerApp talks to it through :class:`RemoteAuthority` (run config ``authority-url``);
client nodes never contact it: they get the signed bundle in the ``identify`` message and
verify it against the authority key in their own directory file (:class:`BundleView`).

Transport security: plain HTTP is for loopback tests only. In production put the service
behind TLS with client authentication (mTLS) so that only the aggregation server can
reach it; see docs/deployment.md.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..exceptions import InputError, SecureFKMError
from .provision import Directory

API = "/v1"
MAX_BODY = 64 << 20
IDENTITY_FILE = "identity.pem"
PAILLIER_FILE = "paillier.json"
VERIFY_FILE = "authority.pub"


class AuthorityUnavailable(SecureFKMError, RuntimeError):
    """The key authority service could not be reached or answered something unexpected."""


# ------------------------------------------------------------------ keys on disk
def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def init_authority_keys(keys_dir, *, key_size: int = 2048, exist_ok: bool = True) -> bytes:
    """Create the authority's Paillier keypair and Ed25519 identity in ``keys_dir``; return the verify key.

    Files: ``identity.pem`` and ``paillier.json`` (private, mode 0600, in a 0700 directory)
    and ``authority.pub`` (the verify key as hex: put it into the directory). With
    ``exist_ok`` existing keys are kept.
    """
    from phe import paillier

    from protocols.paillier.authority import KEY_SIZES

    keys_dir = Path(keys_dir)
    if (keys_dir / IDENTITY_FILE).exists() or (keys_dir / PAILLIER_FILE).exists():
        if not exist_ok:
            raise InputError(f"{keys_dir} already holds authority keys; refusing to overwrite them.")
        return _load_identity(keys_dir).public_key().public_bytes_raw()
    if key_size not in KEY_SIZES:
        raise InputError(f"key_size must be one of {KEY_SIZES} bits, got {key_size!r}.")
    keys_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(keys_dir, 0o700)
    public, private = paillier.generate_paillier_keypair(n_length=key_size)
    identity = Ed25519PrivateKey.generate()
    _write_private(keys_dir / IDENTITY_FILE, identity.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    _write_private(keys_dir / PAILLIER_FILE, json.dumps(
        {"format": "securefkm-paillier-key/v1", "p": format(private.p, "x"), "q": format(private.q, "x")}).encode())
    verify = identity.public_key().public_bytes_raw()
    (keys_dir / VERIFY_FILE).write_text(verify.hex() + "\n")
    return verify


def _load_identity(keys_dir: Path) -> Ed25519PrivateKey:
    path = keys_dir / IDENTITY_FILE
    if not path.is_file():
        raise InputError(f"{path} does not exist; create the authority's keys with `securefkm authority init --keys {keys_dir}`.")
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{path} is not an Ed25519 private key.")
    return key


def load_authority(keys_dir, directory: Directory, *, min_clients: int = 2):
    """The :class:`KeyAuthority` stored in ``keys_dir``, with every directory node enrolled."""
    from phe import paillier

    from protocols.paillier import KeyAuthority

    keys_dir = Path(keys_dir)
    identity = _load_identity(keys_dir)
    path = keys_dir / PAILLIER_FILE
    if not path.is_file():
        raise InputError(f"{path} does not exist; create the authority's keys with `securefkm authority init --keys {keys_dir}`.")
    raw = json.loads(path.read_text())
    p, q = int(raw["p"], 16), int(raw["q"], 16)
    public = paillier.PaillierPublicKey(p * q)
    authority = KeyAuthority(public, paillier.PaillierPrivateKey(public, p, q), min_clients=min_clients,
                             identity_key=identity.private_bytes_raw())
    verify = authority.public_bundle().authority_key
    if directory.authority_key is not None and directory.authority_key != verify:
        raise InputError(
            f"the directory pins authority key {directory.authority_key.hex()[:16]}... but {keys_dir} holds "
            f"{verify.hex()[:16]}...; put {keys_dir / VERIFY_FILE} into the directory (`securefkm provision directory --authority`)."
        )
    for cid, key in enumerate(directory.nodes):
        authority.enroll(cid, key)
    return authority


# ------------------------------------------------------------------ JSON codec (no pickle on this wire)
class _BadRequest(ValueError):
    pass


def _hex_bytes(value, what: str, *, size: int | None = None, max_size: int = 1 << 16) -> bytes:
    if not isinstance(value, str):
        raise _BadRequest(f"{what} must be a hex string")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise _BadRequest(f"{what} is not hex") from None
    if (size is not None and len(raw) != size) or len(raw) > max_size:
        raise _BadRequest(f"{what} has the wrong length")
    return raw


def _hex_int(value, what: str) -> int:
    if not isinstance(value, str) or not value or len(value) > 8192:
        raise _BadRequest(f"{what} must be a non-empty hex string")
    try:
        return int(value, 16)
    except ValueError:
        raise _BadRequest(f"{what} is not hex") from None


def _int(value, what: str) -> int:
    if type(value) is not int:
        raise _BadRequest(f"{what} must be an integer")
    return value


def _field(obj: dict, key: str):
    if key not in obj:
        raise _BadRequest(f"missing field {key!r}")
    return obj[key]


def bundle_to_json(bundle) -> dict:
    return {"n": format(bundle.n, "x"), "authority_key": bundle.authority_key.hex(), "signature": bundle.signature.hex()}


def bundle_from_json(obj):
    from protocols.paillier import PublicBundle

    return PublicBundle(n=_hex_int(_field(obj, "n"), "n"),
                        authority_key=_hex_bytes(_field(obj, "authority_key"), "authority_key", size=32),
                        signature=_hex_bytes(_field(obj, "signature"), "signature", size=64))


def ticket_to_json(t) -> dict:
    return {"nonce": t.nonce.hex(), "run": t.run, "round": t.round, "digest": t.digest.hex(),
            "n_ciphertexts": t.n_ciphertexts, "max_clients": t.max_clients}


def ticket_from_json(obj):
    from protocols.paillier import RoundTicket

    return RoundTicket(nonce=_hex_bytes(_field(obj, "nonce"), "nonce"), run=_int(_field(obj, "run"), "run"),
                       round=_int(_field(obj, "round"), "round"), digest=_hex_bytes(_field(obj, "digest"), "digest"),
                       n_ciphertexts=_int(_field(obj, "n_ciphertexts"), "n_ciphertexts"),
                       max_clients=_int(_field(obj, "max_clients"), "max_clients"))


def contribution_to_json(c) -> dict:
    return {"client_id": int(c.client_id), "nonce": c.nonce.hex(), "digest": c.digest.hex(),
            "ciphertexts": [format(int(x), "x") for x in c.ciphertexts], "signature": c.signature.hex()}


def contribution_from_json(obj, i: int):
    from protocols.paillier import EncryptedContribution

    if not isinstance(obj, dict):
        raise _BadRequest(f"contributions[{i}] must be an object")
    cts = _field(obj, "ciphertexts")
    if not isinstance(cts, list) or len(cts) > 1 << 16:
        raise _BadRequest(f"contributions[{i}].ciphertexts must be a list")
    return EncryptedContribution(
        client_id=_int(_field(obj, "client_id"), f"contributions[{i}].client_id"),
        nonce=_hex_bytes(_field(obj, "nonce"), f"contributions[{i}].nonce"),
        digest=_hex_bytes(_field(obj, "digest"), f"contributions[{i}].digest"),
        ciphertexts=tuple(_hex_int(x, f"contributions[{i}].ciphertexts") for x in cts),
        signature=_hex_bytes(_field(obj, "signature"), f"contributions[{i}].signature", size=64),
    )


# ------------------------------------------------------------------ the HTTP service
class _Handler(BaseHTTPRequestHandler):
    server_version = "securefkm-authority/1"
    sys_version = ""
    timeout = 60  # seconds per connection: a stalled peer cannot hold a thread forever

    # -- plumbing
    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code == 405:
            self.send_header("Allow", "GET" if self.path == f"{API}/bundle" else "POST")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, kind: str, message: str) -> None:
        self._send(code, {"error": kind, "message": message})

    def log_message(self, fmt, *args):  # one line per request on stderr, no bodies
        if not self.server.quiet:
            sys.stderr.write(f"authority {self.address_string()} {fmt % args}\n")

    def _body(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise _BadRequest("Content-Length required") from None
        if length < 0:
            raise _BadRequest("bad Content-Length")
        if length > MAX_BODY:
            raise OverflowError(length)
        try:
            obj = json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError):
            raise _BadRequest("body is not JSON") from None
        if not isinstance(obj, dict):
            raise _BadRequest("body must be a JSON object")
        return obj

    # -- routes
    _GET = {"bundle"}
    _POST = {"open_round", "close_round", "decrypt_aggregate"}

    def _route(self) -> str | None:
        if not self.path.startswith(API + "/"):
            return None
        name = self.path[len(API) + 1:]
        return name if name in self._GET | self._POST else None

    def do_GET(self):  # noqa: N802
        name = self._route()
        if name is None:
            return self._error(404, "not_found", f"no such operation {self.path!r}")
        if name not in self._GET:
            return self._error(405, "method_not_allowed", f"{self.path} needs POST")
        with self.server.lock:
            bundle = self.server.authority.public_bundle()
        self._send(200, bundle_to_json(bundle))

    def do_POST(self):  # noqa: N802
        from protocols.paillier import AuthorityRefusal

        name = self._route()
        if name is None:
            return self._error(404, "not_found", f"no such operation {self.path!r}")
        if name not in self._POST:
            return self._error(405, "method_not_allowed", f"{self.path} needs GET")
        try:
            body = self._body()
            with self.server.lock:
                out = getattr(self, f"_op_{name}")(body, self.server.authority)
        except OverflowError:
            return self._error(413, "too_large", f"request body over {MAX_BODY} bytes")
        except _BadRequest as exc:
            return self._error(400, "bad_request", str(exc))
        except AuthorityRefusal as exc:
            return self._error(403, "refused", str(exc))
        except InputError as exc:
            return self._error(400, "bad_request", str(exc))
        except Exception as exc:  # never leak a traceback to the peer
            sys.stderr.write(f"authority: internal error in {name}: {type(exc).__name__}: {exc}\n")
            return self._error(500, "internal", type(exc).__name__)
        self._send(200, out)

    def do_PUT(self):  # noqa: N802
        self._error(405 if self._route() else 404, "method_not_allowed", "only GET /v1/bundle and POST operations")

    do_DELETE = do_PATCH = do_PUT

    # -- operations: KeyAuthority's own, nothing else
    @staticmethod
    def _op_open_round(body, authority) -> dict:
        ticket = authority.open_round(
            _int(_field(body, "run"), "run"), _int(_field(body, "round"), "round"),
            _hex_bytes(_field(body, "digest"), "digest"),
            n_ciphertexts=_int(_field(body, "n_ciphertexts"), "n_ciphertexts"),
            max_clients=_int(_field(body, "max_clients"), "max_clients"),
        )
        return ticket_to_json(ticket)

    @staticmethod
    def _op_close_round(body, authority) -> dict:
        authority.close_round(_hex_bytes(_field(body, "nonce"), "nonce"))
        return {"ok": True}

    @staticmethod
    def _op_decrypt_aggregate(body, authority) -> dict:
        nonce = _hex_bytes(_field(body, "nonce"), "nonce")
        raw = _field(body, "contributions")
        if not isinstance(raw, list):
            raise _BadRequest("contributions must be a list")
        try:
            contributions = [contribution_from_json(c, i) for i, c in enumerate(raw)]
            claimed = body.get("claimed_sum")
            if claimed is not None:
                if not isinstance(claimed, list):
                    raise _BadRequest("claimed_sum must be a list of hex strings or null")
                claimed = [_hex_int(x, "claimed_sum") for x in claimed]
        except _BadRequest:
            authority.close_round(nonce)  # a malformed attempt burns the ticket like any other
            raise
        dec = authority.decrypt_aggregate(nonce, contributions, claimed)
        return {"plaintexts": [format(int(p), "x") for p in dec.plaintexts], "contributors": list(dec.contributors)}


def make_server(authority, host: str = "127.0.0.1", port: int = 0, *, quiet: bool = False) -> ThreadingHTTPServer:
    """An HTTP server answering for ``authority`` (not started: call ``serve_forever``)."""
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    server.authority = authority
    server.lock = threading.Lock()
    server.quiet = quiet
    return server


def serve(keys_dir, directory_path, *, host: str = "127.0.0.1", port: int = 8471, min_clients: int = 2,
          quiet: bool = False, out=print) -> None:
    """Run the authority service until interrupted (``securefkm authority serve``)."""
    directory = Directory.load(directory_path)
    authority = load_authority(keys_dir, directory, min_clients=min_clients)
    server = make_server(authority, host, port, quiet=quiet)
    h, p = server.server_address[:2]
    out(f"securefkm key authority: {authority.key_size}-bit Paillier key, {len(directory)} enrolled node(s), "
        f"min_clients={authority.min_clients}, verify key {authority.public_bundle().authority_key.hex()}")
    out(f"listening on http://{h}:{p}{API} (plain HTTP: loopback only; use TLS/mTLS in production)")
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


# ------------------------------------------------------------------ the ServerApp's client
class RemoteAuthority:
    """The ServerApp's handle on the authority service: KeyAuthority's interface over HTTP.

    ``verify_key`` answers from the server's copy of the directory (public data); refusals
    of the service raise :class:`AuthorityRefusal` exactly like an in-process authority.
    The public bundle is checked against the directory's authority key.
    """

    def __init__(self, url: str, directory: Directory, *, timeout: float = 60.0, allow_weak_key: bool = False):
        url = str(url or "").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise InputError(
                f"authority-url {url!r} must be an http(s):// address of `securefkm authority serve`, "
                "e.g. 'http://127.0.0.1:8471'."
            )
        self.url = url
        self.directory = directory
        self.timeout = float(timeout)
        self.allow_weak_key = bool(allow_weak_key)
        self.n_decryptions = 0
        self._bundle = None

    def _call(self, method: str, op: str, body: dict | None = None) -> dict:
        from protocols.paillier import AuthorityRefusal
        from protocols.paillier.authority import STAGE

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{API}/{op}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                err = json.loads(exc.read())
                message = str(err.get("message", ""))
            except ValueError:
                message = exc.reason
            if exc.code == 403:
                raise AuthorityRefusal(message, stage=STAGE) from None
            raise AuthorityUnavailable(f"key authority at {self.url} answered {exc.code} to {op}: {message}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise AuthorityUnavailable(
                f"key authority at {self.url} is unreachable ({exc}); start it with `securefkm authority serve` "
                "and set the run config 'authority-url' to its address."
            ) from None

    # -- KeyAuthority's interface
    def public_bundle(self):
        if self._bundle is None:
            try:
                bundle = bundle_from_json(self._call("GET", "bundle"))
            except _BadRequest as exc:
                raise AuthorityUnavailable(f"key authority at {self.url} sent a malformed bundle: {exc}") from None
            if self.directory.authority_key is None:
                raise InputError(
                    "the directory has no authority key; add the authority's verify key "
                    "(`securefkm provision directory --authority KEYS/authority.pub`)."
                )
            try:
                bundle.verify(self.directory.authority_key)
            except ValueError as exc:
                raise InputError(f"key authority at {self.url}: {exc} (its key is not the directory's authority key).") from None
            self._bundle = bundle
        return self._bundle

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
        out = self._call("POST", "open_round", {"run": int(run), "round": int(round), "digest": bytes(digest).hex(),
                                                "n_ciphertexts": int(n_ciphertexts), "max_clients": int(max_clients)})
        try:
            return ticket_from_json(out)
        except _BadRequest as exc:
            raise AuthorityUnavailable(f"key authority at {self.url} sent a malformed ticket: {exc}") from None

    def close_round(self, nonce: bytes) -> None:
        self._call("POST", "close_round", {"nonce": bytes(nonce).hex()})

    def decrypt_aggregate(self, nonce: bytes, contributions, claimed_sum=None):
        from protocols.paillier import DecryptedAggregate

        out = self._call("POST", "decrypt_aggregate", {
            "nonce": bytes(nonce).hex(),
            "contributions": [contribution_to_json(c) for c in contributions],
            "claimed_sum": None if claimed_sum is None else [format(int(c), "x") for c in claimed_sum],
        })
        try:
            plaintexts = tuple(_hex_int(p, "plaintexts") for p in out["plaintexts"])
            contributors = tuple(_int(c, "contributors") for c in out["contributors"])
        except (_BadRequest, KeyError, TypeError) as exc:
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


# ------------------------------------------------------------------ CLI (securefkm authority ...)
def add_cli(sub) -> None:
    p = sub.add_parser("authority", help="the Paillier key authority service (a separate process from the server)")
    ps = p.add_subparsers(dest="authority", required=True)
    i = ps.add_parser("init", help="create the Paillier keypair and Ed25519 identity in --keys DIR; prints the verify key")
    i.add_argument("--keys", required=True, metavar="DIR", help="directory to create the keys in")
    i.add_argument("--key-size", type=int, default=2048, choices=(2048, 3072), help="Paillier modulus bits")
    s = ps.add_parser("serve", help="serve the authority over HTTP (loopback without TLS: tests only)")
    s.add_argument("--keys", required=True, metavar="DIR", help="the directory written by 'authority init'")
    s.add_argument("--directory", required=True, help="the public directory JSON (enrolled node keys)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on")
    s.add_argument("--port", type=int, default=8471, help="TCP port")
    s.add_argument("--min-clients", type=int, default=2, help="fewest distinct signers per decryption")
    s.add_argument("--quiet", action="store_true", help="no per-request log lines")


def run_cli(args, out=print) -> None:
    if args.authority == "init":
        out(init_authority_keys(args.keys, key_size=args.key_size).hex())
    elif args.authority == "serve":
        serve(args.keys, args.directory, host=args.host, port=args.port, min_clients=args.min_clients,
              quiet=args.quiet, out=out)
