"""The ``Paillier`` aggregator: packed Paillier encryption with a separate key authority.

Round protocol (one aggregator stage, ``encrypted_input``, plus one server -> authority call):

1. server: ``authority.open_round(run, round, digest)`` -> single-use :class:`RoundTicket`;
   sends every surviving client ``EncryptRequest(bundle, ticket)`` where ``bundle`` is the
   Paillier public key signed by the authority;
2. client: verifies the bundle against the authority key it trusts, encodes its sum-fields
   with the shared :class:`~protocols.codec.FixedPointCodec` (signed ``int64``), packs them
   into slots (:mod:`protocols.paillier.packing`), encrypts each packed plaintext with phe's
   ``raw_encrypt`` (fresh ``r^n`` obfuscation from the OS CSPRNG) and signs the ciphertexts
   with its enrolled Ed25519 key;
3. server: keeps well-formed contributions (a client that did not answer is simply left
   out), aborts if fewer than ``min_clients`` remain, multiplies the ciphertexts (phe
   ``EncryptedNumber`` addition) and forwards sum + signed contributions to the authority;
4. authority: verifies everything, recomputes the sum, decrypts only the sum
   (:class:`~protocols.paillier.authority.KeyAuthority`); the server unpacks the slots,
   subtracts ``n * offset`` and decodes with the codec.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from securefkm.validation import check_int
from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.layers import (
    Aggregator,
    ClientContext,
    ClientSession,
    ProtocolRefusal,
    RoundContext,
    RunInfo,
    ServerSession,
)

from .authority import (
    KEY_SIZES,
    STAGE,
    EncryptedContribution,
    EncryptRequest,
    KeyAuthority,
    homomorphic_sum,
    sign_contribution,
    verify_contribution,
)
from .packing import MAX_VALUE_BITS, SlotLayout, layout_for_key

log = logging.getLogger("securefkm")


def _default_codec():
    from protocols.codec import FixedPointCodec

    return FixedPointCodec()


def value_bits_for_codec(codec) -> int:
    """Bits of one client's encoded value implied by the codec's declared bound (else 64).

    With ``bound`` declared, the largest encoded magnitude is ``rint(bound * scale)``; one
    sign bit more holds it in two's complement. Without a bound the codec may emit any
    ``int64`` value (up to its :meth:`max_abs`), so the slot must hold 64 bits.
    """
    bound = getattr(codec, "bound", None)
    if bound is None:
        return MAX_VALUE_BITS
    magnitude = int(np.floor(float(bound) * codec.scale + 0.5))
    return min(MAX_VALUE_BITS, magnitude.bit_length() + 1)


class Paillier(Aggregator):
    """Secure sum by additively homomorphic (Paillier) encryption, with slot packing.

    Clients encrypt their encoded sum-fields under a Paillier public key (Paillier,
    EUROCRYPT 1999), packing ``floor((bits(n)-1) / (b + ceil(log2 max_clients)))`` values of
    ``b`` bits per ciphertext (BatchCrypt, USENIX ATC 2020); the server multiplies the
    ciphertexts, and a separate :class:`KeyAuthority` decrypts the sum only after checking
    Ed25519 signatures (RFC 8032) of at least ``min_clients`` distinct enrolled clients on
    a fresh single-use round ticket.

    Trust model
    -----------
    * **Private key**: held only by the key authority, never by the server or the clients.
      Clients get only the public key (signed by the authority; they trust the authority's
      Ed25519 key, configured out of band).
    * **Server learns**: which clients contributed, ciphertexts (semantically secure under
      the decisional composite residuosity assumption), and the decrypted *sum* of at least
      ``min_clients`` clients' encoded sum-fields (as under pairwise masking).
    * **Must not collude**: the server with the authority (together they decrypt any single
      client's ciphertext: this breaks the layer completely); the server with
      ``min_clients - 1`` clients (they subtract their own inputs from the sum). Enrollment
      must be run by someone other than the server (else Sybil clients), and in this
      in-process simulation the client -> authority enrollment call stands for such a
      channel.
    * **Does not protect against**: what the sum itself reveals (use ``GaussianDP`` before
      this layer), differencing across rounds with different client subsets, set-fields
      (sent in plain), a malicious client sending wrong but well-formed values (no range
      proofs: a value beyond its slot is refused on honest clients; a malicious client's
      value that pushes the decrypted sum out of its slots' ranges aborts the round with
      nothing released, one that stays inside them goes unnoticed), denial of
      service by the server or the authority, a server that sends different broadcasts to
      different clients *and* gets each subset above ``min_clients`` (the authority
      refuses contributions signed for different broadcast digests within one round).

    Parameters
    ----------
    key_size:
        Paillier modulus bits, 2048 (default, ~112-bit security) or 3072 (~128-bit).
    min_clients:
        fewest distinct clients whose sum may be decrypted; fewer survivors abort the round.
    slot_bits:
        bits of one client's encoded value in a slot (two's complement range
        ``[-2**(b-1), 2**(b-1))``), 2..64. ``None``: derived from the codec's ``bound``
        (``bits(rint(bound * scale)) + 1``), or 64 without a bound. E.g. ``slot_bits=32``
        with ``frac_bits=24`` holds ``|v| < 128``; 2048-bit keys then hold 48 slots.
    codec:
        the shared :class:`protocols.codec.FixedPointCodec` (default ``FixedPointCodec()``).
    max_clients:
        most clients one sum may combine (sets the slot headroom); default: all clients of
        the run. A round sampling more is refused.
    authority:
        an existing :class:`KeyAuthority` (e.g. a separate service, or a test fixture with
        a small key); default: a new one with a fresh ``key_size`` keypair per fit.
    allow_plain_set_fields:
        Run on an algorithm that sends set-fields (k-FED, child/parent, aligning, FedFCM with
        k-means averaging, outside their secure mode): only the sum-fields are encrypted,
        every client's local centres and sizes reach the server in plain, and
        ``protection_report_`` says so. Default ``False``: such a stack is refused, naming
        the algorithm's secure mode.
    """

    stages = (STAGE,)
    input_stage = STAGE
    client_public_key_work = True  # Paillier encryptions every round

    def __init__(
        self,
        key_size: int = 2048,
        min_clients: int = 2,
        slot_bits: int | None = None,
        codec=None,
        *,
        max_clients: int | None = None,
        authority: KeyAuthority | None = None,
        allow_plain_set_fields: bool = False,
    ):
        if key_size not in KEY_SIZES or isinstance(key_size, bool):
            raise InputError(f"Paillier key_size must be 2048 or 3072 bits, got {key_size!r}.")
        self.key_size = int(key_size)
        self.min_clients = check_int(min_clients, "min_clients", minimum=1)
        if slot_bits is not None:
            if (
                not isinstance(slot_bits, (int, np.integer))
                or isinstance(slot_bits, bool)
                or not 2 <= slot_bits <= MAX_VALUE_BITS
            ):
                raise InputError(
                    f"slot_bits must be None or an int in [2, {MAX_VALUE_BITS}] (bits of one client's "
                    f"encoded value), got {slot_bits!r}."
                )
            slot_bits = int(slot_bits)
        self.slot_bits = slot_bits
        if codec is None:
            codec = _default_codec()
        if not all(
            hasattr(codec, a) for a in ("encode_signed", "decode_signed", "check_capacity", "scale")
        ):
            raise InputError(
                f"codec must be a protocols.codec.FixedPointCodec, got {type(codec).__name__}."
            )
        self.codec = codec
        if max_clients is not None:
            max_clients = check_int(max_clients, "max_clients", minimum=1)
            if max_clients < self.min_clients:
                raise InputError(
                    f"max_clients={max_clients} is below min_clients={self.min_clients}."
                )
        self.max_clients = max_clients
        if authority is not None and not isinstance(authority, KeyAuthority):
            raise InputError(f"authority must be a KeyAuthority, got {type(authority).__name__}.")
        self._given_authority = authority
        self._signing_key: bytes | None = None
        self.authority: KeyAuthority | None = None
        self.layout: SlotLayout | None = None
        self.allow_plain_set_fields = bool(allow_plain_set_fields)
        self._repr_params = {
            "key_size": key_size,
            "min_clients": min_clients,
            "slot_bits": slot_bits,
        }
        if self.allow_plain_set_fields:
            self._repr_params["allow_plain_set_fields"] = True

    # ------------------------------------------------------------------ setup
    @property
    def value_bits(self) -> int:
        return self.slot_bits if self.slot_bits is not None else value_bits_for_codec(self.codec)

    def use_authority(self, authority, *, signing_key: bytes | None = None) -> None:
        """Deployment hook: adopt a provisioned authority instead of an in-process one.

        ``authority`` is a :class:`KeyAuthority` or any object with its interface
        (``public_bundle``, ``open_round``, ``close_round``, ``decrypt_aggregate``,
        ``verify_key``, ``key_size``, ``n_decryptions``): e.g. the server's client of a
        separate authority service, or a client node's read-only view of the signed public
        bundle (``securefkm.flower.authority_service``). ``signing_key`` (client nodes) is the
        node's raw 32-byte Ed25519 identity key, enrolled with the authority out of band: the
        layer signs with it instead of creating and enrolling a key itself. Call before
        ``setup``.
        """
        missing = [m for m in ("public_bundle", "open_round", "close_round", "decrypt_aggregate", "verify_key")
                   if not callable(getattr(authority, m, None))]
        if missing:
            raise InputError(f"authority lacks the KeyAuthority methods {missing}.")
        if signing_key is not None and (not isinstance(signing_key, bytes) or len(signing_key) != 32):
            raise InputError("signing_key must be the 32 raw bytes of an Ed25519 private key.")
        self._given_authority = authority
        self._signing_key = signing_key

    def setup(self, info: RunInfo) -> None:
        """Once per fit: create (or adopt) the authority and its keypair; fix the slot layout."""
        if self.min_clients > info.n_clients:
            raise InputError(
                f"Paillier(min_clients={self.min_clients}) needs at least that many clients; the "
                f"federation has {info.n_clients}. Lower min_clients."
            )
        self.max_clients_ = self.max_clients or info.n_clients
        if self._given_authority is not None:
            self.authority = self._given_authority
        else:
            self.authority = KeyAuthority.generate(self.key_size, min_clients=self.min_clients)
        bundle = self.authority.public_bundle()
        self.bundle = bundle
        #: the trust anchor clients are configured with (out of band in a deployment)
        self.trusted_authority_key = bundle.authority_key
        self.layout = layout_for_key(bundle.n, self.value_bits, self.max_clients_)

    def _require_setup(self):
        if self.layout is None:
            raise InputError(
                "Paillier layer used before setup(); run it through a Federation or estimator."
            )

    def before_round(self, ctx: RoundContext) -> None:
        self._require_setup()
        n = len(ctx.sampled)
        if n > self.max_clients_:
            raise RoundAbortedError(
                f"round samples {n} clients but Paillier slots have headroom for max_clients="
                f"{self.max_clients_}; declare Paillier(max_clients>={n}).",
                round=ctx.round,
                stage="update",
            )
        if ctx.specs:
            self.codec.check_capacity(ctx.specs, self.max_clients_)

    def report(self) -> dict:
        if self.layout is None:
            return {}
        lay = self.layout
        return {
            "key_size": self.authority.key_size,
            "slot_bits": lay.slot_bits,
            "value_bits": lay.value_bits,
            "slots_per_ciphertext": lay.slots_per_plaintext,
            "decryptions": self.authority.n_decryptions,
        }

    # ------------------------------------------------------------------ sessions
    def server_view(self, algorithm, aggregator):
        sees = ("one Paillier ciphertext bundle per client and the sum of the survivors' sum-fields (exact unless a client-side layer, e.g. distributed GaussianDP, noised them), "
                "decrypted by the key authority")
        if self.allow_plain_set_fields and getattr(algorithm, "uses_set_fields", False):
            sees += "; AND every client's local centres and sizes in plain (allow_plain_set_fields=True)"
        trust = ("the key authority holds the private key and must not collude with the server nor decrypt "
                 "single ciphertexts; fewer than min_clients clients must not collude with the server; the sum "
                 "itself is not hidden (GaussianDP noises it)")
        return sees, trust

    def server_session(self, ctx: RoundContext) -> ServerSession:
        self._require_setup()
        return _PaillierServer(self, ctx)

    def too_few_to_decrypt(self, n: int, ctx: RoundContext) -> RoundAbortedError | None:
        """The abort for a round whose ``n`` valid inputs are fewer than ``min_clients`` or than
        a client-side layer's :meth:`~securefkm.layers.Layer.survivors_needed` (distributed
        GaussianDP's ``min_clients``): raised before anything is decrypted. None if enough."""
        floor = self.survivors_floor(ctx)
        if n >= max(self.min_clients, floor):
            return None
        who = (f"Paillier(min_clients={self.min_clients})" if n < self.min_clients else
               f"a client-side layer (GaussianDP's min_clients={floor}: its noise shares are sized for that "
               "many; lower it to what survives)")
        return RoundAbortedError(
            f"only {n} client(s) sent a valid encrypted input; {who} refuses to decrypt fewer (nothing was decrypted)",
            round=ctx.round,
            stage=STAGE,
        )

    def _enroll(self, client: ClientContext) -> dict:
        # A fresh identity created on the client; its public half goes to the authority
        # directly (the in-process stand-in for an authenticated enrollment channel).
        key = Ed25519PrivateKey.generate()
        self.authority.enroll(client.client_id, key.public_key().public_bytes_raw())
        state = {"authority": self.bundle.fingerprint, "signing_key": key.private_bytes_raw()}
        client.state["paillier"] = state
        return state

    def provision_client(self, client: ClientContext) -> None:
        """Enroll the client before it moves to a worker (the authority stays with the server)."""
        self._require_setup()
        if self._signing_key is None and "paillier" not in client.state:
            self._enroll(client)

    def encoded_values(self, sums: dict[str, np.ndarray], ctx: RoundContext) -> np.ndarray:
        """A client's signed fixed-point values, checked against the slot's value range
        (the error names the field); what both the real client and the ideal one hold."""
        values = self.codec.encode_signed(sums, ctx.specs, self.max_clients_)
        try:
            self.layout.check_values(values)
        except InputError:
            names = [s.name for s in ctx.specs for _ in range(s.size)]
            self.layout.check_values(values, names)
            raise
        return values.astype(np.int64)

    def client_session(
        self, client: ClientContext, ctx: RoundContext, sums: dict[str, np.ndarray]
    ) -> ClientSession:
        self._require_setup()
        state = client.state.get("paillier")
        fp = self.bundle.fingerprint
        if (state is None or state.get("authority") != fp) and self._signing_key is not None:
            # deployment: the node's own identity key, enrolled out of band
            state = {"authority": fp, "signing_key": self._signing_key}
            client.state["paillier"] = state
        elif state is None or state.get("authority") != fp:
            state = self._enroll(client)
        return PaillierClientSession(
            client_id=client.client_id,
            values=self.encoded_values(sums, ctx),
            signing_key=state["signing_key"],
            trusted_authority_key=self.trusted_authority_key,
            value_bits=self.layout.value_bits,
            max_clients=self.max_clients_,
            n_sampled=len(ctx.sampled),
            run=ctx.run,
            round=ctx.round,
            digest=ctx.broadcast_digest,
        )

    def client_sessions(self, clients, ctx: RoundContext, sums_list) -> list[ClientSession]:
        """:meth:`client_session` of each client; a client whose own encoder refuses its update
        (the codec's checks, the slot's value range) raises
        :class:`~securefkm.exceptions.EncodingError` with ``row`` its index, so the caller
        leaves that client out and opens the others (:func:`securefkm.federation.client.open_sessions`)."""
        from securefkm.exceptions import EncodingError

        sessions = []
        for i, (client, sums) in enumerate(zip(clients, sums_list)):
            try:
                self.encoded_values(sums, ctx)
            except InputError as exc:
                raise EncodingError(f"update {i} of the {len(sums_list)} encoded together: {exc}",
                                    field=getattr(exc, "field", None), row=i) from exc
            sessions.append(self.client_session(client, ctx, sums))
        return sessions


@dataclass
class PaillierClientSession(ClientSession):
    """A client's side of one round: its encoded values and signing key (picklable, plain data)."""

    client_id: int
    values: np.ndarray
    signing_key: bytes
    trusted_authority_key: bytes
    value_bits: int
    max_clients: int
    n_sampled: int
    run: int
    round: int
    digest: bytes

    def respond(self, stage: str, message) -> EncryptedContribution:
        if stage != STAGE:
            raise ProtocolRefusal(f"Paillier client got unknown stage {stage!r}")
        if not isinstance(message, EncryptRequest):
            raise ProtocolRefusal(f"expected an EncryptRequest, got {type(message).__name__}")
        try:
            message.bundle.verify(self.trusted_authority_key)
        except ValueError as exc:
            raise ProtocolRefusal(f"refusing to encrypt: {exc}") from None
        t = message.ticket
        if (t.run, t.round, t.digest) != (self.run, self.round, self.digest):
            raise ProtocolRefusal(
                "round ticket does not match the round and broadcast this client computed"
            )
        if t.max_clients != self.max_clients or self.n_sampled > self.max_clients:
            raise ProtocolRefusal(
                f"round of {self.n_sampled} sampled clients exceeds the declared max_clients={self.max_clients}"
            )
        layout = layout_for_key(message.bundle.n, self.value_bits, self.max_clients)
        plaintexts = layout.pack(self.values)
        if len(plaintexts) != t.n_ciphertexts:
            raise ProtocolRefusal("round ticket expects a different number of ciphertexts")
        pk = message.bundle.public_key()
        ciphertexts = [pk.raw_encrypt(p) for p in plaintexts]
        return sign_contribution(
            self.signing_key,
            message.bundle.fingerprint,
            self.client_id,
            t.nonce,
            t.digest,
            ciphertexts,
        )


class _PaillierServer(ServerSession):
    def __init__(self, layer: Paillier, ctx: RoundContext):
        self.layer = layer
        self.ctx = ctx
        self.n_values = sum(s.size for s in ctx.specs)
        self.ticket = layer.authority.open_round(
            ctx.run,
            ctx.round,
            ctx.broadcast_digest,
            n_ciphertexts=layer.layout.n_plaintexts(self.n_values),
            max_clients=layer.max_clients_,
        )
        self.contributions: dict[int, EncryptedContribution] = {}
        #: client -> why its contribution was refused at receipt (the runtime's ``faults``)
        self.rejected: dict[int, str] = self.faults

    def messages(self, stage, alive):
        request = EncryptRequest(bundle=self.layer.bundle, ticket=self.ticket)
        return {c: request for c in alive}

    def refusal(self, client: int, reply) -> str | None:
        """Why ``client``'s reply is not a valid contribution for this round, or None.

        Checked at receipt, per client, before anything is aggregated: the shape of the
        message, the ticket it answers, every ciphertext in ``Z*_{n^2}`` (an integer in
        ``(0, n^2)`` coprime to ``n``: anything else is no Paillier encryption, and one
        such factor turns the product of all ciphertexts into garbage) and the signature.
        """
        if not isinstance(reply, EncryptedContribution):
            return f"stage {STAGE!r}: the reply is a {type(reply).__name__}, not an EncryptedContribution"
        if type(reply.client_id) is not int or reply.client_id != client:
            return f"stage {STAGE!r}: field client_id is {reply.client_id!r}, not the sender's id {client}"
        if reply.nonce != self.ticket.nonce:
            return f"stage {STAGE!r}: field nonce is not this round's ticket"
        cts = reply.ciphertexts
        if not isinstance(cts, (tuple, list)) or len(cts) != self.ticket.n_ciphertexts:
            got = len(cts) if isinstance(cts, (tuple, list)) else type(cts).__name__
            return f"stage {STAGE!r}: field ciphertexts holds {got} values, expected {self.ticket.n_ciphertexts}"
        n = self.layer.bundle.n
        n2 = n * n
        for i, c in enumerate(cts):
            if type(c) is not int:
                why = f"a {type(c).__name__}, not an integer"
            elif not 0 < c < n2:
                why = "outside (0, n^2)"
            elif math.gcd(c, n) != 1:
                why = "not coprime to n"
            else:
                continue
            return f"stage {STAGE!r}: field ciphertexts[{i}] is not a Paillier ciphertext (an element of Z*_(n^2)): {why}"
        key = self.layer.authority.verify_key(client)
        if key is None:
            return f"stage {STAGE!r}: client {client} is not enrolled with the key authority"
        if not verify_contribution(reply, key, self.layer.bundle.fingerprint):
            return f"stage {STAGE!r}: field signature does not verify against the client's enrolled key"
        return None

    def receive(self, stage, replies):
        for c, r in replies.items():
            why = self.refusal(c, r)
            if why is None:
                self.contributions[c] = r
            else:
                # left out like a dropout; the authority would refuse the whole sum otherwise
                self.faults[c] = why
                log.warning("Paillier: refusing client %s's contribution in round %s: %s", c, self.ctx.round, why)

    def result(self):
        ctx, layer = self.ctx, self.layer
        n = len(self.contributions)
        too_few = layer.too_few_to_decrypt(n, ctx)
        if too_few is not None:
            layer.authority.close_round(self.ticket.nonce)
            raise too_few
        contributions = [self.contributions[c] for c in sorted(self.contributions)]
        claimed = homomorphic_sum(layer.bundle.public_key(), [c.ciphertexts for c in contributions])
        dec = layer.authority.decrypt_aggregate(self.ticket.nonce, contributions, claimed)
        why = (f"the key authority returned {len(dec.contributors)} contributors, not the {n} sent"
               if tuple(dec.contributors) != tuple(sorted(self.contributions)) else
               layer.layout.sum_violation(list(dec.plaintexts), self.n_values, n, layer.bundle.n))
        if why is not None:
            # no range proofs: a client encrypted a value outside its slots; the sum is not released
            raise RoundAbortedError(
                f"the decrypted Paillier sum is out of its slots' declared ranges ({why}); the sum is "
                "not released (no single client can be named: only the sum was decrypted)",
                round=ctx.round,
                stage=STAGE,
            )
        sums = layer.layout.unpack(list(dec.plaintexts), self.n_values, n, layer.bundle.n)
        try:
            decoded = layer.codec.decode_signed(np.array(sums, dtype=object), ctx.specs)
        except InputError as exc:  # e.g. a carry out of a slot made a sum no codec value can be
            raise RoundAbortedError(
                f"the decrypted Paillier sum is out of its slots' declared ranges ({exc}); the sum is "
                "not released (no single client can be named: only the sum was decrypted)",
                round=ctx.round,
                stage=STAGE,
            ) from None
        return decoded, dec.contributors
