"""Prio3 (draft-irtf-cfrg-vdaf-20, Sec. 7): a VDAF from a fully linear proof on secret shares.

Operation names and byte encodings follow the draft: :meth:`Prio3.shard` (Sec. 7.2.1),
:meth:`Prio3.verify_init`, :meth:`Prio3.verifier_shares_to_message`, :meth:`Prio3.verify_next`
(Sec. 7.2.2), :meth:`Prio3.is_valid` (Sec. 7.2.3), ``agg_init/agg_update/merge``
(Sec. 7.2.4), :meth:`Prio3.unshard` (Sec. 7.2.5), auxiliary functions (Sec. 7.2.6) and the
message serialization of Sec. 7.2.7. Field elements are ints (:mod:`protocols.vdaf.field`).

A failed check raises :class:`VdafError`; so does decoding bytes that are not a well-formed
message. Only the draft's variants' registered ids (1-5) and the private-use id
:data:`CLUSTER_VALIDITY_ID` (``0xFFFF0C01``, for :class:`~protocols.vdaf.ClusterValidity`)
are used by the factories below; any other circuit must be given its own id.
"""
from __future__ import annotations

from .circuits import Count, Histogram, MultihotCountVec, Sum, SumVec
from .field import Field64, Field128, FieldDecodeError, vec_add, vec_sub
from .flp import FlpBBCGGI19, Valid
from .xof import XofTurboShake128

VERSION = 18
USAGE_MEAS_SHARE = 1
USAGE_PROOF_SHARE = 2
USAGE_JOINT_RANDOMNESS = 3
USAGE_PROVE_RANDOMNESS = 4
USAGE_QUERY_RANDOMNESS = 5
USAGE_JOINT_RAND_SEED = 6
USAGE_JOINT_RAND_PART = 7

#: Private-use algorithm id (draft Sec. 10, range 0xFFFF0000-0xFFFFFFFF) of Prio3 over
#: ClusterValidity in this library.
CLUSTER_VALIDITY_ID = 0xFFFF0C01


class VdafError(ValueError):
    """A report failed verification, or a message is not a well-formed encoding."""


def format_dst(algo_class: int, algo: int, usage: int) -> bytes:
    """Sec. 6.2.3: VERSION (1 byte) || class (1) || algorithm id (4, big-endian) || usage (2)."""
    return (VERSION.to_bytes(1, "big") + algo_class.to_bytes(1, "big") + algo.to_bytes(4, "big")
            + usage.to_bytes(2, "big"))


class Prio3:
    """Prio3 over a validity circuit ``valid``, with ``num_proofs`` proofs and ``shares`` aggregators."""

    NONCE_SIZE = 16
    ROUNDS = 1

    def __init__(self, valid: Valid, num_proofs: int = 1, shares: int = 2, algorithm_id: int = CLUSTER_VALIDITY_ID,
                 xof=XofTurboShake128):
        if not 1 <= int(num_proofs) < 256:
            raise ValueError(f"num_proofs must be in [1, 256), got {num_proofs}")
        if not 2 <= int(shares) < 256:
            raise ValueError(f"shares must be in [2, 256), got {shares}")
        if not 0 <= int(algorithm_id) < 2**32:
            raise ValueError(f"algorithm_id must fit 4 bytes, got {algorithm_id}")
        self.flp = FlpBBCGGI19(valid)
        self.field = valid.field
        self.xof = xof
        self.PROOFS = int(num_proofs)
        self.SHARES = int(shares)
        self.ID = int(algorithm_id)
        S = xof.SEED_SIZE
        self.VERIFY_KEY_SIZE = S
        self.RAND_SIZE = S * self.SHARES if self.flp.JOINT_RAND_LEN == 0 else 2 * S * self.SHARES

    # --- constructors --------------------------------------------------------------------
    @classmethod
    def for_circuit(cls, valid: Valid, num_proofs: int = 1, shares: int = 2,
                    algorithm_id: int = CLUSTER_VALIDITY_ID) -> "Prio3":
        """Prio3 over any circuit (default id: the private-use :data:`CLUSTER_VALIDITY_ID`)."""
        return cls(valid, num_proofs=num_proofs, shares=shares, algorithm_id=algorithm_id)

    @classmethod
    def count(cls, shares: int = 2) -> "Prio3":
        return cls(Count(Field64), 1, shares, 0x00000001)

    @classmethod
    def sum(cls, max_measurement: int, shares: int = 2) -> "Prio3":
        return cls(Sum(Field64, max_measurement), 1, shares, 0x00000002)

    @classmethod
    def sum_vec(cls, length: int, max_measurement: int, chunk_length: int, shares: int = 2) -> "Prio3":
        return cls(SumVec(Field128, length, max_measurement, chunk_length), 1, shares, 0x00000003)

    @classmethod
    def histogram(cls, length: int, chunk_length: int, shares: int = 2) -> "Prio3":
        return cls(Histogram(Field128, length, chunk_length), 1, shares, 0x00000004)

    @classmethod
    def multihot_count_vec(cls, length: int, max_weight: int, chunk_length: int, shares: int = 2) -> "Prio3":
        return cls(MultihotCountVec(Field128, length, max_weight, chunk_length), 1, shares, 0x00000005)

    # --- auxiliary functions (Sec. 7.2.6) ------------------------------------------------
    def domain_separation_tag(self, usage: int, ctx: bytes) -> bytes:
        return format_dst(0, self.ID, usage) + ctx

    def helper_meas_share(self, ctx, agg_id, share):
        return self.xof.expand_into_vec(self.field, share, self.domain_separation_tag(USAGE_MEAS_SHARE, ctx),
                                        bytes([agg_id]), self.flp.MEAS_LEN)

    def helper_proofs_share(self, ctx, agg_id, share):
        return self.xof.expand_into_vec(self.field, share, self.domain_separation_tag(USAGE_PROOF_SHARE, ctx),
                                        bytes([self.PROOFS, agg_id]), self.flp.PROOF_LEN * self.PROOFS)

    def expand_input_share(self, ctx, agg_id, input_share):
        if agg_id > 0:
            if len(input_share) != 2:
                raise VdafError("a helper input share is (seed, blind)")
            share, blind = input_share
            return self.helper_meas_share(ctx, agg_id, share), self.helper_proofs_share(ctx, agg_id, share), blind
        if len(input_share) != 3:
            raise VdafError("the leader input share is (meas_share, proofs_share, blind)")
        return input_share

    def prove_rands(self, ctx, prove_seed):
        return self.xof.expand_into_vec(self.field, prove_seed,
                                        self.domain_separation_tag(USAGE_PROVE_RANDOMNESS, ctx),
                                        bytes([self.PROOFS]), self.flp.PROVE_RAND_LEN * self.PROOFS)

    def query_rands(self, verify_key, ctx, nonce):
        return self.xof.expand_into_vec(self.field, verify_key,
                                        self.domain_separation_tag(USAGE_QUERY_RANDOMNESS, ctx),
                                        bytes([self.PROOFS]) + nonce, self.flp.QUERY_RAND_LEN * self.PROOFS)

    def joint_rand_part(self, ctx, agg_id, blind, meas_share, nonce):
        return self.xof.derive_seed(blind, self.domain_separation_tag(USAGE_JOINT_RAND_PART, ctx),
                                    bytes([agg_id]) + nonce + self.field.encode_vec(meas_share))

    def joint_rand_seed(self, ctx, joint_rand_parts):
        return self.xof.derive_seed(bytes(self.xof.SEED_SIZE),
                                    self.domain_separation_tag(USAGE_JOINT_RAND_SEED, ctx),
                                    b"".join(joint_rand_parts))

    def joint_rands(self, ctx, joint_rand_seed):
        return self.xof.expand_into_vec(self.field, joint_rand_seed,
                                        self.domain_separation_tag(USAGE_JOINT_RANDOMNESS, ctx),
                                        bytes([self.PROOFS]), self.flp.JOINT_RAND_LEN * self.PROOFS)

    # --- sharding (Sec. 7.2.1) -----------------------------------------------------------
    def shard(self, ctx: bytes, measurement, nonce: bytes, rand: bytes):
        """``(public_share, input_shares)``; raises ValueError for a measurement the circuit refuses."""
        return self.shard_encoded(ctx, self.flp.encode(measurement), nonce, rand)

    def shard_encoded(self, ctx: bytes, meas: list[int], nonce: bytes, rand: bytes):
        """``shard`` from an already encoded measurement (the draft's step after ``encode``).

        Honest clients use :meth:`shard`; this entry exists so tests can submit encodings
        that ``encode`` would refuse and check that verification rejects them.
        """
        if len(nonce) != self.NONCE_SIZE:
            raise ValueError(f"nonce must be NONCE_SIZE={self.NONCE_SIZE} bytes, got {len(nonce)}")
        if len(rand) != self.RAND_SIZE:
            raise ValueError(f"rand must be RAND_SIZE={self.RAND_SIZE} bytes, got {len(rand)}")
        if len(meas) != self.flp.MEAS_LEN:
            raise ValueError(f"encoded measurement length {len(meas)} != MEAS_LEN={self.flp.MEAS_LEN}")
        S = self.xof.SEED_SIZE
        seeds = [rand[i:i + S] for i in range(0, self.RAND_SIZE, S)]
        meas = [int(x) % self.field.MODULUS for x in meas]
        if self.flp.JOINT_RAND_LEN > 0:
            return self._shard_with_joint_rand(ctx, meas, nonce, seeds)
        return self._shard_without_joint_rand(ctx, meas, seeds)

    def _prove_all(self, ctx, meas, prove_seed, joint_rands):
        prove_rands = self.prove_rands(ctx, prove_seed)
        P, J = self.flp.PROVE_RAND_LEN, self.flp.JOINT_RAND_LEN
        proofs: list[int] = []
        for i in range(self.PROOFS):
            proofs += self.flp.prove(meas, prove_rands[i * P:(i + 1) * P], joint_rands[i * J:(i + 1) * J])
        return proofs

    def _shard_without_joint_rand(self, ctx, meas, seeds):
        helper_shares, prove_seed = seeds[:self.SHARES - 1], seeds[self.SHARES - 1]
        leader_meas = meas
        for j in range(self.SHARES - 1):
            leader_meas = vec_sub(self.field, leader_meas, self.helper_meas_share(ctx, j + 1, helper_shares[j]))
        leader_proofs = self._prove_all(ctx, meas, prove_seed, [])
        for j in range(self.SHARES - 1):
            leader_proofs = vec_sub(self.field, leader_proofs,
                                    self.helper_proofs_share(ctx, j + 1, helper_shares[j]))
        return None, [(leader_meas, leader_proofs, None)] + [(s, None) for s in helper_shares]

    def _shard_with_joint_rand(self, ctx, meas, nonce, seeds):
        n = self.SHARES - 1
        helper_shares = [seeds[2 * i] for i in range(n)]
        helper_blinds = [seeds[2 * i + 1] for i in range(n)]
        leader_blind, prove_seed = seeds[2 * n], seeds[2 * n + 1]
        leader_meas = meas
        parts = []
        for j in range(n):
            hm = self.helper_meas_share(ctx, j + 1, helper_shares[j])
            leader_meas = vec_sub(self.field, leader_meas, hm)
            parts.append(self.joint_rand_part(ctx, j + 1, helper_blinds[j], hm, nonce))
        parts.insert(0, self.joint_rand_part(ctx, 0, leader_blind, leader_meas, nonce))
        joint_rands = self.joint_rands(ctx, self.joint_rand_seed(ctx, parts))
        leader_proofs = self._prove_all(ctx, meas, prove_seed, joint_rands)
        for j in range(n):
            leader_proofs = vec_sub(self.field, leader_proofs,
                                    self.helper_proofs_share(ctx, j + 1, helper_shares[j]))
        shares = [(leader_meas, leader_proofs, leader_blind)]
        shares += [(helper_shares[j], helper_blinds[j]) for j in range(n)]
        return parts, shares

    # --- verification (Sec. 7.2.2) -------------------------------------------------------
    def verify_init(self, verify_key: bytes, ctx: bytes, agg_id: int, agg_param, nonce: bytes,
                    public_share, input_share):
        """``(verify_state, verifier_share)`` of aggregator ``agg_id``."""
        if not 0 <= agg_id < self.SHARES:
            raise VdafError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        if len(verify_key) != self.VERIFY_KEY_SIZE:
            raise VdafError(f"verify_key must be VERIFY_KEY_SIZE={self.VERIFY_KEY_SIZE} bytes")
        if len(nonce) != self.NONCE_SIZE:
            raise VdafError(f"nonce must be NONCE_SIZE={self.NONCE_SIZE} bytes")
        meas_share, proofs_share, blind = self.expand_input_share(ctx, agg_id, input_share)
        flp = self.flp
        if len(meas_share) != flp.MEAS_LEN or len(proofs_share) != flp.PROOF_LEN * self.PROOFS:
            raise VdafError("input share has the wrong length")
        out_share = flp.truncate(meas_share)
        joint_rands: list[int] = []
        corrected_seed = part = None
        if flp.JOINT_RAND_LEN > 0:
            if blind is None or public_share is None or len(public_share) != self.SHARES:
                raise VdafError("this circuit needs a blind and the public share's joint randomness parts")
            part = self.joint_rand_part(ctx, agg_id, blind, meas_share, nonce)
            parts = list(public_share)
            parts[agg_id] = part
            corrected_seed = self.joint_rand_seed(ctx, parts)
            joint_rands = self.joint_rands(ctx, corrected_seed)
        query_rands = self.query_rands(verify_key, ctx, nonce)
        P, Q, J = flp.PROOF_LEN, flp.QUERY_RAND_LEN, flp.JOINT_RAND_LEN
        verifiers: list[int] = []
        for i in range(self.PROOFS):
            try:
                verifiers += flp.query(meas_share, proofs_share[i * P:(i + 1) * P], query_rands[i * Q:(i + 1) * Q],
                                       joint_rands[i * J:(i + 1) * J], self.SHARES)
            except ValueError as e:
                raise VdafError(str(e)) from e
        return (out_share, corrected_seed), (verifiers, part)

    def verifier_shares_to_message(self, ctx: bytes, agg_param, verifier_shares):
        """Combine the verifier shares, decide every proof; the joint randomness seed (or None)."""
        flp = self.flp
        if len(verifier_shares) != self.SHARES:
            raise VdafError(f"expected {self.SHARES} verifier shares, got {len(verifier_shares)}")
        V = flp.VERIFIER_LEN
        verifiers = [0] * (V * self.PROOFS)
        parts = []
        for vs, part in verifier_shares:
            if len(vs) != len(verifiers):
                raise VdafError("verifier share has the wrong length")
            verifiers = vec_add(self.field, verifiers, vs)
            if flp.JOINT_RAND_LEN > 0:
                if part is None:
                    raise VdafError("verifier share lacks its joint randomness part")
                parts.append(part)
        for i in range(self.PROOFS):
            if not flp.decide(verifiers[i * V:(i + 1) * V]):
                raise VdafError("proof verifier check failed")
        return self.joint_rand_seed(ctx, parts) if flp.JOINT_RAND_LEN > 0 else None

    def verify_next(self, ctx: bytes, verify_state, verifier_message):
        """The output share, once the joint randomness check holds."""
        out_share, corrected_seed = verify_state
        if verifier_message != corrected_seed:
            raise VdafError("joint randomness check failed")
        return out_share

    def is_valid(self, agg_param, previous_agg_params) -> bool:
        return len(previous_agg_params) == 0

    # --- aggregation and unsharding (Sec. 7.2.4-7.2.5) -----------------------------------
    def agg_init(self, agg_param=None):
        return [0] * self.flp.OUTPUT_LEN

    def agg_update(self, agg_param, agg_share, out_share):
        return vec_add(self.field, agg_share, out_share)

    def merge(self, agg_param, agg_shares):
        agg = self.agg_init(agg_param)
        for a in agg_shares:
            agg = vec_add(self.field, agg, a)
        return agg

    def aggregate(self, agg_param, out_shares):
        """The aggregate share of a list of output shares (agg_init then agg_update)."""
        agg = self.agg_init(agg_param)
        for o in out_shares:
            agg = self.agg_update(agg_param, agg, o)
        return agg

    def unshard(self, agg_param, agg_shares, num_measurements: int):
        return self.flp.decode(self.merge(agg_param, agg_shares), num_measurements)

    # --- message serialization (Sec. 7.2.7) ----------------------------------------------
    def _decode_vec(self, b: bytes, n: int) -> list[int]:
        if not isinstance(b, (bytes, bytearray)):
            raise VdafError("message must be bytes")
        if len(b) != n * self.field.ENCODED_SIZE:
            raise VdafError(f"expected {n} field elements ({n * self.field.ENCODED_SIZE} bytes), got {len(b)} bytes")
        try:
            return self.field.decode_vec(bytes(b))
        except FieldDecodeError as e:
            raise VdafError(str(e)) from e

    def _check_bytes(self, b, n, what):
        if not isinstance(b, (bytes, bytearray)) or len(b) != n:
            raise VdafError(f"{what} must be {n} bytes")
        return bytes(b)

    def encode_public_share(self, public_share) -> bytes:
        return b"" if public_share is None else b"".join(public_share)

    def decode_public_share(self, encoded: bytes):
        S = self.xof.SEED_SIZE
        if self.flp.JOINT_RAND_LEN == 0:
            self._check_bytes(encoded, 0, "public share")
            return None
        b = self._check_bytes(encoded, S * self.SHARES, "public share")
        return [b[i:i + S] for i in range(0, len(b), S)]

    def encode_input_share(self, agg_id: int, input_share) -> bytes:
        if agg_id == 0:
            meas, proofs, blind = input_share
            out = self.field.encode_vec(meas) + self.field.encode_vec(proofs)
        else:
            share, blind = input_share
            out = share
        return out + (blind if blind is not None else b"")

    def decode_input_share(self, agg_id: int, encoded: bytes):
        S, E = self.xof.SEED_SIZE, self.field.ENCODED_SIZE
        jr = self.flp.JOINT_RAND_LEN > 0
        if not 0 <= agg_id < self.SHARES:
            raise VdafError(f"agg_id must be in [0, {self.SHARES}), got {agg_id}")
        if agg_id == 0:
            m, p = self.flp.MEAS_LEN, self.flp.PROOF_LEN * self.PROOFS
            b = self._check_bytes(encoded, (m + p) * E + (S if jr else 0), "leader input share")
            meas = self._decode_vec(b[:m * E], m)
            proofs = self._decode_vec(b[m * E:(m + p) * E], p)
            return meas, proofs, (b[(m + p) * E:] if jr else None)
        b = self._check_bytes(encoded, S * (2 if jr else 1), "helper input share")
        return b[:S], (b[S:] if jr else None)

    def encode_verifier_share(self, verifier_share) -> bytes:
        vs, part = verifier_share
        return self.field.encode_vec(vs) + (part if part is not None else b"")

    def decode_verifier_share(self, encoded: bytes):
        S, E = self.xof.SEED_SIZE, self.field.ENCODED_SIZE
        n = self.flp.VERIFIER_LEN * self.PROOFS
        if self.flp.JOINT_RAND_LEN > 0:
            b = self._check_bytes(encoded, n * E + S, "verifier share")
            return self._decode_vec(b[:n * E], n), b[n * E:]
        return self._decode_vec(encoded, n), None

    def encode_verifier_message(self, verifier_message) -> bytes:
        return b"" if verifier_message is None else verifier_message

    def decode_verifier_message(self, encoded: bytes):
        if self.flp.JOINT_RAND_LEN > 0:
            return self._check_bytes(encoded, self.xof.SEED_SIZE, "verifier message")
        self._check_bytes(encoded, 0, "verifier message")
        return None

    def encode_agg_share(self, agg_share) -> bytes:
        return self.field.encode_vec(agg_share)

    def decode_agg_share(self, encoded: bytes):
        return self._decode_vec(encoded, self.flp.OUTPUT_LEN)

    def encode_out_share(self, out_share) -> bytes:
        return self.field.encode_vec(out_share)
