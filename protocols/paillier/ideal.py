"""The ideal functionality of :class:`~protocols.paillier.layer.Paillier` (``crypto="ideal"``).

A trusted party receives every client's encoded signed values and gives the server what the
real protocol gives it: the exact sum over the clients whose contribution arrived, if at
least ``min_clients`` did (the layer's and, for a given authority, the authority's own
threshold), else the same abort. No key generation, encryption or decryption; the clients
encode and range-check their values exactly as under the real protocol (the slot layout is
the real key size's), and refuse a round ticket for another broadcast exactly as a real
client does, so the model-inconsistency attack drops the same clients. The sums are exact
integers either way (slot packing adds values exactly), decoded by the same codec: the
release is bit-identical (``tests/test_ideal.py``).

Not for deployments: it trusts the simulation's process to hold every input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securefkm.exceptions import InputError
from securefkm.layers import ClientSession, ProtocolRefusal, ServerSession

from ..masking.ideal import Sealed
from .authority import STAGE, AuthorityRefusal
from .layer import Paillier
from .packing import layout_for_key


@dataclass
class _IdealAuthority:
    """What ``Paillier.report()`` reads of an authority; nothing is decrypted here."""

    key_size: int
    min_clients: int
    n_decryptions: int = 0


@dataclass(frozen=True)
class IdealPaillierTicket:
    run: int
    round: int
    digest: bytes
    max_clients: int


class IdealPaillier(Paillier, ideal_of=Paillier):
    """``Paillier``'s ideal functionality: same configuration and release, no cryptography."""

    client_public_key_work = False

    @classmethod
    def of(cls, real: Paillier) -> IdealPaillier:
        ideal = cls.__new__(cls)
        ideal.__dict__.update(real.__dict__)
        return ideal

    @property
    def name(self) -> str:
        return "Paillier"

    def setup(self, info):
        if self.min_clients > info.n_clients:
            raise InputError(
                f"Paillier(min_clients={self.min_clients}) needs at least that many clients; the "
                f"federation has {info.n_clients}. Lower min_clients."
            )
        self.max_clients_ = self.max_clients or info.n_clients
        given = self._given_authority
        if given is not None:  # its public modulus fixes the slot layout; its threshold applies
            n = given.public_bundle().n
            auth_min = int(getattr(given, "min_clients", self.min_clients))
        else:  # phe draws a modulus of exactly key_size bits
            n, auth_min = (1 << self.key_size) - 1, self.min_clients
        self.authority = _IdealAuthority(int(n).bit_length(), auth_min)
        self.layout = layout_for_key(n, self.value_bits, self.max_clients_)

    def server_session(self, ctx):
        self._require_setup()
        return _IdealServer(self, ctx)

    def client_session(self, client, ctx, sums):
        return self.client_sessions([client], ctx, [sums])[0]

    def client_sessions(self, clients, ctx, sums_list):
        # every client's input encoded and range-checked in one pass; row i is what client i
        # alone holds (a failing client is re-encoded alone, so its error names the field)
        self._require_setup()
        values = self.codec.encode_signed_many(sums_list, ctx.specs, self.max_clients_)
        try:
            self.layout.check_values(values)
        except InputError:
            values = np.stack([self.encoded_values(sums, ctx) for sums in sums_list])
        round_id = (ctx.run, ctx.round, ctx.broadcast_digest)
        return [_IdealClient(v, round_id, self.max_clients_, len(ctx.sampled)) for v in values.astype(np.int64)]


class _IdealClient(ClientSession):
    def __init__(self, values, round_id, max_clients, n_sampled):
        self.values, self.round_id = values, round_id
        self.max_clients, self.n_sampled = max_clients, n_sampled

    def respond(self, stage, message):
        if stage != STAGE:
            raise ProtocolRefusal(f"Paillier client got unknown stage {stage!r}")
        if not isinstance(message, IdealPaillierTicket):
            raise ProtocolRefusal(f"expected a round ticket, got {type(message).__name__}")
        if (message.run, message.round, message.digest) != self.round_id:
            raise ProtocolRefusal("round ticket does not match the round and broadcast this client computed")
        if message.max_clients != self.max_clients or self.n_sampled > self.max_clients:
            raise ProtocolRefusal(
                f"round of {self.n_sampled} sampled clients exceeds the declared max_clients={self.max_clients}"
            )
        values, self.values = self.values, None
        return Sealed(values, message.digest)


class _IdealServer(ServerSession):
    def __init__(self, layer: IdealPaillier, ctx):
        self.layer, self.ctx = layer, ctx
        self.ticket = IdealPaillierTicket(ctx.run, ctx.round, ctx.broadcast_digest, layer.max_clients_)
        self.inputs: dict[int, np.ndarray] = {}

    def messages(self, stage, alive):
        return {c: self.ticket for c in alive}

    def receive(self, stage, replies):
        for c, r in replies.items():
            if isinstance(r, Sealed):
                self.inputs[int(c)] = r.open()

    def result(self):
        ctx, layer = self.ctx, self.layer
        n = len(self.inputs)
        too_few = layer.too_few_to_decrypt(n, ctx)
        if too_few is not None:
            raise too_few
        if n < layer.authority.min_clients:
            raise AuthorityRefusal(
                f"key authority refused to decrypt: only {n} distinct client(s); at least "
                f"min_clients={layer.authority.min_clients} required", round=ctx.round, stage=STAGE)
        if n > self.ticket.max_clients:
            raise AuthorityRefusal(
                f"key authority refused to decrypt: {n} clients exceed the slot headroom for "
                f"max_clients={self.ticket.max_clients}", round=ctx.round, stage=STAGE)
        contributors = tuple(sorted(self.inputs))
        rows = np.stack([self.inputs[c] for c in contributors])
        if layer.layout.value_bits + int(n).bit_length() <= 63:  # the int64 sum cannot wrap
            total = rows.sum(axis=0, dtype=np.int64)
        else:  # exact Python integers, as the real decryption returns
            total = np.array([sum(int(v) for v in col) for col in rows.T], dtype=object)
        layer.authority.n_decryptions += 1
        return layer.codec.decode_signed(total, ctx.specs), contributors
