"""Malicious clients in simulation: :class:`ClientPolicy`, the client-side twin of
:class:`~securefkm.federation.runtime.ServerPolicy`.

``Federation(..., client_policies={client_id: policy})`` (and every estimator's
``fit(..., client_policies=...)``) hands some clients a policy. The client still computes
its honest update and its honest answer to every stage; the policy then sees them and says
what actually leaves the client:

* :meth:`ClientPolicy.update` rewrites the client's update *before* the client-side layers
  (clipping, rounding, noise, encoding): a poisoning client;
* :meth:`ClientPolicy.reply` rewrites any outgoing message at any stage: the ``update``
  stage's :class:`~securefkm.federation.client.UpdateReply`, the aggregator's stages
  (pairwise masking's ``advertise``, ``share``, ``masked_input``, ``consistency_check``,
  ``unmask``; Paillier's input), and the aggregator's first stage when the transport fuses
  it into the update exchange (the policy is then asked about that stage first, with its
  own stage name, exactly as if it had been a separate exchange, and then about the
  ``update`` reply that carries it). It may return :data:`ClientPolicy.SILENT` (the client
  says nothing: a dropout at that stage) or a :class:`Refusal` (the client refuses, as an
  honest client refuses a malformed request).

Policies run on the client side of :func:`~securefkm.federation.client.serve`, the one
loop of every simulation backend, so they act the same in process, in worker processes and
in Ray actors. A policy object is copied into the worker that holds its client (it must be
picklable) and keeps its own state there across the rounds of the fit (e.g. the messages
it sent earlier, to replay them); the driver's object is not updated. Randomness a policy
uses should be derived from the context (``np.random.default_rng((seed, ctx.run,
ctx.round, ctx.attempt, ctx.client_id))``) so the backends agree exactly.

A policy must not modify ``honest_reply`` or ``request`` in place (they may be shared with
the honest session or with other clients): copy what it changes.

A reply that is not even a well-formed message of its stage (for the ``update`` stage: not
an :class:`UpdateReply` with the honest reply's set-field names, shapes and dtypes; for the
aggregator's stages: not of the honest reply's type; for any stage: not picklable) never
reaches the server: the simulated transport records it in ``Transport.faults`` for the
round, as a deployment's transport records a message that fails to decode, and the client
is treated as silent for the rest of the round. Everything else reaches the server session,
whose checks decide (docs/trust-model.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class _Silent:
    """The marker :data:`ClientPolicy.SILENT` (one object, also after pickling)."""

    _instance: _Silent | None = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self):
        return (_Silent, ())

    def __repr__(self) -> str:
        return "ClientPolicy.SILENT"


#: a policy's reply meaning "send nothing at this stage" (the client drops out there)
SILENT = _Silent()


@dataclass(frozen=True)
class Refusal:
    """A refusal: what :meth:`ClientPolicy.reply` receives as ``honest_reply`` when the honest
    client refused the stage's message, and what it returns to make the client refuse."""

    reason: str


@dataclass
class PolicyContext:
    """What a policy knows when it is asked: whose message, which stage, which round.

    ``client`` is the client's :class:`~securefkm.federation.client.ClientRuntime` (its
    records, its persistent ``context.state``, its open aggregator ``session``): a malicious
    client knows everything the client knows. ``round_context`` is the round's
    :class:`~securefkm.layers.RoundContext` (the specs, the sampled clients, the broadcast).
    """

    client_id: int
    stage: str
    run: int
    round: int
    attempt: int
    round_context: Any = None
    client: Any = None

    @property
    def session(self):
        """The client's aggregator session this round (None if it has none)."""
        return getattr(self.client, "session", None)


class ClientPolicy:
    """What a simulated client actually sends. The base class is honest: it changes nothing.

    Subclass it and override :meth:`update` and/or :meth:`reply`; keep any state on
    ``self`` (it persists across the fit's rounds on the client's side). See the module
    docstring for where it runs and what the transport does with a malformed reply.
    """

    #: return it from :meth:`reply` to send nothing at that stage
    SILENT = SILENT
    #: return ``ClientPolicy.Refusal(reason)`` from :meth:`reply` to refuse the stage
    Refusal = Refusal

    def update(self, update, ctx: PolicyContext):
        """The client's :class:`~securefkm.messages.Update` before the client-side layers;
        return the update the client goes on with (poisoning attacks replace its fields)."""
        return update

    def reply(self, stage: str, request, honest_reply, ctx: PolicyContext):
        """What the client sends at ``stage`` in answer to ``request``: ``honest_reply`` (the
        honest client's answer, or a :class:`Refusal`), a replacement, :data:`SILENT` or a
        :class:`Refusal`."""
        return honest_reply
