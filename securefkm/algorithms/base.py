"""The algorithm contract: pure server logic plus pure client logic.

An algorithm knows nothing about transport or protection. The runtime
(:mod:`securefkm.federation`) calls, per round::

    broadcast = algorithm.configure(state, round)             # server
    specs     = algorithm.sum_fields(broadcast)                # declared before data is touched
    update    = algorithm.client_update(X_i, broadcast, rng)   # each sampled client
    state     = algorithm.aggregate(state, aggregated_update)  # server
    stop      = algorithm.converged(state)

``state`` is an :class:`AlgorithmState` owned by the server; each algorithm of the library
keeps its own fields in a :class:`SeededState` subclass. An algorithm that needs several
kinds of rounds (seeding, training, a final federated score request) keeps a ``phase`` in
its state and returns a :class:`~securefkm.messages.Broadcast` whose ``action`` tells
clients what to compute.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..messages import AggregatedUpdate, Broadcast, FieldSpec, Update


@dataclass
class AlgorithmState:
    """Server state shared by every algorithm: centres, phase and the round history.

    Each algorithm of the library keeps what else it needs in typed fields of its own
    subclass (:class:`SeededState` and its subclasses). ``extra`` is the slot of an algorithm
    written outside the library that declares no state class of its own: any plain values
    (a checkpoint saves dicts, lists, tuples, numbers, strings, arrays and generators).

    Parameters
    ----------
    centres : ndarray of shape (n_clusters, n_features) or None
        The current global centres (None until a seeding phase has produced them).
    phase : str
        The algorithm's current phase (e.g. ``"init"``, ``"train"``, ``"done"``).
    round : int
        Completed training rounds.
    movements : list of float
        Centre movement of each training round, in order (the convergence criteria read it).
    score : float or None
        The federated score of a closing score round, if the algorithm runs one.
    extra : dict
        Free values of an algorithm without a state class of its own.
    """

    centres: np.ndarray | None
    phase: str = "train"
    round: int = 0
    movements: list[float] = field(default_factory=list)
    score: float | None = None
    extra: dict = field(default_factory=dict)

    def generators(self) -> list[np.random.Generator]:
        """The numpy generators this state holds, in field order (then ``extra``'s).

        ``configure`` may draw from them (the seeding draw), so the runtime saves their
        positions before a round and puts them back when the round aborts and is retried.
        """
        values = [*vars(self).values(), *self.extra.values()]
        return [v for v in values if isinstance(v, np.random.Generator)]


@dataclass
class SeededState(AlgorithmState):
    """State of an algorithm whose server draws random numbers and whose first centres may
    come from seeding rounds (every algorithm of the library).

    Parameters
    ----------
    rng : numpy.random.Generator or None
        The server's generator: seeding draws, server-side k-means restarts, reassignment.
    n_clients : int
        Clients of the federation; a seeding phase gives up after ``3 * n_clients`` attempts.
    seed_attempts : int
        Seeding rounds so far in which the asked client could not seed (too few records).
    """

    rng: np.random.Generator | None = None
    n_clients: int = 0
    seed_attempts: int = 0


class Algorithm(ABC):
    """Base class. Subclasses implement one published method each."""

    #: short name used in transcripts, the CLI and the benchmark tables.
    name: str = "algorithm"
    #: True if some rounds carry set-fields (per-client local centres). Secure aggregators
    #: cannot hide set-fields, so a stack with one refuses such an algorithm (see
    #: :func:`securefkm.layers.validate_stack`); an algorithm with a sum-only variant names
    #: the estimator parameter that selects it in ``secure_mode_param``.
    uses_set_fields: bool = False
    secure_mode_param: str | None = None
    #: True if client_update draws random numbers (shuffling, sampling); the runtime then
    #: passes a per-(run, round, client) generator, else ``None``.
    needs_client_rng: bool = False

    #: broadcast actions whose weighted sums are hard nearest-centre sums of the broadcast
    #: centres: a record moves only the row of its nearest centre, so
    #: ``GaussianDP(radius=...)`` may bound those rows by a radius around each centre.
    nearest_centre_actions: tuple[str, ...] = ()

    #: None if, with its current options, every round's sum-fields have a per-record bound
    #: (counts, sums, means); else the options that make them so, for the refusal of
    #: record-level DP that does not project whole values (central and distributed modes).
    dp_value_fix: str | None = None

    n_clusters: int

    def client_rng_needed(self, broadcast: Broadcast) -> bool:
        """Whether clients need a random generator for ``broadcast`` (creating one per client
        and round costs more than a whole vectorised k-means step)."""
        return self.needs_client_rng

    @abstractmethod
    def init(self, n_clients: int, n_features: int, rng: np.random.Generator) -> AlgorithmState:
        """Initial server state (may hold no centres yet if a seeding phase comes first)."""

    @abstractmethod
    def configure(self, state: AlgorithmState, round: int) -> Broadcast:
        """The broadcast of the next round."""

    @abstractmethod
    def sum_fields(self, broadcast: Broadcast) -> tuple[FieldSpec, ...]:
        """Layout of the sum-fields clients return for ``broadcast``."""

    @abstractmethod
    def client_update(
        self, X: np.ndarray, broadcast: Broadcast, rng: np.random.Generator | None, memory: dict | None = None
    ) -> Update:
        """A client's computation on its own records.

        ``memory`` is a dict private to this client that persists across rounds (in a
        deployment: the node's persistent state). Algorithms whose clients must remember
        something between rounds (e.g. their local centres in a secure mode) keep it there;
        the server never sees it.
        """

    def client_updates(self, datas, broadcast: Broadcast, rngs, memories) -> list[Update]:
        """Several clients that received the same broadcast (simulation fast path).

        Override with a vectorised version when the per-client loop dominates a round;
        results must equal the loop exactly.
        """
        return [self.client_update(X, broadcast, r, m) for X, r, m in zip(datas, rngs, memories)]

    @abstractmethod
    def aggregate(self, state: AlgorithmState, agg: AggregatedUpdate) -> AlgorithmState:
        """New server state from the round's aggregate."""

    @abstractmethod
    def converged(self, state: AlgorithmState) -> bool:
        """True when the run is finished (all phases done)."""

    def planned_rounds(self, max_rounds: int) -> int:
        """Upper bound on rounds that touch client data (DP layers calibrate on it)."""
        return max_rounds

    def planned_sequence(self, max_rounds: int) -> Sequence[str]:
        """The broadcast actions of one run's rounds, in order, or empty if not known ahead.

        A known sequence has :meth:`planned_rounds` entries; it lets
        ``GaussianDP(last_round_weights=...)`` find the last round of an action. Default:
        empty (the layer then applies no last-round weight).
        """
        return ()

    def planned_actions(self, max_rounds: int) -> dict[str, int]:
        """Rounds per broadcast action of one run (summing to :meth:`planned_rounds`), or empty
        if not known ahead; lets ``GaussianDP(round_weights=...)`` calibrate for each action's
        rounds (an unknown split is charged as if every round had the largest weight).
        Default: the counts of :meth:`planned_sequence`."""
        return dict(Counter(self.planned_sequence(max_rounds)))

    def round_limit(self, max_rounds: int) -> int:
        """Most rounds one run can take when every inner loop runs to its own cap (secure
        modes' server k-means sub-rounds); the runtime's guard against a run that never ends
        is a multiple of it. Default: :meth:`planned_rounds`."""
        return self.planned_rounds(max_rounds)

    def close(self, state: AlgorithmState) -> AlgorithmState | None:
        """The state that runs the algorithm's closing phases (e.g. a federated score request)
        once the training round budget ``max_rounds`` is spent, or None: no closing phase, the
        run ends with ``state`` (the default)."""
        return None

    def resumable(self, state: AlgorithmState) -> bool:
        """Whether a fit can go on from ``state`` with clients that lost their ``memory``.

        A restarted deployment (a new Flower run after the ServerApp crashed) has fresh
        clients; a state whose next rounds read what clients stored earlier (the local
        centres of a secure mode) is not a point to resume from, and the checkpoint goes
        back to the last state that is.
        """
        return True
