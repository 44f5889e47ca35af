"""Mask expansion: a 256-bit seed -> a vector of uint64 words from a stream-cipher keystream
or an extendable-output function.

Bonawitz et al. 2017 (CCS), Sec. 3-4: masks are ``PRG(seed)`` expanded to the input
length, added modulo ``R`` (here ``2**64``). The PRGs: the keystream of ChaCha20 (RFC 8439,
``cryptography``'s ``algorithms.ChaCha20`` with an all-zero 16-byte counter||nonce) or
AES-256-CTR (zero IV), keyed with the full 32-byte seed; or SHAKE-256 (FIPS 202, the
standard library's OpenSSL-backed ``hashlib.shake_256``) of the 32-byte seed. Every seed is
used for exactly one mask (seeds are fresh per round: self-mask seeds come from
``os.urandom`` and pairwise seeds from :func:`~protocols.masking.keys.kdf` over fresh
per-round X25519 keys), so a fixed nonce never repeats a (key, nonce) pair.

``"auto"`` (the default) picks by the mask's length, which every party knows from the
round's public plan, so all of them expand alike: SHAKE-256 up to ``AUTO_XOF_MAX_BYTES``
(1 KiB), ChaCha20 above. A stream cipher's per-seed set-up (context creation in OpenSSL,
3.5-5.5 us here) dominates a short mask, where SHAKE-256 costs about 1 us; its throughput is
lower, so long masks stay on ChaCha20 (measured on this machine, us per mask, ChaCha20 /
SHAKE-256: 16 words 5.5 / 1.0, 128 words 4.7 / 2.8, 256 words 3.8 / 4.7, 1024 words 5.5 / 17).

Performance: one cipher call per mask writes the keystream into a reusable buffer
(``update_into``), viewed as ``uint64`` with ``np.frombuffer`` and added in place with
wrap-around numpy arithmetic; no per-word Python work.
"""

from __future__ import annotations

import hashlib

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from securefkm.exceptions import InputError

CIPHERS = ("auto", "chacha20", "aes-ctr", "shake256")
#: longest mask (bytes) that ``cipher="auto"`` expands with SHAKE-256 rather than ChaCha20
AUTO_XOF_MAX_BYTES = 1024
#: largest keystream matrix (bytes) that MaskExpander.add_signed fills before one reduction
BATCH_BYTES = 1 << 20
_ZERO_NONCE = bytes(16)


def resolve_cipher(cipher: str, length: int) -> str:
    """The PRG that ``cipher`` names for masks of ``length`` uint64 words (``"auto"``: see
    the module docstring)."""
    if cipher not in CIPHERS:
        raise InputError(f"cipher must be one of {CIPHERS}, got {cipher!r}.")
    if cipher == "auto":
        return "shake256" if 8 * int(length) <= AUTO_XOF_MAX_BYTES else "chacha20"
    return cipher


def _check_seed(seed: bytes) -> None:
    if len(seed) != 32:
        raise InputError(f"mask seeds must be 32 bytes (256 bits), got {len(seed)}.")


def _xof(seed: bytes, nbytes: int) -> bytes:
    _check_seed(seed)
    return hashlib.shake_256(seed).digest(nbytes)


def _cipher(seed: bytes, cipher: str) -> Cipher:
    _check_seed(seed)
    if cipher == "chacha20":
        return Cipher(algorithms.ChaCha20(seed, _ZERO_NONCE), mode=None)
    if cipher == "aes-ctr":
        return Cipher(algorithms.AES(seed), modes.CTR(_ZERO_NONCE))
    raise InputError(f"cipher must be one of {CIPHERS}, got {cipher!r}.")


class MaskExpander:
    """Expands seeds into ``length``-word uint64 masks, reusing its buffers.

    Not thread-safe (one per session or per worker); cheap to create.
    """

    def __init__(self, length: int, cipher: str = "auto"):
        self.length = int(length)
        self.cipher = resolve_cipher(cipher, self.length)
        self.nbytes = 8 * self.length
        self._zeros = bytes(self.nbytes)
        # update_into needs len(buf) >= len(data) + block_size - 1 (block size <= 16 bytes)
        self._buf = bytearray(self.nbytes + 16)
        self._view = np.frombuffer(self._buf, dtype="<u8", count=self.length)  # wire order: little-endian
        self._rows = bytearray()  # add_signed's scratch matrix, grown on demand

    def mask(self, seed: bytes) -> np.ndarray:
        """The mask words for ``seed`` (a view into an internal buffer: copy to keep it)."""
        if self.cipher == "shake256":
            self._buf[: self.nbytes] = _xof(seed, self.nbytes)
            return self._view
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
        if self.cipher == "shake256":
            data = b"".join([_xof(seed, nb) for seed in seeds])
            words = np.frombuffer(data, dtype="<u8").reshape(count, self.length)
            return words.sum(axis=0, dtype=np.uint64)
        if len(self._rows) < count * nb + 16:
            self._rows = bytearray(count * nb + 16)
        rows, zeros = memoryview(self._rows), self._zeros
        for i, seed in enumerate(seeds):
            # update_into needs nb + 15 bytes of room; the slack is the next row, written after
            _cipher(seed, self.cipher).encryptor().update_into(zeros, rows[i * nb : (i + 1) * nb + 16])
        words = np.frombuffer(self._rows, dtype="<u8", count=count * self.length).reshape(count, self.length)
        return words.sum(axis=0, dtype=np.uint64)


def expand(seed: bytes, length: int, cipher: str = "auto") -> np.ndarray:
    """A fresh copy of the ``length``-word mask of ``seed``."""
    return MaskExpander(length, cipher).mask(seed).copy()


def keystream_bytes(seed: bytes, nbytes: int, cipher: str = "chacha20") -> bytes:
    """Raw PRG output (the baseline the benchmark compares masking against)."""
    cipher = resolve_cipher(cipher, -(-nbytes // 8))
    if cipher == "shake256":
        return _xof(seed, nbytes)
    return _cipher(seed, cipher).encryptor().update(bytes(nbytes))
