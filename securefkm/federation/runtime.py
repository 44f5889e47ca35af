"""The server side of the round path and the in-process transport.

:class:`Federation` drives the rounds of one fit for any :class:`~securefkm.algorithms.base.Algorithm`:
it samples clients, asks the (possibly malicious) server policy what to broadcast to whom,
runs the ``update`` stage and the aggregator's stages through a :class:`Transport`, applies
the server-side layers, updates the algorithm state and records everything in the
:class:`~securefkm.transcript.Transcript`.

The transport is pluggable: :class:`LocalTransport` (default) keeps every client in this
process and injects simulated dropouts; the Flower app (``securefkm.flower``) implements
the same :class:`Transport` over the network.
"""

from __future__ import annotations

import copy
import logging
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .._validation import check_fraction_or_count, check_int
from ..exceptions import InputError, NoParticipantsError, RoundAbortedError
from ..layers import Layer, ProtocolRefusal, RoundContext, RunInfo, validate_stack
from ..messages import AggregatedUpdate, Broadcast
from ..transcript import RECORD_LEVELS, RoundRecord, StageRecord, Transcript
from .client import UPDATE_STAGE, ClientRuntime, UpdateRequest, batch_update
from .sampling import Dropouts, resolve_sample, sample_clients

log = logging.getLogger("securefkm")

#: ``crypto=`` choices: the aggregators' real protocol, or their ideal functionality
CRYPTO = ("real", "ideal")


class ServerPolicy:
    """Whom the server asks and what it sends them. The honest policy sends every sampled
    client the algorithm's broadcast. Active attacks (``attacks``) subclass this to choose
    participants or send crafted, per-client broadcasts; the clients cannot tell."""

    def plan(
        self, state, round: int, broadcast: Broadcast, sampled: tuple[int, ...], n_clients: int
    ) -> tuple[tuple[int, ...], dict[int, Broadcast]]:
        return sampled, {c: broadcast for c in sampled}

    def observe(self, record: RoundRecord) -> None:
        """Called with each completed round record (adaptive attacks learn from it)."""

    def on_abort(self, record: RoundRecord, error: Exception) -> None:
        """Called when a round aborted (e.g. a consistency check caught this policy)."""


class Transport:
    """Carries one stage's messages to clients and returns the replies of those that answered.

    ``fuse_first_stage``: a transport that pays per message exchange (a network round trip,
    a process start) sets it, and the runtime then sends the aggregator's first stage
    message inside the ``update`` request (one exchange fewer per round). The protocol is
    unchanged: every aggregator's first stage message depends only on the round's public
    facts, and the transcript records both stages as usual.
    """

    fuse_first_stage: bool = False

    def client_ids(self) -> list[int]:
        raise NotImplementedError

    def begin_round(self, ctx: RoundContext, stages: tuple[str, ...]) -> None:
        """Called before the first stage of a round."""

    def exchange(self, stage: str, messages: dict[int, Any]) -> tuple[dict[int, Any], dict[int, str]]:
        """Send ``messages`` and return (replies, refusals); a client missing from both dropped."""
        raise NotImplementedError


class LocalTransport(Transport):
    """In-process simulation: clients are :class:`ClientRuntime` objects in this process."""

    def __init__(self, clients: Sequence[ClientRuntime], dropouts: Dropouts, rng: np.random.Generator):
        self.clients = {c.client_id: c for c in clients}
        self.dropouts = dropouts
        self.rng = rng
        self._drop_at: dict[int, str] = {}
        self._gone: set[int] = set()

    def client_ids(self):
        return list(self.clients)

    def begin_round(self, ctx, stages):
        self._drop_at = self.dropouts.plan(self.rng, ctx.round, ctx.sampled, stages)
        self._gone = set()

    def _drops(self, client: int, stage: str) -> bool:
        if client in self._gone:
            return True
        if self._drop_at.get(client) == stage:
            self._gone.add(client)
            return True
        return False

    def exchange(self, stage, messages):
        if self._drop_at or self._gone:
            live = [c for c in messages if not self._drops(c, stage)]
        else:  # no simulated dropouts this round
            live = list(messages)
        replies: dict[int, Any] = {}
        refused: dict[int, str] = {}
        if stage == UPDATE_STAGE:
            # Group clients that got the very same broadcast so the algorithm can vectorise.
            groups: dict[int, list[int]] = {}
            for c in live:
                if messages[c].then is not None:  # fused first stage: per-client answers
                    replies[c] = self.clients[c].handle(stage, messages[c])
                    continue
                groups.setdefault(id(messages[c].broadcast), []).append(c)
            for members in groups.values():
                outs = batch_update([self.clients[c] for c in members], messages[members[0]])
                replies.update(zip(members, outs))
            return replies, refused
        for c in live:
            try:
                replies[c] = self.clients[c].handle(stage, messages[c])
            except ProtocolRefusal as exc:
                refused[c] = str(exc)
                self._gone.add(c)
        return replies, refused


def _copy_payload(x):
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: _copy_payload(v) for k, v in x.items()}
    return x


class Federation:
    """Rounds of one fit: the server runtime over a transport.

    Parameters mirror the estimators': ``clients_per_round`` (count or fraction),
    ``dropout_rate`` (probability or schedule, simulation only), ``max_rounds``,
    ``random_state``, ``verbose`` and the ``protection`` stack. ``n_runs`` is the number of
    runs the fit will make (``n_init``); DP layers size their budget for all of them.
    ``crypto="ideal"`` swaps the stack's secure aggregator for its ideal functionality
    (:meth:`~securefkm.layers.Aggregator.ideal`): same release, same aborts, no cryptography.
    """

    def __init__(
        self,
        algorithm,
        clients: Sequence[np.ndarray] | None = None,
        *,
        protection: Sequence[Layer] | None = None,
        clients_per_round=1.0,
        dropout_rate=None,
        max_rounds: int = 100,
        n_runs: int = 1,
        random_state=None,
        verbose: int = 0,
        record: str = "full",
        server_policy: ServerPolicy | None = None,
        transport: Transport | None = None,
        n_features: int | None = None,
        crypto: str = "real",
    ):
        self.algorithm = algorithm
        self.layers, self.aggregator = validate_stack(protection, algorithm)
        if crypto not in CRYPTO:
            raise InputError(
                f"crypto must be 'real' (run the secure aggregators' protocol) or 'ideal' (their ideal "
                f"functionality: the same release without the cryptography, for studies); got {crypto!r}."
            )
        self.crypto = crypto
        if crypto == "ideal":  # the one seam: the stack keeps its order, the aggregator is swapped
            ideal = self.aggregator.ideal()
            self.layers = [ideal if layer is self.aggregator else layer for layer in self.layers]
            self.aggregator = ideal
        self.max_rounds = check_int(max_rounds, "max_rounds", minimum=1)
        self.n_runs = check_int(n_runs, "n_runs", minimum=1)
        if record not in RECORD_LEVELS:
            raise InputError(f"record must be one of {RECORD_LEVELS}, got {record!r}.")
        if random_state is not None and not isinstance(random_state, (int, np.integer)):
            raise InputError("Federation random_state must be an int or None (estimators convert Generators).")
        self.random_state = None if random_state is None else int(random_state)
        seq = np.random.SeedSequence(self.random_state)
        server_seq, drop_seq, self._algo_seq = seq.spawn(3)
        self.rng = np.random.default_rng(server_seq)
        self.verbose = verbose
        self.policy = server_policy or ServerPolicy()
        if transport is None or clients is not None:
            if clients is None:
                raise InputError("Federation needs client arrays or a transport.")
            n_clients = len(clients)
            n_features = clients[0].shape[1]
            sizes = tuple(len(x) for x in clients)
        if transport is not None:
            n_clients = len(transport.client_ids())
            sizes = None
            if n_features is None:
                raise InputError("Federation over a remote transport needs n_features.")
        self.n_clients = n_clients
        self.clients_per_round = check_fraction_or_count(clients_per_round, "clients_per_round", n_clients)
        self.info = RunInfo(
            algorithm=algorithm,
            n_clients=n_clients,
            n_features=n_features,
            clients_per_round=self.clients_per_round,
            max_rounds=self.max_rounds,
            planned_rounds=self.n_runs * algorithm.planned_rounds(self.max_rounds),
            random_state=self.random_state,
            client_sizes=sizes,
        )
        for layer in self.layers:
            layer.setup(self.info)
        if transport is None:
            runtimes = [
                ClientRuntime(i, X, algorithm, self.layers, self.aggregator, self.info)
                for i, X in enumerate(clients)
            ]
            transport = LocalTransport(runtimes, Dropouts(dropout_rate), np.random.default_rng(drop_seq))
        elif dropout_rate:
            raise InputError("dropout_rate is a simulation parameter; a remote transport has real dropouts.")
        self.transport = transport
        self.transcript = Transcript(
            meta={
                "algorithm": algorithm.name,
                "n_clients": n_clients,
                "n_features": n_features,
                "protection": tuple(repr(layer) for layer in self.layers),
                "aggregator": self.aggregator.name,
                "clients_per_round": self.clients_per_round,
                "crypto": crypto,
            },
            level=record,
        )
        self._round_counter = 0  # global across runs: dropout schedules count from 0
        self.elapsed = 0.0

    # ------------------------------------------------------------------ rounds
    def run(self, run: int = 0):
        """One complete run of the algorithm from a fresh init; returns the final state.

        ``max_rounds`` bounds the algorithm's own round counter (``state.round``: training
        rounds); seeding and score rounds do not use it up. When it is reached the
        algorithm's ``close`` runs its closing phases (e.g. the federated score request).
        """
        algo_rng = np.random.default_rng(self._algo_seq.spawn(1)[0])
        state = self.algorithm.init(self.n_clients, self.info.n_features, algo_rng)
        start = time.perf_counter()
        # guards against an algorithm that never advances (secure modes run many sub-rounds)
        hard_cap = 10 * max(self.max_rounds, self.algorithm.planned_rounds(self.max_rounds)) + 1000
        t = 0
        with tqdm(
            total=self.max_rounds,
            desc=f"{self.algorithm.name} run {run}",
            disable=self.verbose <= 0,
            delay=2.0,
            leave=False,
            unit="round",
        ) as bar:
            while not self.algorithm.converged(state):
                if state.round >= self.max_rounds:
                    state = self.finish(state, run=run, first_round=t)
                    break
                if t >= hard_cap:
                    raise RuntimeError(f"{self.algorithm.name} made {t} rounds without finishing")
                before = state.round
                try:
                    state = self.run_round(state, run=run, round=t)
                except NoParticipantsError as exc:
                    # Clients refuse (participation caps): the run ends with the last
                    # completed round's state; nothing of the refused round is used.
                    if state.centres is None or np.ndim(state.centres) != 2 or state.phase in ("init", "seed"):
                        raise NoParticipantsError(
                            f"{exc}; the run had not produced centres yet ({self.algorithm.name} was in "
                            f"phase {state.phase!r} after {t} rounds). Raise the participation cap or "
                            "lower max_rounds / use an algorithm mode that needs fewer rounds.",
                            round=t,
                            stage=exc.stage,
                        ) from exc
                    warnings.warn(f"run {run} stopped after {state.round} rounds: {exc}", stacklevel=2)
                    break
                bar.update(state.round - before)
                t += 1
        self.elapsed += time.perf_counter() - start
        return state

    def finish(self, state, run: int, first_round: int):
        close = getattr(self.algorithm, "close", None)
        if close is None:
            return state
        state = close(state)
        t = first_round
        while not self.algorithm.converged(state):
            state = self.run_round(state, run=run, round=t)
            t += 1
        return state

    def run_round(self, state, *, run: int = 0, round: int = 0):
        """One round; raises RoundAbortedError and leaves ``state`` untouched on failure."""
        algorithm = self.algorithm
        broadcast = algorithm.configure(state, round)
        count = resolve_sample(broadcast.sample, self.clients_per_round, self.n_clients)
        sampled = sample_clients(self.rng, self.n_clients, count)
        sampled, per_client = self.policy.plan(state, round, broadcast, sampled, self.n_clients)
        sampled = tuple(sampled)
        specs = algorithm.sum_fields(broadcast)
        ctx = RoundContext(
            run=run,
            round=round,
            action=broadcast.action,
            sampled=sampled,
            specs=specs,
            info=self.info,
            broadcast_digest=broadcast.digest(),
            broadcast=broadcast,
        )
        record = RoundRecord(
            run=run,
            round=round,
            action=broadcast.action,
            sampled=sampled,
            broadcasts=dict(per_client),
            specs=specs,
            protection=tuple(layer.name for layer in self.layers),
        )
        global_round = self._round_counter
        self._round_counter += 1
        try:
            for layer in self.layers:
                layer.before_round(ctx)
            stages = (UPDATE_STAGE,) + (self.aggregator.stages if specs else ())
            self.transport.begin_round(
                RoundContext(run, global_round, ctx.action, sampled, specs, self.info, ctx.broadcast_digest),
                stages,
            )
            server, fused = None, {}
            if specs and self.transport.fuse_first_stage:
                server = self.aggregator.server_session(ctx)
                fused = server.messages(self.aggregator.stages[0], sampled)
            first = self.aggregator.stages[0] if fused else None
            requests = {
                c: UpdateRequest(run, round, per_client[c], sampled, (first, fused[c]) if c in fused else None)
                for c in sampled
            }
            replies, refused = self.transport.exchange(UPDATE_STAGE, requests)
            record.stages.append(
                StageRecord(
                    UPDATE_STAGE,
                    sent=dict(requests),
                    received={c: _copy_payload(r.items) for c, r in replies.items()},
                    dropped=tuple(c for c in sampled if c not in replies and c not in refused),
                    refused=refused,
                )
            )
            alive = tuple(c for c in sampled if c in replies and replies[c].declined is None)
            if not alive:
                declined = sum(1 for r in replies.values() if r.declined)
                error = NoParticipantsError if declined and declined == len(replies) else RoundAbortedError
                raise error(
                    f"no sampled client answered round {round} (sampled {len(sampled)}, "
                    f"declined {sum(1 for r in replies.values() if r.declined)})",
                    round=round,
                    stage=UPDATE_STAGE,
                )
            if specs:
                sums, contributors = self._aggregate(ctx, alive, record, server, fused, replies)
            else:
                sums, contributors = {}, alive
            items = {c: replies[c].items for c in contributors if replies[c].items}
            agg = AggregatedUpdate(sums=sums, items=items, contributors=tuple(contributors), specs=specs)
            for layer in self.layers:
                agg = layer.server_aggregate(agg, ctx)
            new_state = algorithm.aggregate(state, agg)
        except RoundAbortedError as exc:
            record.aborted = str(exc)
            self.transcript.append(record)
            self.policy.on_abort(record, exc)
            raise
        for layer in self.layers:
            layer.after_round(ctx, agg)
        record.items = {c: _copy_payload(v) for c, v in items.items()}
        record.aggregate = {k: np.array(v, copy=True) for k, v in agg.sums.items()}
        record.contributors = agg.contributors
        if new_state.centres is not None:
            record.centres_after = np.array(new_state.centres, copy=True)
        self.transcript.append(record)
        self.policy.observe(record)
        return new_state

    def _aggregate(self, ctx: RoundContext, alive: tuple[int, ...], record: RoundRecord,
                   server=None, fused=None, update_replies=None):
        if server is None:
            server = self.aggregator.server_session(ctx)
        for i, stage in enumerate(self.aggregator.stages):
            if i == 0 and fused:
                # answered inside the update exchange: same messages, same replies
                messages = {c: fused[c] for c in alive if c in fused}
                replies = {c: update_replies[c].then for c in messages if update_replies[c].then is not None}
                refused = {c: update_replies[c].then_refused for c in messages if update_replies[c].then_refused}
            else:
                messages = server.messages(stage, alive)
                replies, refused = self.transport.exchange(stage, messages)
            record.stages.append(
                StageRecord(
                    stage,
                    sent=messages,
                    received=replies,
                    dropped=tuple(c for c in messages if c not in replies and c not in refused),
                    refused=refused,
                )
            )
            server.receive(stage, replies)
            alive = tuple(c for c in alive if c in replies)
        return server.result()

    def privacy_spent(self) -> tuple[float, float] | None:
        for layer in self.layers:
            spent = layer.report().get("privacy_spent")
            if spent is not None:
                return spent
        return None


def clone_layers(protection):
    """Fresh copies of a protection list, so that a fit never mutates the user's objects.

    Text and dict specs (``"masking"``, ``["dp:epsilon=1,delta=1e-5,clip=2", "masking"]``) are
    built into layers first (:func:`securefkm.registry.make_protection`)."""
    if protection is None:
        return []
    if isinstance(protection, (str, dict)) or (
        isinstance(protection, (list, tuple)) and any(isinstance(x, (str, dict)) for x in protection)
    ):
        from ..registry import make_protection

        return make_protection(protection)  # freshly built: nothing of the user's to copy
    if isinstance(protection, Layer):
        protection = [protection]
    return [copy.deepcopy(layer) for layer in protection]
