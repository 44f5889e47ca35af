"""Extendable output functions of the VDAF draft (draft-irtf-cfrg-vdaf-20, Sec. 6.2).

XofTurboShake128 (Sec. 6.2.1) absorbs ``len(dst) (2 bytes LE) || dst || len(seed) (1 byte) ||
seed || binder`` into TurboSHAKE128 with domain byte 1 (RFC 9861) and streams its output.
XofFixedKeyAes128 (Sec. 6.2.2) is provided for completeness; Prio3 uses XofTurboShake128.
"""
from __future__ import annotations

from Crypto.Hash import TurboSHAKE128

from .field import next_power_of_2


class Xof:
    SEED_SIZE: int

    def next(self, length: int) -> bytes:  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def derive_seed(cls, seed: bytes, dst: bytes, binder: bytes) -> bytes:
        return cls(seed, dst, binder).next(cls.SEED_SIZE)

    def next_vec(self, field, length: int) -> list[int]:
        """Rejection-sample ``length`` field elements (Sec. 6.2, next_vec)."""
        m = next_power_of_2(field.MODULUS) - 1
        p = field.MODULUS
        size = field.ENCODED_SIZE
        out: list[int] = []
        while len(out) < length:
            need = length - len(out)
            buf = self.next(size * need)
            for i in range(0, len(buf), size):
                x = int.from_bytes(buf[i:i + size], "little") & m
                if x < p:
                    out.append(x)
        return out

    @classmethod
    def expand_into_vec(cls, field, seed: bytes, dst: bytes, binder: bytes, length: int) -> list[int]:
        return cls(seed, dst, binder).next_vec(field, length)


class XofTurboShake128(Xof):
    SEED_SIZE = 32

    def __init__(self, seed: bytes, dst: bytes, binder: bytes):
        if len(seed) > 255:
            raise ValueError(f"seed of {len(seed)} bytes exceeds 255")
        if len(dst) > 65535:
            raise ValueError(f"dst of {len(dst)} bytes exceeds 65535")
        self._h = TurboSHAKE128.new(domain=1)
        self._h.update(len(dst).to_bytes(2, "little") + dst + len(seed).to_bytes(1, "little")
                       + seed + binder)

    def next(self, length: int) -> bytes:
        return self._h.read(length)


class XofFixedKeyAes128(Xof):
    """Fixed-key AES-128 XOF (Sec. 6.2.2); the key is TurboSHAKE128(domain 2) of dst and binder."""

    SEED_SIZE = 16

    def __init__(self, seed: bytes, dst: bytes, binder: bytes):
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        if len(seed) != self.SEED_SIZE:
            raise ValueError(f"seed must be {self.SEED_SIZE} bytes, got {len(seed)}")
        if len(dst) > 65535:
            raise ValueError(f"dst of {len(dst)} bytes exceeds 65535")
        h = TurboSHAKE128.new(domain=2)
        h.update(len(dst).to_bytes(2, "little") + dst + binder)
        key = h.read(16)
        self._enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
        self._seed = seed
        self._used = 0

    def _hash_block(self, block: bytes) -> bytes:
        lo, hi = block[:8], block[8:]
        sigma = hi + bytes(a ^ b for a, b in zip(hi, lo))
        enc = self._enc.update(sigma)
        return bytes(a ^ b for a, b in zip(enc, sigma))

    def next(self, length: int) -> bytes:
        offset = self._used % 16
        end = self._used + length
        blocks = []
        for i in range(self._used // 16, end // 16 + 1):
            ctr = i.to_bytes(16, "little")
            blocks.append(self._hash_block(bytes(a ^ b for a, b in zip(self._seed, ctr))))
        self._used = end
        return b"".join(blocks)[offset:offset + length]
