"""The client side of pairwise masking (Bonawitz et al. 2017, CCS, Fig. 4, user side).

One :class:`MaskingClient` per client and round. It answers the stages in order
(``advertise``, ``share``, ``masked_input``, with ``consistency`` also
``consistency_check``, then ``unmask``) and refuses
(:class:`~securefkm.layers.ProtocolRefusal`) any request an honest client must not
answer. The session is a plain picklable object: a deployment can persist it between
messages. Its two shared secrets (the mask key and the self-mask seed) and their Shamir
shares are made when it opens, together for all sessions a layer opens at once
(:meth:`MaskingClient.prepare_sharing`). Secrets are erased as soon as they are no longer
needed: the X25519 private keys and the prepared shares after the share stage, the
self-mask seed, the pairwise seeds and the plaintext vector after the masked input, the
held shares after the unmask stage.

Consistency check (active-server variant, Bonawitz et al. Fig. 4 round 3): the client signs
``(round id, broadcast digest, U3)`` for the survivor list ``U3`` the server tells it, and
at unmask answers only if the request repeats that very ``U3`` and carries valid
signatures over it from at least ``plan.consistency_quorum`` distinct holders of its
neighbourhood listed in ``U3``; it then returns self-mask shares of the held peers in
``U3`` and mask-key shares only of held peers not in ``U3`` (``U2 \\ U3`` as it knows it),
whatever else the request asks.
"""

from __future__ import annotations

import os

import numpy as np

from securefkm.layers import ClientSession, ProtocolRefusal

from .. import shamir
from . import keys
from .graph import RoundPlan, ints_within
from .prg import MaskExpander

_SHARE_LEN = 6 + 4 * shamir.n_limbs(32)  # one share of a 32-byte secret

# (tuple, frozenset of it) of the last survivor / dropout lists read: see _id_set
_ID_SET_MEMO: list[tuple[tuple, frozenset]] = []


def _id_set(ids) -> frozenset:
    """``frozenset(ids)``, memoised on the identity of an immutable tuple of integers.

    The unmask request lists every survivor, so reading it is O(n) per client and O(n**2)
    per simulated round (1.9 s of a 10,000-client round). In process, the server hands
    every client the very same tuple object; a tuple of ints cannot change, so its set is
    computed once and reused while that object is alive (the memo keeps a reference, so the
    identity cannot be recycled). Anything else (lists, a fresh tuple per client as from a
    network transport) is converted as before: the checks see the same set either way.
    """
    if type(ids) is tuple:
        for held, cached in _ID_SET_MEMO:
            if held is ids:
                return cached
        if all(type(i) is int for i in ids):
            out = frozenset(ids)
            _ID_SET_MEMO.insert(0, (ids, out))
            del _ID_SET_MEMO[2:]  # survivors and dropped of the current round
            return out
    return frozenset(ids)


class MaskingClient(ClientSession):
    """A client's session. ``vector`` is its encoded sum-fields plus the check slot (= 1)."""

    def __init__(
        self,
        client_id: int,
        plan: RoundPlan,
        vector: np.ndarray,
        digest: bytes,
        *,
        cipher: str = "auto",
        identity_private: bytes | None = None,
        registry: dict[int, bytes] | None = None,
        consistency: bool = False,
        statement_digest: bytes = b"",
        survivors_floor: int | None = None,
    ):
        """``consistency`` adds the ``consistency_check`` stage (needs ``identity_private``
        and ``registry``); ``statement_digest`` is signed with ``U3`` whether or not the masks
        are bound to the broadcast (the layer's: the broadcast's digest bound to the run's
        floor, :meth:`PairwiseMasking.statement_digest`); ``survivors_floor``: the run's
        survivors floor (:meth:`PairwiseMasking.run_floor`, from the client's own run facts),
        below which the client refuses a survivor list whatever the plan says."""
        if consistency and (identity_private is None or registry is None):
            raise ValueError("the consistency check needs the client's identity key and the PKI directory")
        self.me = int(client_id)
        # only this client's slice of the public plan is kept: O(k) state to persist
        self.rid = plan.rid
        self.neigh = frozenset(plan.graph.neighbours(self.me).tolist())
        self.locality = plan.graph.position(self.me)  # the ring's order: see ClientSession.locality
        self.complete = plan.graph.kind == "complete"  # then neigh | {me} is the sampled set
        self.t_share = plan.t_share
        self.min_survivors = max(plan.min_survivors, int(survivors_floor or 0))
        self.length = plan.length
        self.vector = vector
        self.digest = digest
        self.cipher = cipher
        self.identity_private = identity_private
        self.registry = registry
        self.consistency = bool(consistency)
        self.statement_digest = bytes(statement_digest)
        self.quorum = plan.consistency_quorum
        self.order = ("advertise", "share", "masked_input") + (("consistency_check",) if consistency else ()) + ("unmask",)
        self.done: list[str] = []
        self.signed_u3: tuple[int, ...] | None = None

    @staticmethod
    def prepare_sharing(sessions: list[MaskingClient]) -> None:
        """Make each session's two secrets -- the mask key pair's private key ``s`` (X25519)
        and the self-mask seed ``b``, 32 bytes each -- when it opens, and their Shamir shares
        at all of its possible holders (itself and its neighbours), vectorised across the
        sessions (:func:`protocols.shamir.share_rows`: one Vandermonde matrix per holder
        set, every share serialised from one record array). The ``advertise`` stage then
        publishes the prepared key and the share stage sends the shares of the holders that
        advertised keys: the same protocol and randomness (fresh uniform coefficients, keys
        and seed from the OS CSPRNG), the key pair made a stage earlier. Everything prepared
        is erased where the secrets always were: the key and the shares after the share
        stage, the seed after the masked input."""
        groups: dict[tuple[int, int], list[tuple[MaskingClient, list[int]]]] = {}
        for session in sessions:
            points = sorted(v + 1 for v in session.neigh | {session.me})
            if 1 <= session.t_share <= len(points):  # else the share stage refuses anyway
                groups.setdefault((len(points), session.t_share), []).append((session, points))
        for (_, t), members in groups.items():
            b_seeds = os.urandom(32 * len(members))
            secret_rows = []
            for i, (session, _) in enumerate(members):
                session.s_sk, session._s_pk, session._s_key = keys.x25519_keypair(with_key=True)
                session.b_seed = b_seeds[32 * i : 32 * i + 32]
                secret_rows.append([session.s_sk, session.b_seed])
            payloads = shamir.share_rows([points for _, points in members], t, secret_rows)
            for (session, _), row in zip(members, payloads):
                session._payloads = row  # row[j]: s-share || b-share of holder j (ascending ids)

    @staticmethod
    def share_pair_secrets(sessions: list[MaskingClient]) -> None:
        """Let sessions opened together in one process compute each pairwise X25519 secret
        once between them (:class:`~protocols.masking.keys.PairSecrets`: ``X25519(a, B)`` is
        ``X25519(b, A)``, so the bytes are those each would compute). What every session
        sends is unchanged; the simulation does half the agreements of pairs it holds both
        ends of. Dropped with the session's other unpicklable state when it is pickled."""
        pairs = keys.PairSecrets()
        for session in sessions:
            session._pairs = pairs

    def __getstate__(self):
        # loaded key objects are not picklable; a restored session reloads the raw keys
        # nor is the process's PairSecrets: a restored session computes its own agreements
        return {k: v for k, v in self.__dict__.items() if k not in ("_loaded", "_s_key", "_pairs")}

    # ------------------------------------------------------------------ helpers
    def _refuse(self, why: str):
        raise ProtocolRefusal(f"client {self.me} refuses: {why}")

    def _enter(self, stage: str):
        if stage in self.done:
            self._refuse(f"stage {stage!r} was already answered this round (replayed request)")
        if tuple(self.done) != self.order[: self.order.index(stage)]:
            self._refuse(f"stage {stage!r} out of order (answered so far: {self.done})")

    def respond(self, stage, message):
        if stage == "advertise":
            return self._advertise(message)
        if stage == "share":
            return self._share(message)
        if stage == "masked_input":
            return self._masked_input(message)
        if stage == "consistency_check" and self.consistency:
            return self._consistency_check(message)
        if stage == "unmask":
            return self._unmask(message)
        self._refuse(f"unknown stage {stage!r}")

    def _survivor_list(self, message, stage: str) -> tuple[int, ...]:
        try:
            raw = list(message["survivors"])
        except (KeyError, TypeError, ValueError):
            self._refuse(f"the {stage} request must list the survivors")
        if not all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in raw):
            self._refuse(f"the {stage} request's survivor list holds non-integer ids")
        survivors = tuple(sorted(int(c) for c in raw))
        if len(set(survivors)) != len(survivors):
            self._refuse(f"the {stage} request lists a survivor twice")
        return survivors

    def _check_survivors(self, survivors) -> None:
        """Refusals shared by the consistency check and the unmask stage."""
        if not isinstance(survivors, (set, frozenset)):
            survivors = _id_set(survivors)
        if self.complete and not survivors <= self.neigh | {self.me}:
            self._refuse(f"the survivor list names clients {sorted(survivors - self.neigh - {self.me})[:5]} who were not sampled this round")
        if self.me not in survivors:
            self._refuse("I sent my masked input but am not listed as a survivor")
        if len(survivors) < self.min_survivors:
            self._refuse(
                f"field 'survivors' lists only {len(survivors)} clients, fewer than the round's minimum "
                f"{self.min_survivors} (the run's survivors floor and the threshold): the sum would expose "
                "too few clients"
            )
        # |survivors & (mask_peers + me)|, counted over my O(k) neighbourhood, not the O(n)
        # list (I am a survivor, checked above, and never one of my mask peers)
        alive = len(survivors.intersection(self.mask_peers)) + 1
        if alive < self.t_share:
            self._refuse(
                f"only {alive} of my neighbourhood survived, fewer than the "
                f"threshold {self.t_share}"
            )

    # ------------------------------------------------------------------ stage 0
    def _advertise(self, message):
        self._enter("advertise")
        self.c_sk, c_pk, c_key = keys.x25519_keypair(with_key=True)
        if "_s_pk" in self.__dict__:  # made when the session opened (prepare_sharing)
            s_pk = self.__dict__.pop("_s_pk")
            s_key = self.__dict__.pop("_s_key", None) or keys.load_x25519(self.s_sk)
        else:
            self.s_sk, s_pk, s_key = keys.x25519_keypair(with_key=True)
        self._loaded = (c_key, s_key)  # not pickled (__getstate__): reloaded from the raw keys
        pairs = self.__dict__.get("_pairs")
        if pairs is not None:
            pairs.join(c_pk, s_pk)
        sig = None
        if self.identity_private is not None:
            sig = keys.sign(self.identity_private, keys.advert_message(self.rid, self.me, c_pk, s_pk))
        self.my_keys = (c_pk, s_pk)
        self.done.append("advertise")
        return {"c_pk": c_pk, "s_pk": s_pk, "sig": sig, "commit": self._commitments(),
                "digest": self.statement_digest}

    def _commitments(self) -> bytes:
        """What the client commits to at advertise (verifiable shares): ``H(b)``
        (:func:`~protocols.masking.keys.seed_commitment`), then a commitment to each share it
        deals, at every possible holder (itself and its neighbours, ascending ids;
        :func:`~protocols.masking.keys.share_commitments`). The server checks each share a
        holder reveals at unmask against them, and the reconstructed seed against ``H(b)``.
        The shares are made here if the session was opened alone (not by
        :meth:`prepare_sharing`); b"" when the threshold exceeds the holders (the share stage
        refuses then)."""
        holders = sorted(self.neigh | {self.me})
        payloads = self.__dict__.get("_payloads")
        if payloads is None:
            if not 1 <= self.t_share <= len(holders):
                return b""
            self.b_seed = os.urandom(32)
            s_shares, b_shares = shamir.share_many([self.s_sk, self.b_seed], self.t_share, [h + 1 for h in holders])
            payloads = self._payloads = [a + b for a, b in zip(s_shares, b_shares)]
        return keys.seed_commitment(self.rid, self.me, self.b_seed) + keys.share_commitments(
            self.rid, self.me, holders, payloads)

    # ------------------------------------------------------------------ stage 1
    def _share(self, message):
        self._enter("share")
        if not isinstance(message, dict) or not isinstance(message.get("keys"), dict):
            self._refuse("the share request carries no key list")
        adverts = message["keys"]
        mine = adverts.get(self.me)
        if not isinstance(mine, dict) or (mine.get("c_pk"), mine.get("s_pk")) != self.my_keys:
            self._refuse("the key list does not contain my own advertised keys unchanged")
        peers = self._listed_peers(adverts) if self.registry is None else None
        if peers is None:
            peers = self._checked_peers(adverts)
        holders = sorted(peers + [self.me])
        if len(holders) < self.t_share:
            self._refuse(
                f"only {len(holders)} holders (me and {len(peers)} neighbours) advertised keys; "
                f"my secrets need threshold {self.t_share}"
            )
        # pairwise mask seeds and share-encryption keys, computed once here
        loaded = self.__dict__.pop("_loaded", None)
        c_key, s_key = loaded if loaded is not None else (keys.load_x25519(self.c_sk), keys.load_x25519(self.s_sk))
        try:
            derived = keys.pair_keys(s_key, c_key, self.rid, self.me, peers,
                                     [adverts[v]["s_pk"] for v in peers], [adverts[v]["c_pk"] for v in peers],
                                     self.digest, pairs=self.__dict__.pop("_pairs", None), own=self.my_keys)
        except keys.PeerKeyError as exc:
            self._refuse(f"client {exc.peer}'s advertised key is invalid ({exc.failure})")
        seeds, send_keys, recv_keys = derived
        self.pair_seeds: dict[int, bytes] = dict(zip(peers, seeds))
        self.recv_keys: dict[int, bytes] = dict(zip(peers, recv_keys))
        # each holder's payload: its share of s, then its share of b
        # made when the session opened (prepare_sharing) or at advertise, at every neighbour,
        # and committed to at advertise
        payloads = self.__dict__.pop("_payloads")
        if len(payloads) != len(holders):  # not every neighbour advertised: theirs are dropped
            prepared = dict(zip(sorted(self.neigh | {self.me}), payloads))
            payloads = [prepared[h] for h in holders]
        at = holders.index(self.me)
        own = payloads.pop(at)  # the peers are the holders without me, in the same (sorted) order
        self.held: dict[int, bytes] = {self.me: own}  # holder -> its s-share || b-share, split at unmask
        blobs = keys.encrypt_shares_many(send_keys, self.rid, self.me, peers, payloads)
        out = dict(zip(peers, blobs))
        del self.c_sk, self.s_sk
        self.done.append("share")
        return out

    def _listed_peers(self, adverts: dict) -> list[int] | None:
        """The sorted peers of a key list as a process sends it (distinct ``int`` ids, all
        neighbours, each with two distinct 32-byte keys, no key twice), checked in bulk; None
        for anything else, which :meth:`_checked_peers` then checks item by item and names."""
        me = self.me
        if not ints_within(adverts.keys() - {me}, self.neigh):
            return None
        try:
            pks = [pk for adv in adverts.values() for pk in (adv["c_pk"], adv["s_pk"])]
        except (KeyError, TypeError):
            return None
        if not all(type(pk) is bytes and len(pk) == 32 for pk in pks) or len(set(pks)) != len(pks):
            return None
        return sorted(v for v in adverts if v != me)

    def _checked_peers(self, adverts: dict) -> list[int]:
        """The sorted peers of a key list, each item checked (and each signature verified,
        with a registry); refuses naming the first fault."""
        seen: set[bytes] = set()
        peers, listed = [], set()
        for v, adv in adverts.items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                self._refuse(f"key list field 'keys' has the key {v!r}, which is not a client id")
            v = int(v)
            if v != self.me and v not in self.neigh:
                self._refuse(f"key list names client {v}, who is not my neighbour this round")
            if v in listed:
                self._refuse(f"key list names client {v} twice")
            listed.add(v)
            try:
                c_pk, s_pk = adv["c_pk"], adv["s_pk"]
            except (KeyError, TypeError):
                self._refuse(f"malformed advertised keys for client {v}")
            if not (isinstance(c_pk, bytes) and isinstance(s_pk, bytes) and len(c_pk) == 32 and len(s_pk) == 32):
                self._refuse(f"malformed advertised keys for client {v}")
            if c_pk in seen or s_pk in seen or c_pk == s_pk:
                self._refuse(f"advertised keys are not all distinct (client {v}): a replayed key")
            seen.update((c_pk, s_pk))
            if self.registry is not None:
                ident = self.registry.get(v)
                sig = adv.get("sig")
                if ident is None or not isinstance(sig, bytes):
                    self._refuse(f"client {v}'s advertised keys carry no valid signature")
                try:
                    keys.verify(ident, sig, keys.advert_message(self.rid, v, c_pk, s_pk))
                except keys.CryptoFailure:
                    self._refuse(f"client {v}'s advertised keys fail signature verification (tampered key)")
            if v != self.me:
                peers.append(v)
        peers.sort()
        return peers

    # ------------------------------------------------------------------ stage 2
    def _masked_input(self, message):
        self._enter("masked_input")
        if not isinstance(message, dict):
            self._refuse("the masked-input request carries no share ciphertexts")
        recv_keys = self.recv_keys
        senders = list(message)
        if not ints_within(message.keys(), recv_keys.keys()):  # else checked one by one
            senders = []
            for u in message:
                if isinstance(u, bool) or not isinstance(u, (int, np.integer)):
                    self._refuse(f"the masked-input request has the key {u!r}, which is not a client id")
                u = int(u)
                if u not in recv_keys:
                    self._refuse(f"received shares from client {u}, who is not one of my key-sharing neighbours")
                senders.append(u)
            if len(set(senders)) != len(senders):
                self._refuse("received two share ciphertexts from one client")
        blobs = list(message.values())
        try:
            payloads = keys.decrypt_shares_many([recv_keys[u] for u in senders], self.rid, senders, self.me, blobs)
        except keys.PeerKeyError:  # one by one, to name every sender whose ciphertext fails
            payloads = []
            for u, blob in zip(senders, blobs):
                try:
                    payloads.append(keys.decrypt_shares(recv_keys[u], self.rid, u, self.me, blob))
                except keys.CryptoFailure:
                    payloads.append(None)
        # a ciphertext that fails authentication or holds shares of the wrong size: its sender
        # (or the server that relayed it) altered it. The round goes on as if that sender had
        # not shared with me (no mask with it, none of its shares held), and the reply names
        # it, so that the server leaves it out of the round (failed_shares)
        failed = sorted(u for u, payload in zip(senders, payloads) if payload is None or len(payload) != 2 * _SHARE_LEN)
        if failed:
            bad = set(failed)
            kept = [(u, payload) for u, payload in zip(senders, payloads) if u not in bad]
            senders, payloads = [u for u, _ in kept], [payload for _, payload in kept]
        self.held.update(zip(senders, payloads))
        mask_peers = sorted(senders)
        if len(mask_peers) + 1 < self.t_share:
            self._refuse(
                f"only {len(mask_peers)} neighbours completed the share stage; "
                f"threshold {self.t_share} cannot be met"
            )
        expander = MaskExpander(self.length, self.cipher)
        y = self.vector.astype(np.uint64, copy=True)
        me, seeds = self.me, self.pair_seeds
        # + PRG(b) + sum_{v > me} PRG(s_uv) - sum_{v < me} PRG(s_uv), modulo 2**64
        expander.add_signed(y, [self.b_seed] + [seeds[v] for v in mask_peers if me < v],
                            [seeds[v] for v in mask_peers if me > v])
        self.mask_peers = tuple(mask_peers)
        # nothing but the held shares is needed any more
        del self.b_seed, self.pair_seeds, self.recv_keys
        self.vector = None
        self.done.append("masked_input")
        if failed:
            return {"masked": y, "failed_shares": tuple(failed)}
        return y

    # ------------------------------------------------------------------ stage 3 (active variant)
    def _consistency_check(self, message):
        """Sign the survivor list ``U3`` (Bonawitz et al. Fig. 4, ConsistencyCheck)."""
        self._enter("consistency_check")
        survivors = self._survivor_list(message, "consistency-check")
        self._check_survivors(survivors)
        listed = set(survivors)
        unknown = sorted(v for v in listed & self.neigh if v not in self.mask_peers)
        if unknown:
            self._refuse(
                f"neighbours {unknown[:5]} are listed as survivors but never sent me their shares "
                "(the survivors must be a subset of the clients that completed the share stage)"
            )
        self.signed_u3 = survivors
        sig = keys.sign(self.identity_private, keys.consistency_message(self.rid, self.statement_digest, survivors))
        self.done.append("consistency_check")
        return sig

    def _check_signatures(self, message, survivors: tuple[int, ...]) -> None:
        sigs = message.get("signatures") if isinstance(message, dict) else None
        if not isinstance(sigs, dict):
            self._refuse("the unmask request carries no consistency-check signatures")
        statement = keys.consistency_message(self.rid, self.statement_digest, survivors)
        eligible = (self.neigh | {self.me}) & set(survivors)
        valid: set[int] = set()
        for v, sig in sigs.items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) not in eligible:
                continue
            v = int(v)
            if v in valid or not isinstance(sig, bytes):
                continue
            try:
                keys.verify(self.registry.get(v, b""), sig, statement)
            except keys.CryptoFailure:
                continue
            valid.add(v)
            if len(valid) >= self.quorum:
                return
        self._refuse(
            f"only {len(valid)} of my holders signed the survivor list I signed (quorum "
            f"{self.quorum}): the server may be showing different clients different survivor sets"
        )

    # ------------------------------------------------------------------ stage 4
    def _unmask(self, message):
        self._enter("unmask")
        try:
            survivors = _id_set(message["survivors"])
            dropped = _id_set(message["dropped"])
        except (KeyError, TypeError, ValueError):
            self._refuse("the unmask request must list survivors and dropped clients")
        if not survivors.isdisjoint(dropped):
            both = survivors & dropped
            self._refuse(
                f"clients {sorted(both)[:5]} are listed as both survivor and dropped: answering "
                "would reveal both the self-mask and the mask key of one client"
            )
        mine = set(self.mask_peers) | {self.me}
        if self.consistency:
            listed = self._survivor_list(message, "unmask")
            if listed != self.signed_u3:
                self._refuse("the unmask request's survivor list differs from the one I signed at the consistency check")
            self._check_signatures(message, listed)
            # answer from the signed view only: b-shares of held peers in U3, s-shares of
            # held peers outside it (U2 minus U3 as this client knows U2), nothing else
            dropped = mine - survivors
        self._check_survivors(survivors)
        # no client's two shares are ever revealed: survivors and dropped are disjoint
        # (checked above) and the stage is answered once (_enter refuses a replay)
        b_ids, s_ids = sorted(mine & survivors), sorted(mine & dropped)
        held = self.held
        b_out = {v: held[v][_SHARE_LEN:] for v in b_ids}
        s_out = {v: held[v][:_SHARE_LEN] for v in s_ids}
        self.held = {}
        self.done.append("unmask")
        return {"b": b_out, "s": s_out}
