"""The key authority's JSON wire format (no pickle on this wire), shared by service and client.

Integers travel as hex strings, byte strings as hex; every decoder checks types and sizes
and raises :class:`BadRequest` (the service answers 400).
"""

from __future__ import annotations

API = "/v1"
#: ceiling of the request-body limit when none is derived (see :func:`request_body_limit`)
MAX_BODY = 64 << 20
#: default most ciphertexts one round may ask for (``open_round``'s ``n_ciphertexts``)
MAX_CIPHERTEXTS = 256
#: largest reply the ServerApp reads from the authority
MAX_REPLY = 8 << 20
#: what one contribution costs on the wire besides its ciphertexts (ids, nonce, digest,
#: signature, keys and punctuation), rounded up
CONTRIBUTION_OVERHEAD = 512


def request_body_limit(n_clients: int, n_ciphertexts: int, key_size: int, *, margin: float = 0.25) -> int:
    """Bytes of the largest legitimate request: a decryption request of ``n_clients``
    contributions of ``n_ciphertexts`` ciphertexts each, plus the server's claimed sum.

    A ciphertext is below ``n**2``, at most ``key_size / 2`` hex digits, and costs four
    bytes more in a JSON list (quotes, comma, space)::

        body = (n_clients + 1) * n_ciphertexts * (key_size / 2 + 4)
               + n_clients * CONTRIBUTION_OVERHEAD + 1024
        limit = ceil(body * (1 + margin)) + 64 KiB

    Every other request (session, ticket, end of session) is far smaller.
    """
    for name, v in (("n_clients", n_clients), ("n_ciphertexts", n_ciphertexts), ("key_size", key_size)):
        if type(v) is not int or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    per_ciphertext = -(-key_size // 2) + 4
    body = (n_clients + 1) * n_ciphertexts * per_ciphertext + n_clients * CONTRIBUTION_OVERHEAD + 1024
    return -(-int(body * (1 + float(margin) + 1e-9)) // 1) + (64 << 10)


def loads(data, what: str = "body"):
    """JSON text -> object, every failure a :class:`BadRequest` (nesting too deep included).

    Plain :func:`json.loads`: it builds only dicts, lists, strings, numbers, booleans and
    None (no object hooks, nothing that runs code); the callers check each field's type.
    """
    import json

    try:
        return json.loads(data)
    except RecursionError:
        raise BadRequest(f"{what} is nested too deeply") from None
    except (ValueError, UnicodeDecodeError, TypeError):
        raise BadRequest(f"{what} is not JSON") from None


class BadRequest(ValueError):
    """A malformed request or reply."""


def hex_bytes(value, what: str, *, size: int | None = None, max_size: int = 1 << 16) -> bytes:
    if not isinstance(value, str):
        raise BadRequest(f"{what} must be a hex string")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise BadRequest(f"{what} is not hex") from None
    if (size is not None and len(raw) != size) or len(raw) > max_size:
        raise BadRequest(f"{what} has the wrong length")
    return raw


def hex_int(value, what: str) -> int:
    if not isinstance(value, str) or not value or len(value) > 8192:
        raise BadRequest(f"{what} must be a non-empty hex string")
    try:
        return int(value, 16)
    except ValueError:
        raise BadRequest(f"{what} is not hex") from None


def as_int(value, what: str) -> int:
    if type(value) is not int:
        raise BadRequest(f"{what} must be an integer")
    return value


def field(obj: dict, key: str):
    if key not in obj:
        raise BadRequest(f"missing field {key!r}")
    return obj[key]


def bundle_to_json(bundle) -> dict:
    return {"n": format(bundle.n, "x"), "authority_key": bundle.authority_key.hex(), "signature": bundle.signature.hex()}


def bundle_from_json(obj):
    from protocols.paillier import PublicBundle

    return PublicBundle(n=hex_int(field(obj, "n"), "n"),
                        authority_key=hex_bytes(field(obj, "authority_key"), "authority_key", size=32),
                        signature=hex_bytes(field(obj, "signature"), "signature", size=64))


def ticket_to_json(t) -> dict:
    return {"nonce": t.nonce.hex(), "run": t.run, "round": t.round, "digest": t.digest.hex(),
            "n_ciphertexts": t.n_ciphertexts, "max_clients": t.max_clients}


def ticket_from_json(obj):
    from protocols.paillier import RoundTicket

    return RoundTicket(nonce=hex_bytes(field(obj, "nonce"), "nonce"), run=as_int(field(obj, "run"), "run"),
                       round=as_int(field(obj, "round"), "round"), digest=hex_bytes(field(obj, "digest"), "digest"),
                       n_ciphertexts=as_int(field(obj, "n_ciphertexts"), "n_ciphertexts"),
                       max_clients=as_int(field(obj, "max_clients"), "max_clients"))


def contribution_to_json(c) -> dict:
    return {"client_id": int(c.client_id), "nonce": c.nonce.hex(), "digest": c.digest.hex(),
            "ciphertexts": [format(int(x), "x") for x in c.ciphertexts], "signature": c.signature.hex()}


def contribution_from_json(obj, i: int):
    from protocols.paillier import EncryptedContribution

    if not isinstance(obj, dict):
        raise BadRequest(f"contributions[{i}] must be an object")
    cts = field(obj, "ciphertexts")
    if not isinstance(cts, list) or len(cts) > 1 << 16:
        raise BadRequest(f"contributions[{i}].ciphertexts must be a list")
    return EncryptedContribution(
        client_id=as_int(field(obj, "client_id"), f"contributions[{i}].client_id"),
        nonce=hex_bytes(field(obj, "nonce"), f"contributions[{i}].nonce"),
        digest=hex_bytes(field(obj, "digest"), f"contributions[{i}].digest"),
        ciphertexts=tuple(hex_int(x, f"contributions[{i}].ciphertexts") for x in cts),
        signature=hex_bytes(field(obj, "signature"), f"contributions[{i}].signature", size=64),
    )
