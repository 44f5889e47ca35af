"""The key authority's JSON wire format (no pickle on this wire), shared by service and client.

Integers travel as hex strings, byte strings as hex; every decoder checks types and sizes
and raises :class:`BadRequest` (the service answers 400).
"""

from __future__ import annotations

API = "/v1"
#: largest request body the service reads (a decryption request carries every ciphertext)
MAX_BODY = 64 << 20


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
