"""Slot packing: many small signed integers in one Paillier plaintext.

A Paillier plaintext is an integer modulo ``n`` (2048 or 3072 bits), while one encoded
value of a sum-field needs only some 32-64 bits. Encrypting each value on its own wastes
the plaintext space and costs one modular exponentiation modulo ``n**2`` per value, which
dominates the client's work. Packing places ``k`` values in disjoint bit ranges ("slots")
of one plaintext, so one encryption carries ``k`` values, and because Paillier addition is
addition of plaintexts modulo ``n``, the product of the clients' ciphertexts decrypts to
the slot-wise sums as long as no slot overflows into the next one.

Layout (least significant slot first)::

    plaintext = sum_i  u_i * 2**(i * w),     u_i = v_i + 2**(b - 1)  in [0, 2**b)
    w = b + h,   h = ceil(log2(max_clients)),   k = floor((bits(n) - 1) / w)

``v_i`` is a client's signed value in ``[-2**(b-1), 2**(b-1))`` (the output of the shared
fixed-point codec, :mod:`protocols.codec`), ``u_i`` its offset, non-negative form. The sum
of ``m <= max_clients`` offset values is at most ``m * (2**b - 1) < 2**(b + h)``, so it fits
in its ``w``-bit slot and never carries into the next; the packed sum stays below
``2**(k*w) <= 2**(bits(n)-1) < n``, so it is never reduced modulo ``n``. After decryption
each slot is read back and ``m * 2**(b-1)`` subtracted to get the exact signed sum.

This is the standard "batching"/"packing" technique for additively homomorphic
encryption; see Zhang et al., "BatchCrypt: Efficient Homomorphic Encryption for
Cross-Silo Federated Learning", USENIX ATC 2020 (quantised values packed with zero
padding bits that absorb the carries of the sum). The plaintext space ``Z_n`` and the
homomorphism ``E(a) * E(b) = E(a + b mod n)`` are from Paillier, "Public-Key Cryptosystems
Based on Composite Degree Residuosity Classes", EUROCRYPT 1999.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from securefkm.exceptions import InputError

#: the codec produces int64 values, so one client's value never needs more bits.
MAX_VALUE_BITS = 64


def headroom_bits(max_clients: int) -> int:
    """``ceil(log2(max_clients))``: extra bits a slot needs so ``max_clients`` values add without carry."""
    return (int(max_clients) - 1).bit_length()


@dataclass(frozen=True)
class SlotLayout:
    """How signed values of ``value_bits`` bits are packed into plaintexts of a Paillier key.

    ``plaintext_bits`` is the number of usable plaintext bits, ``n.bit_length() - 1`` for a
    modulus ``n`` (so every packed sum stays below ``n``). ``max_clients`` is the most
    clients whose values may ever be added; the slot carries ``headroom_bits(max_clients)``
    extra bits for their sum.
    """

    value_bits: int
    max_clients: int
    plaintext_bits: int

    def __post_init__(self):
        vb, mc, pb = self.value_bits, self.max_clients, self.plaintext_bits
        if not isinstance(vb, int) or isinstance(vb, bool) or not 2 <= vb <= MAX_VALUE_BITS:
            raise InputError(
                f"slot_bits (bits of one client's encoded value) must be an int in [2, {MAX_VALUE_BITS}], "
                f"got {vb!r}; the fixed-point codec produces int64 values, so 64 always suffices."
            )
        if not isinstance(mc, int) or isinstance(mc, bool) or mc < 1:
            raise InputError(f"max_clients must be an int >= 1, got {mc!r}.")
        if not isinstance(pb, int) or isinstance(pb, bool) or pb < 1:
            raise InputError(f"plaintext_bits must be a positive int, got {pb!r}.")
        if self.slots_per_plaintext < 1:
            raise InputError(
                f"a slot of {self.slot_bits} bits ({vb} value bits + {self.headroom} headroom bits "
                f"for max_clients={mc}) does not fit in a {pb}-bit plaintext; use a larger key "
                "or fewer slot_bits / max_clients."
            )

    # ------------------------------------------------------------------ geometry
    @property
    def headroom(self) -> int:
        return headroom_bits(self.max_clients)

    @property
    def slot_bits(self) -> int:
        """Width ``w`` of one slot: value bits plus headroom."""
        return self.value_bits + self.headroom

    @property
    def slots_per_plaintext(self) -> int:
        return self.plaintext_bits // self.slot_bits

    @property
    def offset(self) -> int:
        """``2**(b-1)``: added to each signed value so the slot holds a non-negative number."""
        return 1 << (self.value_bits - 1)

    @property
    def value_range(self) -> tuple[int, int]:
        """Inclusive range of signed values one client may put in a slot."""
        return -self.offset, self.offset - 1

    def n_plaintexts(self, n_values: int) -> int:
        k = self.slots_per_plaintext
        return -(-int(n_values) // k)

    # ------------------------------------------------------------------ checks
    def check_clients(self, n_clients: int) -> None:
        """Raise :class:`InputError` if ``n_clients`` values could overflow a slot."""
        if n_clients > self.max_clients:
            raise InputError(
                f"{n_clients} clients exceed the slot headroom of {self.headroom} bits "
                f"(max_clients={self.max_clients}): their sum could carry into the next slot. "
                f"Declare Paillier(max_clients>={n_clients})."
            )

    def check_values(self, values: np.ndarray, names: Sequence[str] | None = None) -> None:
        """Raise :class:`InputError` if any signed value falls outside the slot's value range."""
        values = np.asarray(values)
        if values.size == 0:
            return
        lo, hi = self.value_range
        bad = np.flatnonzero((values < lo) | (values > hi))
        if bad.size:
            i = int(bad[0])
            where = f" (field {names[i]!r})" if names is not None else ""
            raise InputError(
                f"encoded value {int(values[i])} at position {i}{where} does not fit in a "
                f"{self.value_bits}-bit slot (range [{lo}, {hi}]); raise Paillier(slot_bits=...) "
                f"(at most {MAX_VALUE_BITS}) or lower the codec's frac_bits."
            )

    # ------------------------------------------------------------------ pack / unpack
    def pack(self, values: np.ndarray) -> list[int]:
        """Signed integer values -> list of non-negative plaintext ints (exact, no rounding)."""
        values = np.asarray(values)
        if values.ndim != 1 or not np.issubdtype(values.dtype, np.integer):
            raise InputError(
                f"pack() needs a 1-D integer array, got dtype {values.dtype} shape {values.shape}."
            )
        self.check_values(values)
        k, w, off = self.slots_per_plaintext, self.slot_bits, self.offset
        ints = [int(v) + off for v in values.tolist()]
        out = []
        for start in range(0, len(ints), k):
            p = 0
            for j, u in enumerate(ints[start : start + k]):
                p |= u << (j * w)
            out.append(p)
        return out

    def sum_violation(self, plaintexts: Sequence[int], n_values: int, n_clients: int,
                      n: int | None = None) -> str | None:
        """Why decrypted packed sums of ``n_clients`` clients cannot be honest, or None.

        Every client packs offset values ``u`` in ``[0, 2**b)`` into the first ``n_values``
        slots and zeros elsewhere, so each slot of an honest sum lies in
        ``[0, n_clients * (2**b - 1)]``, the slots after the last value are zero and no bit
        is set above the last slot. A sum outside this range means a client encrypted
        something else: a value in a slot's headroom (it would carry into the next slot
        once enough clients are added), bits beyond the last slot, or a "negative"
        plaintext such as ``n - 1`` (``-1`` modulo ``n``, given the modulus ``n``). No
        client can be named: only the sum was decrypted.
        """
        if len(plaintexts) != self.n_plaintexts(n_values):
            return (f"{len(plaintexts)} plaintexts cannot hold exactly {n_values} values "
                    f"({self.slots_per_plaintext} slots each)")
        k, w = self.slots_per_plaintext, self.slot_bits
        mask = (1 << w) - 1
        top = int(n_clients) * ((1 << self.value_bits) - 1)
        for i, p in enumerate(plaintexts):
            p = int(p)
            if n is not None and not 0 <= p < int(n):
                return f"plaintext {i} is not below the modulus n"
            if p < 0 or p >> (k * w):
                if n is not None and p > int(n) // 2:
                    return (f"plaintext {i} is a negative number modulo n (n - {int(n) - p}): "
                            "a client encrypted a value outside every slot")
                return f"plaintext {i} has bits beyond its last slot: a client encrypted a value outside every slot"
            used = min(k, n_values - i * k)
            for j in range(k):
                slot = (p >> (j * w)) & mask
                if j >= used and slot:
                    return (f"plaintext {i} has a non-zero slot {j} after the last value: "
                            "a client filled an unused slot")
                if slot > top:
                    return (f"the sum in slot {j} of plaintext {i} (value {i * k + j}) exceeds the largest "
                            f"sum of {n_clients} clients' {self.value_bits}-bit values: a client's value "
                            "used the slot's headroom")
        return None

    def unpack(self, plaintexts: Sequence[int], n_values: int, n_clients: int,
               n: int | None = None) -> list[int]:
        """Packed sums of ``n_clients`` clients -> the exact signed sum of each value (Python ints).

        Raises :class:`InputError` with :meth:`sum_violation`'s reason if the sums are out of
        their declared ranges (``n``, the modulus, also recognises negative plaintexts).
        """
        self.check_clients(n_clients)
        why = self.sum_violation(plaintexts, n_values, n_clients, n)
        if why is not None:
            raise InputError(f"the decrypted sum is out of range: {why}.")
        k, w = self.slots_per_plaintext, self.slot_bits
        mask = (1 << w) - 1
        shift = n_clients * self.offset
        out: list[int] = []
        for p in plaintexts:
            p = int(p)
            for j in range(min(k, n_values - len(out))):
                out.append(((p >> (j * w)) & mask) - shift)
        return out


def layout_for_key(n: int, value_bits: int, max_clients: int) -> SlotLayout:
    """The slot layout for a Paillier modulus ``n`` (usable bits ``n.bit_length() - 1``)."""
    return SlotLayout(
        value_bits=value_bits, max_clients=max_clients, plaintext_bits=int(n).bit_length() - 1
    )
