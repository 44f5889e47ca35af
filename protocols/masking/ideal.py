"""The ideal functionality of :class:`~protocols.masking.layer.PairwiseMasking` (``crypto="ideal"``).

A trusted party receives every client's encoded input and gives the server exactly what the
real protocol (Bonawitz et al. 2017, Fig. 4; the SecAgg+ graph of Bell et al. 2020) gives it
for the same dropouts: the sum modulo ``2**64`` of the encoded inputs of the clients whose
masked input arrived (``U3``), or an abort at the same stage for the same reason. This is the
simulation of a secure-sum intrinsic, as TensorFlow Federated's simulation runs
``federated_secure_sum``: no key agreement, no Shamir sharing, no mask expansion; the
clients still encode their values exactly as under the real protocol (and every client-side
layer -- DP noise shares, rounding, caps -- runs for real before it).

Why the release is the same (honest server, honest clients; the simulation's only faults are
dropouts at chosen stages and the server policy's choice of broadcasts). Malicious clients are
not simulated: a fit with a ``ClientPolicy`` that rewrites a client's messages is refused
under ``crypto="ideal"`` (the real protocol's checks decide what such a message does); a
policy that only rewrites the update before the client-side layers is simulated exactly. Write ``H(c) = {c} u N(c)``
for a client's holders, ``t`` the Shamir threshold, ``m`` the minimum survivors, ``q`` the
consistency quorum. The real protocol's decisions depend only on who answered which stage:

* ``advertise``: ``U1`` = answering sampled clients; abort if ``|U1| < m``.
* ``share``: client ``c`` refuses if ``|H(c) n U1| < t``; ``U2`` = the others that answer;
  abort if ``|U2| < m``.
* ``masked_input``: ``c`` refuses if ``1 + |N(c) n U2| < t`` (too few peers sent shares);
  ``U3`` = the answering others; abort if ``|U3| < m``.
* ``consistency_check`` (``sign_keys``): ``c`` refuses if ``1 + |N(c) n U3| < t``; the signers
  ``Sig``; abort if ``|Sig| < q``.
* ``unmask``: ``c`` (in ``U3``, with ``sign_keys`` in ``Sig``) refuses if fewer than ``q`` of
  ``H(c)`` signed, or ``1 + |N(c) n U3| < t``; ``R`` = the answering others. The server needs,
  for every survivor ``o`` (in id order), ``|R n H(o)| >= t`` self-mask shares, then for every
  dropped ``v`` in ``U2 \\ U3``, ``|R n N(v)| >= t`` mask-key shares, else it aborts naming the
  first short owner.
* The masks cancel iff every pair of neighbouring survivors bound them to the same broadcast
  digest, and every survivor next to a dropped client bound them to the digest the server
  uses to remove that client's masks (``bind_broadcast``); otherwise the check slot fails and
  the round aborts (the model-inconsistency attack is caught): a ``ServerMisbehaviourError``
  when some survivor answered the consistency check over a broadcast digest other than the
  server's (the real server holds its signature over that digest), else a
  ``RoundAbortedError`` with cause ``"unattributed_check_failure"``. With cancelling masks the
  unmasked sum *is* the modular sum of the encoded inputs of ``U3``, decoded by the same codec.

The functionality below evaluates exactly these rules, and tells each client (through its own
message) whether its honest counterpart would refuse, so the transport drops the same clients
as under the real protocol. ``tests/test_ideal.py`` checks bit-identical centres, aborts,
transcripts' released fields and attack reports over a matrix of algorithms, dropouts at every
stage, thresholds and graphs. The one difference: an abort on the check slot cannot quote the
value the real check slot read (random under the real protocol).

The server's transcript records :class:`Sealed` objects at ``masked_input``: a handle the
functionality empties on receipt, so no client's input is readable from the transcript.
"""

from __future__ import annotations

import numpy as np

from securefkm.exceptions import RoundAbortedError
from securefkm.layers import ClientSession, ProtocolRefusal, ServerSession

from .layer import PairwiseMasking
from .server import RoundChecks

#: the functionality's message "go on" (shared, never mutated)
_GO: dict = {}


class Sealed:
    """A client's encoded input handed to the ideal functionality (never to the server).

    The functionality takes the value out on receipt (:meth:`open`); what stays in the
    transcript is an empty handle whose repr reveals nothing."""

    __slots__ = ("_value", "digest")

    def __init__(self, value: np.ndarray, digest: bytes):
        self._value = value
        self.digest = digest

    def open(self) -> np.ndarray:
        value, self._value = self._value, None
        if value is None:
            raise RuntimeError("a sealed input was opened twice")
        return value

    def __repr__(self) -> str:
        return "Sealed(<input held by the ideal functionality>)"

    def __getstate__(self):
        return {"_value": self._value, "digest": self.digest}

    # a saved transcript (securefkm._codec) keeps what the server holds: the digest, never the input
    def _codec_state(self) -> dict:
        return {"digest": self.digest}

    @classmethod
    def _codec_restore(cls, fields: dict) -> "Sealed":
        if set(fields) != {"digest"} or not isinstance(fields["digest"], bytes):
            raise ValueError("a Sealed handle holds exactly its digest (bytes)")
        return cls(None, fields["digest"])

    def __setstate__(self, state):
        self._value, self.digest = state["_value"], state["digest"]


class IdealMasking(PairwiseMasking, ideal_of=PairwiseMasking):
    """``PairwiseMasking``'s ideal functionality: same configuration, same release, no cryptography.

    Built by :meth:`PairwiseMasking.ideal` (``crypto="ideal"``); its name and repr are the real
    layer's, so transcripts and reports read the same. Not for deployments (a Flower run with
    ``crypto="ideal"`` is refused): it trusts the simulation's process to hold every input.
    """

    client_public_key_work = False
    #: the functionality simulates honest clients only: a ClientPolicy that rewrites a client's
    #: messages (``ClientPolicy.reply``) needs the real protocol (crypto="real"); one that only
    #: rewrites the update (poisoning, before the client-side layers) is simulated exactly
    simulates_client_replies = False

    @classmethod
    def of(cls, real: PairwiseMasking) -> IdealMasking:
        ideal = cls.__new__(cls)
        ideal.__dict__.update(real.__dict__)
        ideal.registry = None  # no identity keys: the functionality authenticates everyone
        return ideal

    @property
    def name(self) -> str:
        return "PairwiseMasking"

    def setup(self, info):
        registry, self.registry = self.registry, None
        try:
            super().setup(info)  # the configuration checks, without provisioning identity keys
        finally:
            self.registry = registry

    def server_session(self, ctx):
        self.codec.check_capacity(ctx.specs, len(ctx.sampled))
        return _IdealServer(ctx, self.plan(ctx), self.codec, bind_broadcast=self.bind_broadcast,
                            consistency=self.sign_keys, statement=self._statement(ctx))

    def _statement(self, ctx) -> bytes:
        """The digest the real clients sign at the consistency check (the real layer's)."""
        statement = getattr(self, "statement_digest", None)
        return statement(ctx) if self.sign_keys and callable(statement) else ctx.broadcast_digest

    def client_session(self, client, ctx, sums):
        return self.client_sessions([client], ctx, [sums])[0]

    def client_sessions(self, clients, ctx, sums_list):
        # every client's input encoded in one pass; row i is what client i alone would encode
        plan = self.plan(ctx)
        vectors = np.empty((len(sums_list), plan.length), dtype=np.uint64)
        vectors[:, :-1] = self.codec.encode_signed_many(sums_list, ctx.specs, len(ctx.sampled)).view(np.uint64)
        vectors[:, -1] = 1  # the check slot, as under the real protocol
        digest = ctx.broadcast_digest if self.bind_broadcast else b""
        statement = self._statement(ctx)
        return [_IdealClient(vector, digest, statement) for vector in vectors]


class _IdealClient(ClientSession):
    """Answers each stage; refuses exactly where its real counterpart would (told by the
    functionality, which sees the same public facts the real client would)."""

    def __init__(self, vector: np.ndarray, digest: bytes, statement: bytes = b""):
        self.vector = vector
        self.digest = digest
        self.statement = statement

    def respond(self, stage, message):
        if isinstance(message, dict) and message.get("refuse"):
            raise ProtocolRefusal(message["refuse"])
        if stage == "masked_input":
            vector, self.vector = self.vector, None
            return Sealed(vector, self.digest)
        if stage == "consistency_check":
            return self.statement  # what the real client signs: the server checks it against its own
        return True  # answered: the functionality needs nothing else from an honest client


class _IdealServer(RoundChecks, ServerSession):
    def __init__(self, ctx, plan, codec, *, bind_broadcast: bool, consistency: bool, statement: bytes = b""):
        self.ctx, self.plan, self.codec = ctx, plan, codec
        self.statement = statement
        self.other_digests: dict[int, bytes] = {}
        self.server_digest = ctx.broadcast_digest if bind_broadcast else b""
        self.consistency = consistency
        self.t, self.m, self.q = plan.t_share, plan.min_survivors, plan.consistency_quorum
        self.u1: set[int] = set()
        self.u2: set[int] = set()
        self.u3: list[int] = []
        self.signers: set[int] = set()
        self.answered_unmask: set[int] = set()
        self.digests: dict[int, bytes] = {}
        self.acc = np.zeros(plan.length, dtype=np.uint64)
        g = plan.graph
        if g.kind != "complete":  # the Harary ring in position space: ring[i] = positions of i's neighbours
            n, half = len(g.order), g.degree // 2
            offs = np.concatenate([np.arange(1, half + 1), -np.arange(1, half + 1)])
            self._ring = (np.arange(n)[:, None] + offs) % n
            self._pos = {int(c): i for i, c in enumerate(g.order.tolist())}

    # -------------------------------------------------------------- helpers
    def _counter(self, members):
        """``c -> |N(c) n members|`` (the complete graph: everyone else that is a member); on
        the sparse graph one vectorised pass over the ring for all clients at once."""
        if self.plan.graph.kind == "complete":
            size = len(members)
            return lambda c: size - (c in members)
        member = np.zeros(len(self._ring), dtype=bool)
        member[[self._pos[v] for v in members]] = True
        counts = member[self._ring].sum(axis=1)
        return lambda c: int(counts[self._pos[c]])

    def _refusals(self, clients, members, why: str) -> dict[int, dict]:
        if self.plan.graph.kind == "complete" and len(members) >= self.t:
            return dict.fromkeys(clients, _GO)  # everyone holds enough: nobody refuses
        count, out = self._counter(members), {}
        for c in clients:
            have = 1 + count(c)
            out[c] = {"refuse": f"client {c} refuses: {why} ({have} < threshold {self.t})"} if have < self.t else _GO
        return out

    # -------------------------------------------------------------- messages
    def messages(self, stage, alive):
        alive = [int(c) for c in alive]
        if stage == "advertise":
            return dict.fromkeys(alive, _GO)
        if stage == "share":
            return self._refusals([c for c in alive if c in self.u1], self.u1,
                                  "too few of my holders advertised keys")
        if stage == "masked_input":
            return self._refusals([c for c in alive if c in self.u2], self.u2,
                                  "too few neighbours completed the share stage")
        u3 = set(self.u3)
        if stage == "consistency_check" and self.consistency:
            return self._refusals([c for c in alive if c in u3], u3, "too few of my neighbourhood survived")
        if stage == "unmask":
            if not self.consistency:
                return self._refusals([c for c in alive if c in u3], u3, "too few of my neighbourhood survived")
            out, count = {}, self._counter(self.signers)
            for c in (c for c in alive if c in self.signers):
                signed = 1 + count(c)  # c signed too
                if signed < self.q:
                    out[c] = {"refuse": f"client {c} refuses: only {signed} of my holders signed the survivor "
                                        f"list (quorum {self.q})"}
                else:
                    out.update(self._refusals([c], u3, "too few of my neighbourhood survived"))
            return out
        raise RoundAbortedError(f"unknown stage {stage!r}", round=self.ctx.round, stage=stage)

    # -------------------------------------------------------------- receive
    def receive(self, stage, replies):
        if stage == "advertise":
            self.u1 = {int(c) for c in replies if int(c) in self.plan.members}
            self._need(stage, len(self.u1), "advertised keys")
        elif stage == "share":
            self.u2 = {int(c) for c in replies if int(c) in self.u1}
            self._need(stage, len(self.u2), "completed the share stage")
        elif stage == "masked_input":
            for u in sorted(replies):
                if int(u) not in self.u2:
                    continue
                sealed = replies[u]
                if not isinstance(sealed, Sealed):
                    self._abort(stage, f"client {u} sent a malformed masked vector")
                np.add(self.acc, sealed.open(), out=self.acc)
                self.digests[int(u)] = sealed.digest
                self.u3.append(int(u))
            self._need(stage, len(self.u3), "sent masked input")
        elif stage == "consistency_check" and self.consistency:
            # the real server keeps the signatures over its own statement; one over another
            # broadcast digest is evidence that the server sent different broadcasts
            u3 = set(self.u3)
            self.signers = {int(c) for c, r in replies.items() if int(c) in u3 and r == self.statement}
            self.other_digests = {int(c): r for c, r in replies.items() if int(c) in u3 and r != self.statement}
            if len(self.signers) < self.q:
                self._abort(stage, f"only {len(self.signers)} clients signed the survivor list, fewer than the "
                                   f"quorum of {self.q} every client needs before it unmasks")
        elif stage == "unmask":
            self.answered_unmask = {int(c) for c in replies}

    # -------------------------------------------------------------- result
    def _masks_cancel(self, survivors: list[int], dropped: list[int]) -> bool:
        d = self.digests
        if self.plan.graph.kind == "complete":
            first = d[survivors[0]]
            if any(d[u] != first for u in survivors):
                return False
            return not dropped or first == self.server_digest
        # sparse graph, in position space: every survivor's neighbours that survived share its
        # digest; every survivor next to a dropped client used the server's digest
        n = len(self._ring)
        codes = {dig: k for k, dig in enumerate({d[u] for u in survivors} | {self.server_digest})}
        digest = np.full(n, -1)
        digest[[self._pos[u] for u in survivors]] = [codes[d[u]] for u in survivors]
        alive = digest >= 0
        around = digest[self._ring]
        if np.any(alive[:, None] & (around >= 0) & (around != digest[:, None])):
            return False
        if dropped:
            near = self._ring[[self._pos[v] for v in dropped]].ravel()
            near = near[alive[near]]
            if np.any(digest[near] != codes[self.server_digest]):
                return False
        return True

    def result(self):
        if not self.u3:
            self._abort("unmask", "no masked input was received")
        survivors = sorted(self.u3)
        dropped = sorted(self.u2 - set(survivors))
        R = self.answered_unmask
        count = self._counter(R)
        for kind, owners, own in (("b", survivors, 1), ("s", dropped, 0)):
            for o in owners:
                found = count(o) + (own if o in R else 0)
                if found < self.t:
                    self._abort("unmask", f"only {found} {kind}-shares of client {o} came back, threshold is "
                                          f"{self.t} ({len(R)} clients answered unmask)")
        if not self._masks_cancel(survivors, dropped):
            self._check_failure(survivors, "does not read", self.other_digests)
        sums = self.codec.decode(self.acc[:-1], tuple(self.ctx.specs))
        return sums, tuple(survivors)
