"""The key authority of the Paillier aggregator and the signed messages it checks.

The authority is the only holder of the Paillier private key. It is a separate party from
the aggregating server: the server receives the clients' ciphertexts and adds them (the
Paillier homomorphism, Paillier 1999, Sec. 6: ``E(a) * E(b) mod n^2 = E(a + b mod n)``), and
asks the authority to decrypt the sum. The authority decrypts only an aggregate that it can
*prove* combines at least ``min_clients`` distinct enrolled clients:

1. **Enrollment.** Each client creates an Ed25519 signing key (RFC 8032) on its own device
   and registers the public half with the authority over a channel the server does not
   control (a PKI / onboarding step; in the in-process simulation a direct method call).
   Re-enrolling a client id with a different key is refused.
2. **Round ticket.** For each round the server asks the authority to open a ticket; the
   authority returns a fresh 128-bit nonce from the OS CSPRNG bound to ``(run, round,
   broadcast digest)``. Tickets are single-use, and a ticket for a ``(run, round)`` not later
   than the last decrypted one is refused (stale round ids).
3. **Contribution.** A client signs ``(authority fingerprint, client id, nonce, broadcast
   digest, ciphertexts)``. The server forwards the signed per-client ciphertexts (and its
   own homomorphic sum) to the authority.
4. **Decryption.** The authority burns the ticket, verifies every signature against the
   enrolled key of the claimed client, refuses duplicates, contributions for another
   ticket or broadcast, malformed ciphertexts, fewer than ``min_clients`` or more than the
   ticket's ``max_clients`` distinct signers, **recomputes the homomorphic sum itself**
   (refusing a server sum that differs), decrypts only that sum and returns its plaintexts
   and the contributor ids. Anything wrong raises :class:`AuthorityRefusal` (a
   :class:`~securefkm.exceptions.RoundAbortedError`): nothing is decrypted.

The server therefore cannot get a single client's ciphertext, or a sum of one real
client with forged "clients", decrypted, nor decrypt two different subsets of the same
round (the ticket is burned by the first decryption attempt). What breaks it is collusion:
an authority that colludes with the server (or simply sees the ciphertexts) decrypts every
client's value; a server colluding with ``min_clients - 1`` enrolled clients learns the
remaining client's value from the sum; whoever controls enrollment can register Sybil
identities.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from phe import paillier

from securefkm.validation import check_int
from securefkm.exceptions import InputError, RoundAbortedError

DOMAIN_PUBLIC_KEY = b"securefkm/paillier/public-key/v1"
DOMAIN_CONTRIBUTION = b"securefkm/paillier/contribution/v1"
#: key sizes the public API accepts (NIST SP 800-57 Part 1 Rev. 5, Table 2: 2048-bit
#: factoring moduli give 112-bit security, 3072-bit give 128-bit).
KEY_SIZES = (2048, 3072)
STAGE = "encrypted_input"


class AuthorityRefusal(RoundAbortedError):
    """The key authority refused to decrypt an aggregate; nothing was decrypted."""


# ---------------------------------------------------------------------- messages
@dataclass(frozen=True)
class PublicBundle:
    """The Paillier public key, signed by the authority's Ed25519 identity key.

    Clients hold the authority's 32-byte verify key as a trust anchor (configured out of
    band) and refuse a bundle it did not sign, so a server cannot substitute its own key.
    """

    n: int
    authority_key: bytes
    signature: bytes

    @property
    def fingerprint(self) -> bytes:
        """SHA-256 of the authority key and modulus: names this authority in signatures."""
        return hashlib.sha256(self.authority_key + _int_bytes(self.n)).digest()

    def public_key(self) -> paillier.PaillierPublicKey:
        return paillier.PaillierPublicKey(self.n)

    def verify(self, trusted_authority_key: bytes) -> None:
        """Raise ``ValueError`` unless the trusted authority key signed this modulus."""
        if self.authority_key != trusted_authority_key:
            raise ValueError("public key bundle comes from an authority this client does not trust")
        try:
            Ed25519PublicKey.from_public_bytes(self.authority_key).verify(
                self.signature, DOMAIN_PUBLIC_KEY + _int_bytes(self.n)
            )
        except InvalidSignature:
            raise ValueError("public key bundle signature is invalid") from None


@dataclass(frozen=True)
class RoundTicket:
    """A single-use decryption ticket for one round (public: the server forwards it to clients)."""

    nonce: bytes
    run: int
    round: int
    digest: bytes
    n_ciphertexts: int
    max_clients: int


@dataclass(frozen=True)
class EncryptRequest:
    """The server's ``encrypted_input`` message: the signed public key and the round ticket."""

    bundle: PublicBundle
    ticket: RoundTicket


@dataclass(frozen=True)
class EncryptedContribution:
    """A client's ``encrypted_input`` reply: its packed ciphertexts, signed.

    ``ciphertexts`` are raw Paillier ciphertexts (ints modulo ``n**2``), one per packed
    plaintext; this is exactly what the server receives and what the transcript records.
    """

    client_id: int
    nonce: bytes
    digest: bytes
    ciphertexts: tuple[int, ...]
    signature: bytes


@dataclass(frozen=True)
class DecryptedAggregate:
    """What the authority releases: the packed plaintext sums and whose inputs they contain."""

    plaintexts: tuple[int, ...]
    contributors: tuple[int, ...]


def _int_bytes(x: int) -> bytes:
    x = int(x)
    length = max(1, (x.bit_length() + 7) // 8)
    return length.to_bytes(4, "big") + x.to_bytes(length, "big")


def contribution_payload(
    fingerprint: bytes, client_id: int, nonce: bytes, digest: bytes, ciphertexts: Sequence[int]
) -> bytes:
    """The canonical byte string a client signs (length-prefixed, domain-separated)."""
    parts = [
        DOMAIN_CONTRIBUTION,
        fingerprint,
        int(client_id).to_bytes(8, "big", signed=True),
        len(nonce).to_bytes(2, "big") + nonce,
        len(digest).to_bytes(2, "big") + digest,
        len(ciphertexts).to_bytes(4, "big"),
    ]
    parts.extend(_int_bytes(c) for c in ciphertexts)
    return b"".join(parts)


def sign_contribution(
    signing_key: bytes, fingerprint: bytes, client_id: int, nonce: bytes, digest: bytes, ciphertexts
) -> EncryptedContribution:
    """Client side: sign packed ciphertexts for one round ticket."""
    ciphertexts = tuple(int(c) for c in ciphertexts)
    sig = Ed25519PrivateKey.from_private_bytes(signing_key).sign(
        contribution_payload(fingerprint, client_id, nonce, digest, ciphertexts)
    )
    return EncryptedContribution(int(client_id), nonce, digest, ciphertexts, sig)


def verify_contribution(
    contribution: EncryptedContribution, verify_key: bytes, fingerprint: bytes
) -> bool:
    """True iff ``verify_key`` signed exactly this contribution (anyone can check this)."""
    try:
        Ed25519PublicKey.from_public_bytes(verify_key).verify(
            contribution.signature,
            contribution_payload(
                fingerprint,
                contribution.client_id,
                contribution.nonce,
                contribution.digest,
                contribution.ciphertexts,
            ),
        )
    except (InvalidSignature, ValueError, TypeError, OverflowError):  # OverflowError: a negative "ciphertext"
        return False
    return True


def homomorphic_sum(
    public_key: paillier.PaillierPublicKey, vectors: Sequence[Sequence[int]]
) -> list[int]:
    """Position-wise homomorphic sum of ciphertext vectors with phe's ``EncryptedNumber`` addition."""
    totals = None
    for vec in vectors:
        enc = [paillier.EncryptedNumber(public_key, int(c), 0) for c in vec]
        totals = enc if totals is None else [a + b for a, b in zip(totals, enc)]
    return [t.ciphertext(be_secure=False) for t in totals or []]


# ---------------------------------------------------------------------- the authority
class KeyAuthority:
    """Holder of the Paillier private key; decrypts only provably multi-client aggregates.

    Trust model: the authority is trusted (i) to keep the private key and (ii) never to
    decrypt anything but what :meth:`decrypt_aggregate` allows, and it must not collude with
    the aggregating server (together they decrypt any client's ciphertext). It never sees
    a ciphertext except through :meth:`decrypt_aggregate`, and then it learns the same sum
    the server learns. See the module docstring for the protocol.

    Parameters
    ----------
    public_key, private_key:
        a phe keypair, e.g. from ``phe.generate_paillier_keypair(n_length=2048)``.
    min_clients:
        the authority's own threshold of distinct enrolled signers per decryption.
    allow_weak_key:
        test-only: accept a modulus shorter than 2048 bits (fast unit tests).
    identity_key:
        the raw 32-byte Ed25519 private key the authority signs its public bundle with
        (a long-lived authority service keeps it on disk, so clients can pin its verify key
        out of band); default: a fresh key per authority object.
    """

    def __init__(
        self,
        public_key: paillier.PaillierPublicKey,
        private_key: paillier.PaillierPrivateKey,
        *,
        min_clients: int = 2,
        allow_weak_key: bool = False,
        identity_key: bytes | None = None,
    ):
        if not isinstance(public_key, paillier.PaillierPublicKey) or not isinstance(
            private_key, paillier.PaillierPrivateKey
        ):
            raise InputError(
                "KeyAuthority needs a phe keypair: public_key, private_key = "
                "phe.generate_paillier_keypair(n_length=2048)."
            )
        if private_key.public_key.n != public_key.n:
            raise InputError("KeyAuthority: private_key does not belong to public_key.")
        bits = public_key.n.bit_length()
        if bits < min(KEY_SIZES) and not allow_weak_key:
            raise InputError(
                f"KeyAuthority: a {bits}-bit Paillier modulus is too weak; use key_size 2048 or "
                "3072 (allow_weak_key=True is for unit tests only)."
            )
        self.min_clients = check_int(min_clients, "min_clients", minimum=1)
        self._public_key = public_key
        self._private_key = private_key
        if identity_key is None:
            self._identity = Ed25519PrivateKey.generate()
        else:
            if not isinstance(identity_key, bytes) or len(identity_key) != 32:
                raise InputError("identity_key must be the 32 raw bytes of an Ed25519 private key.")
            self._identity = Ed25519PrivateKey.from_private_bytes(identity_key)
        ak = self._identity.public_key().public_bytes_raw()
        self._bundle = PublicBundle(
            n=public_key.n,
            authority_key=ak,
            signature=self._identity.sign(DOMAIN_PUBLIC_KEY + _int_bytes(public_key.n)),
        )
        self._enrolled: dict[int, bytes] = {}
        self._open: dict[bytes, RoundTicket] = {}
        self._last_decrypted: tuple[int, int] | None = None
        self.n_decryptions = 0

    @classmethod
    def generate(cls, key_size: int = 2048, *, min_clients: int = 2) -> KeyAuthority:
        """A fresh authority with a new ``key_size``-bit keypair (phe, OS CSPRNG primes)."""
        if key_size not in KEY_SIZES:
            raise InputError(f"key_size must be one of {KEY_SIZES} bits, got {key_size!r}.")
        public_key, private_key = paillier.generate_paillier_keypair(n_length=key_size)
        return cls(public_key, private_key, min_clients=min_clients)

    def __getstate__(self):
        # Ed25519 key objects do not pickle; keep the raw bytes (deepcopy of a set-up layer).
        state = self.__dict__.copy()
        state["_identity"] = self._identity.private_bytes_raw()
        return state

    def __setstate__(self, state):
        state["_identity"] = Ed25519PrivateKey.from_private_bytes(state["_identity"])
        self.__dict__.update(state)

    # -- public facts
    @property
    def key_size(self) -> int:
        return self._public_key.n.bit_length()

    @property
    def public_key(self) -> paillier.PaillierPublicKey:
        return self._public_key

    def public_bundle(self) -> PublicBundle:
        return self._bundle

    def verify_key(self, client_id: int) -> bytes | None:
        """The enrolled Ed25519 key of ``client_id`` (public), or None."""
        return self._enrolled.get(int(client_id))

    # -- enrollment (client -> authority, not through the server)
    def enroll(self, client_id: int, verify_key: bytes) -> None:
        """Register a client's Ed25519 public key; idempotent, refuses a changed key."""
        client_id = check_int(client_id, "client_id", minimum=0)
        if not isinstance(verify_key, bytes) or len(verify_key) != 32:
            raise InputError("verify_key must be the 32 raw bytes of an Ed25519 public key.")
        Ed25519PublicKey.from_public_bytes(verify_key)
        old = self._enrolled.get(client_id)
        if old is not None and old != verify_key:
            raise InputError(
                f"client {client_id} is already enrolled with another key; re-enrollment must "
                "go through the deployment's identity process (revoke first)."
            )
        self._enrolled[client_id] = verify_key

    # -- rounds
    def open_round(
        self, run: int, round: int, digest: bytes, *, n_ciphertexts: int, max_clients: int
    ) -> RoundTicket:
        """A fresh single-use ticket for ``(run, round)``; refuses stale round ids."""
        run = check_int(run, "run", minimum=0)
        round = check_int(round, "round", minimum=0)
        if self._last_decrypted is not None and (run, round) <= self._last_decrypted:
            raise AuthorityRefusal(
                f"round ({run}, {round}) is not after the last decrypted round {self._last_decrypted}",
                round=round,
                stage=STAGE,
            )
        ticket = RoundTicket(
            nonce=secrets.token_bytes(16),
            run=run,
            round=round,
            digest=bytes(digest),
            n_ciphertexts=check_int(n_ciphertexts, "n_ciphertexts", minimum=1),
            max_clients=check_int(max_clients, "max_clients", minimum=1),
        )
        self._open[ticket.nonce] = ticket
        return ticket

    def close_round(self, nonce: bytes) -> None:
        """Burn a ticket without decrypting (the server aborted the round)."""
        self._open.pop(nonce, None)

    def decrypt_aggregate(
        self,
        nonce: bytes,
        contributions: Sequence[EncryptedContribution],
        claimed_sum: Sequence[int] | None = None,
    ) -> DecryptedAggregate:
        """Verify, recompute the homomorphic sum of ``contributions`` and decrypt only that.

        Raises :class:`AuthorityRefusal` (nothing decrypted) on an unknown or used ticket,
        an unenrolled client, a bad signature, a duplicate client, a contribution for
        another ticket or broadcast, a malformed ciphertext, fewer than ``min_clients`` or
        more than ``max_clients`` distinct clients, or a ``claimed_sum`` that differs from
        the authority's own sum.
        """
        ticket = self._open.pop(nonce, None)  # single use: burned by any attempt

        def refuse(msg: str):
            raise AuthorityRefusal(
                f"key authority refused to decrypt: {msg}",
                round=getattr(ticket, "round", None),
                stage=STAGE,
            )

        if ticket is None:
            refuse("unknown, stale or already used round ticket")
        if self._last_decrypted is not None and (ticket.run, ticket.round) <= self._last_decrypted:
            refuse(f"stale round ({ticket.run}, {ticket.round})")
        fp = self._bundle.fingerprint
        n, n2 = self._public_key.n, self._public_key.nsquare
        seen: set[int] = set()
        for con in contributions:
            if not isinstance(con, EncryptedContribution):
                refuse(f"not a signed contribution: {type(con).__name__}")
            cid = con.client_id
            key = self._enrolled.get(cid)
            if key is None:
                refuse(f"client {cid} is not enrolled")
            if cid in seen:
                refuse(f"client {cid} appears twice")
            seen.add(cid)
            if con.nonce != ticket.nonce:
                refuse(f"client {cid}'s contribution is for another round ticket")
            if con.digest != ticket.digest:
                refuse(f"client {cid} signed a different broadcast than the round's")
            if len(con.ciphertexts) != ticket.n_ciphertexts:
                refuse(
                    f"client {cid} sent {len(con.ciphertexts)} ciphertexts, expected {ticket.n_ciphertexts}"
                )
            if not all(type(c) is int and 0 < c < n2 and math.gcd(c, n) == 1 for c in con.ciphertexts):
                refuse(f"client {cid} sent a value that is not a Paillier ciphertext (an element of Z*_(n^2))")
            if not verify_contribution(con, key, fp):
                refuse(
                    f"client {cid}'s signature does not verify (tampered or forged contribution)"
                )
        if len(seen) < self.min_clients:
            refuse(
                f"only {len(seen)} distinct client(s); at least min_clients={self.min_clients} required"
            )
        if len(seen) > ticket.max_clients:
            refuse(
                f"{len(seen)} clients exceed the slot headroom for max_clients={ticket.max_clients}"
            )
        total = homomorphic_sum(self._public_key, [c.ciphertexts for c in contributions])
        if claimed_sum is not None and [int(c) for c in claimed_sum] != total:
            refuse("the server's homomorphic sum differs from the sum of the signed contributions")
        plaintexts = tuple(self._private_key.raw_decrypt(c) for c in total)
        self._last_decrypted = (ticket.run, ticket.round)
        self.n_decryptions += 1
        return DecryptedAggregate(plaintexts=plaintexts, contributors=tuple(sorted(seen)))
