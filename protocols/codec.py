"""Fixed-point codec shared by the secure aggregators (pairwise masking, Paillier).

Secure aggregation adds integers modulo a ring (here ``Z_{2^64}``, as in Bonawitz et al.
2017, CCS, Sec. 3: "inputs are vectors of elements of Z_R"), so real-valued sum-fields
must be mapped to integers first. A value ``v`` is encoded as ``round(v * 2**frac_bits)``
in signed 64-bit two's complement and stored as ``uint64``; sums of encodings wrap modulo
``2**64`` and the total is read back as a signed ``int64`` and divided by the scale.

* Integer fields (:attr:`securefkm.messages.FieldSpec.integer`, e.g. crisp counts) are
  encoded with 0 fractional bits: their secure sum is bit-exact.
* Float fields are rounded to the nearest multiple of ``resolution = 2**-frac_bits``: the
  decoded sum of ``n`` clients is within ``n * resolution / 2`` of the plain sum.
* Nothing is clipped silently: a value whose magnitude exceeds the declared ``bound`` (or,
  without a declared bound, the largest magnitude that cannot overflow for the round's
  number of clients) raises :class:`~securefkm.exceptions.InputError` naming the field.

See ``docs/protocols/codec.md``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from securefkm.validation import check_int
from securefkm.exceptions import EncodingError, InputError
from securefkm.messages import FieldSpec, check_sums, stack_sums

#: the ring is Z_{2^64}; the decoded total must fit signed int64, so |sum| <= 2**63 - 1.
INT64_MAX = 2**63 - 1


def _as_specs(specs) -> tuple[FieldSpec, ...]:
    if type(specs) is tuple and all(type(s) is FieldSpec for s in specs):
        return specs  # the runtime's own declared layout: nothing to convert
    specs = tuple(specs)
    for s in specs:
        if not isinstance(s, FieldSpec):
            raise InputError(f"specs must be FieldSpec objects, got {type(s).__name__}.")
    return specs


@functools.lru_cache(maxsize=512)
def _integer_mask(specs: tuple[FieldSpec, ...]) -> np.ndarray:
    """Which words of the flattened fields belong to integer fields (read-only)."""
    mask = np.concatenate([np.full(s.size, s.integer, dtype=bool) for s in specs])
    mask.setflags(write=False)
    return mask


def _check_n(n_clients) -> int:
    return check_int(n_clients, "n_clients", minimum=1)


class FixedPointCodec:
    """Signed fixed-point encoding into ``uint64`` words (arithmetic modulo ``2**64``).

    Parameters
    ----------
    frac_bits:
        Fractional bits of float fields (0..62); ``scale = 2**frac_bits``,
        ``resolution = 2**-frac_bits``. Integer fields always use 0 fractional bits.
    bound:
        Declared maximum ``|value|`` of any entry a single client sends. ``None`` means the
        largest bound that still cannot overflow for the round's number of clients
        (:meth:`max_abs`). With a declared bound, :meth:`check_capacity` refuses a round in
        which ``bound * n_clients * scale`` could exceed ``2**63 - 1``.
    """

    def __init__(self, frac_bits: int = 24, bound: float | None = None):
        self.frac_bits = check_int(frac_bits, "frac_bits", minimum=0, maximum=62)
        self.scale = 2**self.frac_bits
        self.resolution = 2.0**-self.frac_bits
        if bound is not None:
            if isinstance(bound, bool) or not isinstance(bound, (int, float, np.integer, np.floating)):
                raise InputError(f"bound must be a positive number or None, got {bound!r}.")
            if not math.isfinite(float(bound)) or float(bound) <= 0:
                raise InputError(f"bound must be a positive finite number or None, got {bound!r}.")
            bound = float(bound)
        self.bound = bound

    def __repr__(self) -> str:
        return f"FixedPointCodec(frac_bits={self.frac_bits}, bound={self.bound!r})"

    # ------------------------------------------------------------------ capacity
    def max_abs(self, n_clients: int) -> float:
        """Largest per-client ``|value|`` of a float field such that the sum of
        ``n_clients`` encodings cannot overflow signed 64-bit.

        Each encoding is at most ``|v| * scale + 1/2`` in magnitude, so we need
        ``n * (|v| * scale + 1/2) <= 2**63 - 1``.
        """
        n = _check_n(n_clients)
        words = (INT64_MAX - n) // n  # per-client budget in encoded units, minus rounding
        # float(words) may round up; step down so max_abs * scale <= words exactly
        out = math.ldexp(float(words), -self.frac_bits)
        while out * self.scale > words:
            out = math.nextafter(out, 0.0)
        return out

    def max_abs_integer(self, n_clients: int) -> int:
        """Largest per-client ``|value|`` of an integer field for ``n_clients`` clients."""
        n = _check_n(n_clients)
        return INT64_MAX // n

    def effective_bound(self, n_clients: int) -> float:
        """The bound encode enforces on float fields: declared, else :meth:`max_abs`."""
        return self.bound if self.bound is not None else self.max_abs(n_clients)

    def check_capacity(self, specs: Sequence[FieldSpec], n_clients: int) -> None:
        """Raise :class:`InputError` before a round if the declared bound could overflow.

        With ``bound=None`` there is nothing to check ahead (encode enforces ``max_abs``).
        """
        specs = _as_specs(specs)
        n = _check_n(n_clients)
        if self.bound is None or not specs:
            return
        has_float = any(not s.integer for s in specs)
        scale = self.scale if has_float else 1
        if self.bound * n * scale + n / 2 > INT64_MAX:
            limit = self.max_abs(n) if has_float else float(self.max_abs_integer(n))
            # largest frac_bits that fits the declared bound
            fit = math.floor(math.log2(INT64_MAX / (n * self.bound))) - 1 if self.bound * n < INT64_MAX else -1
            hint = (
                f"lower frac_bits to {fit} or less" if fit >= 0 else "the bound cannot fit at any precision"
            )
            raise InputError(
                f"FixedPointCodec overflow: bound={self.bound:g} * n_clients={n} * scale=2**{self.frac_bits} "
                f"exceeds the signed 64-bit range 2**63; {hint}, or declare bound <= {limit:.6g} "
                "(e.g. clip or normalise the data first), or sample fewer clients per round."
            )

    # ------------------------------------------------------------------ encode / decode
    def encode_signed(self, sums: dict[str, np.ndarray], specs: Sequence[FieldSpec], n_clients: int) -> np.ndarray:
        """Flatten ``sums`` in spec order into signed fixed-point ``int64`` (no wrap-around).

        Raises :class:`InputError` naming the field for NaN/inf, a fractional value in an
        integer field, or a value above the bound. Never clips.
        """
        specs = _as_specs(specs)
        if not isinstance(sums, dict):
            raise InputError(f"sums must be a dict of arrays keyed by field name, got {type(sums).__name__}.")
        check_sums(sums, specs)
        if not specs:
            return np.zeros(0, dtype=np.int64)
        n, fbound, ibound = self._bounds(n_clients)
        fast = self._encode_fast(sums, specs, fbound, ibound)
        if fast is not None:
            return fast
        parts = []  # the per-field path: it names the field that fails a check
        for s in specs:
            v = np.asarray(sums[s.name], dtype=np.float64).ravel()
            if not np.all(np.isfinite(v)):
                raise EncodingError(
                    f"sum-field {s.name!r} contains NaN or infinity; the codec cannot encode it "
                    "(check the client's data and the algorithm's update).", field=s.name
                )
            peak = float(np.max(np.abs(v))) if v.size else 0.0
            if s.integer:
                if not np.all(v == np.round(v)):
                    raise EncodingError(
                        f"sum-field {s.name!r} is declared integer but holds fractional values; "
                        "declare FieldSpec(integer=False) or round the values first.", field=s.name
                    )
                if peak > ibound:
                    raise EncodingError(
                        f"sum-field {s.name!r} has |value| {peak:.6g} above the codec bound {ibound:g} "
                        f"for {n} clients; raise FixedPointCodec(bound=...) or sample fewer clients.", field=s.name
                    )
                parts.append(v.astype(np.int64))
            else:
                if peak > fbound:
                    raise EncodingError(
                        f"sum-field {s.name!r} has |value| {peak:.6g} above the codec bound {fbound:.6g} "
                        f"(frac_bits={self.frac_bits}, {n} clients); values are never clipped silently: "
                        "raise FixedPointCodec(bound=...), lower frac_bits, or scale/clip the data first.",
                        field=s.name,
                    )
                parts.append(np.rint(v * self.scale).astype(np.int64))
        return np.concatenate(parts)

    def _bounds(self, n_clients) -> tuple[int, float, float]:
        """(n, float-field bound, integer-field bound) for a round of ``n_clients``; every
        client of a round asks with the same n, so the last answer is kept."""
        cached = getattr(self, "_last_bounds", None)
        if cached is not None and cached[0] == n_clients and type(n_clients) is int:
            return cached
        n = _check_n(n_clients)
        ibound = min(self.bound, self.max_abs_integer(n)) if self.bound is not None else self.max_abs_integer(n)
        self._last_bounds = (n, self.effective_bound(n), ibound)
        return self._last_bounds

    def _encode_fast(self, sums, specs, fbound: float, ibound: float) -> np.ndarray | None:
        """The same words as the per-field loop, with one check over all fields at once
        (every client of every round encodes: per-field numpy calls dominated a round).
        ``None`` when any check fails, so the loop can name the failing field."""
        flat = np.concatenate([np.asarray(sums[s.name], dtype=np.float64).ravel() for s in specs])
        return self._checked_words(flat, _integer_mask(specs), fbound, ibound)

    def _checked_words(self, flat: np.ndarray, integer: np.ndarray, fbound: float, ibound: float) -> np.ndarray | None:
        """Fixed-point words of ``flat`` (last axis: the fields' values in spec order; a leading
        axis of clients allowed), or None when any value fails a check. Elementwise."""
        if not np.isfinite(flat).all() or (np.abs(flat) > np.where(integer, ibound, fbound)).any():
            return None
        if integer.any() and (np.round(flat[..., integer]) != flat[..., integer]).any():
            return None
        # rint of a whole number is itself: integer fields encode as their value, others scaled
        return np.rint(np.where(integer, flat, flat * self.scale)).astype(np.int64)

    def encode_signed_many(self, sums_list: Sequence[dict], specs: Sequence[FieldSpec], n_clients: int) -> np.ndarray:
        """:meth:`encode_signed` of many clients' sums at once: row i of the ``(clients, words)``
        result is exactly client i's encoding (the checks and the rounding are elementwise).
        When any client's values fail a check, the clients are encoded one by one, so the error
        is the one :meth:`encode_signed` raises for the first of them, naming its field, with
        ``row`` (:class:`~securefkm.exceptions.EncodingError`) its index in ``sums_list``."""
        specs = _as_specs(specs)
        sums_list = list(sums_list)
        if not specs or not sums_list:
            return np.zeros((len(sums_list), self.total_size(specs)), dtype=np.int64)
        _, fbound, ibound = self._bounds(n_clients)
        stacked = stack_sums(sums_list, specs)  # None: a layout check_sums refuses
        if stacked is not None:
            m = len(sums_list)
            flat = np.concatenate([stacked[s.name].reshape(m, s.size) for s in specs], axis=1)
            words = self._checked_words(flat, _integer_mask(specs), fbound, ibound)
            if words is not None:
                return words
        rows = []
        for i, sums in enumerate(sums_list):
            try:
                rows.append(self.encode_signed(sums, specs, n_clients))
            except InputError as exc:  # which client of the batch: the caller isolates it
                raise EncodingError(f"update {i} of the {len(sums_list)} encoded together: {exc}",
                                    field=getattr(exc, "field", None), row=i) from exc
        return np.stack(rows)

    def encode(self, sums: dict[str, np.ndarray], specs: Sequence[FieldSpec], n_clients: int) -> np.ndarray:
        """Like :meth:`encode_signed`, viewed as ``uint64`` words for arithmetic mod ``2**64``."""
        return self.encode_signed(sums, specs, n_clients).view(np.uint64)

    def decode_signed(self, total, specs: Sequence[FieldSpec]) -> dict[str, np.ndarray]:
        """Decode a signed integer total (``int64`` array or Python ints) into float64 fields."""
        specs = _as_specs(specs)
        arr = np.asarray(total)
        if arr.dtype == object:
            arr = np.array([int(x) for x in arr.ravel()], dtype=object)
            if any(abs(int(x)) > INT64_MAX for x in arr):
                raise InputError("decode: a total exceeds the signed 64-bit range; the round overflowed.")
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iu" or arr.ndim != 1:
            raise InputError(f"total must be a 1-D integer array, got dtype {arr.dtype} and shape {arr.shape}.")
        signed = arr.astype(np.uint64, copy=False).view(np.int64) if arr.dtype.kind == "u" else arr.astype(np.int64)
        expected = sum(s.size for s in specs)
        if signed.size != expected:
            raise InputError(f"total has {signed.size} words but the fields need {expected}.")
        out, offset = {}, 0
        for s in specs:
            words = signed[offset : offset + s.size]
            offset += s.size
            vals = words.astype(np.float64)
            if not s.integer:
                vals = vals / self.scale
            out[s.name] = vals.reshape(s.shape)
        return out

    def decode(self, total: np.ndarray, specs: Sequence[FieldSpec]) -> dict[str, np.ndarray]:
        """Interpret ``total`` (``uint64``, a sum mod ``2**64``) as two's-complement ``int64``
        and divide float fields by the scale. Integer fields come back as exact whole
        float64 values (exact below ``2**53``)."""
        arr = np.asarray(total)
        if arr.dtype != np.uint64 and arr.dtype != np.int64:
            raise InputError(f"decode expects a uint64 (or int64) array, got dtype {arr.dtype}.")
        return self.decode_signed(arr.view(np.int64) if arr.dtype == np.uint64 else arr, specs)

    def total_size(self, specs: Sequence[FieldSpec]) -> int:
        """Number of words an encoding of ``specs`` occupies."""
        return sum(s.size for s in _as_specs(specs))
