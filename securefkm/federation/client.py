"""The client side of the round path, shared by the in-process runtime and the Flower app.

A :class:`ClientRuntime` holds one client's records and answers the server's messages:

* stage ``"update"``: receive the broadcast, compute the update on the local records
  (after the client-side layers' data transforms), apply the client-side layers to the
  update, keep its sum-fields for the aggregator and return its set-fields;
* every later stage: answer through the aggregator's :class:`ClientSession`.

A transport that pays per message exchange (Flower) may send the aggregator's first stage
message inside the :class:`UpdateRequest` (``then``); the client answers it right after
its update, in the same reply (``UpdateReply.then``), exactly as it would have answered a
separate message (see :meth:`Federation.run_round`).

Nothing here reads another client's data or any server state.
"""

from __future__ import annotations

import dataclasses
import operator
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..exceptions import InputError
from ..layers import Aggregator, ClientContext, Layer, ProtocolRefusal, RoundContext, RunInfo
from ..messages import check_all_sums
from .client_policy import SILENT, PolicyContext, Refusal
from .update_stage import UPDATE_STAGE, UpdateReply, UpdateRequest

#: how a client's refusal of the update stage begins when its own encoder refused its update
ENCODER_REFUSAL = "its encoder refused its update: "


def client_seed(random_state: int | None, run: int, round: int, client: int) -> np.random.SeedSequence:
    """Seed of a client's algorithm randomness in (run, round): reproducible, order-free."""
    base = [] if random_state is None else [int(random_state)]
    return np.random.SeedSequence(base + [run, round, client, 0x5EC])


class ClientRuntime:
    """One client: its records, its persistent state, its aggregator sessions."""

    def __init__(
        self,
        client_id: int,
        X: np.ndarray,
        algorithm,
        layers: list[Layer],
        aggregator: Aggregator,
        info: RunInfo,
        state: dict | None = None,
        n_records: int | None = None,
        policy=None,
    ):
        # ``X`` may be a zero-argument loader (with ``n_records``): a deployed client then
        # reads its records only for the stages that compute on them, not for every
        # aggregator stage (each Flower message is a fresh process that would re-read them)
        if callable(X):
            if n_records is None:
                raise TypeError("ClientRuntime: a loader X needs n_records")
            self._load, self._X = X, None
        else:
            self._load, self._X = None, X
            n_records = len(X)
        self.context = ClientContext(client_id=client_id, n_records=int(n_records), state=state if state is not None else {})
        self.algorithm = algorithm
        self.layers = layers
        self.aggregator = aggregator
        self.info = info
        self.session = None
        self._ctx: RoundContext | None = None  # the open round (None in a fresh deployed process)
        #: a :class:`~securefkm.federation.client_policy.ClientPolicy` rewriting what this
        #: simulated client sends (None: honest)
        self.policy = policy
        #: why this client's own encoder refused its update this round (None: it did not);
        #: :func:`serve` reports it as the client's refusal of the update stage
        self.refusal: str | None = None

    @property
    def X(self) -> np.ndarray:
        """The client's records (loaded on first use when a loader was given)."""
        if self._X is None:
            X = self._load()
            if len(X) != self.context.n_records:
                raise InputError(
                    f"client {self.client_id}: its data changed during the run ({len(X)} records, "
                    f"{self.context.n_records} when the run started); keep the data file fixed while a run is going."
                )
            self._X = X
        return self._X

    @property
    def memory(self) -> dict:
        """The algorithm's private per-client memory (inside the client's persistent state)."""
        return self.context.state.setdefault("algorithm", {})

    @property
    def client_id(self) -> int:
        return self.context.client_id

    def round_context(self, req: UpdateRequest) -> RoundContext:
        specs = self.algorithm.sum_fields(req.broadcast)
        return RoundContext(
            run=req.run,
            round=req.round,
            action=req.broadcast.action,
            sampled=req.sampled,
            specs=specs,
            info=self.info,
            broadcast_digest=req.broadcast.digest(),
            broadcast=req.broadcast,
            attempt=req.attempt,
        )

    def rng(self, req: UpdateRequest):
        if not self.algorithm.client_rng_needed(req.broadcast):
            return None
        return np.random.default_rng(client_seed(self.info.random_state, req.run, req.round, self.client_id))

    def prepared_data(self, ctx: RoundContext) -> np.ndarray:
        return prepared_datas([self], ctx)[0]

    def finish_update(self, update, ctx: RoundContext) -> UpdateReply:
        """Apply the client-side layers to a computed update and open the aggregator session."""
        return finish_updates([self], [update], ctx)[0]

    def decline(self, layer: Layer) -> UpdateReply:
        self.session, self.refusal = None, None
        return UpdateReply(declined=f"{layer.name} declined")

    def _input_sent(self, ctx: RoundContext | None) -> None:
        for layer in self.layers:
            layer.client_input_sent(self.context, ctx)

    def _respond(self, stage: str, message: Any) -> Any:
        reply = self.session.respond(stage, message)
        if self.layers and stage == self.aggregator.input_stage:
            self._input_sent(self._ctx)
        return reply

    def answer_fused(self, reply: UpdateReply, request: UpdateRequest) -> UpdateReply:
        """Answer the aggregator's first stage carried in ``request.then`` (if any)."""
        if request.then is None or self.session is None:
            return reply
        stage, message = request.then
        try:
            reply.then = self._respond(stage, message)
        except ProtocolRefusal as exc:
            reply.then_refused = str(exc)
            self.session = None
        return reply

    def refuse_round(self, ctx: RoundContext) -> UpdateReply | None:
        """The run's floor, checked on the server's request before anything is computed
        (:meth:`~securefkm.layers.Aggregator.round_refusal` against this client's own
        RunInfo): the refusal reply, or None when the round may go on. A refusing client
        opens no session and sends nothing of this round; :func:`serve` reports its reason
        as the client's refusal of the update stage."""
        why = self.aggregator.round_refusal(ctx, self.client_id)
        if why is None:
            return None
        self.session, self._ctx, self.refusal = None, ctx, why
        return UpdateReply(declined=why)  # a decline for a transport that does not convert

    def handle(self, stage: str, message: Any) -> Any:
        if stage == UPDATE_STAGE:
            ctx = self.round_context(message)
            refused = self.refuse_round(ctx)
            if refused is not None:
                return refused
            X = self.prepared_data(ctx)
            update = self.algorithm.client_update(X, message.broadcast, self.rng(message), self.memory)
            return self.answer_fused(self.finish_update(update, ctx), message)
        return self.answer(stage, message)

    def answer(self, stage: str, message: Any) -> Any:
        """:meth:`handle` for a stage after the update: the aggregator session answers."""
        if self.session is None:
            raise RuntimeError(f"client {self.client_id} got stage {stage!r} without an open round")
        return self._respond(stage, message)


_LAYERS, _AGGREGATOR = operator.attrgetter("layers"), operator.attrgetter("aggregator")


def _one_object(objects) -> bool:
    """Whether ``objects`` (at least one) are all the very same object."""
    return len(set(map(id, objects))) == 1


def batch_update(clients: list[ClientRuntime], request: UpdateRequest) -> list[UpdateReply]:
    """The ``update`` stage for many in-process clients that got the same broadcast.

    Equivalent to calling ``handle("update", request)`` on each, but lets the algorithm
    vectorise its computation across clients (:meth:`Algorithm.client_updates`).
    """
    if not clients:
        return []
    if request.then is not None:  # per-client fused stage messages: no shared request
        raise ValueError("batch_update serves unfused update requests only; call handle() per client")
    algorithm = clients[0].algorithm
    ctx = clients[0].round_context(request)
    refused = {i: r for i, c in enumerate(clients) if (r := c.refuse_round(ctx)) is not None}
    if refused:  # below the run's floor: those clients compute nothing
        taking = [c for i, c in enumerate(clients) if i not in refused]
        done = iter(batch_update(taking, request))
        return [refused[i] if i in refused else next(done) for i in range(len(clients))]
    datas = prepared_datas(clients, ctx)
    # one question for the batch: the clients share the algorithm and the broadcast
    rngs = [c.rng(request) for c in clients] if algorithm.client_rng_needed(request.broadcast) else [None] * len(clients)
    updates = algorithm.client_updates(datas, request.broadcast, rngs, _Memories(clients))
    return finish_updates(clients, updates, ctx)


class _Memories(Sequence):
    """The clients' :attr:`ClientRuntime.memory`, each looked up when the algorithm reads it
    (a one-step k-means round reads none of them)."""

    def __init__(self, clients: list[ClientRuntime]):
        self._clients = clients

    def __len__(self) -> int:
        return len(self._clients)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [c.memory for c in self._clients[i]]
        return self._clients[i].memory


def prepared_datas(clients: list[ClientRuntime], ctx: RoundContext) -> list[np.ndarray]:
    """:meth:`ClientRuntime.prepared_data` for many clients: each layer sees the round's
    records at once (:meth:`Layer.client_datas`) when the clients share their layer objects."""
    if not _one_object(map(_LAYERS, clients)):
        return [prepared_datas([c], ctx)[0] for c in clients]
    datas = [c.X for c in clients]
    for layer in clients[0].layers:
        datas = layer.client_datas(datas, [c.context for c in clients], ctx)
    return datas


def finish_updates(clients: list[ClientRuntime], updates: list, ctx: RoundContext) -> list[UpdateReply]:
    """:meth:`ClientRuntime.finish_update` for many clients: each client-side layer sees the
    round's live updates at once (:meth:`Layer.client_updates`, so e.g. DP noise shares are
    drawn in one pass) when the clients share their layer objects, as simulated clients do."""
    if any(c.policy is not None for c in clients):  # malicious clients rewrite their update first
        updates = [u if c.policy is None else c.policy.update(u, _policy_context(c, UPDATE_STAGE, ctx))
                   for c, u in zip(clients, updates)]
    return _finish_updates(clients, updates, ctx)


def _finish_updates(clients: list[ClientRuntime], updates: list, ctx: RoundContext) -> list[UpdateReply]:
    if not _one_object(map(_LAYERS, clients)):
        return [_finish_updates([c], [u], ctx)[0] for c, u in zip(clients, updates)]
    if not any(layer.side == "client" for layer in clients[0].layers):
        return open_sessions(clients, updates, ctx)
    updates = list(updates)
    declined: dict[int, Layer] = {}
    for layer in clients[0].layers:
        if layer.side != "client":
            continue
        live = [i for i in range(len(clients)) if i not in declined]
        if not live:
            break
        results = layer.client_updates([updates[i] for i in live], [clients[i].context for i in live], ctx)
        for i, update in zip(live, results):
            if update is None:
                declined[i] = layer
            updates[i] = update
    taking = [i for i in range(len(clients)) if i not in declined]
    opened = dict(zip(taking, open_sessions([clients[i] for i in taking], [updates[i] for i in taking], ctx)))
    return [c.decline(declined[i]) if i in declined else opened[i] for i, c in enumerate(clients)]


def open_sessions(clients: list[ClientRuntime], updates: list, ctx: RoundContext) -> list[UpdateReply]:
    """Hand each client's (layered) update's sum-fields to its aggregator; reply with its
    set-fields. Clients that share their aggregator object have their sessions opened at once
    (:meth:`Aggregator.client_sessions`)."""
    if not clients:
        return []
    for c in clients:
        c.refusal = None
    refusals: dict[int, str] = {}  # index in ``clients`` -> why its own encoder refused its update
    try:
        check_all_sums([u.sums for u in updates], ctx.specs)
    except InputError:  # whose update has the wrong layout: that client's refusal
        for i, u in enumerate(updates):
            try:
                check_all_sums([u.sums], ctx.specs)
            except InputError as exc:
                refusals[i] = str(exc)
    if not ctx.specs:  # no aggregator stage: the update reply itself is the input
        for c in clients:
            c.session, c._ctx = None, ctx
            c._input_sent(ctx)
    else:
        live = [i for i in range(len(clients)) if i not in refusals]
        if _one_object(map(_AGGREGATOR, clients)):
            opened = _open_isolating(clients[0].aggregator, clients, updates, live, ctx, refusals)
        else:
            opened = {}
            for i in live:
                try:
                    opened[i] = clients[i].aggregator.client_session(clients[i].context, ctx, updates[i].sums)
                except InputError as exc:
                    refusals[i] = _reason(exc)
        for i, session in opened.items():
            clients[i].session, clients[i]._ctx = session, ctx
    out = []
    for i, (c, u) in enumerate(zip(clients, updates)):
        if i in refusals:  # never a session: the client sends nothing of this round
            c.session, c._ctx, c.refusal = None, ctx, ENCODER_REFUSAL + refusals[i]
            out.append(UpdateReply(declined=c.refusal))  # a decline for a transport that does not convert
        else:
            out.append(UpdateReply(items=u.items))
    return out


def _reason(exc: Exception) -> str:
    """The client's own reason: the codec's message without the batch position."""
    return str(exc.__cause__) if getattr(exc, "row", None) is not None and exc.__cause__ is not None else str(exc)


def _open_isolating(aggregator, clients, updates, live, ctx, refusals) -> dict[int, Any]:
    """The sessions of ``clients[i]`` for ``i`` in ``live``, opened together
    (:meth:`Aggregator.client_sessions`); a client whose own encoder refuses its update
    (an :class:`InputError`: NaN, a fractional count, a value above the codec's bound) is
    left out and its reason put in ``refusals``, and the others are opened without it. The
    codec's error names the failing row (:class:`~securefkm.exceptions.EncodingError`);
    an error that does not is narrowed down by opening the clients one at a time (every
    aggregator's batch gives each client exactly the session it gives that client alone)."""
    live = list(live)
    while live:
        try:
            sessions = aggregator.client_sessions([clients[i].context for i in live], ctx,
                                                  [updates[i].sums for i in live])
        except InputError as exc:
            row = getattr(exc, "row", None)
            if isinstance(row, int) and 0 <= row < len(live):
                refusals[live.pop(row)] = _reason(exc)
                continue
            if len(live) == 1:
                refusals[live[0]] = str(exc)
                return {}
            opened = {}
            for i in live:
                opened.update(_open_isolating(aggregator, clients, updates, [i], ctx, refusals))
            return opened
        return dict(zip(live, sessions))
    return {}


def serve(
    clients: Mapping[int, ClientRuntime], stage: str, messages: dict[int, Any], faults: dict[int, str] | None = None
) -> tuple[dict[int, Any], dict[int, str]]:
    """Answer one stage's ``messages`` with in-process ``clients``: (replies, refusals).

    The one client-side loop of every simulation transport (in process, worker processes,
    Ray actors). ``update`` requests that share the very same broadcast object are served
    by :func:`batch_update` so the algorithm can vectorise; a :class:`ProtocolRefusal` in
    a later stage is the client's refusal. Later stages are answered in the order of the
    sessions' :attr:`~securefkm.layers.ClientSession.locality` when they all give one;
    replies come in the order of ``messages`` either way.

    Clients with a :class:`~securefkm.federation.client_policy.ClientPolicy` answer
    honestly first; their policy then decides what is sent (:func:`_apply_policies`). A
    policy's reply that is not a well-formed message of the stage is left out of the
    replies and recorded in ``faults`` (client -> reason), the transport's record of the
    round's undecodable messages.
    """
    replies, refused = _serve_honest(clients, stage, messages)
    policied = [c for c in messages if clients[c].policy is not None]
    if policied:
        replies, refused = _apply_policies(clients, stage, messages, replies, refused, policied,
                                           {} if faults is None else faults)
    return replies, refused


def _policy_context(client: ClientRuntime, stage: str, ctx: RoundContext | None) -> PolicyContext:
    ctx = client._ctx if ctx is None else ctx
    return PolicyContext(client.client_id, stage, getattr(ctx, "run", 0), getattr(ctx, "round", 0),
                         getattr(ctx, "attempt", 0), ctx, client)


def _malformed(stage: str, honest, out) -> str | None:
    """Why ``out`` (a policy's reply replacing ``honest``) is not a message of ``stage`` that
    a transport could deliver, or None. The update stage's schema is the honest reply's
    (an :class:`UpdateReply` with the same set-field names, shapes and dtypes); an
    aggregator stage's is the honest reply's type; every message must be picklable."""
    where = f"stage {stage!r}"
    if stage == UPDATE_STAGE and isinstance(honest, UpdateReply):
        if not isinstance(out, UpdateReply):
            return f"{where}: the reply is a {type(out).__name__}, not an UpdateReply"
        if not isinstance(out.items, dict) or set(out.items) != set(honest.items):
            got = sorted(map(str, out.items)) if isinstance(out.items, dict) else type(out.items).__name__
            return f"{where}: the reply's set-fields are {got}, not {sorted(honest.items)}"
        for name, value in out.items.items():
            ref = honest.items[name]
            if not isinstance(value, np.ndarray) or value.shape != np.shape(ref) or value.dtype != np.asarray(ref).dtype:
                return f"{where}: set-field {name!r} is not an array of shape {np.shape(ref)} and dtype {np.asarray(ref).dtype}"
        for name in ("declined", "then_refused"):
            if getattr(out, name) is not None and not isinstance(getattr(out, name), str):
                return f"{where}: the reply's {name} is a {type(getattr(out, name)).__name__}, not a str or None"
    elif not isinstance(honest, Refusal) and honest is not None and type(out) is not type(honest):
        return f"{where}: the reply is a {type(out).__name__}, not a {type(honest).__name__}"
    try:
        pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        return f"{where}: the reply cannot be serialised ({type(exc).__name__})"
    return None


def _through_wire(stage: str, out, fused: str | None):
    """(why ``out`` fails the deployment's wire schema of the stage's reply, or None; the
    message as a deployed server would decode it). A stage without a wire schema (an ideal
    functionality's) keeps the type check of :func:`_malformed` alone."""
    from ..flower import _wire  # the schemas the Flower transport checks every reply against

    if (stage, "reply") not in _wire.MESSAGES:
        return None, out
    try:
        return None, _wire.decode(stage, "reply", _wire.encode(stage, "reply", out, fused=fused), fused=fused)
    except _wire.WireError as exc:
        return f"stage {stage!r}: {exc}", None


def _policy_reply(client: ClientRuntime, stage: str, request, honest, ctx: PolicyContext, faults: dict):
    """The policy's answer to one message: (reply or SILENT or a Refusal); a malformed reply
    (:func:`_malformed`, then the deployment's wire schema of the stage) is recorded in
    ``faults`` and turned into SILENT; a well-formed one is delivered as a deployed server
    would decode it."""
    out = client.policy.reply(stage, request, honest, ctx)
    if out is honest or out is SILENT:
        return out
    if isinstance(out, Refusal):
        return out if isinstance(out.reason, str) else Refusal(repr(out.reason))
    why = _malformed(stage, honest, out)
    if why is None:
        fused = request.then[0] if stage == UPDATE_STAGE and getattr(request, "then", None) else None
        why, out = _through_wire(stage, out, fused)
    if why is not None:
        faults.setdefault(client.client_id, why)
        return SILENT
    return out


def _apply_policies(clients, stage, messages, replies, refused, policied, faults):
    """Each policied client's honest reply (or refusal) replaced by what its policy sends."""
    for c in policied:
        client = clients[c]
        honest = replies.get(c, Refusal(refused[c]) if c in refused else None)
        if honest is None:  # the client had nothing to say (it dropped): nothing to rewrite
            continue
        ctx = _policy_context(client, stage, None)
        if stage == UPDATE_STAGE:
            own = client._ctx
            same = own is not None and (own.run, own.round, own.attempt) == (
                messages[c].run, messages[c].round, messages[c].attempt)
            ctx.round_context = own if same else None
            ctx.run, ctx.round, ctx.attempt = messages[c].run, messages[c].round, messages[c].attempt
            request = messages[c]
            if isinstance(honest, UpdateReply) and request.then is not None and (
                    honest.then is not None or honest.then_refused is not None):
                # the fused first stage: asked about under its own stage name, first
                first_stage, first_message = request.then
                first_honest = honest.then if honest.then_refused is None else Refusal(honest.then_refused)
                first_ctx = dataclasses.replace(ctx, stage=first_stage)
                first = _policy_reply(client, first_stage, first_message, first_honest, first_ctx, faults)
                if first is not first_honest:
                    then, then_refused = (None, None) if first is SILENT else (
                        (None, first.reason) if isinstance(first, Refusal) else (first, None))
                    honest = dataclasses.replace(honest, then=then, then_refused=then_refused)
                if c in faults:  # its fused message did not decode: the whole reply is lost
                    replies.pop(c, None)
                    continue
        out = _policy_reply(client, stage, messages[c], honest, ctx, faults)
        replies.pop(c, None)
        refused.pop(c, None)
        if isinstance(out, Refusal):
            refused[c] = out.reason
        elif out is not SILENT:
            replies[c] = out
    replies = {c: replies[c] for c in messages if c in replies}
    refused = {c: refused[c] for c in messages if c in refused}
    return replies, refused


def _serve_updates(clients: Mapping[int, ClientRuntime], messages: dict[int, Any]) -> dict[int, Any]:
    """The update stage of :func:`_serve_honest`: every client's :class:`UpdateReply`."""
    first = next(iter(messages.values()), None)
    if first is not None and first.then is None and _one_object(messages.values()):  # one shared request
        return dict(zip(messages, batch_update([clients[c] for c in messages], first)))
    replies: dict[int, Any] = {}
    groups: dict[int, list[int]] = {}
    for c, message in messages.items():
        if message.then is not None:  # fused first stage: per-client answers
            replies[c] = clients[c].handle(UPDATE_STAGE, message)
            continue
        groups.setdefault(id(message.broadcast), []).append(c)
    for members in groups.values():
        outs = batch_update([clients[c] for c in members], messages[members[0]])
        replies.update(zip(members, outs))
    return {c: replies[c] for c in messages}


def _serve_honest(
    clients: Mapping[int, ClientRuntime], stage: str, messages: dict[int, Any]
) -> tuple[dict[int, Any], dict[int, str]]:
    """:func:`serve` for honest clients (and the honest answers policies start from)."""
    if stage == UPDATE_STAGE:
        replies = _serve_updates(clients, messages)
        refused = {c: clients[c].refusal for c in messages if clients[c].refusal is not None}
        if refused:  # a client whose own encoder refused its update: that client's refusal
            replies = {c: r for c, r in replies.items() if c not in refused}
        return replies, refused
    replies: dict[int, Any] = {}
    refused: dict[int, str] = {}
    order = list(messages)
    places = [getattr(clients[c].session, "locality", None) for c in order]
    reorder = bool(places) and None not in places
    if reorder:  # the sessions' preferred order (ClientSession.locality); the same replies
        order = [c for _, c in sorted(zip(places, order))]
    for c in order:
        try:
            replies[c] = clients[c].answer(stage, messages[c])
        except ProtocolRefusal as exc:
            refused[c] = str(exc)
    if reorder:
        replies = {c: replies[c] for c in messages if c in replies}
        refused = {c: refused[c] for c in messages if c in refused}
    return replies, refused
