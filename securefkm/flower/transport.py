"""A :class:`~securefkm.federation.Transport` over Flower's ``Grid`` (Message API).

One Flower message per (client, stage): the server's payload for that client (the
``UpdateRequest`` of the ``update`` stage, then the aggregator's stage messages) is encoded
with the explicit codec of :mod:`securefkm.flower._wire` (JSON fields and raw numeric
arrays, never pickle) into a ``ConfigRecord`` under key ``"securefkm"``, sent as
``train.securefkm`` to the client's node, and the reply is rebuilt field by field against
the stage's reply schema. A reply that fails it (wrong type, dtype, shape or size, a
missing or extra field, bytes that are no securefkm message at all) is that client's
refusal of the stage, naming the client, the stage and the field, and is recorded in
:attr:`FlowerTransport.faults` for the round. Every stage has a deadline (``stage_timeout``): a client that
has not answered by then is a dropout for the rest of the round, so a dead SuperNode never
hangs the server. The Federation then handles it exactly like a simulated dropout (the
masking protocol's unmask stage recovers the dropped client's masks).

Client ids are the positions of the node ids in sorted order (``sorted(node_ids)[i]`` is
client ``i``), so the same CSV-to-node assignment always gives the same client ids. When
node identities are provisioned (Paillier, masking ``sign_keys``) client ``i`` is instead
the node that proved it holds the directory's ``i``-th key (``ordered=True``: the given order).

A node that missed a deadline becomes *suspect*: later stages still send it its messages
but wait for it only ``suspect_timeout`` seconds beyond the other clients' replies, so a
node that died costs one full ``stage_timeout`` and not one per stage and round. A node
that answers again is trusted again.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict

from ..exceptions import InputError
from ..federation import Transport
from ..federation.client import UPDATE_STAGE
from . import _wire

log = logging.getLogger("securefkm.flower")

# Flower error codes (flwr.common.constant.ErrorCode) that mean "the node did not answer"
# rather than "the ClientApp failed on this message".
_UNAVAILABLE_CODES = {0, 3, 4, 5, 8}


class FlowerTransport(Transport):
    """Carries the federation's stage messages as Flower messages.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    node_ids : iterable of int
        The SuperNodes taking part; client ``i`` is ``sorted(node_ids)[i]`` (``node_ids[i]``
        with ``ordered=True``, where ``None`` marks a client *left out* of the run: its node
        disappeared during enrolment, so it is never sent a message and is a dropout of
        every stage at no cost in waiting).
    stage_timeout : float
        Seconds to wait for the replies of one stage before treating the silent clients as
        dropouts.
    suspect_timeout : float
        Extra seconds to wait for a node that already missed a deadline.
    poll_interval : float
        Seconds between two polls of the SuperLink for replies (Flower's own
        ``send_and_receive`` polls every 3 s, which would dominate a multi-stage round).
    progress_path : str or None
        If given, one JSON line per stage start/end is appended there (for monitoring and
        for the fault-injection tests).
    fuse_stages : bool
        Send the aggregator's first stage message (masking ``advertise``, Paillier
        ``encrypted_input``, plain ``input``) inside the ``update`` message, saving one
        message exchange per round (each costs a ClientApp process and a SuperLink round
        trip). The protocol and the transcript are unchanged; ``False`` sends them apart.
    """

    def __init__(
        self,
        grid,
        node_ids,
        *,
        stage_timeout: float = 60.0,
        suspect_timeout: float = 3.0,
        poll_interval: float = 0.05,
        progress_path: str | None = None,
        ordered: bool = False,
        fuse_stages: bool = True,
    ):
        if ordered:
            node_ids = [None if n is None else int(n) for n in node_ids]
        else:
            node_ids = sorted(int(n) for n in node_ids)
        present = [n for n in node_ids if n is not None]
        if not present:
            raise InputError("FlowerTransport needs at least one node id; no SuperNode is connected.")
        if len(set(present)) != len(present):
            raise InputError(f"node_ids contains duplicates: {node_ids}.")
        for name, value in (("stage_timeout", stage_timeout), ("suspect_timeout", suspect_timeout), ("poll_interval", poll_interval)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise InputError(f"{name} must be a positive number of seconds, got {value!r}.")
        self.grid = grid
        self.node_ids = node_ids
        self.node_of = {c: n for c, n in enumerate(node_ids) if n is not None}
        #: clients left out at enrolment (no node): dropouts of every stage, never messaged
        self.left_out = frozenset(c for c, n in enumerate(node_ids) if n is None)
        self.stage_timeout = float(stage_timeout)
        self.suspect_timeout = float(suspect_timeout)
        self.poll_interval = float(poll_interval)
        self.progress_path = progress_path
        self.fuse_first_stage = bool(fuse_stages)
        self.suspect: set[int] = set()
        #: client id -> last error a client reported about itself (e.g. unreadable data)
        self.errors: dict[int, str] = {}
        #: client id -> why its reply of the current round failed the wire schema (reset in
        #: ``begin_round``): the client sent something that is not a message of the stage
        self.faults: dict[int, str] = {}
        self._fused: dict[int, str | None] = {}  # client -> stage fused into its update request
        #: (global round, stage, seconds, n_sent, n_replied) per exchange
        self.timings: list[tuple[int, str, float, int, int]] = []
        self._ctx = None
        self._round = -1

    # ------------------------------------------------------------ Transport
    def client_ids(self):
        return list(range(len(self.node_ids)))

    def begin_round(self, ctx, stages):
        self._ctx = ctx
        self._round = ctx.round
        self._stages = tuple(stages)
        self.faults = {}

    def exchange(self, stage: str, messages: dict[int, Any]):
        start = time.perf_counter()
        self._progress("start", stage, n=len(messages))
        out: list[Message] = []
        self._fused = {}
        for c, payload in messages.items():
            if stage == UPDATE_STAGE:
                then = getattr(payload, "then", None)
                self._fused[c] = None if then is None else then[0]
            if c in self.left_out:
                continue  # no node: a dropout without waiting
            if c not in self.node_of:
                raise InputError(f"client id {c} has no Flower node (known: 0..{len(self.node_of) - 1}).")
            record = ConfigRecord(
                {
                    "stage": stage,
                    "client-id": int(c),
                    "round": int(self._round),
                    "data": _wire.encode(stage, "request", payload),
                }
            )
            out.append(
                Message(
                    content=RecordDict({_wire.RECORD_KEY: record}),
                    dst_node_id=self.node_of[c],
                    message_type=_wire.MESSAGE_TYPE,
                    group_id=f"{self._round}:{stage}",
                    ttl=self.stage_timeout + 30.0,
                )
            )
        replies, refused = self._send_and_receive(out, stage)
        elapsed = time.perf_counter() - start
        self.timings.append((self._round, stage, elapsed, len(messages), len(replies)))
        dropped = [c for c in messages if c not in replies and c not in refused]
        self._progress("end", stage, n=len(messages), replied=len(replies), refused=sorted(refused), dropped=dropped, seconds=round(elapsed, 4))
        if dropped:
            log.warning("round %s stage %s: clients %s did not answer within the deadline (dropouts)", self._round, stage, dropped)
        for c, why in refused.items():
            log.warning("round %s stage %s: client %s refused: %s", self._round, stage, c, why)
        return replies, refused

    # ------------------------------------------------------------ internals
    def _send_and_receive(self, out: list[Message], stage: str):
        client_of_node = {n: c for c, n in self.node_of.items()}
        msg_ids = list(self.grid.push_messages(out)) if out else []
        pending = {mid: client_of_node[m.metadata.dst_node_id] for mid, m in zip(msg_ids, out)}
        replies: dict[int, Any] = {}
        refused: dict[int, str] = {}
        t0 = time.monotonic()
        deadline = t0 + self.stage_timeout
        trusted_done_at = None
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                c = pending.pop(reply.metadata.reply_to_message_id, None)
                if c is None:
                    continue
                self._decode(c, reply, stage, replies, refused)
            if not pending:
                break
            now = time.monotonic()
            if now >= deadline:
                break
            if all(c in self.suspect for c in pending.values()):
                # every client still missing already missed a deadline: give them a grace period
                trusted_done_at = trusted_done_at or now
                if now - trusted_done_at >= self.suspect_timeout:
                    break
            time.sleep(self.poll_interval)
        for c in pending.values():
            self.suspect.add(c)
        for c in replies:
            self.suspect.discard(c)
        return replies, refused

    def _decode(self, c: int, reply: Message, stage: str, replies: dict, refused: dict) -> None:
        if reply.has_error():
            err = reply.error
            if int(err.code) in _UNAVAILABLE_CODES:
                return  # the node is unavailable: a dropout
            refused[c] = f"ClientApp failed (Flower error {err.code}): {err.reason}"
            self.errors[c] = refused[c]
            return
        try:
            record = reply.content[_wire.RECORD_KEY]
            status = record["status"]
        except (KeyError, TypeError) as exc:
            self._malformed(c, stage, f"no securefkm record ({type(exc).__name__}: {exc})", refused)
            return
        if status == "ok":
            try:
                replies[c] = _wire.decode(stage, "reply", record.get("data"), fused=self._fused.get(c))
            except _wire.WireError as exc:
                self._malformed(c, stage, str(exc), refused)
            return
        if status not in ("refused", "error"):
            self._malformed(c, stage, f"unknown status {str(status)[:40]!r}", refused)
            return
        refused[c] = str(record.get("reason", status))[:2000]
        if status == "error":
            self.errors[c] = refused[c]

    def _malformed(self, c: int, stage: str, why: str, refused: dict) -> None:
        """Client ``c``'s reply to ``stage`` is not a message of the stage: its refusal and fault."""
        reason = f"refused: malformed reply from client {c} to stage {stage!r}: {why}"
        refused[c] = self.errors[c] = self.faults[c] = reason

    def _progress(self, event: str, stage: str, **extra) -> None:
        if not self.progress_path:
            return
        line = {"t": time.time(), "event": event, "round": self._round, "stage": stage, **extra}
        with open(self.progress_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
