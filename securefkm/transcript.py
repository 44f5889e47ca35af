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

from collections.abc import Iterator, Sequence
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
    #: clients left out of this attempt by a check that cannot tell their fault from the
    #: server's (e.g. two clients advertising one public key: a leaked key or collusion),
    #: client -> reason; no strike
    unattributed: dict[int, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        end = f", aborted: {self.abort_cause or 'error'}" if self.aborted is not None else ""
        faults = f", {len(self.faults)} faulty" if self.faults else ""
        return (f"RoundRecord(run {self.run}, round {self.round}, {self.action!r}, attempt {self.attempt}: "
                f"{len(self.sampled)} sampled, {len(self.contributors)} contributed, {len(self.dropped)} dropped, "
                f"{len(self.stages)} stages{faults}{end})")

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
    #: the recorded rounds: a list, or a :class:`~securefkm.transcript_file.RoundFile` (a
    #: transcript on disk, read one round at a time)
    rounds: Sequence[RoundRecord] = field(default_factory=list)
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

    def log_abort(self, entry: AbortedRound) -> None:
        """Log an aborted attempt (at every level; written at once to a file-backed transcript)."""
        self.aborts.append(entry)
        self._log(entry)

    def log_exclusion(self, entry: Exclusion) -> None:
        """Log a client's exclusion (at every level; written at once to a file-backed transcript)."""
        self.exclusions.append(entry)
        self._log(entry)

    def _log(self, entry) -> None:
        log = getattr(self.rounds, "log", None)
        if log is not None:
            log(entry)

    def close(self) -> None:
        """Finish a file-backed transcript (its ``meta`` written, the file complete); a no-op
        in memory. Reading still works afterwards."""
        close = getattr(self.rounds, "close", None)
        if close is not None:
            close(self.meta)

    @property
    def path(self) -> str | None:
        """The file holding the rounds, or None in memory."""
        return getattr(self.rounds, "path", None)

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

    def __repr__(self) -> str:
        if self.path is None:
            n_runs = len(self.runs())
            runs = f"{n_runs} run{'s' if n_runs != 1 else ''}"
        else:  # counting runs would read every round from disk
            runs = f"in {self.path!r}"
        return (f"Transcript({len(self.rounds)} round{'s' if len(self.rounds) != 1 else ''}, "
                f"{runs}, level={self.level!r}, "
                f"{len(self.aborts)} aborted, {len(self.exclusions)} excluded)")

    def summary(self, rounds: bool = True) -> str:
        """What the server saw, as text.

        The first line counts rounds, runs, client messages and aborted rounds and names the
        protection. Then, with ``rounds=True``, one block per recorded round: its run, index,
        action and attempt; the clients sampled, that contributed, dropped, refused, were
        found faulty or excluded; the broadcast; per protocol stage the kind and per-field
        shapes of the messages received (e.g. ``update: 3 clients, fields weights (3,), sums
        (3, 2)``); the set-fields received in plain; the released aggregate's fields with
        shapes. Last, the aborted rounds, the clients' faults and the exclusions.
        """
        n_msgs = sum(len(s.received) for r in self.rounds for s in r.stages)
        lines = [
            f"Transcript: {len(self.rounds)} rounds over {len(self.runs())} run(s), "
            f"{n_msgs} client messages, {len(self.aborts)} aborted round(s), protection="
            f"{list(self.meta.get('protection', ()))}"
        ]
        if rounds:
            if not self.rounds:
                lines.append(f"no round recorded (record={self.level!r})" if self.level == "none"
                             else "no round recorded")
            for r in self.rounds:
                lines.extend(self._round_lines(r))
        if self.aborts:
            causes: dict[str, int] = {}
            for a in self.aborts:
                causes[a.cause] = causes.get(a.cause, 0) + 1
            lines.append("aborted rounds (retried): " + ", ".join(f"{n} {c}" for c, n in sorted(causes.items())))
            if rounds:
                lines.extend("  " + a.describe() + (": " + a.message if a.message else "") for a in self.aborts)
        faulty: dict[int, int] = {}
        for r in self.rounds:
            for c in r.faults:
                faulty[c] = faulty.get(c, 0) + 1
        if faulty:
            lines.append("client faults: " + ", ".join(f"client {c}: {n}" for c, n in sorted(faulty.items())))
        if self.exclusions:
            lines.append("excluded clients: " + "; ".join(e.describe() for e in self.exclusions))
        return "\n".join(lines)

    def _round_lines(self, r: RoundRecord) -> list[str]:
        head = f"run {r.run} round {r.round} {r.action} (attempt {r.attempt})"
        if r.aborted is not None:
            head += f": ABORTED ({r.abort_cause or 'error'})"
        refused = sorted({c for s in r.stages for c in s.refused})
        excluded = sorted(e.client for e in self.exclusions
                          if (e.run, e.round, e.attempt) == (r.run, r.round, r.attempt))
        lines = [head,
                 f"  clients: sampled {_ids(r.sampled)}; contributed {_ids(r.contributors)}; "
                 f"dropped {_ids(r.dropped)}; refused {_ids(refused)}; excluded {_ids(excluded)}"]
        if r.faults:
            lines.append("  faults: " + "; ".join(f"client {c}: {why}" for c, why in sorted(r.faults.items())))
        if r.unattributed:
            lines.append("  left out, unattributed (no strike): "
                         + "; ".join(f"client {c}: {why}" for c, why in sorted(r.unattributed.items())))
        if r.broadcasts:
            lines.append("  broadcast: " + _broadcasts(r.broadcasts))
        if self.level == "full":
            for st in r.stages:
                lost = "".join(f"; {what} {_ids(who)}" for what, who in (("dropped", st.dropped),
                                                                           ("refused", st.refused)) if who)
                lines.append(f"  {st.stage}: " + _grouped(st.received) + lost)
            if r.items:
                lines.append("  set-fields in plain: " + _grouped(r.items))
        elif r.stages:
            lines.append(f"  stages {', '.join(s.stage for s in r.stages)}: messages not kept "
                         f"(record={self.level!r})")
        if r.aggregate is not None:
            lines.append("  released aggregate: " + _fields(r.aggregate))
        elif r.aborted is None:
            lines.append("  released aggregate: none")
        return lines



def _ids(clients) -> str:
    """``"3 [0-2]"``: a count and the client ids as ranges (``"none"`` when empty)."""
    ids = sorted(int(c) for c in clients)
    if not ids:
        return "none"
    runs: list[str] = []
    lo = prev = ids[0]
    for c in [*ids[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        runs.append(str(lo) if lo == prev else f"{lo}, {prev}" if prev == lo + 1 else f"{lo}-{prev}")
        if c is not None:
            lo = prev = c
    shown = runs if len(runs) <= 8 else [*runs[:6], "...", runs[-1]]
    return f"{len(ids)} [{', '.join(shown)}]"


def _shape(v) -> str:
    """One value as the server received it: an array's shape (and dtype unless float64)."""
    if isinstance(v, np.ndarray):
        dt = "" if v.dtype == np.float64 else f" {v.dtype}"
        return f"{tuple(v.shape)}{dt}"
    if isinstance(v, (bytes, bytearray)):
        return f"{len(v)} bytes"
    if isinstance(v, (bool, int, float, np.number, np.bool_)):
        return type(v).__name__
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v):
            return "{" + ", ".join(f"{k} {_shape(x)}" for k, x in v.items()) + "}"
        kinds = sorted({_kind(x) for x in v.values()})
        return f"{len(v)} x {'/'.join(kinds) or 'nothing'}"
    if isinstance(v, (list, tuple)):
        kinds = sorted({_kind(x) for x in v})
        return f"{len(v)} x {'/'.join(kinds) or 'nothing'}"
    if v is None:
        return "None"
    return type(v).__name__


def _kind(v) -> str:
    if isinstance(v, np.ndarray):
        return f"array{tuple(v.shape)}"
    if isinstance(v, (bytes, bytearray)):
        return "bytes"
    return type(v).__name__


def _fields(fields: dict) -> str:
    if not fields:
        return "no fields"
    return "fields " + ", ".join(f"{k} {_shape(v)}" for k, v in fields.items())


def _message(m) -> str:
    """A message's kind and per-field shapes (a dict of named fields, an array, a ciphertext ...)."""
    if isinstance(m, dict) and all(isinstance(k, str) for k in m):
        return _fields(m)
    if isinstance(m, np.ndarray):
        return f"array {_shape(m)}"
    return _shape(m)


def _grouped(received: dict) -> str:
    """Per-client messages grouped by identical description: ``"3 clients, fields a (2,)"``."""
    if not received:
        return "nothing received"
    groups: dict[str, list] = {}
    for c, m in received.items():
        groups.setdefault(_message(m), []).append(c)
    return "; ".join(f"{len(cs)} client{'s' if len(cs) != 1 else ''}"
                     + (f" {_ids(cs).split(' ', 1)[1]}" if len(groups) > 1 else "") + f", {d}"
                     for d, cs in groups.items())


def _broadcasts(broadcasts: dict) -> str:
    groups: dict[str, list] = {}
    for c, b in broadcasts.items():
        centres = getattr(b, "centres", None)
        d = f"{getattr(b, 'action', '?')}, centres {_shape(np.asarray(centres)) if centres is not None else 'none'}"
        groups.setdefault(d, []).append(c)
    if len(groups) == 1:
        (d, cs), = groups.items()
        return f"{d} to {len(cs)} client{'s' if len(cs) != 1 else ''}"
    return "; ".join(f"{d} to {_ids(cs)}" for d, cs in groups.items())
