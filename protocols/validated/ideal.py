"""The ideal functionality of :class:`~protocols.validated.layer.ValidatedAggregation` (``crypto="ideal"``).

A trusted party receives every client's integer measurement, applies the validity predicate
the circuit proves (:func:`~protocols.validated.measurement.is_valid`), names each invalid
client with the reason the real protocol gives, and releases the exact integer sum of the
valid ones, decoded by the same layout: the release, the contributors and the faults are
those of the real protocol (a valid report always verifies; an invalid one fails except
with the FLP's soundness error), without sharding, proofs, HPKE or signatures. Clients
check the round's ticket exactly as a real client does.

Not for deployments: it trusts the simulation's process to hold every input.
"""

from __future__ import annotations

from dataclasses import dataclass

from securefkm.layers import ClientSession, ProtocolRefusal, ServerSession

from ..masking.ideal import Sealed
from . import helper as H
from .layer import ValidatedAggregation
from .measurement import is_valid


@dataclass(frozen=True)
class IdealValidationTicket:
    run: int
    round: int
    attempt: int
    digest: bytes
    k: int
    widths: tuple
    frac_bits: int
    noise: H.NoisePlan | None = None
    votes: tuple | None = None


class _IdealHelper:
    """What the layer's ``report()`` reads of a Helper."""

    def __init__(self, min_clients):
        self.min_clients, self.n_aggregates = min_clients, 0


class IdealValidatedAggregation(ValidatedAggregation, ideal_of=ValidatedAggregation):
    """``ValidatedAggregation``'s ideal functionality: same configuration and release, no cryptography."""

    client_public_key_work = False

    @classmethod
    def of(cls, real: ValidatedAggregation) -> IdealValidatedAggregation:
        ideal = cls.__new__(cls)
        ideal.__dict__.update(real.__dict__)
        return ideal

    @property
    def name(self) -> str:
        return "ValidatedAggregation"

    def setup(self, info):
        given = self._given_helper
        self._given_helper = None
        try:
            super().setup(info)
        finally:
            self._given_helper = given
        self.helper = _IdealHelper(self.min_clients if given is None else given.min_clients)

    def provision_client(self, client):
        pass

    def client_session(self, client, ctx, sums):
        lay = self.layout(ctx)
        counts, shifted, *votes = lay.measurement(sums)
        ident = (ctx.run, ctx.round, ctx.attempt, ctx.broadcast_digest, lay.k, lay.widths, lay.frac_bits,
                 self.noise_plan(ctx, lay), lay.vote_shape)
        return _IdealClient((counts, shifted, self.n_max(client.client_id, client.n_records),
                             votes[0] if votes else None), ident)

    def server_session(self, ctx):
        return _IdealServer(self, ctx)


class _IdealClient(ClientSession):
    def __init__(self, measurement, ident):
        self.measurement, self.ident = measurement, ident

    def respond(self, stage, message):
        if stage != H.STAGE:
            raise ProtocolRefusal(f"validated-aggregation client got unknown stage {stage!r}")
        if not isinstance(message, IdealValidationTicket):
            raise ProtocolRefusal(f"expected a round ticket, got {type(message).__name__}")
        t = message
        if (t.run, t.round, t.attempt, t.digest) != self.ident[:4]:
            raise ProtocolRefusal("round ticket does not match the round and broadcast this client computed")
        if (t.k, t.widths, t.frac_bits) != self.ident[4:7]:
            raise ProtocolRefusal("round ticket's circuit parameters (clusters, box widths, frac_bits) differ from "
                                  "this client's own")
        if t.votes != self.ident[8]:
            raise ProtocolRefusal("round ticket's circuit parameters (clusters, box widths, frac_bits, votes) differ "
                                  "from this client's own")
        if t.noise != self.ident[7]:
            raise ProtocolRefusal("round ticket's DP noise plan (the noise the Helper adds) differs from this client's "
                                  "own calibration of the round")
        m, self.measurement = self.measurement, None
        return Sealed(m, t.digest)


class _IdealServer(ServerSession):
    def __init__(self, layer, ctx):
        self.layer, self.ctx = layer, ctx
        self.lay = layer.layout(ctx)
        self.ticket = IdealValidationTicket(ctx.run, ctx.round, ctx.attempt, ctx.broadcast_digest, self.lay.k, self.lay.widths,
                              self.lay.frac_bits, layer.noise_plan(ctx, self.lay), self.lay.vote_shape)
        self.valid: dict[int, tuple] = {}

    def messages(self, stage, alive):
        return {c: self.ticket for c in alive}

    def receive(self, stage, replies):
        for c, r in replies.items():
            if not isinstance(r, Sealed):
                continue
            counts, shifted, _, votes = m = r.open()
            if is_valid(counts, shifted, self.layer.n_max(int(c)), self.lay.widths, votes):
                self.valid[int(c)] = m
            else:
                self.faults[int(c)] = f"stage {H.STAGE!r}: {H.INVALID}"

    def result(self):
        layer, ctx = self.layer, self.ctx
        accepted = tuple(sorted(self.valid))
        too_few = layer.too_few(len(accepted), ctx)
        if too_few is not None:
            raise too_few
        if len(accepted) < layer.helper.min_clients:
            raise H.HelperRefusal(f"helper refuses to release an aggregate share: only {len(accepted)} client(s); at "
                                  f"least min_clients={layer.helper.min_clients} required (nothing was released)",
                                  round=ctx.round, stage=H.STAGE)
        k, d = self.lay.k, self.lay.d
        counts = [sum(self.valid[c][0][j] for c in accepted) for j in range(k)]
        shifted = [[sum(self.valid[c][1][j][e] for c in accepted) for e in range(d)] for j in range(k)]
        if self.ticket.noise is not None:  # the Helper's noise, drawn as the real Helper draws it
            n_c, n_t = H.release_noise(self.ticket.noise, k, layer.noise_sources(ctx))
            counts = [c + n for c, n in zip(counts, n_c)]
            shifted = [[t + n for t, n in zip(row, nrow)] for row, nrow in zip(shifted, n_t)]
        votes = None
        if self.lay.votes is not None:
            _, vd, vb = self.lay.votes
            votes = [[[sum(self.valid[c][3][j][e][b] for c in accepted) for b in range(vb)] for e in range(vd)]
                     for j in range(k)]
        layer.helper.n_aggregates += 1
        return self.lay.decode(counts, shifted, votes), accepted
