"""The validation Helper's JSON wire format (no pickle on this wire), shared by the key
authority service, which hosts the Helper, and the ServerApp's :class:`RemoteHelper`.

Byte strings travel as hex, field elements as hex integers; every decoder checks types and
sizes and raises :class:`~securefkm.flower.authority_wire.BadRequest` (the service answers 400).
"""

from __future__ import annotations

import math

from .authority_wire import BadRequest, as_int, field, hex_bytes, hex_int

#: most reports one verify request may carry, and most entries of an aggregate share
MAX_REPORTS = 1 << 20
MAX_SHARE_LEN = 1 << 22
#: largest report part on this wire (the Leader's share never travels here)
MAX_PART = 1 << 20


def _float(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise BadRequest(f"{what} must be a finite non-negative number")
    return float(value)


def _ints(value, what: str, *, minimum: int | None = None, max_len: int = MAX_SHARE_LEN) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > max_len:
        raise BadRequest(f"{what} must be a list of at most {max_len} integers")
    out = tuple(as_int(v, what) for v in value)
    if minimum is not None and any(v < minimum for v in out):
        raise BadRequest(f"{what} must hold integers >= {minimum}")
    return out


def bundle_to_json(b) -> dict:
    return {"hpke_key": b.hpke_key.hex(), "helper_key": b.helper_key.hex(), "signature": b.signature.hex()}


def bundle_from_json(obj):
    from protocols.validated.helper import HelperBundle

    if not isinstance(obj, dict):
        raise BadRequest("bundle must be an object")
    return HelperBundle(hex_bytes(field(obj, "hpke_key"), "hpke_key", size=32),
                        hex_bytes(field(obj, "helper_key"), "helper_key", size=32),
                        hex_bytes(field(obj, "signature"), "signature", size=64))


def noise_to_json(plan) -> dict | None:
    if plan is None:
        return None
    return {"count": plan.count, "count_sigma": plan.count_sigma,
            "fields": [{"name": f.name, "sigma": f.sigma, "width": f.width} for f in plan.fields],
            "offsets": list(plan.offsets)}


def noise_from_json(obj):
    from protocols.validated.helper import NoiseField, NoisePlan

    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise BadRequest("noise must be an object or null")
    count = field(obj, "count")
    fields = field(obj, "fields")
    if not isinstance(count, str) or len(count) > 64 or not isinstance(fields, list) or len(fields) > 64:
        raise BadRequest("noise.count must be a field name and noise.fields a short list")
    out = []
    for i, f in enumerate(fields):
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or len(f["name"]) > 64:
            raise BadRequest(f"noise.fields[{i}] must be an object with a field name")
        out.append(NoiseField(f["name"], _float(field(f, "sigma"), f"noise.fields[{i}].sigma"),
                              as_int(field(f, "width"), f"noise.fields[{i}].width")))
    return NoisePlan(count, _float(field(obj, "count_sigma"), "noise.count_sigma"), tuple(out),
                     _ints(field(obj, "offsets"), "noise.offsets"))


def ticket_to_json(t) -> dict:
    return {"nonce": t.nonce.hex(), "run": t.run, "round": t.round, "attempt": t.attempt, "digest": t.digest.hex(),
            "k": t.k, "widths": list(t.widths), "frac_bits": t.frac_bits, "min_clients": t.min_clients,
            "noise": noise_to_json(t.noise), "votes": None if t.votes is None else list(t.votes)}


def ticket_from_json(obj):
    from protocols.validated.helper import ValidationTicket

    if not isinstance(obj, dict):
        raise BadRequest("ticket must be an object")
    votes = obj.get("votes")
    if votes is not None:
        votes = _ints(votes, "votes", minimum=1, max_len=2)
        if len(votes) != 2:
            raise BadRequest("votes must be [coordinates, bins] or null")
    return ValidationTicket(
        hex_bytes(field(obj, "nonce"), "nonce", size=16), as_int(field(obj, "run"), "run"),
        as_int(field(obj, "round"), "round"), as_int(field(obj, "attempt"), "attempt"),
        hex_bytes(field(obj, "digest"), "digest", max_size=64), as_int(field(obj, "k"), "k"),
        _ints(field(obj, "widths"), "widths", minimum=0, max_len=1 << 16), as_int(field(obj, "frac_bits"), "frac_bits"),
        as_int(field(obj, "min_clients"), "min_clients"), noise_from_json(obj.get("noise")), votes)


def report_to_json(cid: int, r) -> dict:
    return {"client_id": int(cid), "report_nonce": r.report_nonce.hex(), "public_share": r.public_share.hex(),
            "sealed_helper_share": r.sealed_helper_share.hex(), "signature": r.signature.hex(), "n_max": int(r.n_max),
            "leader_verifier_share": r.leader_verifier_share.hex()}


def reports_from_json(value) -> dict:
    """``{client id: HelperReport}`` of a verify request; a repeated client id is refused."""
    from protocols.validated.helper import HelperReport

    if not isinstance(value, list) or len(value) > MAX_REPORTS:
        raise BadRequest(f"reports must be a list of at most {MAX_REPORTS}")
    out = {}
    for i, obj in enumerate(value):
        if not isinstance(obj, dict):
            raise BadRequest(f"reports[{i}] must be an object")
        cid = as_int(field(obj, "client_id"), f"reports[{i}].client_id")
        if cid in out:
            raise BadRequest(f"reports[{i}]: client {cid} is listed twice")
        out[cid] = HelperReport(
            hex_bytes(field(obj, "report_nonce"), f"reports[{i}].report_nonce", max_size=64),
            hex_bytes(field(obj, "public_share"), f"reports[{i}].public_share", max_size=MAX_PART),
            hex_bytes(field(obj, "sealed_helper_share"), f"reports[{i}].sealed_helper_share", max_size=MAX_PART),
            hex_bytes(field(obj, "signature"), f"reports[{i}].signature", max_size=64),
            as_int(field(obj, "n_max"), f"reports[{i}].n_max"),
            hex_bytes(field(obj, "leader_verifier_share"), f"reports[{i}].leader_verifier_share", max_size=MAX_PART))
    return out


def share_to_json(share) -> list[str]:
    return [format(int(x), "x") for x in share]


def share_from_json(value) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_SHARE_LEN:
        raise BadRequest("share must be a list of hex integers")
    return [hex_int(x, "share") for x in value]
