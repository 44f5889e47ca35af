"""Wire format of securefkm's protocol messages over Flower: an explicit codec, no pickle.

Every protocol message that crosses the network (the server's request of a stage, a
client's reply) is one ``bytes`` field ``data`` of a Flower ``ConfigRecord``, laid out as

``MAGIC`` | 4-byte big-endian length of the header | header (UTF-8 JSON) | array buffers

The header is ``{"arrays": [[dtype, shape], ...], "body": ...}``. ``body`` is plain JSON
(str, int, float, bool, null, lists, objects with str keys); a numpy array in a message
is an index into ``arrays``, whose raw little-endian bytes follow the header in order and
are rebuilt with ``np.frombuffer`` for a whitelisted numeric dtype (:data:`DTYPES`; never
an object or structured dtype) after the declared shape was checked against the bytes
present. ``bytes`` travel as base64 strings, Paillier's big integers as hexadecimal
strings, dicts keyed by client id as lists of ``[id, value]`` pairs (ids are JSON ints).

Nothing in a message names a type. The receiver knows the stage (the record's ``stage``)
and the direction, looks the message up in :data:`MESSAGES` and rebuilds it field by field
with that entry's schema: each field's JSON type, that ids are non-negative ints, the
dtype and number of dimensions of each array, the exact or largest size of each key,
signature and ciphertext, the largest number of items in each list. Missing or extra
fields, duplicate keys, unused array buffers and trailing bytes are refused. The library's
message dataclasses (:class:`~securefkm.messages.Broadcast`,
:class:`~securefkm.federation.update_stage.UpdateRequest`, ``UpdateReply``, Paillier's
``EncryptRequest`` ...) are built by their own constructors from the checked fields; no
class is ever looked up by a name read from the wire. A message that fails its schema
raises :class:`WireError` naming the stage and the field; the server records it as that
client's refusal (and fault), a client refuses the request.

Adding a field to a stage message is one line: add ``"name": <type>`` to that message's
:class:`Struct` (or :class:`Record`) below, with :class:`Optional` around it if older
peers may omit it (``optional=`` of :class:`Struct` for a key that may be absent). A new
stage is one entry per direction in :data:`MESSAGES`.

What is *not* decoded here: the ClientApp's own persistent state (its ``ClientRuntime``
state and open aggregator session in the node's ``context.state``), written and read by the
node itself and never by a peer (:mod:`securefkm.flower.clientapp`).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import struct
from typing import Any

import numpy as np

from .. import _frame
from .._frame import DTYPES, WireError

#: the one ConfigRecord key holding a securefkm message, and its fields
RECORD_KEY = "securefkm"
#: Flower message type: ``train.<action>``; the stage travels inside the record
ACTION = "securefkm"
MESSAGE_TYPE = f"train.{ACTION}"

MAGIC = b"SFKM-WIRE/1\n"
#: numeric dtypes an array may have on the wire (little-endian, fixed size)
#: most items of any list or dict in a message (clients of a round, ciphertexts, ...)
MAX_ITEMS = 1 << 22
#: largest message accepted (header and arrays)
MAX_MESSAGE_BYTES = 1 << 31
#: largest id (Flower node ids are unsigned 64-bit)
MAX_ID = (1 << 64) - 1
_MAX_INT = 1 << 63
_MAX_STR = 1 << 16




def _fail(path: str, why: str):
    raise WireError(f"field {path or '<message>'!r}: {why}")


def _kind(v) -> str:
    return "null" if v is None else type(v).__name__


# ---------------------------------------------------------------- schema types
class _Ctx:
    """Arrays of one message being encoded (collected) or decoded (table, use count)."""

    def __init__(self, arrays=None, fused=None):
        self.arrays: list[np.ndarray] = [] if arrays is None else arrays
        self.used: set[int] = set()
        self.fused = fused


class Type:
    """One field's schema: ``encode`` a Python value to JSON, ``decode`` JSON back (checked)."""

    def encode(self, value, path: str, ctx: _Ctx):  # pragma: no cover - interface
        raise NotImplementedError

    def decode(self, value, path: str, ctx: _Ctx):  # pragma: no cover - interface
        raise NotImplementedError


class Int(Type):
    def __init__(self, minimum: int | None = None, maximum: int | None = None):
        self.minimum = -_MAX_INT if minimum is None else minimum
        self.maximum = _MAX_INT - 1 if maximum is None else maximum

    def _check(self, value, path):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            _fail(path, f"expected an int, got {_kind(value)}")
        value = int(value)
        if not self.minimum <= value <= self.maximum:
            _fail(path, f"int {value} outside [{self.minimum}, {self.maximum}]")
        return value

    encode = decode = lambda self, value, path, ctx: self._check(value, path)


#: a client id / count: a non-negative int
Id = Int(0, MAX_ID)


class Float(Type):
    def _check(self, value, path):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            _fail(path, f"expected a number, got {_kind(value)}")
        return float(value)

    encode = decode = lambda self, value, path, ctx: self._check(value, path)


class Str(Type):
    def __init__(self, max_len: int = _MAX_STR, choices: tuple[str, ...] | None = None):
        self.max_len, self.choices = max_len, choices

    def _check(self, value, path):
        if not isinstance(value, str):
            _fail(path, f"expected a string, got {_kind(value)}")
        if len(value) > self.max_len:
            _fail(path, f"string of {len(value)} characters, at most {self.max_len}")
        if self.choices is not None and value not in self.choices:
            _fail(path, f"{value[:40]!r} is not one of {list(self.choices)}")
        return value

    encode = decode = lambda self, value, path, ctx: self._check(value, path)


class Null(Type):
    def _check(self, value, path):
        if value is not None:
            _fail(path, f"expected null, got {_kind(value)}")
        return None

    encode = decode = lambda self, value, path, ctx: self._check(value, path)


class Optional(Type):
    """``None`` or the wrapped type."""

    def __init__(self, inner: Type):
        self.inner = inner

    def encode(self, value, path, ctx):
        return None if value is None else self.inner.encode(value, path, ctx)

    def decode(self, value, path, ctx):
        return None if value is None else self.inner.decode(value, path, ctx)


class Bytes(Type):
    """Bytes as base64; ``size``: exact length, else ``min_len``..``max_len``."""

    def __init__(self, size: int | None = None, *, min_len: int = 0, max_len: int = 1 << 20):
        self.min_len, self.max_len = (size, size) if size is not None else (min_len, max_len)

    def _len(self, n, path):
        if not self.min_len <= n <= self.max_len:
            want = self.min_len if self.min_len == self.max_len else f"{self.min_len}..{self.max_len}"
            _fail(path, f"{n} bytes, expected {want}")

    def encode(self, value, path, ctx):
        if not isinstance(value, (bytes, bytearray)):
            _fail(path, f"expected bytes, got {_kind(value)}")
        self._len(len(value), path)
        return base64.b64encode(bytes(value)).decode("ascii")

    def decode(self, value, path, ctx):
        if not isinstance(value, str):
            _fail(path, f"expected base64 bytes, got {_kind(value)}")
        if len(value) > 4 * (self.max_len // 3 + 1):
            _fail(path, f"more than {self.max_len} bytes")
        try:
            out = base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError, ValueError):
            _fail(path, "not valid base64")
        self._len(len(out), path)
        return out


class BigInt(Type):
    """A non-negative integer of at most ``max_bits`` bits, as a hexadecimal string."""

    def __init__(self, max_bits: int):
        self.max_bits = max_bits

    def encode(self, value, path, ctx):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            _fail(path, f"expected an int, got {_kind(value)}")
        value = int(value)
        if value < 0 or value.bit_length() > self.max_bits:
            _fail(path, f"int outside [0, 2**{self.max_bits})")
        return format(value, "x")

    def decode(self, value, path, ctx):
        if not isinstance(value, str) or not value or len(value) > (self.max_bits + 3) // 4:
            _fail(path, f"expected a hexadecimal int of at most {self.max_bits} bits")
        if value.strip("0123456789abcdef"):
            _fail(path, "not a lower-case hexadecimal int")
        out = int(value, 16)
        if out.bit_length() > self.max_bits:
            _fail(path, f"int of {out.bit_length()} bits, at most {self.max_bits}")
        return out


class Array(Type):
    """A numpy array: dtype in ``dtypes``, ``ndim`` dimensions (None: any up to 4)."""

    def __init__(self, dtypes=("<f8",), ndim: int | tuple[int, ...] | None = None, max_size: int = 1 << 28):
        self.dtypes = frozenset(dtypes)
        assert self.dtypes <= DTYPES
        self.ndim = (ndim,) if isinstance(ndim, int) else ndim
        self.max_size = max_size

    def _check(self, arr: np.ndarray, path):
        if arr.dtype.str not in self.dtypes:
            _fail(path, f"array of dtype {arr.dtype.str}, expected one of {sorted(self.dtypes)}")
        if (self.ndim is not None and arr.ndim not in self.ndim) or arr.ndim > 4:
            _fail(path, f"array of {arr.ndim} dimensions, expected {self.ndim or 'at most 4'}")
        if arr.size > self.max_size:
            _fail(path, f"array of {arr.size} values, at most {self.max_size}")

    def encode(self, value, path, ctx):
        if isinstance(value, bool) or not isinstance(value, (np.ndarray, np.generic, int, float)):
            _fail(path, f"expected a numpy array, got {_kind(value)}")
        arr = np.asarray(value)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        self._check(arr, path)
        ctx.arrays.append(np.ascontiguousarray(arr))
        return len(ctx.arrays) - 1

    def decode(self, value, path, ctx):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < len(ctx.arrays):
            _fail(path, f"expected an array index below {len(ctx.arrays)}, got {value!r}")
        if value in ctx.used:
            _fail(path, f"array {value} used twice")
        ctx.used.add(value)
        arr = ctx.arrays[value]
        self._check(arr, path)
        return arr


class List(Type):
    def __init__(self, item: Type, max_len: int = MAX_ITEMS, *, as_tuple: bool = False):
        self.item, self.max_len, self.as_tuple = item, max_len, as_tuple

    def encode(self, value, path, ctx):
        if not isinstance(value, (list, tuple)):
            _fail(path, f"expected a list, got {_kind(value)}")
        if len(value) > self.max_len:
            _fail(path, f"{len(value)} items, at most {self.max_len}")
        return [self.item.encode(v, f"{path}[{i}]", ctx) for i, v in enumerate(value)]

    def decode(self, value, path, ctx):
        if not isinstance(value, list):
            _fail(path, f"expected a list, got {_kind(value)}")
        if len(value) > self.max_len:
            _fail(path, f"{len(value)} items, at most {self.max_len}")
        out = [self.item.decode(v, f"{path}[{i}]", ctx) for i, v in enumerate(value)]
        return tuple(out) if self.as_tuple else out


class IdMap(Type):
    """A dict keyed by client id, as a list of ``[id, value]`` pairs (distinct int ids)."""

    def __init__(self, value: Type, max_len: int = MAX_ITEMS):
        self.value, self.max_len = value, max_len

    def encode(self, value, path, ctx):
        if not isinstance(value, dict):
            _fail(path, f"expected a dict of client ids, got {_kind(value)}")
        if len(value) > self.max_len:
            _fail(path, f"{len(value)} items, at most {self.max_len}")
        return [[Id.encode(k, f"{path}.key", ctx), self.value.encode(v, f"{path}[{k}]", ctx)] for k, v in value.items()]

    def decode(self, value, path, ctx):
        if not isinstance(value, list):
            _fail(path, f"expected a list of [client id, value] pairs, got {_kind(value)}")
        if len(value) > self.max_len:
            _fail(path, f"{len(value)} items, at most {self.max_len}")
        out = {}
        for i, pair in enumerate(value):
            if not isinstance(pair, list) or len(pair) != 2:
                _fail(f"{path}[{i}]", "expected a [client id, value] pair")
            k = Id.decode(pair[0], f"{path}[{i}].id", ctx)
            if k in out:
                _fail(path, f"client id {k} listed twice")
            out[k] = self.value.decode(pair[1], f"{path}[{k}]", ctx)
        return out


class StrMap(Type):
    """A dict with str keys (a JSON object)."""

    def __init__(self, value: Type, max_len: int = 1 << 12):
        self.value, self.max_len = value, max_len

    def encode(self, value, path, ctx):
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            _fail(path, "expected a dict with str keys")
        if len(value) > self.max_len:
            _fail(path, f"{len(value)} items, at most {self.max_len}")
        return {k: self.value.encode(v, f"{path}.{k}", ctx) for k, v in value.items()}

    def decode(self, value, path, ctx):
        if not isinstance(value, dict):
            _fail(path, f"expected an object, got {_kind(value)}")
        if len(value) > self.max_len:
            _fail(path, f"{len(value)} items, at most {self.max_len}")
        return {Str(256).decode(k, f"{path}.key", ctx): self.value.decode(v, f"{path}.{k}", ctx) for k, v in value.items()}


class Struct(Type):
    """A dict with exactly these str keys (those in ``optional`` may be absent)."""

    def __init__(self, fields: dict[str, Type], optional: tuple[str, ...] = ()):
        self.fields, self.optional = fields, frozenset(optional)

    def _keys(self, value, path):
        if not isinstance(value, dict):
            _fail(path, f"expected an object, got {_kind(value)}")
        extra = sorted(str(k) for k in value if k not in self.fields)
        if extra:
            _fail(path, f"unexpected field(s) {extra}")
        missing = sorted(k for k in self.fields if k not in value and k not in self.optional)
        if missing:
            _fail(path, f"missing field(s) {missing}")

    def encode(self, value, path, ctx):
        self._keys(value, path)
        return {k: t.encode(value[k], _join(path, k), ctx) for k, t in self.fields.items() if k in value}

    def decode(self, value, path, ctx):
        self._keys(value, path)
        return {k: t.decode(value[k], _join(path, k), ctx) for k, t in self.fields.items() if k in value}


class Either(Type):
    """A value of ``first`` or, when it is a dict (a JSON object on the wire), of ``second``:
    a message with an optional richer form (``second`` a :class:`Struct`, ``first`` not one)."""

    def __init__(self, first: Type, second: Type):
        self.first, self.second = first, second

    def encode(self, value, path, ctx):
        return (self.second if isinstance(value, dict) else self.first).encode(value, path, ctx)

    def decode(self, value, path, ctx):
        return (self.second if isinstance(value, dict) else self.first).decode(value, path, ctx)


class Record(Type):
    """A library dataclass ``cls``, rebuilt by ``cls(**fields)`` from exactly these fields."""

    def __init__(self, cls: type, fields: dict[str, Type]):
        self.cls, self.struct = cls, Struct(fields)
        assert set(fields) == {f.name for f in dataclasses.fields(cls)}, cls

    def encode(self, value, path, ctx):
        if type(value) is not self.cls:
            _fail(path, f"expected a {self.cls.__name__}, got {_kind(value)}")
        return self.struct.encode({k: getattr(value, k) for k in self.struct.fields}, path, ctx)

    def decode(self, value, path, ctx):
        fields = self.struct.decode(value, path, ctx)
        try:
            return self.cls(**fields)
        except (TypeError, ValueError) as exc:
            _fail(path, f"not a valid {self.cls.__name__} ({exc})")


class Json(Type):
    """Plain JSON data (str, int, float, bool, None, lists, dicts with str keys), ``depth`` deep.
    Numpy scalars are sent as Python numbers and tuples as lists."""

    def __init__(self, depth: int = 4, max_len: int = 1 << 12):
        self.depth, self.max_len = depth, max_len

    def _walk(self, value, path, depth, encoding):
        if value is None or isinstance(value, (bool, str)):
            if isinstance(value, str) and len(value) > _MAX_STR:
                _fail(path, "string too long")
            return value
        if encoding and isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, (int, np.integer)):
            value = int(value)
            if abs(value) >= _MAX_INT:
                _fail(path, "int too large")
            return value
        if isinstance(value, (float, np.floating)):
            return float(value)
        if depth <= 0:
            _fail(path, f"nested deeper than {self.depth}")
        if isinstance(value, list) or (encoding and isinstance(value, tuple)):
            if len(value) > self.max_len:
                _fail(path, f"{len(value)} items, at most {self.max_len}")
            return [self._walk(v, f"{path}[{i}]", depth - 1, encoding) for i, v in enumerate(value)]
        if isinstance(value, dict):
            if len(value) > self.max_len:
                _fail(path, f"{len(value)} items, at most {self.max_len}")
            if not all(isinstance(k, str) for k in value):
                _fail(path, "dict keys must be strings")
            return {k: self._walk(v, f"{path}.{k}", depth - 1, encoding) for k, v in value.items()}
        _fail(path, f"{_kind(value)} is not plain JSON data")

    def encode(self, value, path, ctx):
        return self._walk(value, path, self.depth, True)

    def decode(self, value, path, ctx):
        return self._walk(value, path, self.depth, False)


class Fused(Type):
    """``UpdateRequest.then`` / ``UpdateReply.then``: the aggregator's first stage message
    (request: ``[stage, message]`` of any stage in :data:`MESSAGES`; reply: the answer, in
    that stage's reply schema, to the stage the request fused, given by the caller)."""

    def __init__(self, direction: str):
        self.direction = direction

    def _stage(self, stage, path):
        if not isinstance(stage, str) or stage == "update" or (stage, self.direction) not in MESSAGES:
            _fail(path, f"{str(stage)[:40]!r} is not a stage that can be fused into the update")
        return stage

    def encode(self, value, path, ctx):
        if self.direction == "request":
            if value is None:
                return None
            if not isinstance(value, tuple) or len(value) != 2:
                _fail(path, "expected a (stage, message) pair")
            stage = self._stage(value[0], path)
            return [stage, MESSAGES[stage, "request"].encode(value[1], f"{path}[{stage}]", ctx)]
        if ctx.fused is None:
            return Null().encode(value, path, ctx)
        return None if value is None else MESSAGES[ctx.fused, "reply"].encode(value, f"{path}[{ctx.fused}]", ctx)

    def decode(self, value, path, ctx):
        if self.direction == "request":
            if value is None:
                return None
            if not isinstance(value, list) or len(value) != 2:
                _fail(path, "expected a [stage, message] pair")
            stage = self._stage(value[0], path)
            return (stage, MESSAGES[stage, "request"].decode(value[1], f"{path}[{stage}]", ctx))
        if ctx.fused is None:
            return Null().decode(value, path, ctx)
        return None if value is None else MESSAGES[ctx.fused, "reply"].decode(value, f"{path}[{ctx.fused}]", ctx)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# ---------------------------------------------------------------- the messages
def _schemas() -> dict[tuple[str, str], Type]:
    from protocols import shamir
    from protocols.paillier.authority import (
        KEY_SIZES,
        STAGE as PAILLIER_STAGE,
        EncryptedContribution,
        EncryptRequest,
        PublicBundle,
        RoundTicket,
    )

    from protocols.validated import helper as validated

    from ..federation.update_stage import UPDATE_STAGE, UpdateReply, UpdateRequest
    from ..messages import Broadcast
    from .provision import IDENTIFY_STAGE

    key = Bytes(32)  # X25519 / Ed25519 public keys, SHA-256 digests
    sig = Bytes(64)  # Ed25519 signatures
    share = 6 + 4 * shamir.n_limbs(32)  # one Shamir share of a 32-byte secret
    share_ct = 12 + 2 * share + 16  # AES-CCM nonce, s-share || b-share, tag
    ids = List(Id, as_tuple=True)
    n_bits = max(KEY_SIZES)
    bundle = Record(PublicBundle, {"n": BigInt(n_bits), "authority_key": key, "signature": sig})
    ticket = Record(RoundTicket, {
        "nonce": Bytes(min_len=1, max_len=64), "run": Int(), "round": Int(), "digest": Bytes(max_len=64),
        "n_ciphertexts": Int(0, MAX_ITEMS), "max_clients": Int(1, MAX_ID),
    })
    advert = Struct({"c_pk": key, "s_pk": key, "sig": Optional(sig)})
    # the advertise reply also carries the commitments (H(b), then 2 x 16 bytes per holder) and
    # the broadcast digest the client received; the share request forwards `advert` only
    advert_reply = Struct({"c_pk": key, "s_pk": key, "sig": Optional(sig),
                           "commit": Bytes(min_len=32, max_len=32 + 32 * MAX_ITEMS), "digest": Bytes(max_len=64)})
    masked = Array(("<u8",), ndim=1)
    values = Array(("<f8", "<f4", "<i8", "<i4", "<u8", "<u4", "|b1"))  # a client's sum- or set-field
    return {
        # --------------------------------------------------------- the round's first stage
        (UPDATE_STAGE, "request"): Record(UpdateRequest, {
            "run": Int(), "round": Int(),
            "broadcast": Record(Broadcast, {
                "action": Str(256), "centres": Optional(Array(("<f8",), ndim=(1, 2, 3))),
                "params": Json(), "sample": Json(depth=0),
            }),
            "sampled": ids, "then": Fused("request"), "attempt": Int(0),
        }),
        (UPDATE_STAGE, "reply"): Record(UpdateReply, {
            "items": StrMap(values), "declined": Optional(Str(4096)), "then": Fused("reply"),
            "then_refused": Optional(Str(4096)),
        }),
        # --------------------------------------------------------- PlainSum
        ("input", "request"): Null(),
        ("input", "reply"): StrMap(values),
        # --------------------------------------------------------- PairwiseMasking
        ("advertise", "request"): Struct({"stage": Str(16, choices=("advertise",))}),
        ("advertise", "reply"): advert_reply,
        ("share", "request"): Struct({"keys": IdMap(advert)}),
        ("share", "reply"): IdMap(Bytes(share_ct)),
        ("masked_input", "request"): IdMap(Bytes(share_ct)),
        ("masked_input", "reply"): Either(masked, Struct({"masked": masked, "failed_shares": ids})),
        ("consistency_check", "request"): Struct({"survivors": ids}),
        ("consistency_check", "reply"): sig,
        ("unmask", "request"): Struct({"survivors": ids, "dropped": ids, "signatures": IdMap(sig)},
                                      optional=("signatures",)),
        ("unmask", "reply"): Struct({"b": IdMap(Bytes(share)), "s": IdMap(Bytes(share))}),
        # --------------------------------------------------------- Paillier
        (PAILLIER_STAGE, "request"): Record(EncryptRequest, {"bundle": bundle, "ticket": ticket}),
        (PAILLIER_STAGE, "reply"): Record(EncryptedContribution, {
            "client_id": Id, "nonce": Bytes(min_len=1, max_len=64), "digest": Bytes(max_len=64),
            "ciphertexts": List(BigInt(2 * n_bits), as_tuple=True), "signature": sig,
        }),
        # --------------------------------------------------------- ValidatedAggregation
        (validated.STAGE, "request"): Record(validated.ValidationRequest, {
            "bundle": Record(validated.HelperBundle, {"hpke_key": key, "helper_key": key, "signature": sig}),
            "ticket": Record(validated.ValidationTicket, {
                "nonce": Bytes(16), "run": Int(), "round": Int(), "attempt": Int(0), "digest": Bytes(max_len=64),
                "k": Int(1, MAX_ITEMS), "widths": List(Int(0), as_tuple=True), "frac_bits": Int(0, 62),
                "min_clients": Int(2, MAX_ID),
                "noise": Optional(Record(validated.NoisePlan, {
                    "count": Str(64), "count_sigma": Float(),
                    "fields": List(Record(validated.NoiseField, {"name": Str(64), "sigma": Float(),
                                                                 "width": Int(1, MAX_ITEMS)}), as_tuple=True),
                    "offsets": List(Int(), max_len=1 << 20, as_tuple=True),
                })),
                "votes": Optional(List(Int(1, MAX_ITEMS), max_len=2, as_tuple=True)),
            }),
        }),
        (validated.STAGE, "reply"): Record(validated.ValidatedReport, {
            "client_id": Id, "report_nonce": Bytes(validated.REPORT_NONCE_SIZE),
            "public_share": Bytes(max_len=1 << 26), "leader_share": Bytes(max_len=1 << 26),
            "sealed_helper_share": Bytes(max_len=1 << 26), "signature": sig,
        }),
        # --------------------------------------------------------- node identification
        (IDENTIFY_STAGE, "request"): Struct({
            "challenge": Bytes(min_len=16, max_len=64), "node_id": Id, "directory_digest": key,
            "bundle": Optional(bundle),
        }),
        (IDENTIFY_STAGE, "reply"): Struct({"client_id": Id, "public_key": key, "signature": sig}),
    }


class _Messages(dict):
    """:data:`MESSAGES`, built on first use (the schemas import the protocol packages)."""

    def _fill(self):
        if not dict.__len__(self):
            self.update(_schemas())

    def __getitem__(self, k):
        self._fill()
        return dict.__getitem__(self, k)

    def __contains__(self, k):
        self._fill()
        return dict.__contains__(self, k)

    def __iter__(self):
        self._fill()
        return dict.__iter__(self)

    def __len__(self):
        self._fill()
        return dict.__len__(self)

    def keys(self):
        self._fill()
        return dict.keys(self)

    def items(self):
        self._fill()
        return dict.items(self)

    def get(self, k, default=None):
        self._fill()
        return dict.get(self, k, default)


#: ``(stage, "request" | "reply") -> schema`` of every message that crosses the wire
MESSAGES: dict[tuple[str, str], Type] = _Messages()


# ---------------------------------------------------------------- framing
def _schema(stage: str, direction: str) -> Type:
    if not isinstance(stage, str) or (stage, direction) not in MESSAGES:
        raise WireError(f"stage {str(stage)[:40]!r} has no {direction} message on the wire")
    return MESSAGES[stage, direction]


def encode(stage: str, direction: str, message: Any, *, fused: str | None = None) -> bytes:
    """The wire bytes of ``message``, the ``direction`` ("request" / "reply") of ``stage``.

    ``fused``: for the ``update`` reply, the stage the request fused (``UpdateRequest.then``).
    Raises :class:`WireError` if the message does not fit its schema.
    """
    ctx = _Ctx(fused=fused)
    body = _schema(stage, direction).encode(message, "", ctx)
    return frame(body, ctx.arrays)


def frame(body, arrays, *, magic: bytes = MAGIC) -> bytes:
    """:func:`securefkm._frame.frame` with the wire's magic by default."""
    return _frame.frame(body, arrays, magic=magic)


def decode(stage: str, direction: str, data: Any, *, fused: str | None = None) -> Any:
    """Rebuild the ``direction`` message of ``stage`` from a peer's ``data``, checked field by
    field against its schema; :class:`WireError` names the field that fails."""
    try:
        return _decode(stage, direction, data, fused)
    except WireError as exc:
        raise WireError(f"malformed {stage} {direction}: {exc}") from None


def _decode(stage, direction, data, fused):
    schema = _schema(stage, direction)
    body, arrays = unframe(data)
    ctx = _Ctx(arrays, fused=fused)
    out = schema.decode(body, "", ctx)
    if len(ctx.used) != len(arrays):
        raise WireError(f"{len(arrays) - len(ctx.used)} array(s) sent but not part of the message")
    return out


def unframe(data, *, magic: bytes = MAGIC, max_bytes: int = MAX_MESSAGE_BYTES):
    """:func:`securefkm._frame.unframe` with the wire's magic and size bound by default."""
    return _frame.unframe(data, magic=magic, max_bytes=max_bytes)
