"""ParticipationCap: each client takes part in at most ``max_rounds`` rounds of a fit.

What it does: a client keeps, in its own persistent state (``ClientContext.state``, which
the server never reads), the number of rounds in which its input left it; once that
reaches ``max_rounds`` its ``client_update`` returns ``None`` and the runtime records the
client as having declined. A round counts when the client answers the aggregator's input
stage (``Aggregator.input_stage``: the masked vector, the ciphertexts, the plain sums; in a
round without sum-fields, its update reply). A round that aborts before that point (too few
clients advertised keys, a layer refused to start it) took nothing of the client's data and
does not count, so aborted-and-retried rounds do not use up the cap
(docs/aborted-rounds.md). A round that aborts *after* the client sent its input still counts:
the client cannot verify that the server learned nothing from it (conservative).

Trust model: enforced by the *client*, so it holds against a server that keeps sampling
the same client (a curious or malicious server cannot extract more than ``max_rounds``
answers). Nobody else needs to be trusted. The server learns that a client declined.

Use with DP: :class:`~protocols.dp.GaussianDP` reads the cap from the stack and calibrates
for ``min(planned_rounds, max_rounds)`` compositions per record, which is sound because the
cap does not depend on the server's behaviour.

What it does not protect against: what the client sends within its ``max_rounds`` rounds
(combine with noise or secure aggregation); a client whose state is reset (a fresh device
or a wiped node state starts counting from zero); Sybil clients holding copies of the same
records; differencing across the rounds it does take part in. Once every sampled client
has reached its cap, rounds abort (no one answers): plan ``max_rounds`` accordingly.
"""

from __future__ import annotations

from securefkm.validation import check_int
from securefkm.layers import Layer

STATE_KEY = "participation_cap.rounds"


class ParticipationCap(Layer):
    """Clients refuse after answering ``max_rounds`` rounds (client-enforced, see module doc)."""

    side = "client"

    def __init__(self, max_rounds: int):
        self.max_rounds = check_int(max_rounds, "max_rounds", minimum=1)
        self._repr_params = {"max_rounds": self.max_rounds}

    def server_view(self, algorithm, aggregator):
        return (f"each client's messages in at most {self.max_rounds} rounds (limits repeated exposure and "
                "differencing across rounds)",
                "clients enforce the cap themselves; the server cannot raise it")

    def client_update(self, update, client, ctx):
        if int(client.state.get(STATE_KEY, 0)) >= self.max_rounds:
            return None
        return update

    def client_input_sent(self, client, ctx):
        client.state[STATE_KEY] = int(client.state.get(STATE_KEY, 0)) + 1
