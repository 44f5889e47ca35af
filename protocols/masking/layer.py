"""PairwiseMasking: secure aggregation by pairwise-cancelling masks with dropout recovery.

Bonawitz et al. 2017, "Practical Secure Aggregation for Privacy-Preserving Machine
Learning" (CCS), with the sparse neighbourhood graph of Bell et al. 2020, "Secure
single-server aggregation with (poly)logarithmic overhead" (CCS) as an option.
Stages: ``advertise`` (X25519 keys, optionally Ed25519-signed), ``share`` (encrypted Shamir
shares of the mask key and self-mask seed), ``masked_input`` (encoded sum-fields + check
slot + masks), with ``sign_keys=True`` ``consistency_check`` (every survivor signs the
survivor list ``U3``; Bonawitz et al. Fig. 4 round 3), and ``unmask`` (shares of survivors'
self-masks and dropped clients' mask keys). The layer's ``stages`` attribute lists the
stages of its configuration; the runtime drives exactly those.
See ``docs/protocols/pairwise-masking.md``.

Trust model
-----------
* Secrets: each client holds, per round, two X25519 private keys (``c``: share encryption,
  ``s``: mask agreement) and a self-mask seed ``b`` (OS CSPRNG). Shamir shares of ``s`` and
  ``b`` are held by the client's neighbours (everyone in the complete graph), encrypted so
  the server cannot read them. With ``sign_keys`` each client also holds a long-term
  Ed25519 identity key registered with a PKI (simulated here) that clients trust.
* Server honest-but-curious: it learns the sum of the survivors' sum-fields and the
  survivor/dropout sets, nothing else, unless it colludes with ``t`` or more of a client's
  holders (they could then reconstruct both ``b`` and ``s`` of that client). Collusions of
  the server with up to ``t - 1`` holders of each client reveal nothing about honest
  clients' individual inputs beyond the sum.
* Server malicious (active): needs ``sign_keys=True``. Then it cannot substitute keys (man
  in the middle), and the consistency check runs: each survivor signs
  ``(round id, broadcast digest, U3)`` and unmasks only with valid signatures over the same
  ``U3`` from ``max(t, floor(m/2) + 1)`` of its holders, answering from that ``U3`` alone.
  A server that tells some holders "B dropped" and others "B survived" (split view) cannot
  collect a quorum for both lists, so honest clients refuse before any share leaves.
  Honest clients also refuse to reveal both shares of one peer and survivor lists smaller
  than the threshold, and (``bind_broadcast``) masks only cancel between clients that
  received the same broadcast, so sending different centres to different clients makes
  the round fail detectably instead of leaking. Colluding clients answer (and sign) both
  views: security against a malicious server colluding with ``n_C`` clients needs
  ``t > (m + n_C) / 2`` (Bonawitz et al. Sec. 6); the default ``t = floor(2m/3) + 1`` gives
  ``n_C < m/3``. The check costs one message round and one Ed25519 signature per client
  (plus ``quorum`` verifications), no keystream.
* Without ``sign_keys`` there is no PKI, no consistency check: the layer is secure against
  a semi-honest server only (plus the broadcast-binding check against inconsistent
  broadcasts). A malicious server can impersonate clients in the key exchange and, with an
  explicit ``t <= m/2``, unmask one client by a split view of the survivors.
* Not protected: the sum itself (use DP noise on top, e.g. ``GaussianDP``), differencing of
  sums across rounds with different participants, sybil clients the server creates
  (without a PKI), a malicious server that reports dropouts falsely to shrink the sum to
  ``min_survivors`` clients, and denial of service (any party can make the round abort).
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np

from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.layers import Aggregator, ClientContext, RoundContext, RunInfo

from ..codec import FixedPointCodec
from . import keys
from .client import MaskingClient
from .graph import (
    AUTO_COMPLETE_MAX,
    GRAPHS,
    RoundPlan,
    check_threshold_arg,
    make_plan,
    minimums,
    resolve_graph,
)
from .params import CORRECTNESS_BITS, CORRUPT_FRACTION, DROPOUT_FRACTION, SECURITY_BITS, check_rates
from .prg import CIPHERS
from .server import MaskingServer, RunHistory

IDENTITY_STATE_KEY = "pairwise_masking.identity"


class PairwiseMasking(Aggregator):
    """Secure sum by pairwise masking (Bonawitz et al. 2017), complete or sparse graph.

    Parameters
    ----------
    threshold:
        Shamir threshold ``t``: an int, or a fraction of the holders of each client's
        secrets (all sampled clients for the complete graph, the client and its ``k``
        neighbours for the sparse one). Default: ``floor(2m/3) + 1`` for the complete graph
        (and an explicit ``neighbours``), Bell et al.'s ``t`` for the sparse graph. The round
        needs at least that many survivors (the same fraction of the sampled clients in
        sparse mode).
    graph:
        ``"auto"`` (default): the complete graph for at most 100 sampled clients (cheap, and
        no assumed corrupt or dropout fraction), the sparse graph above that (or the
        complete graph when no smaller degree meets Bell et al.'s bounds). ``"complete"``
        (Bonawitz) or ``"sparse"`` (Bell et al.'s k-regular graph) force one.
    neighbours:
        Degree ``k`` of the sparse graph (``graph="sparse"`` only). Default: the smallest
        even ``k`` meeting Bell et al. 2020's bounds (CCS, Sec. 3-5;
        :func:`protocols.masking.params.bell_parameters`) for the four parameters below,
        e.g. ``k = 36, t = 19`` for 1,000 clients and ``k = 42, t = 22`` for 10,000 with the
        defaults (``k = 78, t = 52`` and ``96, 64`` with ``sign_keys=True``).
    corrupt_fraction:
        ``gamma``: the fraction of sampled clients that may collude with the server
        (default 0.05, Bell et al.'s running example). With more, honest inputs may leak.
    dropout_fraction:
        ``delta``: the fraction of sampled clients that may drop out (default 0.10). With
        more, the round may abort (it never releases a wrong sum).
    security_bits:
        ``sigma``: the sparse graph is secure except with probability ``2**-sigma``
        (default 40).
    correctness_bits:
        ``eta``: a round with at most ``dropout_fraction`` dropouts completes except with
        probability ``2**-eta`` (default 20).
    bind_broadcast:
        Bind the pairwise masks to the digest of the broadcast each client received, so
        that a server sending different broadcasts cannot decode (model-inconsistency attack).
    sign_keys:
        Sign advertised keys with per-client Ed25519 identity keys (simulated PKI) and run
        the consistency-check stage (clients sign the survivor list before unmasking):
        the configuration for a malicious server. Without it the layer assumes a
        semi-honest server.
    codec:
        :class:`~protocols.codec.FixedPointCodec` (default 24 fractional bits, no bound).
    cipher:
        The mask PRG: ``"auto"`` (default: SHAKE-256 for masks up to 1 KiB, ChaCha20 above,
        see :mod:`protocols.masking.prg`), ``"chacha20"``, ``"aes-ctr"`` or ``"shake256"``.
    allow_insecure_threshold:
        Accept a ``threshold`` below the secure floor (:func:`protocols.masking.graph.threshold_floor`:
        a strict majority ``floor(m/2) + 1`` of the ``m`` holders on the complete graph or a
        sparse graph of explicit degree, Bell et al.'s ``t`` on the sparse graph of Bell's
        degree). Default ``False``: such a threshold raises :class:`InputError` when the fit
        starts (and any round whose sampled set resolves it below the floor aborts). With it,
        a malicious server can unmask a client by a split view (two disjoint sets of holders
        each reconstruct one of its secrets), and ``protection_report_`` says the threshold is
        insecure.
    allow_plain_set_fields:
        Run on an algorithm that sends set-fields (k-FED, child/parent, aligning, FedFCM with
        k-means averaging, outside their secure mode). Masking then hides only the sum-fields
        (e.g. the fuzzy validity index); every client's local centres and sizes reach the
        server in plain, and ``protection_report_`` says so. Default ``False``: such a stack
        is refused, naming the algorithm's secure mode.
    """

    secure = True
    #: stages without / with the consistency check (``sign_keys=True``); an instance's
    #: ``stages`` is the one of its configuration
    STAGES = ("advertise", "share", "masked_input", "unmask")
    STAGES_CHECKED = ("advertise", "share", "masked_input", "consistency_check", "unmask")
    stages = STAGES
    input_stage = "masked_input"
    client_public_key_work = True  # X25519 key pairs and agreements every round

    def __init__(
        self,
        threshold=None,
        graph: str = "auto",
        neighbours: int | None = None,
        bind_broadcast: bool = True,
        sign_keys: bool = False,
        codec: FixedPointCodec | None = None,
        cipher: str = "auto",
        *,
        corrupt_fraction: float = CORRUPT_FRACTION,
        dropout_fraction: float = DROPOUT_FRACTION,
        security_bits: float = SECURITY_BITS,
        correctness_bits: float = CORRECTNESS_BITS,
        allow_insecure_threshold: bool = False,
        allow_plain_set_fields: bool = False,
    ):
        check_threshold_arg(threshold)
        if graph not in GRAPHS:
            raise InputError(f"graph must be one of {GRAPHS}, got {graph!r}.")
        if neighbours is not None:
            if isinstance(neighbours, bool) or not isinstance(neighbours, (int, np.integer)) or neighbours < 2:
                raise InputError(f"neighbours must be an int >= 2 (the sparse graph's degree), got {neighbours!r}.")
            if graph != "sparse":
                raise InputError("neighbours only applies to graph='sparse'; drop it or set graph='sparse'.")
        if cipher not in CIPHERS:
            raise InputError(f"cipher must be one of {CIPHERS}, got {cipher!r}.")
        check_rates(corrupt_fraction, dropout_fraction, security_bits, correctness_bits, bool(sign_keys))
        if codec is None:
            codec = FixedPointCodec()
        if not isinstance(codec, FixedPointCodec):
            raise InputError(f"codec must be a protocols.codec.FixedPointCodec, got {type(codec).__name__}.")
        self.threshold = threshold
        self.graph = graph
        self.neighbours = None if neighbours is None else int(neighbours)
        self.bind_broadcast = bool(bind_broadcast)
        self.sign_keys = bool(sign_keys)
        self.codec = codec
        self.cipher = cipher
        self.allow_plain_set_fields = bool(allow_plain_set_fields)
        self.allow_insecure_threshold = bool(allow_insecure_threshold)
        #: the run's floor (:meth:`run_floor`), fixed by :meth:`setup` from the run's declared facts
        self.floor: dict | None = None
        #: Bell et al.'s parameters (semi-malicious bounds with sign_keys): the keyword
        #: arguments of :func:`protocols.masking.params.bell_parameters`
        self.graph_params = {
            "corrupt_fraction": float(corrupt_fraction),
            "dropout_fraction": float(dropout_fraction),
            "security_bits": float(security_bits),
            "correctness_bits": float(correctness_bits),
            "malicious": self.sign_keys,
        }
        self.registry = keys.IdentityRegistry() if self.sign_keys else None
        self.stages = self.STAGES_CHECKED if self.sign_keys else self.STAGES
        self._repr_params = {
            "threshold": threshold,
            "graph": graph,
            "neighbours": neighbours,
            "bind_broadcast": bind_broadcast,
            "sign_keys": sign_keys,
            "cipher": cipher,
        }
        defaults = (CORRUPT_FRACTION, DROPOUT_FRACTION, SECURITY_BITS, CORRECTNESS_BITS)
        for name, value, default in zip(
            ("corrupt_fraction", "dropout_fraction", "security_bits", "correctness_bits"),
            (corrupt_fraction, dropout_fraction, security_bits, correctness_bits), defaults,
        ):
            if value != default:
                self._repr_params[name] = value
        if self.allow_insecure_threshold:
            self._repr_params["allow_insecure_threshold"] = True
        if self.allow_plain_set_fields:
            self._repr_params["allow_plain_set_fields"] = True

    # ------------------------------------------------------------------ hooks
    def server_view(self, algorithm, aggregator):
        sees = ("one masked vector per client (uniformly random without the other clients' masks), the "
                "sum of the survivors' sum-fields (exact unless a client-side layer such as distributed GaussianDP "
                "noised them), and who survived each stage")
        if self.allow_plain_set_fields and getattr(algorithm, "uses_set_fields", False):
            sees += "; AND every client's local centres and sizes in plain (allow_plain_set_fields=True)"
        if self.insecure_threshold():
            floor = self.floor or {}
            sees += ("; AND, against a malicious server, single clients' inputs: the threshold is INSECURE "
                     f"(allow_insecure_threshold=True; t={floor.get('t')} of {floor.get('holders')} holders, "
                     f"secure floor {floor.get('secure_t')}): two disjoint sets of holders can each reconstruct "
                     "one of a client's secrets, so a split view of the survivors unmasks it")
        trust = "no t of a client's holders (Shamir threshold) collude with the server"
        rates = (f"at most {self.graph_params['corrupt_fraction']:.0%} of the clients collude with the server and at "
                 f"most {self.graph_params['dropout_fraction']:.0%} drop (Bell et al. 2020's bounds; corrupt_fraction= "
                 "to assume more)")
        if self.graph == "auto":  # the sparse graph's degree and threshold rest on these rates
            trust += f"; above {AUTO_COMPLETE_MAX} clients the sparse graph assumes " + rates
        elif self.graph == "sparse":
            trust += "; the sparse graph assumes " + rates
        if self.floor is not None:
            trust += (f"; clients refuse rounds sampling fewer than {self.floor['sampled']} clients or listing "
                      f"fewer than {self.floor['survivors']} survivors (the run's floor, from clients_per_round="
                      f"{self.floor['clients_per_round']})")
        trust += ("; " + ("a malicious server is covered (signed keys, consistency check)" if self.sign_keys else
                          "the server follows the protocol (semi-honest; sign_keys=True for a malicious one)")
                  + "; the sum itself is not hidden (GaussianDP noises it)")
        return sees, trust

    def report(self) -> dict:
        return {"graph_params": dict(self.graph_params), "run_floor": None if self.floor is None else dict(self.floor),
                "insecure_threshold": self.insecure_threshold()}

    def insecure_threshold(self) -> bool:
        """Whether the opt-in ``allow_insecure_threshold=True`` let a threshold below the
        secure floor through (for the run's ``clients_per_round`` once set up; before that,
        whether the opt-in was given with an explicit threshold)."""
        if not self.allow_insecure_threshold:
            return False
        if self.floor is None:
            return self.threshold is not None
        return self.floor["t"] < self.floor["secure_t"]

    def designed_survivors(self, n_sampled: int) -> int:
        """The survivors this layer is declared to tolerate: all but ``dropout_fraction`` of
        the sampled clients (Bell et al.'s delta, default 10%), at least 2."""
        n = int(n_sampled)
        return min(n, max(2, math.ceil((1.0 - self.graph_params["dropout_fraction"]) * n - 1e-9)))

    def designed_corrupt(self, n_sampled: int) -> int:
        """The clients this layer is declared to tolerate colluding with the server:
        ``ceil(corrupt_fraction * n)`` of the sampled clients (Bell et al.'s gamma, default 5%)."""
        return math.ceil(self.graph_params["corrupt_fraction"] * int(n_sampled) - 1e-9)

    def run_floor(self, info: RunInfo) -> dict:
        """The run's floor, from its declared facts alone (``info``: the client's own RunInfo):
        the fewest clients a round may sample (:meth:`~securefkm.layers.Aggregator.sampled_floor`),
        the Shamir threshold and holders of a round of that many clients and the secure floor
        of that threshold (:func:`~protocols.masking.graph.threshold_floor`), and the fewest
        survivors a round may decode (the protocol's minimum for that many clients). Clients
        refuse rounds below it (:meth:`round_refusal`, the survivor checks of
        :class:`~protocols.masking.client.MaskingClient`) and, with ``sign_keys``, sign it
        with the survivor list, so that clients shown different floors cannot unmask
        together."""
        n = info.clients_per_round
        sampled = self.sampled_floor(info)
        kind, k, t, min_surv, bell_t = minimums(max(sampled, 1), self.graph, self.neighbours, self.threshold,
                                                self.graph_params, allow_insecure=self.allow_insecure_threshold)
        from .graph import threshold_floor

        secure_t = threshold_floor(kind, k + 1, bell_t if kind == "sparse" and self.neighbours is None else None)
        return {"n_clients": int(info.n_clients), "clients_per_round": int(n), "sampled": int(sampled),
                "graph": kind, "holders": int(k + 1), "t": int(t), "secure_t": int(secure_t),
                "survivors": int(min_surv), "allow_insecure_threshold": self.allow_insecure_threshold}

    def setup(self, info: RunInfo) -> None:
        if isinstance(self.threshold, (int, np.integer)) and resolve_graph(
            info.clients_per_round, self.graph, self.neighbours, self.graph_params
        )[0] == "complete":
            if self.threshold > info.clients_per_round:
                raise InputError(
                    f"PairwiseMasking threshold={self.threshold} exceeds clients_per_round="
                    f"{info.clients_per_round}; lower the threshold or sample more clients."
                )
        # the threshold of a full round, then the run's floor (both refuse an insecure threshold)
        minimums(info.clients_per_round, self.graph, self.neighbours, self.threshold, self.graph_params,
                 allow_insecure=self.allow_insecure_threshold)
        self.floor = self.run_floor(info)
        self._statement_key = None
        if self.registry is not None:
            self.registry.provision(range(info.n_clients))

    def sampled_floor(self, info: RunInfo) -> int:
        """:meth:`Aggregator.sampled_floor <securefkm.layers.Aggregator.sampled_floor>`, raised to
        an explicit int ``threshold`` (a round of fewer sampled clients could not complete)."""
        floor = super().sampled_floor(info)
        if isinstance(self.threshold, (int, np.integer)) and not isinstance(self.threshold, bool):
            floor = max(floor, min(int(self.threshold), int(info.clients_per_round)))
        return floor

    def round_refusal(self, ctx: RoundContext, client_id: int) -> str | None:
        """The sampled-set checks of :meth:`Aggregator.round_refusal
        <securefkm.layers.Aggregator.round_refusal>`, then this round's plan as the client
        derives it: a plan whose threshold falls below the secure floor of its graph (without
        ``allow_insecure_threshold``) or that cannot be made is refused. The plan's survivor
        minimum includes the run's floor (:meth:`run_floor`), which the client's survivor
        checks enforce at the consistency check and at unmask."""
        why = super().round_refusal(ctx, client_id)
        if why is not None or not ctx.specs:
            return why
        try:
            self.plan(ctx)
        except (RoundAbortedError, InputError) as exc:
            return f"client {client_id} refuses the round: {exc}"
        return None

    def statement_digest(self, ctx: RoundContext) -> bytes:
        """What a client signs with the survivor list at the consistency check, besides the
        round id: SHA-256 over the broadcast digest and the run's floor (:meth:`run_floor`,
        canonical JSON), so that clients holding different floors never count each other's
        signatures towards a quorum."""
        floor = self.floor if self.floor is not None else self.run_floor(ctx.info)
        blob = json.dumps(floor, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(keys.DOMAIN + b"|statement|" + len(blob).to_bytes(8, "little") + blob
                              + bytes(ctx.broadcast_digest)).digest()

    def plan(self, ctx: RoundContext) -> RoundPlan:
        """The round's public plan (graph, thresholds), identical on server and clients."""
        cached = self.__dict__.get("_plan_cache")
        if cached is not None and cached[3] is ctx:  # the clients of one simulated round share their context
            return cached[2]
        length = sum(s.size for s in ctx.specs) + 1
        # a retried round (ctx.attempt > 0) gets its own id: nothing signed in an aborted
        # attempt (adverts, share ciphertexts) verifies in the retry
        rid = keys.round_id(ctx.run, ctx.round, ctx.action if not ctx.attempt else f"{ctx.action}|attempt={ctx.attempt}")
        if len(ctx.sampled) < 2:
            raise RoundAbortedError(
                f"pairwise masking needs at least 2 sampled clients (got {len(ctx.sampled)}): "
                "the sum of one client is its input",
                round=ctx.round,
                stage="advertise",
            )
        # the plan does not decode fewer than the client-side layers allow nor than the run's floor
        floor = max(self.survivors_floor(ctx), 0 if self.floor is None else self.floor["survivors"])
        key = (rid, length, floor)
        # in-process simulation: clients of one round share the plan (and usually the very
        # sampled tuple, whose identity spares an O(n) comparison per client)
        if cached is not None and cached[0] == key and (cached[1] is ctx.sampled or cached[1] == tuple(ctx.sampled)):
            self._plan_cache = cached[:3] + (ctx,)
            return cached[2]
        try:
            plan = make_plan(rid, ctx.sampled, self.graph, self.neighbours, self.threshold, length, self.graph_params,
                             survivors_floor=floor, allow_insecure=self.allow_insecure_threshold)
        except InputError as exc:
            raise RoundAbortedError(str(exc), round=ctx.round, stage="advertise") from None
        self._plan_cache = (key, tuple(ctx.sampled), plan, ctx)
        return plan

    def before_round(self, ctx: RoundContext) -> None:
        if not ctx.specs:  # nothing to aggregate (e.g. a seeding round of set-fields): no masking round
            return
        self.codec.check_capacity(ctx.specs, len(ctx.sampled))
        self.plan(ctx)

    def server_session(self, ctx: RoundContext) -> MaskingServer:
        self.codec.check_capacity(ctx.specs, len(ctx.sampled))
        server = MaskingServer(
            ctx,
            self.plan(ctx),
            self.codec,
            cipher=self.cipher,
            bind_broadcast=self.bind_broadcast,
            registry=None if self.registry is None else self.registry.public,
            consistency=self.sign_keys,
            history=self.__dict__.setdefault("_history", RunHistory()),  # the fit's replayed-message memory
        )
        if self.sign_keys:  # the clients sign the survivor list with the run's floor
            server.statement_digest = self.statement_digest(ctx)
        return server

    def client_session(self, client: ClientContext, ctx: RoundContext, sums) -> MaskingClient:
        return self.client_sessions([client], ctx, [sums])[0]

    def client_sessions(self, clients, ctx: RoundContext, sums_list) -> list[MaskingClient]:
        """The clients' sessions; their Shamir polynomials are drawn together
        (:meth:`MaskingClient.prepare_sharing`, vectorised across the clients)."""
        plan = self.plan(ctx)
        # every client's input encoded in one pass: row i is exactly client i's encoding
        # (FixedPointCodec.encode_signed_many; the first failing client's error otherwise)
        vectors = np.empty((len(sums_list), plan.length), dtype=np.uint64)
        vectors[:, :-1] = self.codec.encode_signed_many(sums_list, ctx.specs, len(ctx.sampled)).view(np.uint64)
        vectors[:, -1] = 1  # check slot: the unmasked sum must equal the number of contributors
        sessions = [self._client_session(c, ctx, plan, v) for c, v in zip(clients, vectors)]
        MaskingClient.prepare_sharing(sessions)
        MaskingClient.share_pair_secrets(sessions)
        return sessions

    def _client_session(self, client: ClientContext, ctx: RoundContext, plan: RoundPlan, vector) -> MaskingClient:
        identity = None
        if self.registry is not None:
            # out-of-band provisioning of the client's long-term identity key (simulated PKI)
            identity = client.state.get(IDENTITY_STATE_KEY)
            if identity is None:
                identity = self.registry.private(client.client_id)
                client.state[IDENTITY_STATE_KEY] = identity
        return MaskingClient(
            client.client_id,
            plan,
            vector,
            ctx.broadcast_digest if self.bind_broadcast else b"",
            cipher=self.cipher,
            identity_private=identity,
            registry=None if self.registry is None else self.registry.public,
            consistency=self.sign_keys,
            statement_digest=self.statement_digest(ctx) if self.sign_keys else ctx.broadcast_digest,
            survivors_floor=None if self.floor is None else self.floor["survivors"],
        )
