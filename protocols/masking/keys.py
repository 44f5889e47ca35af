"""Key agreement, key derivation, share encryption and the simulated PKI of pairwise masking.

Bonawitz et al. 2017 (CCS), Sec. 4 and Fig. 4: each client holds two Diffie-Hellman key
pairs per round, ``(c_sk, c_pk)`` to derive the symmetric key that encrypts the Shamir
shares it sends a peer through the server, and ``(s_sk, s_pk)`` to agree the pairwise mask
seed ``s_uv`` with each neighbour. We use X25519 (RFC 7748) for both, and turn each shared
secret into 256-bit keys with the one-step key derivation of NIST SP 800-56C Rev. 2 over
SHA-256 (:func:`kdf`; Bonawitz et al.'s ``KA.agree`` is the Diffie-Hellman secret composed
with a hash, as here), with fixed info that binds the round, the ordered pair of clients
and the purpose, and (with ``bind_broadcast``) the SHA-256 digest of the broadcast the
client acted on. Shares travel under AES-256-CCM (NIST SP 800-38C, RFC 3610; the AEAD mode
of IPsec's RFC 4309 and of TLS 1.3's CCM suites) with a 16-byte tag, a random 96-bit nonce
and the round and both ids as associated data; each direction has its own key, used for
that one message. The keys are single-use, so an AEAD's cost here is its key set-up:
``cryptography``'s ``AESGCM`` and ``ChaCha20Poly1305`` objects prepare an encryption and a
decryption context when made, ``AESCCM`` prepares the one an operation uses. On the 84-byte payloads of a sparse-graph
round, 43 fresh keys in a row: 1.7 us a message with AES-CCM against 3.1 us to encrypt and
2.6 us to decrypt with AES-GCM (ad hoc, ``timeit``; AES-NI here). CCM's drawbacks, two
passes and the length known in advance, cost nothing on such messages. (ChaCha20-Poly1305
and AES-256-GCM are standard AEADs for single-use keys too; CCM is chosen for its set-up cost.)

Signatures (``sign_keys=True``, Bonawitz et al. Sec. 6, active model): every client holds
a long-term Ed25519 identity key registered out of band; it signs its two advertised
public keys together with the round id, and, at the consistency check, the survivor list
``U3`` together with the round id and the digest of the broadcast it received
(:func:`consistency_message`). :class:`IdentityRegistry` *simulates* that PKI:
the layer's ``setup`` creates a key pair per client id, hands the private key to the
client (via its persistent state) and keeps only the public keys for verification.

Private keys are kept as raw 32-byte strings so that client sessions stay picklable.
"""

from __future__ import annotations

import hashlib
import os
import struct
from functools import lru_cache

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESCCM

DOMAIN = b"securefkm/pairwise-masking/v1"
_Q = struct.Struct("<q")
_QQ = struct.Struct("<qq")
_COUNTERS = tuple(struct.pack(">I", i) for i in range(1, 9))  # the KDF's block counters 1..8
_SHA256 = hashlib.sha256


class CryptoFailure(Exception):
    """A signature, a ciphertext or a public key failed to verify."""


# ---------------------------------------------------------------- X25519
def x25519_keypair(with_key: bool = False):
    """A fresh X25519 key pair ``(private, public)`` as raw bytes (OS CSPRNG); with
    ``with_key`` also the loaded private key object (re-loading raw bytes recomputes the
    public key: as costly as generating one)."""
    sk = X25519PrivateKey.generate()
    pair = (sk.private_bytes_raw(), sk.public_key().public_bytes_raw())
    return (*pair, sk) if with_key else pair


def x25519_public(private: bytes) -> bytes:
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()


def load_x25519(private: bytes) -> X25519PrivateKey:
    """Load a raw private key once (loading costs about as much as one agreement)."""
    return X25519PrivateKey.from_private_bytes(private)


@lru_cache(maxsize=1 << 16)
def _public_key(peer_public: bytes) -> X25519PublicKey:
    """Parsed public key, cached: in a simulation every advertised key is parsed by each of
    the owner's ``k`` neighbours (public data; parsing costs 6% of an agreement)."""
    return X25519PublicKey.from_public_bytes(peer_public)


def x25519_agree(private: bytes | X25519PrivateKey, peer_public: bytes) -> bytes:
    """Raw X25519 shared secret; raises :class:`CryptoFailure` on an invalid public key."""
    sk = X25519PrivateKey.from_private_bytes(private) if isinstance(private, (bytes, bytearray)) else private
    try:
        pk = _public_key(peer_public) if type(peer_public) is bytes else X25519PublicKey.from_public_bytes(peer_public)
        return sk.exchange(pk)
    except ValueError as exc:  # all-zero shared secret (small-order point) or bad length
        raise CryptoFailure(f"invalid X25519 public key: {exc}") from None


# the u-coordinates of the points of small order on Curve25519 and its twist (orders 1, 2,
# 4 and 8), with their non-canonical encodings p, p + 1 (the top bit of an encoding is
# ignored by X25519, RFC 7748 Sec. 5, so it is cleared before the lookup): every agreement
# with such a key gives the all-zero secret, which honest peers refuse
_P25519 = 2**255 - 19
SMALL_ORDER = frozenset(
    u.to_bytes(32, "little")
    for u in (0, 1, _P25519 - 1, _P25519, _P25519 + 1,
              325606250916557431795983626356110631294008115727848805560023387167927233504,
              39382357235489614581723060781553021112529911719440698176882885853963445705823)
)


def is_small_order(public: bytes) -> bool:
    """Whether an X25519 public key is a point of small order (every agreement with it is
    all zeros): the server refuses such a key at advertise instead of letting every honest
    neighbour refuse the key list for it."""
    return (public[:31] + bytes([public[31] & 0x7F])) in SMALL_ORDER


# ---------------------------------------------------------------- key derivation
def round_id(run: int, rnd: int, action: str) -> bytes:
    """Public identifier of a round, bound into every derived key."""
    a = action.encode()
    return struct.pack("<qqH", int(run), int(rnd), len(a)) + a


def kdf(secret: bytes, info: bytes, length: int = 32) -> bytes:
    """The one-step key derivation of NIST SP 800-56C Rev. 2 (Sec. 4.1, option 1) with
    H = SHA-256: ``SHA-256(counter || secret || info)`` for the 32-bit big-endian counters
    1, 2, ..., concatenated and cut to ``length`` bytes (at most 256). The same bytes as
    ``cryptography``'s ``ConcatKDFHash(SHA256(), length, otherinfo=info)`` (tested), computed
    with ``hashlib`` because that class's set-up costs more than the hash: 0.4 us a 32-byte
    key against 1.5 us, and 3 us for HKDF's two HMACs (ad hoc, ``timeit``), on the 72,000
    keys of a 1,000-client round. An approved KDF for a Diffie-Hellman secret, like HKDF;
    libsodium's ``crypto_kx`` also hashes the X25519 secret in one step."""
    if length == 32:
        return _SHA256(b"\x00\x00\x00\x01" + secret + info).digest()
    if length == 64:  # the two share-encryption keys of a pair
        tail = secret + info
        return _SHA256(b"\x00\x00\x00\x01" + tail).digest() + _SHA256(b"\x00\x00\x00\x02" + tail).digest()
    if not 0 < length <= 32 * len(_COUNTERS):
        raise ValueError(f"kdf length must be 1..{32 * len(_COUNTERS)} bytes, got {length}")
    tail = secret + info
    return b"".join(_SHA256(c + tail).digest() for c in _COUNTERS[: -(-length // 32)])[:length]


def mask_seed_info(rid: bytes, u: int, v: int, digest: bytes) -> bytes:
    """KDF info of the pairwise mask seed ``s_uv``: symmetric in (u, v)."""
    lo, hi = (u, v) if u < v else (v, u)
    return DOMAIN + b"|mask|" + rid + struct.pack("<qq", lo, hi) + b"|" + digest


class PairSecrets:
    """The X25519 secrets of pairs of clients simulated in one process, each computed once.

    Two clients ``u`` and ``v`` holding private keys ``a`` and ``b`` with public keys
    ``A = X25519(a, 9)`` and ``B = X25519(b, 9)`` agree on ``X25519(a, B) = X25519(b, A)``
    (RFC 7748: both are the x-coordinate of ``clamp(a) clamp(b) G``), so when both sessions
    live in one process the second can take the values the first computed instead of
    computing them again: the same bytes, half the agreements. A pair's two secrets (mask
    key ``s``, share-encryption key ``c``) are kept together, keyed by the unordered pair
    (the session's own advertised ``(c_pk, s_pk)``, the peer's ``(c_pk, s_pk)`` as
    received); they are found only by a session whose own keys and received peer keys form
    the very same pair, which by the identity above computes the very same bytes -- a
    substituted, swapped or replayed key (either of the two) makes another pair, and that
    session computes its own. (Tuples of the keys, not their concatenation: in process the
    keys are the very objects advertised, whose hashes Python computes once.)
    Each entry is taken at most once (only its two parties can ask for its pair, each once
    a round) and removed when taken; an entry is kept only for peer keys one of the
    object's sessions advertised (:meth:`join`). The layer gives one object to the sessions
    it opens together in one process (:meth:`MaskingClient.share_pair_secrets`); it is
    never pickled, so a session that travels or is persisted computes its own.
    """

    __slots__ = ("_members", "_open")

    def __init__(self):
        self._members: set[tuple[bytes, bytes]] = set()
        self._open: dict[tuple[bytes, ...], tuple[bytes, bytes]] = {}

    def join(self, c_pk: bytes, s_pk: bytes) -> None:
        """Public keys advertised by one of this object's sessions: entries with them are kept."""
        self._members.add((c_pk, s_pk))

    def agree(self, s_key: X25519PrivateKey, c_key: X25519PrivateKey, own: tuple[bytes, bytes], c_pk: bytes,
              s_pk: bytes):
        """``(x25519_agree(s_key, s_pk), x25519_agree(c_key, c_pk))``, where ``own`` is
        ``(c_pk, s_pk)`` of the session's own keys ``c_key``, ``s_key``: computed once for
        the pair. Raises :class:`CryptoFailure` for an invalid peer key."""
        peer = (c_pk, s_pk)
        pair = own + peer if own < peer else peer + own
        secrets = self._open.pop(pair, None)
        if secrets is None:
            secrets = (x25519_agree(s_key, s_pk), x25519_agree(c_key, c_pk))
            if peer in self._members:
                self._open[pair] = secrets
        return secrets


def pair_keys(s_key: X25519PrivateKey, c_key: X25519PrivateKey, rid: bytes, me: int, peers, s_pks, c_pks, digest: bytes,
              *, pairs: PairSecrets | None = None, own: tuple[bytes, bytes] | None = None):
    """Three lists over ``peers``: the mask seeds ``s_uv``, the send keys ``me -> v`` and the
    receive keys ``v -> me``, by :func:`x25519_agree`, :func:`kdf` with :func:`mask_seed_info`
    and :func:`share_keys`, as one call per client. With ``pairs`` (a :class:`PairSecrets`
    shared with the peers simulated in this process) and ``own`` (this client's advertised
    ``(c_pk, s_pk)``) each pair's secrets a peer already computed are taken from it: the
    same bytes. Raises :class:`PeerKeyError` (``.peer``, ``.failure``) for a peer whose
    advertised key fails the agreement."""
    seeds, send, recv = [], [], []
    # the info strings of mask_seed_info and share_keys, their constant parts built once
    mask_prefix, mask_suffix = DOMAIN + b"|mask|" + rid, b"|" + digest
    share_prefix = DOMAIN + b"|share-enc|" + rid
    agree, derive, pack = x25519_agree, kdf, _QQ.pack
    if pairs is not None:
        if own is None:
            raise ValueError("pair_keys: pairs= needs own=(c_pk, s_pk), the client's advertised public keys")
        take, mine = pairs.agree, tuple(own)
    for v, s_pk, c_pk in zip(peers, s_pks, c_pks):
        try:
            if pairs is None:
                s_shared = agree(s_key, s_pk)
                c_shared = agree(c_key, c_pk)
            else:
                s_shared, c_shared = take(s_key, c_key, mine, c_pk, s_pk)
        except CryptoFailure as exc:
            raise PeerKeyError(v, exc) from None
        pair = pack(me, v) if me < v else pack(v, me)
        seeds.append(derive(s_shared, mask_prefix + pair + mask_suffix))
        okm = derive(c_shared, share_prefix + pair, 64)
        if me < v:
            send.append(okm[:32])
            recv.append(okm[32:])
        else:
            send.append(okm[32:])
            recv.append(okm[:32])
    return seeds, send, recv


class PeerKeyError(Exception):
    """What a peer sent failed to verify (``.peer``, ``.failure``): its advertised key, in
    :func:`pair_keys`, or its share ciphertext, in :func:`decrypt_shares_many`."""

    def __init__(self, peer: int, failure: CryptoFailure):
        super().__init__(peer, failure)
        self.peer, self.failure = peer, failure


def share_keys(c_shared: bytes, rid: bytes, u: int, v: int) -> tuple[bytes, bytes]:
    """Share-encryption keys ``(u -> v, v -> u)``: one :func:`kdf` call, one 32-byte key per direction."""
    lo, hi = (u, v) if u < v else (v, u)
    okm = kdf(c_shared, DOMAIN + b"|share-enc|" + rid + struct.pack("<qq", lo, hi), 64)
    k_lo_hi, k_hi_lo = okm[:32], okm[32:]
    return (k_lo_hi, k_hi_lo) if u < v else (k_hi_lo, k_lo_hi)


# ---------------------------------------------------------------- AEAD
def encrypt_shares(key: bytes, rid: bytes, sender: int, receiver: int, payload: bytes, nonce: bytes | None = None) -> bytes:
    """AES-256-CCM ``nonce || ciphertext || tag`` with (round, sender, receiver) as AD; the
    96-bit nonce fresh from the OS CSPRNG unless given (:func:`encrypt_shares_many`)."""
    nonce = os.urandom(12) if nonce is None else nonce
    ad = rid + struct.pack("<qq", sender, receiver)
    return nonce + AESCCM(key).encrypt(nonce, payload, ad)


def encrypt_shares_many(keys, rid: bytes, sender: int, receivers, payloads) -> list[bytes]:
    """:func:`encrypt_shares` to several receivers, all the random 96-bit nonces read in one
    ``os.urandom`` call."""
    nonces = os.urandom(12 * len(receivers))
    ad = rid + struct.pack("<q", sender)  # + the receiver: rid + pack("<qq", sender, receiver)
    out = []
    for i, (key, receiver, payload) in enumerate(zip(keys, receivers, payloads)):
        nonce = nonces[12 * i : 12 * i + 12]
        out.append(nonce + AESCCM(key).encrypt(nonce, payload, ad + _Q.pack(receiver)))
    return out


def decrypt_shares(key: bytes, rid: bytes, sender: int, receiver: int, blob: bytes) -> bytes:
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < 12 + 16:
        raise CryptoFailure("share ciphertext is malformed")
    ad = rid + struct.pack("<qq", sender, receiver)
    try:
        return AESCCM(key).decrypt(bytes(blob[:12]), bytes(blob[12:]), ad)
    except InvalidTag:
        raise CryptoFailure("share ciphertext failed authentication") from None


def decrypt_shares_many(keys, rid: bytes, senders, receiver: int, blobs) -> list[bytes]:
    """:func:`decrypt_shares` of one receiver's blobs from several senders, in order; raises
    :class:`PeerKeyError` naming the first sender whose blob fails."""
    ad_tail = _Q.pack(receiver)  # the associated data: rid + pack("<qq", sender, receiver)
    out = []
    for key, sender, blob in zip(keys, senders, blobs):
        try:
            if type(blob) is not bytes or len(blob) < 12 + 16:  # other types, short blobs: the checked path
                out.append(decrypt_shares(key, rid, sender, receiver, blob))
            else:
                out.append(AESCCM(key).decrypt(blob[:12], blob[12:], rid + _Q.pack(sender) + ad_tail))
        except InvalidTag:
            raise PeerKeyError(sender, CryptoFailure("share ciphertext failed authentication")) from None
        except CryptoFailure as exc:
            raise PeerKeyError(sender, exc) from None
    return out


# ---------------------------------------------------------------- commitments
#: bytes of one share's commitment (a SHA-256 prefix; see :func:`share_commitments`)
SHARE_COMMIT_LEN = 16


def seed_commitment(rid: bytes, client: int, b_seed: bytes) -> bytes:
    """``SHA-256(domain, round id, client, b)``: the commitment to the self-mask seed a client
    publishes at advertise; the server compares the seed it reconstructs with it."""
    return _SHA256(DOMAIN + b"|seed-commit|" + rid + _Q.pack(client) + b_seed).digest()


def share_commitments(rid: bytes, dealer: int, holders, payloads) -> bytes:
    """The dealer's commitments to the shares it deals, one record per holder (``holders``
    ascending, the dealer included): the 16-byte SHA-256 prefix of the holder's s-share, then
    that of its b-share (``payloads[i]`` is holder i's s-share || b-share), each hash bound to
    the round id, the dealer, the holder and the kind (:func:`share_commitment`).

    Why publishing them reveals nothing: a share of a client's secret, given fewer than
    ``t`` other shares, is uniformly distributed over the field (Shamir's scheme is perfectly
    hiding), so each is a value of about 280 bits of entropy, and a hash of a high-entropy
    value bound to a unique prefix hides it (a guess costs a 2**128-work preimage search per
    share); the round id in the prefix makes a commitment useless in any other round.
    """
    head = DOMAIN + b"|share-commit|" + rid + _Q.pack(dealer)
    half = len(payloads[0]) // 2 if payloads else 0
    out = []
    for h, payload in zip(holders, payloads):
        prefix = head + _Q.pack(h)
        out.append(_SHA256(prefix + b"s" + payload[:half]).digest()[:SHARE_COMMIT_LEN])
        out.append(_SHA256(prefix + b"b" + payload[half:]).digest()[:SHARE_COMMIT_LEN])
    return b"".join(out)


def share_commitment(rid: bytes, dealer: int, holder: int, kind: str, share: bytes) -> bytes:
    """The commitment to one share (``kind`` ``"s"`` or ``"b"``), as in :func:`share_commitments`."""
    return _SHA256(DOMAIN + b"|share-commit|" + rid + _QQ.pack(dealer, holder) + kind.encode() + share).digest()[
        :SHARE_COMMIT_LEN]


def masked_digest(y) -> bytes:
    """A 16-byte SHA-256 prefix of a masked vector: what the layer remembers of the masked
    inputs of a run to recognise a replayed one."""
    return _SHA256(memoryview(y).cast("B")).digest()[:16]


# ---------------------------------------------------------------- Ed25519 / PKI
def advert_message(rid: bytes, client: int, c_pk: bytes, s_pk: bytes) -> bytes:
    return DOMAIN + b"|advertise|" + rid + struct.pack("<q", client) + c_pk + s_pk


def consistency_message(rid: bytes, digest: bytes, survivors) -> bytes:
    """What a client signs at the consistency check: round id, broadcast digest, sorted ``U3``.

    Length-prefixed fields, so no two distinct (digest, U3) pairs encode alike.
    """
    ids = sorted(int(c) for c in survivors)
    return (
        DOMAIN + b"|consistency|" + rid + struct.pack("<H", len(digest)) + digest
        + struct.pack(f"<q{len(ids)}q", len(ids), *ids)
    )


def sign(identity_private: bytes, message: bytes) -> bytes:
    return Ed25519PrivateKey.from_private_bytes(identity_private).sign(message)


def verify(identity_public: bytes, signature: bytes, message: bytes) -> None:
    try:
        Ed25519PublicKey.from_public_bytes(identity_public).verify(signature, message)
    except (InvalidSignature, ValueError, TypeError):
        raise CryptoFailure("Ed25519 signature does not verify") from None


class IdentityRegistry:
    """Simulated PKI: long-term Ed25519 identity keys per client id.

    In a deployment each client generates its identity key itself and registers the public
    half with a directory the clients trust (not the aggregation server). Here the layer
    creates the key pairs in ``setup``; :meth:`private` stands for the out-of-band hand-over
    to the client, :attr:`public` is the directory every party reads.
    """

    def __init__(self):
        self.public: dict[int, bytes] = {}
        self._private: dict[int, bytes] = {}

    def provision(self, client_ids) -> None:
        for c in client_ids:
            c = int(c)
            if c not in self.public:
                sk = Ed25519PrivateKey.generate()
                self._private[c] = sk.private_bytes_raw()
                self.public[c] = sk.public_key().public_bytes_raw()

    def private(self, client: int) -> bytes:
        self.provision([client])
        return self._private[int(client)]

    def __deepcopy__(self, memo):
        # A fit's deep copy of the layer keeps the same directory (the PKI is not per fit).
        return self
