"""Mask expansion: a 256-bit seed -> a vector of uint64 words from a stream-cipher keystream.

Bonawitz et al. 2017 (CCS), Sec. 3-4: masks are ``PRG(seed)`` expanded to the input
length, added modulo ``R`` (here ``2**64``). We use the keystream of ChaCha20 (RFC 8439,
``cryptography``'s ``algorithms.ChaCha20`` with an all-zero 16-byte counter||nonce) or
AES-256-CTR (zero IV), keyed with the full 32-byte seed. Every seed is used for exactly
one mask (seeds are fresh per round: self-mask seeds come from ``os.urandom`` and pairwise
seeds from HKDF over fresh per-round X25519 keys), so a fixed nonce never repeats a
(key, nonce) pair.

Performance: one cipher call per mask writes the keystream into a reusable buffer
(``update_into``), viewed as ``uint64`` with ``np.frombuffer`` and added in place with
wrap-around numpy arithmetic; no per-word Python work.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from securefkm.exceptions import InputError

CIPHERS = ("chacha20", "aes-ctr")
#: largest keystream matrix (bytes) that MaskExpander.add_signed fills before one reduction
BATCH_BYTES = 1 << 20
_ZERO_NONCE = bytes(16)


def _cipher(seed: bytes, cipher: str) -> Cipher:
    if len(seed) != 32:
        raise InputError(f"mask seeds must be 32 bytes (256 bits), got {len(seed)}.")
    if cipher == "chacha20":
        return Cipher(algorithms.ChaCha20(seed, _ZERO_NONCE), mode=None)
    if cipher == "aes-ctr":
        return Cipher(algorithms.AES(seed), modes.CTR(_ZERO_NONCE))
    raise InputError(f"cipher must be one of {CIPHERS}, got {cipher!r}.")


class MaskExpander:
    """Expands seeds into ``length``-word uint64 masks, reusing its buffers.

    Not thread-safe (one per session or per worker); cheap to create.
    """

    def __init__(self, length: int, cipher: str = "chacha20"):
        if cipher not in CIPHERS:
            raise InputError(f"cipher must be one of {CIPHERS}, got {cipher!r}.")
        self.length = int(length)
        self.cipher = cipher
        self.nbytes = 8 * self.length
        self._zeros = bytes(self.nbytes)
        # update_into needs len(buf) >= len(data) + block_size - 1 (block size <= 16 bytes)
        self._buf = bytearray(self.nbytes + 16)
        self._view = np.frombuffer(self._buf, dtype="<u8", count=self.length)  # wire order: little-endian
        self._rows = bytearray()  # add_signed's scratch matrix, grown on demand

    def mask(self, seed: bytes) -> np.ndarray:
        """The mask words for ``seed`` (a view into an internal buffer: copy to keep it)."""
        enc = _cipher(seed, self.cipher).encryptor()
        enc.update_into(self._zeros, self._buf)
        return self._view

    def add(self, acc: np.ndarray, seed: bytes, sign: int = 1) -> None:
        """``acc += sign * PRG(seed)`` modulo ``2**64`` (in place)."""
        m = self.mask(seed)
        if sign >= 0:
            np.add(acc, m, out=acc)
        else:
            np.subtract(acc, m, out=acc)


    def add_signed(self, acc: np.ndarray, plus, minus=()) -> None:
        """``acc += sum(PRG(s) for s in plus) - sum(PRG(s) for s in minus)`` modulo ``2**64``
        (in place): the same words as :meth:`add` seed by seed (addition modulo ``2**64``
        is exact in any order). Short masks (such as a client's ``k + 1``) are written one
        per row of a scratch matrix of at most ``BATCH_BYTES`` and each matrix is reduced
        with one sum, instead of one numpy call per seed; masks longer than half of
        ``BATCH_BYTES`` go seed by seed through :meth:`add`."""
        per = BATCH_BYTES // self.nbytes
        for seeds, sign in ((plus, 1), (minus, -1)):
            seeds = list(seeds)
            if per < 2 or len(seeds) < 2:
                for seed in seeds:
                    self.add(acc, seed, sign)
                continue
            for start in range(0, len(seeds), per):
                total = self._keystream_sum(seeds[start : start + per])
                (np.add if sign > 0 else np.subtract)(acc, total, out=acc)

    def _keystream_sum(self, seeds: list) -> np.ndarray:
        """``sum(PRG(s) for s in seeds)`` modulo ``2**64`` through the scratch matrix."""
        nb, count = self.nbytes, len(seeds)
        if len(self._rows) < count * nb + 16:
            self._rows = bytearray(count * nb + 16)
        rows, zeros = memoryview(self._rows), self._zeros
        for i, seed in enumerate(seeds):
            # update_into needs nb + 15 bytes of room; the slack is the next row, written after
            _cipher(seed, self.cipher).encryptor().update_into(zeros, rows[i * nb : (i + 1) * nb + 16])
        words = np.frombuffer(self._rows, dtype="<u8", count=count * self.length).reshape(count, self.length)
        return words.sum(axis=0, dtype=np.uint64)


def expand(seed: bytes, length: int, cipher: str = "chacha20") -> np.ndarray:
    """A fresh copy of the ``length``-word mask of ``seed``."""
    return MaskExpander(length, cipher).mask(seed).copy()


def keystream_bytes(seed: bytes, nbytes: int, cipher: str = "chacha20") -> bytes:
    """Raw keystream (the baseline the benchmark compares masking against)."""
    return _cipher(seed, cipher).encryptor().update(bytes(nbytes))
