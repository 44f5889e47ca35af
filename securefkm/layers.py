"""The interface every protection layer implements, and the plain (unprotected) aggregator.

A protection stack is an ordered list of :class:`Layer` objects, e.g.
``[MinClusterSize(p=2), GaussianDP(...), PairwiseMasking(...)]``. The runtime calls the
hooks of each layer at fixed points of the round path (``docs/architecture.md``):

=====================  ===========  =========================================================
hook                   runs on      purpose
=====================  ===========  =========================================================
``validate_stack``     server       reject inconsistent stacks with an error saying the fix
``setup``              server       once per fit: size noise, derive keys, read run info
``before_round``       server       refuse a round (budget, participation, overflow range)
``client_data``        each client  transform the local records used this round (clipping);
                                    ``client_datas``/``client_updates``: the same for many
                                    simulated clients at once (vectorised, same results)
``client_update``      each client  transform the client's Update (round, suppress, noise);
                                    return ``None`` to decline to take part this round
(aggregator)           both         turn sum-fields of the survivors into one sum
``server_aggregate``   server       decode / post-process the aggregate (central noise)
``after_round``        server       account for what the round released
``after_aborted_round`` server      account for what an aborted round let the server learn
``client_input_sent``  each client  the client's input left it this round (participation)
=====================  ===========  =========================================================

Exactly one :class:`Aggregator` runs each round: the stack's own (``PairwiseMasking``,
``Paillier``) or :class:`PlainSum` when the stack has none. An aggregator is a multi-stage
protocol: a :class:`ServerSession` and one :class:`ClientSession` per client exchange one
message per stage. The in-process runtime passes those messages in memory; the Flower app
sends the very same messages between processes. Client sessions must be picklable, because
in a deployment each message may be handled by a fresh client process that restores the
session from the node's persistent state.

Every layer states its trust model in its docstring: who holds which secret, who must not
collude with whom, what the server learns and what the layer does not protect against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .exceptions import ProtectionConfigError, RoundAbortedError
from .messages import AggregatedUpdate, FieldSpec, Update
from .registry import layer_spec_name

SIDES = ("client", "aggregator", "server")


@dataclass
class RunInfo:
    """Facts about a fit that layers may use in ``setup`` (never client data).

    These are the run's *declared* facts, and a client holds its own copy: in process the
    one the fit was built with, in a deployment the one its ClientApp derives at run start
    from the run config (:func:`securefkm.flower.spec.build_federation`), never from a
    round's messages. What a client enforces against the server every round (the fewest
    clients a round may sample, the secure aggregator's thresholds and survivors:
    :meth:`Aggregator.round_refusal`) is derived from it, so a server cannot lower it
    round by round.
    """

    algorithm: Any
    n_clients: int
    n_features: int
    clients_per_round: int
    max_rounds: int
    planned_rounds: int
    random_state: int | None = None
    client_sizes: tuple[int, ...] | None = None  # only in simulation; layers must not rely on it

    @property
    def sampling_rate(self) -> float:
        return self.clients_per_round / self.n_clients


@dataclass
class RoundContext:
    """Public facts about the round being run."""

    run: int
    round: int
    action: str
    sampled: tuple[int, ...]
    specs: tuple[FieldSpec, ...]
    info: RunInfo
    broadcast_digest: bytes = b""
    #: the broadcast this round acts on (on a client: the one it received)
    broadcast: Any = None
    #: 0, or n for the n-th retry of this round index after aborted attempts (protocols
    #: bind it into their round identifiers so that no message of an aborted attempt is
    #: valid in its retry)
    attempt: int = 0

    @property
    def sampling_rate(self) -> float:
        return len(self.sampled) / self.info.n_clients


@dataclass
class ClientContext:
    """A client's own view: its id, its size, and state that persists across rounds.

    ``state`` lives on the client (in a deployment: the Flower node's persistent state); the
    server never reads it. Layers keep client-side secrets and counters there.
    """

    client_id: int
    n_records: int
    state: dict = field(default_factory=dict)


class ProtocolRefusal(Exception):
    """Raised by an honest client that refuses to answer a malformed or malicious request."""


class Layer:
    """Base class of every protection layer. All hooks default to doing nothing."""

    #: where the layer sits in the stack: "client" layers come before the aggregator,
    #: "server" layers after it.
    side: ClassVar[str] = "client"
    #: set on layers that only make sense with a secure aggregator (distributed DP noise).
    requires_secure_aggregator: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return type(self).__name__

    def validate_stack(self, stack: Sequence[Layer], algorithm: Any) -> None:
        """Raise :class:`ProtectionConfigError` if this layer cannot run in ``stack``."""

    def setup(self, info: RunInfo) -> None:
        """Called once at the start of a fit."""

    def declared_domain(self):
        """The records' box ``(low, high)`` this layer's guarantee assumes, or None (most layers
        declare none; GaussianDP's ``bounds``). The estimators check it against their own
        ``init_bounds``: the domain is declared once."""
        return None

    def survivors_needed(self, ctx: RoundContext) -> int:
        """Fewest contributors this (client-side) layer's guarantee allows in the round's sum
        (distributed DP: the survivors its noise shares are sized for). A secure aggregator
        that honours it aborts before decoding a sum of fewer, so nothing is released and
        the round is retried for free. Default 0: no requirement."""
        return 0

    def provision_client(self, client: ClientContext) -> None:
        """Out-of-band setup of one client, after :meth:`setup`, for clients that run outside
        this process (worker backends): e.g. enrolling its identity key with a key authority
        that lives with the server. In process the layer may do it lazily instead."""

    def before_round(self, ctx: RoundContext) -> None:
        """Called on the server before clients are contacted; may raise to refuse the round."""

    def client_data(self, X: np.ndarray, client: ClientContext, ctx: RoundContext) -> np.ndarray:
        return X

    def client_datas(self, Xs: list[np.ndarray], clients: list[ClientContext], ctx: RoundContext) -> list[np.ndarray]:
        """:meth:`client_data` for several simulated clients of one round that share this layer
        object. Must return, client by client, exactly what :meth:`client_data` returns (and raise
        what it raises for the first client that fails); a layer overrides it only to vectorise."""
        return [self.client_data(X, c, ctx) for X, c in zip(Xs, clients)]

    def client_update(self, update: Update, client: ClientContext, ctx: RoundContext) -> Update | None:
        return update

    def client_updates(
        self, updates: list[Update], clients: list[ClientContext], ctx: RoundContext
    ) -> list[Update | None]:
        """:meth:`client_update` for several simulated clients of one round that share this
        layer object (the simulation transports batch them). Must return, client by client,
        exactly what :meth:`client_update` returns; a layer overrides it only to vectorise
        (e.g. one pass of the noise sampler for every client's share)."""
        return [self.client_update(u, c, ctx) for u, c in zip(updates, clients)]

    def server_aggregate(self, agg: AggregatedUpdate, ctx: RoundContext) -> AggregatedUpdate:
        return agg

    def after_round(self, ctx: RoundContext, agg: AggregatedUpdate) -> None:
        """Called after a round completed (not after an aborted one)."""

    def after_aborted_round(self, ctx: RoundContext, leaked: AggregatedUpdate, error: Exception) -> None:
        """Called when a round aborted *after* the server learned something: ``leaked`` holds
        what reached it (``sums``: the aggregate the aggregator decoded, empty if none;
        ``items``: set-fields received in plain at the update stage). Layers that account
        for releases charge it here. Not called when the round released nothing."""

    def client_input_sent(self, client: ClientContext, ctx: RoundContext) -> None:
        """Called on a client when its input for this round left it: its answer to the
        aggregator's ``input_stage`` (or, in a round without sum-fields, its update reply).
        A round that aborted before this point took nothing of the client's data."""

    def report(self) -> dict:
        """Facts for the user after a fit (e.g. privacy spent)."""
        return {}

    def perturbs_client_messages(self) -> bool:
        """True when what a client sends is no longer the algorithm's exact update (rounded, or
        noised on the client). Public protocol knowledge, recorded in the transcript's meta
        (``client_messages_exact``): an attack that solves messages *exactly* for records knows
        then that no exact solution exists beyond closed forms."""
        return False

    def server_view(self, algorithm: Any, aggregator: Aggregator) -> tuple[str, str]:
        """(what the server receives under this layer, who must be trusted), in words.

        Feeds ``protection_report_`` (:mod:`securefkm.protection_report`); every layer says
        plainly what it does *not* hide, so a report never claims more than the layer does.
        """
        return (f"what the other layers let through; {self.name} states nothing further",
                "see the layer's documentation")

    def __repr__(self) -> str:
        params = getattr(self, "_repr_params", None)
        if params is None:
            return f"{self.name}()"
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in params.items())})"


class ServerSession(ABC):
    """The server's side of one aggregation round.

    ``faults`` (client -> one-line reason naming the stage and field): clients whose message
    this round failed a check that attributes the failure to them (malformed, replayed, a
    wrong share revealed, ...). A session that finds one leaves the client out of the rest
    of the round (as if it dropped at that stage) and records it here; the runtime reads it
    after every round attempt, completed or aborted, and gives each such client a strike
    (``Federation(max_client_faults=...)``). Empty by default; a session may assign its own
    dict or add to this one."""

    @property
    def faults(self) -> dict[int, str]:
        faults = self.__dict__.get("_faults")
        if faults is None:  # one dict per session, made when first read
            faults = self.__dict__["_faults"] = {}
        return faults

    @faults.setter
    def faults(self, value) -> None:
        self.__dict__["_faults"] = value

    @abstractmethod
    def messages(self, stage: str, alive: tuple[int, ...]) -> dict[int, Any]:
        """What to send to each still-alive client at ``stage``."""

    @abstractmethod
    def receive(self, stage: str, replies: dict[int, Any]) -> None:
        """Replies of the clients that answered ``stage``; a missing client has dropped."""

    @abstractmethod
    def result(self) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
        """Decoded sums and the ids whose inputs they contain; raise RoundAbortedError if impossible."""


class ClientSession(ABC):
    """A client's side of one aggregation round (picklable)."""

    #: where this session sits among the round's sessions, for a process that answers many
    #: of them (:func:`securefkm.federation.client.serve`): sessions near in it share work
    #: (pairwise masking: neighbours on the graph's ring), so answering a stage in its order
    #: keeps what they share few and in cache. None: no preference. The order in which a
    #: process answers never changes a reply.
    locality: int | None = None

    @abstractmethod
    def respond(self, stage: str, message: Any) -> Any:
        """Answer the server's message for ``stage``; raise ProtocolRefusal to refuse."""


class Aggregator(Layer):
    """A layer that turns the survivors' sum-fields into one sum through a staged protocol."""

    side: ClassVar[str] = "aggregator"
    #: False only for PlainSum: the server sees each client's sum-fields.
    secure: ClassVar[bool] = True
    stages: tuple[str, ...] = ("input",)
    #: the stage whose client reply carries the client's (masked / encrypted) input; the
    #: runtime calls ``Layer.client_input_sent`` when a client answers it
    input_stage: str = "input"
    #: explicit opt-in (constructor argument of the secure aggregators) to run on an
    #: algorithm whose set-fields reach the server in plain; reports then say so
    allow_plain_set_fields: bool = False
    #: True when the clients' side of this aggregator does public-key cryptography every
    #: round (key agreements, Paillier encryptions), work that holds the GIL: then
    #: ``backend="auto"`` spreads simulated clients over worker processes
    #: (:func:`securefkm.federation.workers.auto_backend`). False for ideal functionalities.
    client_public_key_work: ClassVar[bool] = False
    #: the class of this aggregator's ideal functionality, registered by that class itself
    #: (``class IdealX(X, ideal_of=X)``) so the real protocol's module never imports it
    _ideal_functionality: ClassVar[type | None] = None

    def __init_subclass__(cls, ideal_of: type[Aggregator] | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if ideal_of is not None:
            if not (isinstance(ideal_of, type) and issubclass(cls, ideal_of)):
                raise TypeError(f"{cls.__name__}: ideal_of= must be a class it derives from, got {ideal_of!r}")
            if not hasattr(cls, "of"):
                raise TypeError(f"{cls.__name__} needs a classmethod of(real) building it from a configured {ideal_of.__name__}")
            ideal_of._ideal_functionality = cls

    def validate_stack(self, stack: Sequence[Layer], algorithm: Any) -> None:
        super().validate_stack(stack, algorithm)
        # the client-side layers, whose survivors_needed() is the round's minimum of contributors
        self._floor_layers = [layer for layer in stack if layer.side == "client"]

    def survivors_floor(self, ctx: RoundContext) -> int:
        """Fewest contributors the client-side layers allow in this round's sum
        (:meth:`Layer.survivors_needed`): a secure aggregator aborts before decoding fewer."""
        return max((layer.survivors_needed(ctx) for layer in getattr(self, "_floor_layers", ())), default=0)

    def client_noise_refusal(self, mode: str) -> str | None:
        """Why this aggregator cannot carry GaussianDP noise added in ``mode`` ("central",
        "distributed", "local"), naming what works instead; None if it can (the default).
        GaussianDP asks before its own checks, so the user gets the aggregator's reason."""
        return None

    def release_noise_grid(self, spec) -> float | None:
        """The lattice step on which this aggregator itself adds central GaussianDP noise to the
        released sum of field ``spec``, drawn by a party other than the server (so the server
        sees only the noisy sum), or None: the server adds central noise (the default). An
        aggregator that returns a step also names that party in ``noise_party``."""
        return None

    #: who adds central noise when :meth:`release_noise_grid` gives a step (None: the server)
    noise_party: str | None = None

    def designed_survivors(self, n_sampled: int) -> int:
        """Survivors out of ``n_sampled`` this aggregator is designed to complete a round with
        (its declared dropout tolerance); the default of layers that size something by the
        survivors, e.g. distributed DP's ``min_clients``. Default: all of them."""
        return int(n_sampled)

    def designed_corrupt(self, n_sampled: int) -> int:
        """Clients out of ``n_sampled`` this aggregator is declared to tolerate colluding with
        the server (PairwiseMasking: ``ceil(corrupt_fraction * n)``); distributed DP counts
        them among the noise shares that may be missing. Default: none."""
        return 0

    def sampled_floor(self, info: RunInfo) -> int:
        """Fewest clients a round with sum-fields may sample under this aggregator, from the
        run's declared facts: ``clients_per_round`` less its dropout allowance
        (``clients_per_round - designed_survivors(clients_per_round)``, at least one client,
        so that a client the runtime excluded for faults does not stall a small run), and
        never fewer than 2. 0 for an aggregator that hides nothing (PlainSum)."""
        if not self.secure:
            return 0
        n = int(info.clients_per_round)
        allowance = max(1, n - int(self.designed_survivors(n)))
        return min(n, max(2, n - allowance))

    def fewest_clients(self, info: RunInfo) -> int:
        """Fewest clients a round must sample for this aggregator to complete it, from the
        run's declared facts (0: any number). A secure aggregator needs at least 2 (the "sum"
        of one client is that client's input), its :meth:`sampled_floor` and its
        ``min_clients`` if it has one. The estimators refuse a fit whose ``clients_per_round``
        is below it before the first round, with the fix."""
        if not self.secure:
            return 0
        return max(2, int(self.sampled_floor(info)), int(getattr(self, "min_clients", 0) or 0))

    def round_refusal(self, ctx: RoundContext, client_id: int) -> str | None:
        """Why client ``client_id`` must refuse this round before computing anything, or None.

        Called by every client on the server's :class:`~securefkm.federation.client.UpdateRequest`
        of a round with sum-fields; checked against the client's own :class:`RunInfo`
        (``ctx.info``), never against anything the request says about the run. Refuses a
        sampled set with duplicate or unknown ids, one that does not list the client, and one
        smaller than :meth:`sampled_floor`: a server that samples the target and a few
        clients it controls would otherwise read the target's input off the "secure" sum.
        Aggregators add their own floors (PairwiseMasking: threshold and survivors)."""
        if not self.secure or not ctx.specs:
            return None
        problem, ids = self._sampled_verdict(ctx.sampled, ctx.info)
        who = f"client {client_id} refuses the round"
        if problem is not None:
            return f"{who}: {problem}"
        if int(client_id) not in ids:
            return f"{who}: field 'sampled' does not list this client"
        return None

    def _sampled_verdict(self, sampled, info: RunInfo) -> tuple[str | None, frozenset]:
        """(what is wrong with the sampled set regardless of who asks, or None; its ids).

        The checks read the whole set, so a simulation whose clients of one round share the
        request's sampled tuple would repeat them once per client (quadratic in the cohort):
        the verdict is kept for the last tuple object seen (tuples cannot change; any other
        sequence is checked afresh) together with the RunInfo it was checked against."""
        memo = self.__dict__.get("_sampled_memo")
        if memo is not None and memo[0] is sampled and memo[1] is info:
            return memo[2], memo[3]
        verdict = self._check_sampled(sampled, info)
        if type(sampled) is tuple:
            self._sampled_memo = (sampled, info) + verdict
        return verdict

    def _check_sampled(self, sampled, info: RunInfo) -> tuple[str | None, frozenset]:
        if not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in sampled):
            return "field 'sampled' holds non-integer ids", frozenset()
        ids = [int(c) for c in sampled]
        unique = frozenset(ids)
        if len(unique) != len(ids):
            return "field 'sampled' lists a client twice", unique
        if any(not 0 <= c < info.n_clients for c in ids):
            return f"field 'sampled' names clients outside 0..{info.n_clients - 1}", unique
        floor = self.sampled_floor(info)
        if len(ids) < floor:
            return (f"field 'sampled' lists {len(ids)} clients, below the run's floor of {floor} "
                    f"(clients_per_round={info.clients_per_round} less the dropout allowance): the sum of so few "
                    "clients could expose this client's input"), unique
        return None, unique

    @abstractmethod
    def server_session(self, ctx: RoundContext) -> ServerSession: ...

    def ideal(self) -> Aggregator:
        """This aggregator's ideal functionality (``crypto="ideal"``): a layer that releases
        exactly what this one releases for the same dropouts, with the same aborts, without
        the cryptography. Aggregators without one cannot run under ``crypto="ideal"``."""
        impl = self._ideal_functionality
        if impl is None:
            raise ProtectionConfigError(
                f"{self.name} has no ideal functionality; run it with crypto='real'."
            )
        return self if isinstance(self, impl) else impl.of(self)

    @abstractmethod
    def client_session(
        self, client: ClientContext, ctx: RoundContext, sums: dict[str, np.ndarray]
    ) -> ClientSession: ...

    def client_sessions(
        self, clients: list[ClientContext], ctx: RoundContext, sums_list: list[dict[str, np.ndarray]]
    ) -> list[ClientSession]:
        """:meth:`client_session` for several simulated clients of one round that share this
        aggregator object; each session must be exactly what :meth:`client_session` gives that
        client. Ideal functionalities override it to encode every client's input in one pass."""
        return [self.client_session(c, ctx, sums) for c, sums in zip(clients, sums_list)]


class _PlainServer(ServerSession):
    def __init__(self, ctx: RoundContext):
        self.ctx = ctx
        self.replies: dict[int, dict[str, np.ndarray]] = {}

    def messages(self, stage, alive):
        return {c: None for c in alive}

    def receive(self, stage, replies):
        self.replies = replies

    def result(self):
        if not self.replies:
            raise RoundAbortedError(
                "no client returned an update this round", round=self.ctx.round, stage="input"
            )
        contributors = tuple(sorted(self.replies))
        sums = {}
        for spec in self.ctx.specs:
            rows = [self.replies[c][spec.name] for c in contributors]
            if spec.size == 1:  # np.sum adds a single column pairwise: keep it
                sums[spec.name] = np.sum(rows, axis=0, dtype=np.float64)
                continue
            # np.sum over axis 0 of the stacked replies adds them one by one in contributor
            # order for fields of 2+ values; so does this loop, without stacking 10,000
            # clients x k x d into one more copy of every update (bit-identical sums)
            acc = np.zeros(spec.shape, dtype=np.float64)
            for r in rows:
                acc += r
            sums[spec.name] = acc
        return sums, contributors


@dataclass
class _PlainClient(ClientSession):
    sums: dict[str, np.ndarray]

    def respond(self, stage, message):
        return self.sums


class PlainSum(Aggregator):
    """No protection: each client sends its sum-fields in plain and the server adds them.

    Trust model: none. The server sees every client's sum-fields exactly (this is the
    attack surface the ``attacks`` package measures). Used when the stack has no aggregator.
    """

    secure = False
    stages = ("input",)

    def ideal(self):
        return self  # nothing to simulate: the server sees the inputs either way

    def server_view(self, algorithm, aggregator):
        return ("every sampled client's exact sum-fields (per-cluster counts, coordinate sums ...), "
                "one plain message per client",
                "nothing is hidden from the server: it must be trusted with every client's update")

    def server_session(self, ctx):
        return _PlainServer(ctx)

    def client_session(self, client, ctx, sums):
        return _PlainClient(sums)

    def client_sessions(self, clients, ctx, sums_list):
        return [_PlainClient(sums) for sums in sums_list]


def validate_stack(protection, algorithm=None) -> tuple[list[Layer], Aggregator]:
    """Check a ``protection=[...]`` list and return (layers, aggregator).

    Rules: every item is a :class:`Layer`; at most one aggregator; client-side layers
    (noise, rounding, suppression) come before the aggregator and server-side layers after
    it; each layer then checks its own constraints (e.g. distributed noise needs a secure
    aggregator). Errors say what to change.
    """
    if protection is None:
        protection = []
    if isinstance(protection, Layer):
        protection = [protection]
    if not isinstance(protection, (list, tuple)):
        raise ProtectionConfigError(
            f"protection must be a list of layers, got {type(protection).__name__}; "
            "e.g. protection=[GaussianDP(epsilon=1, delta=1e-5, clip=1.0), PairwiseMasking()]."
        )
    layers = list(protection)
    for i, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            hint = " (did you pass the class instead of an instance? add ())" if isinstance(layer, type) else ""
            raise ProtectionConfigError(
                f"protection[{i}] is {layer!r}, not a protection layer{hint}. Layers come from "
                "the `protocols` package: PairwiseMasking, Paillier, GaussianDP, Rounding, "
                "ParticipationCap, MinClusterSize."
            )
        if layer.side not in SIDES:
            raise ProtectionConfigError(f"{layer.name}.side must be one of {SIDES}, got {layer.side!r}.")
    aggregators = [i for i, layer in enumerate(layers) if layer.side == "aggregator"]
    if len(aggregators) > 1:
        names = ", ".join(layers[i].name for i in aggregators)
        raise ProtectionConfigError(
            f"protection has {len(aggregators)} aggregators ({names}); keep exactly one "
            "(pairwise masking and Paillier both produce the sum, they do not stack)."
        )
    if aggregators:
        pos = aggregators[0]
        for i, layer in enumerate(layers):
            if layer.side == "client" and i > pos:
                raise ProtectionConfigError(
                    f"{layer.name} acts on each client's message but comes after the aggregator "
                    f"{layers[pos].name} in protection; move it before {layers[pos].name} "
                    "(noise and rounding must be applied before the values are aggregated)."
                )
            if layer.side == "server" and i < pos:
                raise ProtectionConfigError(
                    f"{layer.name} post-processes the aggregate but comes before the aggregator "
                    f"{layers[pos].name}; move it after {layers[pos].name}."
                )
        aggregator = layers[pos]
    else:
        aggregator = PlainSum()
    seen: dict[type, int] = {}
    for layer in layers:
        seen[type(layer)] = seen.get(type(layer), 0) + 1
        if seen[type(layer)] > 1 and not getattr(layer, "allow_repeat", False):
            raise ProtectionConfigError(
                f"{layer.name} appears twice in protection; configure one instance instead."
            )
    _refuse_plain_set_fields(aggregator, algorithm)
    for layer in layers:
        if layer.requires_secure_aggregator and not aggregator.secure:
            raise ProtectionConfigError(
                f"{layer!r} needs a secure aggregator; add PairwiseMasking() or Paillier() "
                "after it in protection."
            )
        layer.validate_stack(layers, algorithm)
    return layers, aggregator


def _refuse_plain_set_fields(aggregator: Aggregator, algorithm) -> None:
    """A secure aggregator on an algorithm that sends set-fields would protect nothing of
    them (no aggregator can sum a list of local centres), while every report listed the
    aggregator: refuse, unless the user opted in with ``allow_plain_set_fields=True``."""
    if not aggregator.secure or aggregator.allow_plain_set_fields:
        return
    if algorithm is None or not getattr(algorithm, "uses_set_fields", False):
        return
    algo = getattr(algorithm, "name", type(algorithm).__name__)
    param = getattr(algorithm, "secure_mode_param", None)
    cli_name = layer_spec_name(aggregator)
    what = (
        f"{aggregator.name} hides only sum-fields, but {algo} sends each client's local centres "
        "and sizes as set-fields, which no aggregator can hide: they would reach the server in plain "
        f"while the fit reported {aggregator.name} as its protection. "
    )
    mode_py = f"Use the algorithm's secure (sum-only) mode, {param}=True, " if param else "Use a sum-only algorithm, "
    mode_cli = f"Use the algorithm's secure (sum-only) mode, --param {param}=true, " if param else "Use a sum-only algorithm, "
    tail = "which runs the server's k-means over local centres as rounds of secure sums"
    optin_py = (f"; or, to hide only the sum-fields and keep the set-fields plain, pass "
                f"{aggregator.name}(allow_plain_set_fields=True) (every report then says so).")
    optin_cli = (f"; or, to hide only the sum-fields and keep the set-fields plain, use --protection "
                 f"{cli_name}:allow_plain_set_fields=true (every report then says so).")
    raise ProtectionConfigError(what + mode_py + tail + optin_py, cli=what + mode_cli + tail + optin_cli)
