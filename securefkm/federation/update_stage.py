"""The messages of a round's first stage, ``"update"``: the server's request and a client's reply.

Their own module, below both the client runtime (:mod:`securefkm.federation.client`, which
answers them) and the Flower wire format (:mod:`securefkm.flower._wire`, which checks and
encodes them), so that neither imports the other for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..messages import Broadcast

#: name of the round's first stage, in which clients compute their updates
UPDATE_STAGE = "update"


@dataclass(frozen=True)
class UpdateRequest:
    """The server's first message of a round: the broadcast and the round's public facts.
    Immutable: clients sent the same broadcast share one request object."""

    run: int
    round: int
    broadcast: Broadcast
    sampled: tuple[int, ...]
    #: ``(stage, message)`` of the aggregator's first stage, fused into this exchange
    then: tuple[str, Any] | None = None
    #: retry number of this round index after aborted attempts (RoundContext.attempt)
    attempt: int = 0


@dataclass
class UpdateReply:
    """A client's answer to :class:`UpdateRequest`: its set-fields, or why it declined."""

    items: dict[str, np.ndarray] = field(default_factory=dict)
    declined: str | None = None
    #: the answer to ``UpdateRequest.then`` (None: no fused stage, or declined/refused)
    then: Any = None
    #: why the client refused the fused stage message (its update still counts as sent)
    then_refused: str | None = None
