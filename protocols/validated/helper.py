"""The Helper aggregator of validated aggregation, and the messages it signs and checks.

Prio3 (draft-irtf-cfrg-vdaf, Sec. 7) runs between two aggregators that must not collude:
here the *Leader* is the server and the *Helper* is this separate service (operated by
someone other than the server, as the Paillier key authority is). Each client splits its
measurement into two input shares with a fully linear proof of validity (Boneh, Boyle,
Corrigan-Gibbs, Gilboa & Ishai, CRYPTO 2019); it sends the Leader's share in the clear to
the server and the Helper's share sealed to the Helper with HPKE (RFC 9180; DHKEM(X25519,
HKDF-SHA256), HKDF-SHA256, AES-128-GCM, as the DAP protocol seals input shares), through the
server. Either share alone is uniformly random: neither aggregator learns a client's values.

Per round the Helper

1. opens a single-use **ticket** (a fresh 128-bit nonce, bound to ``(run, round, attempt,
   broadcast digest)`` and the round's circuit parameters) and a fresh Prio3 verification
   key, which it shares with the Leader only;
2. **verifies** each report the server forwards: the client's Ed25519 signature (keys
   enrolled with the Helper over a channel the server does not control, as for the Paillier
   authority), the HPKE opening of its share, and the Prio3 verification with the Leader's
   verifier share; it returns the verifier message of each valid report and the reason for
   each refused one, and keeps the valid reports' output shares;
3. releases its **aggregate share** once, over a set of at least ``min_clients`` reports it
   found valid itself, then burns the ticket.

So the server cannot have a single client's values released (fewer than ``min_clients``
distinct enrolled signers, or a set holding a report the Helper refused, is refused), cannot
replay a report into another round (the ticket is part of the Prio3 application context),
cannot submit a report twice, and cannot ask for two aggregates of one round.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from securefkm.exceptions import InputError, RoundAbortedError
from securefkm.validation import check_int

STAGE = "validated_input"
DOMAIN_BUNDLE = b"securefkm/validated/helper-bundle/v1"
DOMAIN_REPORT = b"securefkm/validated/report/v1"
DOMAIN_CONTEXT = b"securefkm/validated/round/v1"
#: RFC 9180 suite used to seal the Helper's input share
SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_128_GCM)
REPORT_NONCE_SIZE = 16
#: the reason a refused proof is given (real and ideal alike): a proof does not say which
#: condition failed, that is what it hides
INVALID = "its validity proof failed"


class HelperRefusal(RoundAbortedError):
    """The Helper refused to release an aggregate share; nothing was released."""


# ---------------------------------------------------------------------- messages
@dataclass(frozen=True)
class HelperBundle:
    """The Helper's HPKE public key, signed by its Ed25519 identity key (the clients' trust anchor)."""

    hpke_key: bytes
    helper_key: bytes
    signature: bytes

    @property
    def fingerprint(self) -> bytes:
        return hashlib.sha256(self.helper_key + self.hpke_key).digest()

    def verify(self, trusted_helper_key: bytes) -> None:
        """Raise ``ValueError`` unless the trusted Helper key signed this HPKE key."""
        if self.helper_key != trusted_helper_key:
            raise ValueError("helper bundle comes from a helper this client does not trust")
        try:
            Ed25519PublicKey.from_public_bytes(self.helper_key).verify(self.signature, DOMAIN_BUNDLE + self.hpke_key)
        except InvalidSignature:
            raise ValueError("helper bundle signature is invalid") from None


@dataclass(frozen=True)
class NoiseField:
    """One value field's noise in a :class:`NoisePlan`."""

    name: str
    sigma: float  # std in units of 2**-frac_bits
    width: int  # its number of columns


@dataclass(frozen=True)
class NoisePlan:
    """Central GaussianDP noise the Helper adds to its aggregate share, in encoded units.

    ``count_sigma``: std of the integer noise on each count of field ``count``; ``fields``:
    per value field its :class:`NoiseField` (std in units of ``2**-frac_bits``, columns);
    ``offsets``: per cluster and column the integer ``m_je`` the noise of the counts is carried
    into the shifted sums with (``round(c_je 2**frac_bits) - lo_e``, the centre the sums are
    noised about), row-major. A std of 0 means: not noised. Public: every party derives it
    from the round and the DP configuration, so an honest client refuses a ticket whose plan
    differs from its own."""

    count: str
    count_sigma: float
    fields: tuple[NoiseField, ...]
    offsets: tuple[int, ...]

    def encode(self) -> bytes:
        out = [struct.pack(">d", self.count_sigma), _name(self.count)]
        for f in self.fields:
            out += [_name(f.name), struct.pack(">dq", f.sigma, f.width)]
        out.append(struct.pack(f">{len(self.offsets)}q", *self.offsets))
        return b"".join(out)


def _name(name: str) -> bytes:
    b = name.encode()
    return struct.pack(">H", len(b)) + b


def release_noise(plan: NoisePlan, k: int, sources=None) -> tuple[list[int], list[list[int]]]:
    """The integer noise ``(on each count, on each shifted sum)`` of one release: discrete
    Gaussian counts noise ``n_j`` and per-field sums noise ``z_je`` (variance rounded up on the
    integer lattice, :func:`protocols.dp.noise.noise_on_lattice_many`), the shifted sums
    getting ``z_je + n_j m_je``: the release then equals the centred central mechanism's
    output translated back, a post-processing of it. ``sources(field)``: the byte source of a
    field's noise (None or returning None: the OS CSPRNG)."""
    import numpy as np

    from protocols.dp.noise import noise_on_lattice_many

    src = (lambda name: None) if sources is None else sources
    d = sum(f.width for f in plan.fields)
    todo = ([(plan.count, plan.count_sigma, (k,))] if plan.count_sigma > 0 else []) + [
        (f.name, f.sigma, (k, f.width)) for f in plan.fields if f.sigma > 0]
    drawn = dict(zip([t[0] for t in todo], noise_on_lattice_many(
        [np.zeros(shape) for _, _, shape in todo], [t[1] for t in todo], [1.0] * len(todo),
        [src(t[0]) for t in todo]))) if todo else {}
    n_c = [int(x) for x in drawn.get(plan.count, np.zeros(k))]
    cols = [drawn.get(f.name, np.zeros((k, f.width))) for f in plan.fields]
    z = np.concatenate(cols, axis=1) if cols else np.zeros((k, 0))
    offsets = [plan.offsets[j * d:(j + 1) * d] for j in range(k)]
    return n_c, [[int(z[j, e]) + n_c[j] * int(offsets[j][e]) for e in range(d)] for j in range(k)]


@dataclass(frozen=True)
class ValidationTicket:
    """One round's single-use ticket and the circuit parameters every party derives itself."""

    nonce: bytes
    run: int
    round: int
    attempt: int
    digest: bytes
    k: int
    widths: tuple[int, ...]
    frac_bits: int
    min_clients: int
    noise: NoisePlan | None = None
    #: the vote histogram's (coordinates, bins) the circuit checks, or None
    votes: tuple[int, int] | None = None


@dataclass(frozen=True)
class ValidationRequest:
    """The server's message to each client: the Helper's signed bundle and the round ticket."""

    bundle: HelperBundle
    ticket: ValidationTicket


@dataclass(frozen=True)
class ValidatedReport:
    """A client's reply: Prio3 public share, the Leader's input share, the Helper's sealed one."""

    client_id: int
    report_nonce: bytes
    public_share: bytes
    leader_share: bytes
    sealed_helper_share: bytes
    signature: bytes


@dataclass(frozen=True)
class HelperReport:
    """What the server forwards to the Helper for one report (never the Leader's share)."""

    report_nonce: bytes
    public_share: bytes
    sealed_helper_share: bytes
    signature: bytes
    n_max: int
    leader_verifier_share: bytes


def application_context(ticket: ValidationTicket) -> bytes:
    """The Prio3 ``ctx`` string of a round: binds every report to this ticket and round."""
    h = hashlib.sha256()
    h.update(DOMAIN_CONTEXT)
    h.update(ticket.nonce)
    h.update(struct.pack(">qqqq", ticket.run, ticket.round, ticket.attempt, ticket.k))
    h.update(ticket.digest)
    h.update(struct.pack(">q", ticket.frac_bits))
    h.update(struct.pack(f">{len(ticket.widths)}q", *ticket.widths))
    h.update(b"\x00" if ticket.noise is None else b"\x01" + ticket.noise.encode())
    h.update(b"\x00" if ticket.votes is None else b"\x01" + struct.pack(">qq", *ticket.votes))
    return DOMAIN_CONTEXT + h.digest()


def seal_info(ctx: bytes, client_id: int, report_nonce: bytes) -> bytes:
    """HPKE ``info`` of a sealed share: the round context, the sender and its report nonce."""
    return ctx + struct.pack(">q", client_id) + report_nonce


def report_payload(fingerprint: bytes, ctx: bytes, client_id: int, report_nonce: bytes, public_share: bytes,
                   sealed: bytes) -> bytes:
    """What a client signs: the Helper, the round, its id and nonce, and digests of what the
    Helper receives (the server cannot attribute a report to another client, nor forge one)."""
    return (DOMAIN_REPORT + fingerprint + hashlib.sha256(ctx).digest() + struct.pack(">q", client_id) + report_nonce
            + hashlib.sha256(public_share).digest() + hashlib.sha256(sealed).digest())


def sign_report(signing_key: bytes, payload: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(signing_key).sign(payload)


# ---------------------------------------------------------------------- the service
@dataclass
class _Round:
    ticket: ValidationTicket
    verify_key: bytes
    seen_nonces: set
    out_shares: dict  # client -> output share (valid reports only)
    refused: dict  # client -> reason
    burned: bool = False


class ValidationHelper:
    """The Helper aggregator (Prio3 aggregator 1): verifies reports, releases one aggregate share per round.

    ``min_clients``: fewest distinct enrolled clients whose aggregate share it releases.
    Holds its own HPKE and Ed25519 keys (fresh by default); the clients trust its Ed25519
    public key (:attr:`identity_key`), configured out of band.
    """

    def __init__(self, min_clients: int = 2, *, identity: bytes | None = None, hpke_private: bytes | None = None):
        self.min_clients = check_int(min_clients, "min_clients", minimum=2)
        self._identity = Ed25519PrivateKey.from_private_bytes(identity) if identity else Ed25519PrivateKey.generate()
        self._hpke = X25519PrivateKey.from_private_bytes(hpke_private) if hpke_private else X25519PrivateKey.generate()
        hpke_pub = self._hpke.public_key().public_bytes_raw()
        self._bundle = HelperBundle(hpke_pub, self._identity.public_key().public_bytes_raw(),
                                    self._identity.sign(DOMAIN_BUNDLE + hpke_pub))
        self._enrolled: dict[int, bytes] = {}
        self._rounds: dict[bytes, _Round] = {}
        self._last_round: tuple[int, int, int] | None = None
        self.n_aggregates = 0

    @property
    def identity_key(self) -> bytes:
        return self._bundle.helper_key

    def public_bundle(self) -> HelperBundle:
        return self._bundle

    def enroll(self, client_id: int, verify_key: bytes) -> None:
        """Register a client's Ed25519 public key (over a channel the server does not control)."""
        client_id = check_int(client_id, "client_id", minimum=0)
        if not isinstance(verify_key, bytes) or len(verify_key) != 32:
            raise InputError("verify_key must be the 32 raw bytes of an Ed25519 public key.")
        old = self._enrolled.get(client_id)
        if old is not None and old != verify_key:
            raise InputError(f"client {client_id} is already enrolled with a different key; re-enrollment is refused.")
        self._enrolled[client_id] = verify_key

    # ------------------------------------------------------------------ rounds
    def open_round(self, run: int, round: int, attempt: int, digest: bytes, k: int, widths, frac_bits: int,
                   noise: NoisePlan | None = None, votes: tuple[int, int] | None = None):
        """A fresh ticket for one round attempt and the Prio3 verification key (for the Leader only);
        ``noise``: the central DP noise this Helper adds to the round's aggregate share."""
        if noise is not None and not isinstance(noise, NoisePlan):
            raise InputError(f"noise must be a NoisePlan or None, got {type(noise).__name__}.")
        ident = (int(run), int(round), int(attempt))
        if self._last_round is not None and ident <= self._last_round:
            raise HelperRefusal(f"helper refuses a ticket for (run, round, attempt)={ident}: not later than the last "
                                f"one opened {self._last_round}", round=int(round), stage=STAGE)
        self._last_round = ident
        ticket = ValidationTicket(secrets.token_bytes(16), int(run), int(round), int(attempt), bytes(digest),
                                  int(k), tuple(int(w) for w in widths), int(frac_bits), self.min_clients, noise,
                                  None if votes is None else (int(votes[0]), int(votes[1])))
        vdaf = self.vdaf(ticket, 1)
        verify_key = os.urandom(vdaf.VERIFY_KEY_SIZE)
        self._rounds[ticket.nonce] = _Round(ticket, verify_key, set(), {}, {})
        return ticket, verify_key

    def close_round(self, nonce: bytes) -> None:
        self._rounds.pop(nonce, None)

    def vdaf(self, ticket: ValidationTicket, n_max: int):
        """The Prio3 instance of a report with ``n_max`` records under ``ticket`` (cached)."""
        return make_vdaf(ticket.k, tuple(ticket.widths), int(n_max), ticket.votes)

    def verify(self, nonce: bytes, reports: dict[int, HelperReport]) -> tuple[dict[int, bytes], dict[int, str]]:
        """Check each forwarded report; ``(verifier messages of the valid ones, reasons of the refused ones)``."""
        from ._parallel import map_reports

        r = self._live(nonce)
        ticket = r.ticket
        ctx = application_context(ticket)
        messages: dict[int, bytes] = {}
        todo = []
        for cid, rep in reports.items():
            cid = int(cid)
            why = None
            key = self._enrolled.get(cid)
            if cid in r.out_shares or cid in r.refused:
                why = "a second report of this client in one round"
            elif not isinstance(rep, HelperReport):
                why = f"the forwarded report is a {type(rep).__name__}"
            elif rep.report_nonce in r.seen_nonces:
                why = "a report nonce already used this round"
            elif key is None:
                why = "the client is not enrolled with the helper"
            if why is not None:
                r.refused[cid] = why
                continue
            r.seen_nonces.add(rep.report_nonce)
            todo.append((cid, key, rep))
        shared = (ticket.k, tuple(ticket.widths), ticket.votes, r.verify_key, ctx, self._hpke.private_bytes_raw(),
                  self._bundle.fingerprint)
        for (cid, _, _), (out_share, vmsg, why) in zip(todo, map_reports(_helper_verify, shared, todo)):
            if why is not None:
                r.refused[cid] = why
            else:
                r.out_shares[cid] = out_share
                messages[cid] = vmsg
        return messages, {c: r.refused[c] for c in reports if int(c) in r.refused}

    def aggregate(self, nonce: bytes, accepted, noise_sources=None) -> list:
        """The Helper's aggregate share over ``accepted`` (burns the ticket); refuses a set with
        a client it did not find valid, a duplicate, or fewer than ``min_clients`` clients.
        With a noise plan in the ticket, the share carries that noise (:func:`release_noise`;
        ``noise_sources(field)``: seeded byte sources for reproducible studies, default the OS
        CSPRNG), so the server never holds the un-noised sum."""
        r = self._live(nonce)
        r.burned = True
        ids = [int(c) for c in accepted]
        ticket = r.ticket

        def refuse(why):
            self._rounds.pop(nonce, None)
            raise HelperRefusal(f"helper refuses to release an aggregate share: {why} (nothing was released)",
                                round=ticket.round, stage=STAGE)

        if len(set(ids)) != len(ids):
            refuse("the set lists a client twice")
        missing = [c for c in ids if c not in r.out_shares]
        if missing:
            refuse(f"clients {missing[:5]} have no report the helper verified as valid")
        if len(ids) < self.min_clients:
            refuse(f"only {len(ids)} client(s); at least min_clients={self.min_clients} required")
        shares = [r.out_shares[c] for c in sorted(ids)]
        vdaf = self.vdaf(ticket, 1)
        agg = vdaf.aggregate(None, shares)
        if ticket.noise is not None:
            n_c, n_t = release_noise(ticket.noise, ticket.k, noise_sources)
            q = vdaf.field.MODULUS
            flat = n_c + [x for row in n_t for x in row]
            agg = [(a + b) % q for a, b in zip(agg, flat)]
        self._rounds.pop(nonce, None)
        self.n_aggregates += 1
        return agg

    def _live(self, nonce: bytes) -> _Round:
        r = self._rounds.get(nonce)
        if r is None or r.burned:
            raise HelperRefusal("helper has no open round for this ticket (unknown, closed or already used)",
                                stage=STAGE)
        return r

    def __getstate__(self):
        raise TypeError("a ValidationHelper holds private keys and is not copied; run it as its own service")


def _helper_verify(k, widths, votes, verify_key, ctx, hpke_private, fingerprint, cid, key, rep):
    """The Helper's check of one report: ``(output share, encoded verifier message, None)`` or
    ``(None, None, why)``; module level, so the checks can run in the Helper's worker processes."""
    from protocols.vdaf import VdafError

    try:
        vdaf = make_vdaf(k, widths, rep.n_max, votes)
        if not _signature_ok(key, fingerprint, ctx, cid, rep):
            return None, None, "its signature does not verify against the client's enrolled key"
        plain = SUITE.decrypt(rep.sealed_helper_share, X25519PrivateKey.from_private_bytes(hpke_private),
                              info=seal_info(ctx, cid, rep.report_nonce))
        share = vdaf.decode_input_share(1, plain)
        public = vdaf.decode_public_share(rep.public_share)
        state, vshare = vdaf.verify_init(verify_key, ctx, 1, None, rep.report_nonce, public, share)
        leader = vdaf.decode_verifier_share(rep.leader_verifier_share)
        vmsg = vdaf.verifier_shares_to_message(ctx, None, [leader, vshare])
        return vdaf.verify_next(ctx, state, vmsg), vdaf.encode_verifier_message(vmsg), None
    except InvalidTag:
        return None, None, "its sealed helper share does not open (wrong key, context or tampered)"
    except VdafError:
        return None, None, INVALID
    except (ValueError, TypeError, OverflowError) as exc:
        return None, None, f"its report is malformed ({exc})"


def _signature_ok(key: bytes, fingerprint: bytes, ctx: bytes, cid: int, rep: HelperReport) -> bool:
    payload = report_payload(fingerprint, ctx, cid, rep.report_nonce, rep.public_share, rep.sealed_helper_share)
    try:
        Ed25519PublicKey.from_public_bytes(key).verify(rep.signature, payload)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


@functools.lru_cache(maxsize=256)
def make_vdaf(k: int, widths: tuple, n_max: int, votes: tuple[int, int] | None = None):
    """The Prio3 instance validating one client's clustering update (ClusterValidity circuit)."""
    from protocols.vdaf import ClusterValidity, Prio3

    valid = ClusterValidity(k=int(k), d=len(widths), n_max=int(n_max), widths=list(widths), votes=votes)
    return Prio3.for_circuit(valid, num_proofs=1)
