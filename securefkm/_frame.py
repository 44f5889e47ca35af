"""The byte layout every securefkm file and message shares: magic, header length, a JSON
header naming the arrays' dtypes and shapes plus a JSON body, then the arrays' raw bytes.

:func:`unframe` rebuilds arrays with ``np.frombuffer`` for the numeric dtypes of
:data:`DTYPES` only, after checking their declared shapes against the bytes present; no
object is ever constructed from a name read from the bytes.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np

from .exceptions import SecureFKMError

#: the numeric dtypes an array may have (never ``object``)
DTYPES = frozenset({"<f8", "<f4", "<i8", "<i4", "<u8", "<u4", "|u1", "|i1", "|b1"})


class WireError(SecureFKMError, ValueError):
    """A peer sent bytes that are not a well-formed securefkm message of the stage."""


def frame(body, arrays, *, magic: bytes) -> bytes:
    """``magic`` | header length | JSON header ``{"arrays": [[dtype, shape], ...], "body": body}``
    | the arrays' raw bytes: the layout every securefkm file and message shares."""
    header = json.dumps({"arrays": [[a.dtype.str, list(a.shape)] for a in arrays], "body": body},
                        separators=(",", ":"), allow_nan=True).encode()
    return b"".join([magic, struct.pack(">I", len(header)), header] + [np.asarray(a, order="C").tobytes() for a in arrays])


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise WireError(f"key {k[:40]!r} appears twice in one object")
        out[k] = v
    return out


def unframe(data, *, magic: bytes, max_bytes: int):
    """``(body, arrays)`` of bytes laid out by :func:`frame`: the header's JSON (duplicate keys
    refused) and the arrays rebuilt, for whitelisted dtypes only, after their declared shapes
    were checked against the bytes present; :class:`WireError` for anything else."""
    if not isinstance(data, (bytes, bytearray)):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes, at most {max_bytes}")
    if not data.startswith(magic) or len(data) < len(magic) + 4:
        raise WireError(f"not a {magic.decode(errors='replace').strip()} message (bad magic)")
    (n,) = struct.unpack(">I", data[len(magic) : len(magic) + 4])
    start = len(magic) + 4
    if start + n > len(data):
        raise WireError("truncated header")
    try:
        header = json.loads(data[start : start + n].decode("utf-8"), object_pairs_hook=_no_duplicates)
    except WireError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"header is not JSON ({type(exc).__name__})") from None
    if not isinstance(header, dict) or set(header) != {"arrays", "body"} or not isinstance(header["arrays"], list):
        raise WireError("header must hold exactly 'arrays' (a list) and 'body'")
    arrays, offset = [], start + n
    for i, spec in enumerate(header["arrays"]):
        if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str) and isinstance(spec[1], list)):
            raise WireError(f"array {i}: expected [dtype, shape]")
        dtype, shape = spec
        if dtype not in DTYPES:
            raise WireError(f"array {i}: dtype {dtype[:20]!r} is not allowed on the wire")
        if len(shape) > 4 or not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s < (1 << 40) for s in shape):
            raise WireError(f"array {i}: bad shape")
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        if offset + nbytes > len(data):
            raise WireError(f"array {i}: {nbytes} bytes declared, {len(data) - offset} left (truncated)")
        arrays.append(np.frombuffer(data, dtype=dt, count=math.prod(shape), offset=offset).reshape(shape).copy())
        offset += nbytes
    if offset != len(data):
        raise WireError(f"{len(data) - offset} trailing bytes after the arrays")
    return header["body"], arrays
