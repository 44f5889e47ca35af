"""How a round's stage messages reach the clients: the :class:`Transport` interface and the
simulated transports.

:class:`SimulatedTransport` decides the simulated dropouts in the driver, so every simulation
backend (in process here, worker processes and Ray actors in :mod:`.workers`) draws them from
the same generator in the same order and the backends agree exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from ..layers import RoundContext
from .client import ClientRuntime, serve
from .sampling import Dropouts


class Transport:
    """Carries one stage's messages to clients and returns the replies of those that answered.

    ``fuse_first_stage``: a transport that pays per message exchange (a network round trip,
    a process start) sets it, and the runtime then sends the aggregator's first stage
    message inside the ``update`` request (one exchange fewer per round). The protocol is
    unchanged: every aggregator's first stage message depends only on the round's public
    facts, and the transcript records both stages as usual.
    """

    fuse_first_stage: bool = False
    #: the current round's replies that failed decoding or the stage's schema check,
    #: client -> one-line reason naming the stage (reset by :meth:`begin_round`; the
    #: runtime reads it after every round attempt and gives each such client a strike)
    faults: Mapping[int, str] = MappingProxyType({})

    def client_ids(self) -> list[int]:
        raise NotImplementedError

    def begin_round(self, ctx: RoundContext, stages: tuple[str, ...]) -> None:
        """Called before the first stage of a round (resets :attr:`faults`)."""
        self.faults = {}

    def exchange(self, stage: str, messages: dict[int, Any]) -> tuple[dict[int, Any], dict[int, str]]:
        """Send ``messages`` and return (replies, refusals); a client missing from both dropped."""
        raise NotImplementedError

    def abort_note(self) -> str:
        """Why clients were lost beyond the protocol's own dropouts (added to an abort's message)."""
        return ""

    def close(self) -> None:
        """Release the transport's workers (idempotent)."""


class SimulatedTransport(Transport):
    """A transport whose clients are simulated: dropouts are decided here, in the driver.

    Every simulation backend (in process, worker processes, Ray actors) draws the round's
    dropouts from the same generator in the same order, so the backends agree exactly.
    ``_live`` filters a stage's messages down to the clients that still answer and
    ``_refused`` removes clients that refused, or whose reply was malformed
    (:attr:`Transport.faults`, filled by :func:`~securefkm.federation.client.serve` for a
    :class:`~securefkm.federation.client_policy.ClientPolicy`'s replies), from the rest of
    the round.
    """

    def __init__(self, dropouts: Dropouts, rng: np.random.Generator):
        self.dropouts = dropouts
        self.rng = rng
        self._drop_at: dict[int, str] = {}
        self._gone: set[int] = set()

    def begin_round(self, ctx, stages):
        self.faults = {}
        self._drop_at = self.dropouts.plan(self.rng, ctx.round, ctx.sampled, stages)
        self._gone = set()

    def _drops(self, client: int, stage: str) -> bool:
        if client in self._gone:
            return True
        if self._drop_at.get(client) == stage:
            self._gone.add(client)
            return True
        return False

    def _live(self, stage: str, messages: dict[int, Any]) -> dict[int, Any]:
        if not (self._drop_at or self._gone):  # no simulated dropouts this round
            return messages
        return {c: m for c, m in messages.items() if not self._drops(c, stage)}

    def _refused(self, refused: dict[int, str]) -> None:
        self._gone.update(refused)
        self._gone.update(self.faults)  # a client whose message did not decode is gone for the round


class StreamedRuntimes(Mapping):
    """Client id -> :class:`ClientRuntime`, made when a round first asks for the client and
    dropped when the next round begins (:meth:`end_round`).

    What a client keeps between rounds is its persistent state
    (:attr:`~securefkm.layers.ClientContext.state`: a layer's counters, a secure mode's local
    centres), kept here only for clients whose state holds something; its records are loaded
    again from the population, its round's sessions were the round's. So memory follows the
    clients of one round, not the population, and each client computes exactly what a
    resident runtime would have.
    """

    def __init__(self, make: Callable[[int, dict | None], ClientRuntime], ids: range):
        self._make = make
        self._ids = ids  # the clients this mapping may make (a worker's shard, or everyone)
        self._round: dict[int, ClientRuntime] = {}
        self._states: dict[int, dict] = {}

    @classmethod
    def of_population(cls, population, ids: range, algorithm, layers, aggregator, info, policies,
                      provision: Callable[[int, int], dict] | None = None) -> StreamedRuntimes:
        """The runtimes of ``population``'s clients ``ids``: each loads its records from the
        population when it needs them; ``provision(i, n_records)`` makes a client's first state
        (None: an empty one, as a resident client in this process starts)."""

        def make(i: int, state: dict | None) -> ClientRuntime:
            n_records = int(population.sizes[i])
            if state is None and provision is not None:
                state = provision(i, n_records)
            return ClientRuntime(i, lambda: population[i], algorithm, layers, aggregator, info, state=state,
                                 n_records=n_records, policy=policies.get(i))

        return cls(make, ids)

    def __getitem__(self, c) -> ClientRuntime:
        runtime = self._round.get(c)
        if runtime is None:
            if int(c) not in self._ids:
                raise KeyError(c)
            runtime = self._round[c] = self._make(int(c), self._states.get(c))
        return runtime

    def __iter__(self):
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def end_round(self) -> None:
        for c, runtime in self._round.items():
            state = runtime.context.state
            # an empty dict (an unused memory) is what a fresh client makes anyway
            if any(not (isinstance(v, dict) and not v) for v in state.values()):
                self._states[c] = state
            else:
                self._states.pop(c, None)
        self._round = {}

    @property
    def resident(self) -> int:
        """Runtimes held now (this round's clients)."""
        return len(self._round)


class LocalTransport(SimulatedTransport):
    """In-process simulation: clients are :class:`ClientRuntime` objects in this process,
    resident for the fit (a sequence of runtimes) or streamed round by round
    (a :class:`StreamedRuntimes`)."""

    def __init__(self, clients: Sequence[ClientRuntime] | StreamedRuntimes, dropouts: Dropouts,
                 rng: np.random.Generator):
        super().__init__(dropouts, rng)
        self.clients = clients if isinstance(clients, StreamedRuntimes) else {c.client_id: c for c in clients}
        self.faults = {}

    def client_ids(self):
        return list(self.clients)

    def begin_round(self, ctx, stages):
        if isinstance(self.clients, StreamedRuntimes):
            self.clients.end_round()
        super().begin_round(ctx, stages)

    def exchange(self, stage, messages):
        replies, refused = serve(self.clients, stage, self._live(stage, messages), self.faults)
        self._refused(refused)
        return replies, refused
