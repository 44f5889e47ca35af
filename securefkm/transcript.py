"""The transcript: everything the server saw, in the form it saw it.

The transcript is the attack surface. Passive (honest-but-curious) attacks in ``attacks``
read only a :class:`Transcript`; nothing else about a run is exposed to them.

For each round it records whom the server sampled, what it broadcast to each client, every
protocol stage's messages (server to client and client to server, e.g. plaintext arrays
under no protection, masked ``uint64`` vectors under pairwise masking, ciphertexts under
Paillier), the set-fields received in plain, who dropped at which stage, and the decoded
aggregate the server obtained.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .messages import Broadcast, FieldSpec

RECORD_LEVELS = ("full", "aggregates", "none")


@dataclass
class StageRecord:
    """One protocol stage: what the server sent to and received from each client."""

    stage: str
    sent: dict[int, Any] = field(default_factory=dict)
    received: dict[int, Any] = field(default_factory=dict)
    dropped: tuple[int, ...] = ()
    refused: dict[int, str] = field(default_factory=dict)


@dataclass
class RoundRecord:
    """The server's view of one round."""

    run: int
    round: int
    action: str
    sampled: tuple[int, ...]
    broadcasts: dict[int, Broadcast]
    specs: tuple[FieldSpec, ...] = ()
    protection: tuple[str, ...] = ()
    stages: list[StageRecord] = field(default_factory=list)
    items: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    aggregate: dict[str, np.ndarray] | None = None
    contributors: tuple[int, ...] = ()
    centres_after: np.ndarray | None = None
    #: why the round aborted (the error message); None for a completed round
    aborted: str | None = None
    #: the abort's cause code (see :class:`~securefkm.exceptions.RoundAbortedError`)
    abort_cause: str | None = None
    #: 0 for a round's first attempt, n for its n-th retry after aborts (same round index)
    attempt: int = 0
    #: clients whose message this attempt failed a check attributing the failure to them
    #: (the server session's and the transport's faults), client -> one-line reason; each
    #: is a strike (``Federation(max_client_faults=...)``)
    faults: dict[int, str] = field(default_factory=dict)

    def stage(self, name: str) -> StageRecord | None:
        for s in self.stages:
            if s.stage == name:
                return s
        return None

    @property
    def dropped(self) -> tuple[int, ...]:
        out: list[int] = []
        for s in self.stages:
            out.extend(c for c in s.dropped if c not in out)
        return tuple(out)

    def plain_sums(self) -> dict[int, dict[str, np.ndarray]]:
        """Per-client sum-fields the server received in plain (empty under a secure aggregator).

        Under no aggregator the ``input`` stage carries each client's sum-fields as a dict of
        arrays; under masking or Paillier it carries masked integers or ciphertexts, which
        this method does not return.
        """
        st = self.stage("input")
        if st is None:
            return {}
        return {c: m for c, m in st.received.items() if isinstance(m, dict)}

    def broadcast_to(self, client: int) -> Broadcast | None:
        return self.broadcasts.get(client)


@dataclass(frozen=True)
class AbortedRound:
    """One aborted round attempt (kept even under ``record="none"``)."""

    run: int
    round: int
    attempt: int
    cause: str
    stage: str | None
    message: str
    #: the server learned something before the abort (the layers accounted for it)
    released: bool = False

    def describe(self) -> str:
        return f"run {self.run} round {self.round} attempt {self.attempt}: {self.cause} at stage {self.stage!r}"


@dataclass(frozen=True)
class Exclusion:
    """A client excluded from the rest of the fit after ``strikes`` faults (kept at every
    record level); ``reason`` is its last fault's."""

    run: int
    round: int
    attempt: int
    client: int
    strikes: int
    reason: str

    def describe(self) -> str:
        return (f"client {self.client} excluded at run {self.run} round {self.round} attempt {self.attempt} "
                f"after {self.strikes} fault(s), the last: {self.reason}")


@dataclass
class Transcript:
    """All rounds of a fit (all ``n_init`` runs), in order, and the log of aborted rounds.

    ``level`` (:data:`RECORD_LEVELS`, the fit's ``record``): ``"full"`` keeps every stage's
    messages and the set-fields; ``"aggregates"`` keeps of each round whom the server
    sampled, who dropped or refused, the contributors and the decoded aggregate; ``"none"``
    keeps no round (the aborted rounds and the exclusions are logged at every level)."""

    meta: dict = field(default_factory=dict)
    rounds: list[RoundRecord] = field(default_factory=list)
    level: str = "full"
    aborts: list[AbortedRound] = field(default_factory=list)
    #: clients excluded for repeated faults, in the order they were excluded
    exclusions: list[Exclusion] = field(default_factory=list)

    def append(self, record: RoundRecord) -> None:
        if self.level == "none":
            return
        if self.level == "aggregates":
            record.stages = [StageRecord(s.stage, dropped=s.dropped, refused=s.refused) for s in record.stages]
            record.items = {}
        self.rounds.append(record)

    def __iter__(self) -> Iterator[RoundRecord]:
        return iter(self.rounds)

    def __len__(self) -> int:
        return len(self.rounds)

    def __getitem__(self, i) -> RoundRecord:
        return self.rounds[i]

    def with_action(self, action: str) -> list[RoundRecord]:
        return [r for r in self.rounds if r.action == action]

    def runs(self) -> list[int]:
        return sorted({r.run for r in self.rounds})

    def client_view(self, client: int) -> list[tuple[RoundRecord, dict[str, np.ndarray] | None, dict | None]]:
        """Rounds in which ``client`` took part: (record, its plain sum-fields, its set-fields)."""
        out = []
        for r in self.rounds:
            if client in r.sampled:
                out.append((r, r.plain_sums().get(client), r.items.get(client)))
        return out

    def summary(self) -> str:
        n_msgs = sum(len(s.received) for r in self.rounds for s in r.stages)
        out = (
            f"Transcript: {len(self.rounds)} rounds over {len(self.runs())} run(s), "
            f"{n_msgs} client messages, {len(self.aborts)} aborted round(s), protection="
            f"{list(self.meta.get('protection', ()))}"
        )
        if self.aborts:
            causes: dict[str, int] = {}
            for a in self.aborts:
                causes[a.cause] = causes.get(a.cause, 0) + 1
            out += "\naborted rounds (retried): " + ", ".join(f"{n} {c}" for c, n in sorted(causes.items()))
        faulty: dict[int, int] = {}
        for r in self.rounds:
            for c in r.faults:
                faulty[c] = faulty.get(c, 0) + 1
        if faulty:
            out += "\nclient faults: " + ", ".join(f"client {c}: {n}" for c, n in sorted(faulty.items()))
        if self.exclusions:
            out += "\nexcluded clients: " + "; ".join(e.describe() for e in self.exclusions)
        return out
