"""``ValidatedAggregation``: a secure sum whose every input is proven valid (Prio3, two aggregators).

Round protocol (one client stage, ``validated_input``, plus two server -> Helper calls):

1. server: ``helper.open_round(...)`` -> single-use :class:`~.helper.ValidationTicket` and a
   fresh Prio3 verification key (kept by the server as the Leader); sends every sampled
   client ``ValidationRequest(bundle, ticket)``;
2. client: verifies the Helper's signed bundle against the Helper key it trusts and the
   ticket against its own round (run, round, attempt, broadcast digest, circuit parameters);
   turns its counts and the sums weighted by them into the integer measurement of
   :mod:`.measurement`; shards it with Prio3 (``ClusterValidity`` circuit, its own ``n_max``),
   seals the Helper's input share with HPKE and signs the report with its enrolled key;
3. server (Leader): decodes each report (a malformed one names its sender), runs its half of
   the verification and forwards the rest to the Helper; the Helper returns the verifier
   message of each valid report and the reason of each refused one; each refused client is
   named in the round's faults and left out, the round goes on with the others;
4. server: aborts if fewer than ``max(min_clients, the client-side layers' floor)`` reports are
   valid (nothing is released); else asks the Helper for its aggregate share over the valid
   reports, adds its own and decodes the exact sum of the valid clients' encoded values.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from securefkm.exceptions import InputError, ProtectionConfigError, RoundAbortedError
from securefkm.layers import Aggregator, ClientContext, ClientSession, ProtocolRefusal, RoundContext, ServerSession
from securefkm.validation import check_int

from . import helper as H
from ._parallel import map_reports
from .measurement import Layout, layout_for

log = logging.getLogger("securefkm")

#: the field's modulus bound: every aggregate entry must stay below it (Field128, p > 2**127)
_FIELD_BITS = 127


class ValidatedAggregation(Aggregator):
    """Secure aggregation that proves every client's counts and sums valid (Prio3 with a Helper).

    Each client's per-cluster counts ``c_j`` and the sums weighted by them are proven, without
    being revealed, to satisfy: every ``c_j`` a whole number ``>= 0``; ``sum_j c_j <= n_max``
    (the client's declared record count, or ``max_records``); every coordinate sum
    ``S_je`` within ``c_j x [low_e, high_e]`` (the declared box, in fixed point with
    ``frac_bits``). The proof is Prio3's fully linear proof on secret-shared data
    (draft-irtf-cfrg-vdaf, Sec. 7; Boneh et al., CRYPTO 2019) with the clustering validity
    circuit :class:`protocols.vdaf.ClusterValidity`. A client whose report fails is named in
    the round's faults (the runtime strikes it, ``Federation(max_client_faults=...)``) and
    left out; the round completes with the others, whose sum is released exactly.

    Trust model
    -----------
    * **Two aggregators that must not collude**: the server (Leader) and the
      :class:`~protocols.validated.helper.ValidationHelper` (Helper), run by someone else.
      Each sees one secret share of every report (uniformly random alone) and the sum of the
      valid reports; together they see every client's values.
    * **Server learns**: which clients sent a report, which reports were valid, and the exact
      sum over at least ``min_clients`` valid clients (as under masking; add GaussianDP for
      the sum itself).
    * **What is guaranteed against malicious clients**: a released sum holds only inputs that
      satisfy the conditions above (soundness error of the FLP about ``(2 * gadget calls) /
      |Field128|`` per report), so ``m`` malicious clients with ``M`` declared records in total
      move a centre by at most ``M / (C_j + M)`` times the box's diameter per round
      (:func:`protocols.influence.mean_shift_bound`).
    * **Not detected**: an in-range lie about one's own data (claiming its records sit
      elsewhere in the box); a malicious client can also make its own report fail (then it is
      left out). Set-fields are refused (no circuit can check a list the server reads in plain).
    * **Clients must not trust the server for**: the Helper's key (they check its signed
      bundle against the Helper key configured out of band) and the round's parameters
      (checked against their own).

    Parameters
    ----------
    min_clients:
        fewest valid clients whose sum may be released (the Helper enforces it too).
    max_records:
        ``n_max`` of every client; default ``None``: each client's own declared record count
        (the run's ``client_sizes``, known in simulation; a deployment passes it).
    frac_bits:
        fractional bits of the fixed-point encoding of sums (default 16).
    bounds:
        the records' box ``(low, high)``; default: the fit's declared domain (``init_bounds``
        or GaussianDP's ``bounds``).
    helper:
        an existing :class:`~protocols.validated.helper.ValidationHelper` (a separate
        service); default a fresh one per fit, in process.
    """

    stages = (H.STAGE,)
    input_stage = H.STAGE
    client_public_key_work = True  # HPKE sealing, Ed25519 signing and proving every round

    def __init__(self, min_clients: int = 2, max_records: int | None = None, frac_bits: int = 16, bounds=None,
                 *, helper: H.ValidationHelper | None = None):
        self.min_clients = check_int(min_clients, "min_clients", minimum=2)
        self.max_records = None if max_records is None else check_int(max_records, "max_records", minimum=1)
        self.frac_bits = check_int(frac_bits, "frac_bits", minimum=0, maximum=40)
        self.bounds = None if bounds is None else _check_bounds(bounds)
        if helper is not None and not isinstance(helper, H.ValidationHelper):
            raise InputError(f"helper must be a ValidationHelper, got {type(helper).__name__}.")
        self._given_helper = helper
        self.helper: H.ValidationHelper | None = None
        self._domain = self.bounds
        self._sizes: tuple[int, ...] | None = None
        self._repr_params = {"min_clients": min_clients, "max_records": max_records, "frac_bits": frac_bits}

    # ------------------------------------------------------------------ configuration
    def declared_domain(self):
        return None if self.bounds is None else (np.asarray(self.bounds[0], float), np.asarray(self.bounds[1], float))

    def declare_domain(self, domain) -> None:
        """The fit's declared box (``init_bounds`` or GaussianDP's ``bounds``), unless given here."""
        if self.bounds is None and domain is not None:
            self._domain = _check_bounds(domain)
        if self._domain is None:
            raise ProtectionConfigError(
                "ValidatedAggregation proves each coordinate sum lies within count x the records' box, so the box "
                "must be declared: pass init_bounds=(low, high) to the estimator (the public range of every "
                "feature), or ValidatedAggregation(bounds=(low, high)).",
                cli="ValidatedAggregation proves each coordinate sum lies within count x the records' box, so the "
                "box must be declared: pass --param init_bounds=[low,high] (the public range of every feature).",
            )

    def validate_stack(self, stack, algorithm) -> None:
        super().validate_stack(stack, algorithm)
        if algorithm is not None and getattr(algorithm, "uses_set_fields", False):
            param = getattr(algorithm, "secure_mode_param", None)
            raise ProtectionConfigError(
                f"ValidatedAggregation validates sum-fields only, but {getattr(algorithm, 'name', algorithm)} sends each "
                "client's local centres as set-fields. Use WeightedFederatedKMeans (DWF) or mini-batch federated "
                "k-means" + (f", or the algorithm's secure mode ({param}=True) with PairwiseMasking" if param else "") + "."
            )
        self._dp = None
        for layer in stack:
            if layer.side != "client":
                continue
            if callable(getattr(layer, "release_noise", None)) and getattr(layer, "mode", None) == "central":
                self._dp = layer  # its noise is added by the Helper (release_noise_grid)
            refusal = self.client_noise_refusal(getattr(layer, "mode", None)) if layer.name == "GaussianDP" else None
            if refusal is not None:
                raise ProtectionConfigError(refusal)
            if layer.perturbs_client_messages():
                raise ProtectionConfigError(
                    f"{layer.name} changes each client's counts or sums before they are proven, which would make honest "
                    f"updates fail validation; drop {layer.name} or use PairwiseMasking without validation."
                )

    def client_noise_refusal(self, mode):
        if mode == "central":
            return None
        return (f"GaussianDP(mode={mode!r}) adds noise to each client's counts and sums before they are proven, so no "
                "noised update could pass validation. With ValidatedAggregation use GaussianDP(mode='central'): the "
                "Helper adds the noise to its aggregate share, so the server sees only the noisy sum of the validated "
                "inputs (the Helper, which must not collude with the server, is trusted with the noise).")

    noise_party = "the Helper (ValidationHelper)"

    def release_noise_grid(self, spec):
        """Central noise is added by the Helper in the encoded domain: whole counts, sums on
        the ``2**-frac_bits`` grid."""
        return 1.0 if spec.kind == "count" and spec.integer else 2.0 ** -self.frac_bits

    def noise_plan(self, ctx: RoundContext, lay: Layout) -> H.NoisePlan | None:
        """The round's central DP noise in the Helper's encoded units, from public quantities
        (GaussianDP's calibration of this round), or None without a central GaussianDP."""
        dp = getattr(self, "_dp", None)
        if dp is None:
            return None
        sigmas, pairs, centres = dp.release_noise(ctx.specs, ctx)
        if not sigmas:
            return None
        scale = lay.scale
        offsets = [[0] * lay.d for _ in range(lay.k)]
        col = 0
        for name, width in lay.columns:
            if name in pairs:
                for j in range(lay.k):
                    for e in range(width):
                        offsets[j][col + e] = int(np.rint(centres[j, e] * scale)) - lay.lo[col + e]
            col += width
        return H.NoisePlan(lay.count, float(sigmas.get(lay.count, 0.0)),
                           tuple(H.NoiseField(name, float(sigmas.get(name, 0.0)) * scale, width)
                                 for name, width in lay.columns),
                           tuple(x for row in offsets for x in row))

    def noise_sources(self, ctx: RoundContext):
        """Byte sources of the Helper's noise: GaussianDP(rng="seeded")'s keystreams labelled
        by the round and field (owner "helper"), or the OS CSPRNG."""
        dp = getattr(self, "_dp", None)
        if dp is None or getattr(dp, "rng", "system") == "system":
            return None  # the Helper's own CSPRNG
        return lambda field: dp._source(ctx, "helper", field)

    def setup(self, info) -> None:
        if self.min_clients > info.n_clients:
            raise InputError(f"ValidatedAggregation(min_clients={self.min_clients}) needs at least that many clients; "
                             f"the federation has {info.n_clients}. Lower min_clients.")
        if self._domain is None:
            self.declare_domain(None)
        node = getattr(self, "_node_trust", None)
        if node is not None:  # a deployment's client node: no Helper here, only the key it trusts
            self.helper, self.bundle = None, None
            self.trusted_helper_key = node[0]
        else:
            self.helper = self._given_helper or H.ValidationHelper(min_clients=self.min_clients)
            self.bundle = self.helper.public_bundle()
            self.trusted_helper_key = self.bundle.helper_key
        self._sizes = None if info.client_sizes is None else tuple(int(n) for n in info.client_sizes)
        if self.max_records is None and self._sizes is None:
            raise ProtectionConfigError(
                "ValidatedAggregation needs each client's declared record count to bound its counts: this run has "
                "none (a deployment); pass ValidatedAggregation(max_records=N) with the most records a client may hold."
            )
        self._n_clients = int(info.n_clients)

    def n_max(self, client_id: int, own_records: int | None = None) -> int:
        """The record bound client ``client_id``'s counts are proven against."""
        if self.max_records is not None:
            return self.max_records
        if self._sizes is not None:
            return self._sizes[int(client_id)]
        return int(own_records)

    def layout(self, ctx: RoundContext) -> Layout:
        low, high = self._domain
        return layout_for(ctx.specs, low, high, self.frac_bits)

    def before_round(self, ctx: RoundContext) -> None:
        if self.helper is None and getattr(self, "_node_trust", None) is not None:
            return  # a client node: the server checks the round
        if self.helper is None:
            raise InputError("ValidatedAggregation used before setup(); run it through a Federation or estimator.")
        if not ctx.specs:
            return
        lay = self._last_layout = self.layout(ctx)
        n_max = self.max_records or max(self._sizes)
        bits = (len(ctx.sampled) * n_max * max(lay.widths + (1,))).bit_length()
        if bits >= _FIELD_BITS:
            raise RoundAbortedError(
                f"a validated sum of {len(ctx.sampled)} clients with up to {n_max} records each in a box of "
                f"{max(lay.widths)} encoding units could wrap Field128; lower frac_bits={self.frac_bits} or the "
                "clients per round.", round=ctx.round, stage=H.STAGE)

    def after_round(self, ctx: RoundContext, agg) -> None:
        """Keep the last released per-cluster counts: the honest mass the influence bound needs."""
        lay = getattr(self, "_last_layout", None)
        if ctx.specs and agg.sums and lay is not None and lay.count in agg.sums and len(lay.columns) == 1 \
                and lay.columns[0][1] > 1:
            self._last_counts = np.asarray(agg.sums[lay.count], dtype=np.float64).copy()
            if lay.votes is not None and lay.votes[0] in agg.sums:
                self._last_votes = np.asarray(agg.sums[lay.votes[0]], dtype=np.float64).copy()

    def influence(self, n_malicious: int = 1) -> dict | None:
        """How far ``n_malicious`` clients, each declaring the most records any client may hold,
        can move a centre in one round against the last round's released counts
        (:func:`protocols.influence.influence_report`); None before a completed round."""
        counts = getattr(self, "_last_counts", None)
        if counts is None or self._domain is None:
            return None
        from protocols.influence import influence_report

        per_client = self.max_records or max(self._sizes)
        m = int(n_malicious)
        # the released counts hold the malicious clients' own: the honest mass is at least this much less
        honest = np.maximum(counts - m * per_client, 0.0)
        out = influence_report(m, m * per_client, honest, self._domain)
        votes = getattr(self, "_last_votes", None)
        if votes is not None and votes.sum() > 0:
            from protocols.influence import median_shift_bound

            # proven well-formed votes: each client at most one per (cluster, coordinate); against
            # the released histogram (which holds the m malicious votes too) 2 m votes bound them
            med = median_shift_bound(2 * m, votes, self._domain)
            out.update(median=med, median_max=float(med.max()))
            out["lines"].append(f"with aggregation='median' and its votes proven well formed: at most "
                                f"{med.max():.2g} per round ({m} malicious vote{'s' if m != 1 else ''} per cluster "
                                "and coordinate)")
        return out

    def report(self) -> dict:
        if self.helper is None:
            return {}
        out = {"frac_bits": self.frac_bits, "min_clients": self.min_clients,
               "max_records": self.max_records, "helper_aggregates": self.helper.n_aggregates}
        bound = self.influence(1)
        if bound is not None:
            out["influence"] = "; ".join(bound["lines"])
            out["influence_max"] = bound["max"]
            if "median_max" in bound:
                out["influence_median_max"] = bound["median_max"]
        return out

    def server_view(self, algorithm, aggregator):
        sees = ("one Prio3 report per client (public share, the Leader's uniformly random input share, the Helper's "
                "share sealed with HPKE), which reports were valid, and the exact sum of the valid clients' counts and "
                "sums")
        bound = self.influence(1)
        if bound is not None:
            sees += f"; validation bounds a malicious client's influence: {bound['lines'][0]}"
        trust = ("the Helper must not collude with the server (together they recover every input); fewer than "
                 "min_clients clients must not collude with the server; an in-range lie about a client's own data "
                 "is not detected; the sum itself is not hidden (GaussianDP(mode='central') noises it)")
        return sees, trust

    # ------------------------------------------------------------------ deployments
    def use_helper(self, helper) -> None:
        """The server's Helper in a deployment: a handle on the Helper service
        (:class:`securefkm.flower.RemoteHelper`), run by a party other than the server."""
        self._given_helper = helper

    def trust_helper(self, helper_key: bytes, signing_key: bytes) -> None:
        """A deployment's client node: the Helper key it trusts (from its own directory) and
        its own Ed25519 signing key, the one the Helper enrolled from the directory."""
        if not (isinstance(helper_key, bytes) and len(helper_key) == 32 and isinstance(signing_key, bytes)
                and len(signing_key) == 32):
            raise InputError("trust_helper needs the Helper's 32-byte Ed25519 public key and the node's 32-byte "
                             "private key.")
        self._node_trust = (helper_key, signing_key)

    def __deepcopy__(self, memo):
        """A fit's copy shares the Helper given to it (a service, not data to copy)."""
        import copy

        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = v if k in ("_given_helper", "helper") else copy.deepcopy(v, memo)
        return new

    def __getstate__(self):
        """A pickled copy (a worker process running clients) carries the Helper's public
        bundle, never the Helper: its keys stay with the party that runs it."""
        state = dict(self.__dict__)
        state["helper"] = state["_given_helper"] = None
        return state

    # ------------------------------------------------------------------ sessions
    def _enroll(self, client: ClientContext) -> dict:
        if self.helper is None:
            raise InputError(f"client {client.client_id} is not enrolled with the Helper: enroll clients "
                             "(provision_client) where the Helper runs, before they move to a worker.")
        key = Ed25519PrivateKey.generate()
        self.helper.enroll(client.client_id, key.public_key().public_bytes_raw())
        state = {"helper": self.bundle.fingerprint, "signing_key": key.private_bytes_raw()}
        client.state["validated"] = state
        return state

    def provision_client(self, client: ClientContext) -> None:
        """Enroll the client with the Helper before it moves to a worker (the Helper stays here)."""
        if "validated" not in client.state:
            self._enroll(client)

    def client_session(self, client: ClientContext, ctx: RoundContext, sums) -> ClientSession:
        node = getattr(self, "_node_trust", None)
        if node is not None:
            state = {"signing_key": node[1]}
        else:
            state = client.state.get("validated")
            if state is None or state.get("helper") != self.bundle.fingerprint:
                state = self._enroll(client)
        lay = self.layout(ctx)
        counts, shifted, *votes = lay.measurement(sums)
        return ValidatedClientSession(
            client_id=client.client_id, counts=counts, shifted=shifted, n_max=self.n_max(client.client_id, client.n_records),
            k=lay.k, widths=lay.widths, frac_bits=lay.frac_bits, signing_key=state["signing_key"],
            trusted_helper_key=self.trusted_helper_key, run=ctx.run, round=ctx.round, attempt=ctx.attempt,
            digest=ctx.broadcast_digest, min_clients=self.min_clients, noise=self.noise_plan(ctx, lay),
            vote_shape=lay.vote_shape, votes=votes[0] if votes else None,
        )

    def server_session(self, ctx: RoundContext) -> ServerSession:
        return _ValidatedServer(self, ctx)

    def too_few(self, n: int, ctx: RoundContext) -> RoundAbortedError | None:
        floor = self.survivors_floor(ctx)
        if n >= max(self.min_clients, floor):
            return None
        who = (f"ValidatedAggregation(min_clients={self.min_clients})" if n < self.min_clients else
               f"a client-side layer (its floor of {floor} contributors)")
        return RoundAbortedError(f"only {n} client(s) sent a valid report; {who} refuses to release fewer "
                                 "(nothing was released)", round=ctx.round, stage=H.STAGE)


def _check_bounds(bounds):
    try:
        low, high = bounds
        low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"bounds must be a pair (low, high) of numbers or per-feature arrays, got {bounds!r}.") from None
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high)) and np.all(high > low)):
        raise InputError(f"bounds must be finite with high > low in every feature, got {bounds!r}.")
    return low, high


@dataclass
class ValidatedClientSession(ClientSession):
    """A client's side of one validated round (plain data: picklable)."""

    client_id: int
    counts: list
    shifted: list
    n_max: int
    k: int
    widths: tuple
    frac_bits: int
    signing_key: bytes
    trusted_helper_key: bytes
    run: int
    round: int
    attempt: int
    digest: bytes
    min_clients: int
    noise: H.NoisePlan | None = None
    vote_shape: tuple[int, int] | None = None  # the circuit's vote histogram (coordinates, bins)
    votes: list | None = None  # this client's votes (k x coordinates x bins)

    def check_request(self, message) -> H.ValidationTicket:
        if not isinstance(message, H.ValidationRequest):
            raise ProtocolRefusal(f"expected a ValidationRequest, got {type(message).__name__}")
        try:
            message.bundle.verify(self.trusted_helper_key)
        except ValueError as exc:
            raise ProtocolRefusal(f"refusing to send a report: {exc}") from None
        t = message.ticket
        if (t.run, t.round, t.attempt, t.digest) != (self.run, self.round, self.attempt, self.digest):
            raise ProtocolRefusal("round ticket does not match the round and broadcast this client computed")
        if (t.k, tuple(t.widths), t.frac_bits, t.votes) != (self.k, tuple(self.widths), self.frac_bits,
                                                            self.vote_shape):
            raise ProtocolRefusal("round ticket's circuit parameters (clusters, box widths, frac_bits, votes) differ "
                                  "from this client's own")
        if t.noise != self.noise:
            raise ProtocolRefusal("round ticket's DP noise plan (the noise the Helper adds) differs from this client's "
                                  "own calibration of the round")
        if t.min_clients < self.min_clients:
            raise ProtocolRefusal(f"round ticket's min_clients={t.min_clients} is below this client's "
                                  f"{self.min_clients}")
        return t

    def respond(self, stage: str, message) -> H.ValidatedReport:
        if stage != H.STAGE:
            raise ProtocolRefusal(f"validated-aggregation client got unknown stage {stage!r}")
        t = self.check_request(message)
        vdaf = H.make_vdaf(self.k, tuple(self.widths), self.n_max, self.vote_shape)
        ctx = H.application_context(t)
        nonce = os.urandom(vdaf.NONCE_SIZE)
        encoded = encode_for_proof(vdaf, self.counts, self.shifted, self.votes)
        public, shares = vdaf.shard_encoded(ctx, encoded, nonce, os.urandom(vdaf.RAND_SIZE))
        public_b = vdaf.encode_public_share(public)
        leader_b = vdaf.encode_input_share(0, shares[0])
        sealed = H.SUITE.encrypt(vdaf.encode_input_share(1, shares[1]),
                                 X25519PublicKey.from_public_bytes(message.bundle.hpke_key),
                                 info=H.seal_info(ctx, self.client_id, nonce))
        sig = H.sign_report(self.signing_key, H.report_payload(message.bundle.fingerprint, ctx, self.client_id, nonce,
                                                               public_b, sealed))
        self.counts = self.shifted = self.votes = None  # the measurement leaves with the report
        return H.ValidatedReport(self.client_id, nonce, public_b, leader_b, sealed, sig)


def encode_for_proof(vdaf, counts, shifted, votes=None) -> list[int]:
    """The client's encoded measurement (:meth:`protocols.vdaf.ClusterValidity.encode_lenient`):
    the circuit's encoding for a valid update; for an invalid one (a lie passed through the
    honest code path), an encoding that keeps the true values and fails the proof's bit check,
    so the client is caught at verification like any malicious sender."""
    return vdaf.flp.valid.encode_lenient((counts, shifted) if votes is None else (counts, shifted, votes))


def _leader_verify(k, widths, votes, verify_key, app_ctx, c, n_max, nonce, public_b, leader_b):
    """The Leader's check of one report: ``(verify state, encoded verifier share, None)`` or
    ``(None, None, why)``; module level, so the checks can run in worker processes."""
    from protocols.vdaf import VdafError

    vdaf = H.make_vdaf(k, widths, n_max, votes)
    try:
        if not isinstance(nonce, bytes) or len(nonce) != vdaf.NONCE_SIZE:
            raise VdafError(f"field report_nonce is not {vdaf.NONCE_SIZE} bytes")
        public = vdaf.decode_public_share(public_b)
        share = vdaf.decode_input_share(0, leader_b)
        state, vshare = vdaf.verify_init(verify_key, app_ctx, 0, None, nonce, public, share)
    except (VdafError, ValueError, TypeError) as exc:
        return None, None, f"its report is malformed ({exc})"
    return state, vdaf.encode_verifier_share(vshare), None


class _ValidatedServer(ServerSession):
    def __init__(self, layer: ValidatedAggregation, ctx: RoundContext):
        self.layer, self.ctx = layer, ctx
        self.lay = layer.layout(ctx)
        self.ticket, self.verify_key = layer.helper.open_round(
            ctx.run, ctx.round, ctx.attempt, ctx.broadcast_digest, self.lay.k, self.lay.widths, self.lay.frac_bits,
            layer.noise_plan(ctx, self.lay), self.lay.vote_shape)
        self.app_ctx = H.application_context(self.ticket)
        self.out_shares: dict[int, object] = {}

    def messages(self, stage, alive):
        request = H.ValidationRequest(self.layer.bundle, self.ticket)
        return {c: request for c in alive}

    def _fault(self, c: int, why: str) -> None:
        self.faults[int(c)] = f"stage {H.STAGE!r}: {why}"
        log.warning("ValidatedAggregation: leaving client %s out of round %s: %s", c, self.ctx.round, why)

    def receive(self, stage, replies):
        from protocols.vdaf import VdafError

        layer, ctx = self.layer, self.ctx
        forwarded, states, todo = {}, {}, []
        for c, rep in replies.items():
            c = int(c)
            if not isinstance(rep, H.ValidatedReport):
                self._fault(c, f"the reply is a {type(rep).__name__}, not a ValidatedReport")
                continue
            if type(rep.client_id) is not int or rep.client_id != c:
                self._fault(c, f"field client_id is {rep.client_id!r}, not the sender's id {c}")
                continue
            todo.append((c, layer.n_max(c), rep.report_nonce, rep.public_share, rep.leader_share))
        results = map_reports(_leader_verify, (self.lay.k, self.lay.widths, self.lay.vote_shape, self.verify_key,
                                               self.app_ctx), todo)
        for (c, n_max, *_), (state, vshare_b, why) in zip(todo, results):
            if why is not None:
                self._fault(c, why)
                continue
            rep = replies[c]
            states[c] = (H.make_vdaf(self.lay.k, self.lay.widths, n_max, self.lay.vote_shape), state)
            forwarded[c] = H.HelperReport(rep.report_nonce, rep.public_share, rep.sealed_helper_share, rep.signature,
                                          n_max, vshare_b)
        if not forwarded:
            return
        messages, refused = layer.helper.verify(self.ticket.nonce, forwarded)
        for c, why in refused.items():
            self._fault(c, why)
        for c, vmsg_b in messages.items():
            vdaf, state = states[c]
            try:
                self.out_shares[c] = vdaf.verify_next(self.app_ctx, state, vdaf.decode_verifier_message(vmsg_b))
            except (VdafError, ValueError):
                self._fault(c, H.INVALID)

    def result(self):
        layer, ctx = self.layer, self.ctx
        accepted = tuple(sorted(self.out_shares))
        too_few = layer.too_few(len(accepted), ctx)
        if too_few is not None:
            layer.helper.close_round(self.ticket.nonce)
            raise too_few
        helper_share = layer.helper.aggregate(self.ticket.nonce, accepted, layer.noise_sources(ctx))
        vdaf = H.make_vdaf(self.lay.k, self.lay.widths, 1, self.lay.vote_shape)
        leader_share = vdaf.aggregate(None, [self.out_shares[c] for c in accepted])
        if self.ticket.noise is None:
            parts = vdaf.unshard(None, [leader_share, helper_share], len(accepted))
        else:  # noisy: values may be negative, read the field elements as signed
            q = vdaf.field.MODULUS
            flat = [(a + b) % q for a, b in zip(leader_share, helper_share)]
            flat = [x - q if x > q // 2 else x for x in flat]
            k, d = self.lay.k, self.lay.d
            parts = (flat[:k], [flat[k + j * d:k + (j + 1) * d] for j in range(k)])
        return self.lay.decode(*parts), accepted
