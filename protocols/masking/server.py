"""The server side of pairwise masking (Bonawitz et al. 2017, CCS, Fig. 4, server side).

The server only routes messages and, at the end, removes masks: it reconstructs the
self-mask seed ``b_u`` of every survivor and the mask key ``s_v`` of every client that
completed the share stage but sent no masked input, recomputes those masks, subtracts
them from the sum of masked vectors and decodes. Masked vectors are accumulated as they
arrive (no per-client copy is kept). Every failure raises
:class:`~securefkm.exceptions.RoundAbortedError` and releases nothing.

With ``consistency`` (``sign_keys=True``) there is one more stage between masked input and
unmask, ``consistency_check`` (Bonawitz et al. Fig. 4, round 3): the server sends every
survivor the list ``U3``, collects each client's Ed25519 signature over
``(round id, broadcast digest, U3)``, drops invalid ones (a non-signer is a dropout of that
stage) and forwards the signatures with the unmask request (all of them in the complete
graph, those of the client's neighbourhood in the sparse one). An honest server needs
nothing else; the check protects the clients from a dishonest one.
"""

from __future__ import annotations

import bisect
import logging

import numpy as np

from securefkm.exceptions import RoundAbortedError, ServerMisbehaviourError
from securefkm.layers import RoundContext, ServerSession

from .. import shamir
from ..codec import FixedPointCodec
from . import keys
from .graph import RoundPlan, ints_within
from .prg import MaskExpander

log = logging.getLogger(__name__)


def _mulmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a * b`` reduced to [0, p + 1] (congruent mod p) for int64 inputs in [0, p + 1]:
    the product is below 2**62 + 2**33, and two Mersenne folds replace a division."""
    return shamir._fold(a * b)


def _prod_tree(a: np.ndarray) -> np.ndarray:
    """Product along the last axis, reduced to [0, p + 1] (pairwise tree)."""
    while a.shape[-1] > 1:
        if a.shape[-1] % 2:
            a = np.concatenate([a, np.ones(a.shape[:-1] + (1,), dtype=np.int64)], axis=-1)
        a = _mulmod(a[..., 0::2], a[..., 1::2])
    return a[..., 0]


def _pow_mod(a: np.ndarray, e: int) -> np.ndarray:
    """``a**e`` reduced to [0, p + 1], elementwise (square and multiply)."""
    result = np.ones_like(a)
    base = a
    while e:
        if e & 1:
            result = _mulmod(result, base)
        base = _mulmod(base, base)
        e >>= 1
    return result


_BYTES = {bytes, bytearray}


def reconstruct_per_holder_set(groups: list[list[bytes]], threshold: int, chunk_elems: int = 1 << 21) -> list[bytes]:
    """Reconstruct many secrets whose shares are held at *different* points, vectorised.

    Same result and checks as :func:`protocols.shamir.reconstruct_many` (each secret from
    the shares of its ``threshold`` smallest evaluation points; ``ShareError`` on too few,
    duplicated, malformed or inconsistent shares), but instead of one Lagrange solve per
    distinct point set -- one per client in the sparse graph, where every client's holders
    differ -- the shares of all secrets are parsed from one buffer and the Lagrange
    coefficients of a chunk of secrets are computed at once:
    ``lam[g, i] = prod_j x_gj / (x_gi * prod_{j != i} (x_gj - x_gi))`` with one batched
    product tree and one batched Fermat inversion; then every limb is
    ``sum_i lam[g, i] * y[g, i] mod p``. For small thresholds (sparse graph): memory is
    about ``chunk * t * t`` int64 per chunk.
    """
    t = int(threshold)
    P = shamir.P
    header = 6  # shamir's "<IH" share header: x, secret length
    out: list[bytes | None] = [None] * len(groups)
    buckets: dict[tuple[int, int], list[int]] = {}  # (secret length, number of shares) -> groups
    for gi, group in enumerate(groups):
        first = group[0] if len(group) else None
        if not isinstance(first, (bytes, bytearray)) or len(first) < header:
            raise shamir.ShareError("too few shares: none given." if first is None else "a share must be bytes produced by protocols.shamir.share.")
        if len(group) < t:
            raise shamir.ShareError(f"too few shares: {len(group)} given, threshold {t} needed.")
        buckets.setdefault((int.from_bytes(first[4:6], "little"), len(group)), []).append(gi)
    for (length, count), members in buckets.items():
        m = shamir.n_limbs(length)
        # every share of the bucket is bytes of the size its first share's header implies
        flat = [sh for gi in members for sh in groups[gi]]
        sizes = np.fromiter(map(len, flat), dtype=np.int64, count=len(flat)) if set(map(type, flat)) <= _BYTES else None
        if sizes is None or np.any(sizes != 6 + 4 * m):
            raise shamir.ShareError("shares of different secrets were mixed or a share is malformed (sizes differ).")
        dt = np.dtype([("x", "<u4"), ("len", "<u2"), ("ys", "<u4", (m,))])
        rec = np.frombuffer(b"".join(flat), dtype=dt).reshape(len(members), count)
        if np.any(rec["len"] != length):
            raise shamir.ShareError("shares of different secrets were mixed (different secret lengths).")
        xs = rec["x"].astype(np.int64)
        ys = rec["ys"].astype(np.int64)  # (G, count, m)
        if np.any(xs < 1) or np.any(xs >= P) or np.any(ys >= P):
            raise shamir.ShareError("malformed share (x or limb value out of range).")
        order = np.argsort(xs, axis=1, kind="stable")
        xs_sorted = np.take_along_axis(xs, order, axis=1)
        if count > 1 and np.any(xs_sorted[:, 1:] == xs_sorted[:, :-1]):
            raise shamir.ShareError("duplicate shares: two shares have the same evaluation point x.")
        X_all = xs_sorted[:, :t]
        Y_all = np.take_along_axis(ys, order[:, :t, None], axis=1)  # (G, t, m)
        chunk = max(1, chunk_elems // (t * t))
        idx = np.arange(t)
        for start in range(0, len(members), chunk):
            X, Y = X_all[start : start + chunk], Y_all[start : start + chunk]
            diff = X[:, None, :] - X[:, :, None]  # diff[g, i, j] = x_gj - x_gi, in (-p, p)
            diff += P * (diff < 0)  # mod p without a division
            diff[:, idx, idx] = 1
            den = _mulmod(_prod_tree(diff), X)  # x_gi * prod_{j != i} (x_gj - x_gi)
            lam = shamir._canon(_mulmod(_prod_tree(X)[:, None], _pow_mod(den, P - 2)))
            limbs = (shamir._fold(lam[:, :, None] * Y).sum(axis=1)) % P  # t values <= p + 1 each
            for gi, secret in zip(members[start : start + chunk], shamir.from_limb_rows(limbs, length)):
                out[gi] = secret
    return out  # type: ignore[return-value]


class RoundChecks:
    """The server's abort conditions, shared by the real protocol and its ideal
    functionality (:mod:`protocols.masking.ideal`) so both abort with the same words.
    Needs ``self.ctx`` and ``self.plan``."""

    def _abort(self, stage: str, why: str, error=RoundAbortedError, cause: str | None = None):
        faults = self.faults
        if faults and error is RoundAbortedError:
            listed = ", ".join(f"client {c} ({faults[c]})" for c in sorted(faults)[:5])
            more = f" and {len(faults) - 5} more" if len(faults) > 5 else ""
            why += f"; left out of the round for faults: {listed}{more}"
        exc = error(
            f"pairwise masking aborted round {self.ctx.round} at stage {stage!r}: {why}; "
            "no aggregate was released",
            round=self.ctx.round,
            stage=stage,
        )
        if cause is not None:
            exc.cause = cause
        raise exc

    def _need(self, stage: str, count: int, what: str):
        if count < self.plan.min_survivors:
            why = ""
            if self.plan.survivors_floor == self.plan.min_survivors:
                why = (" -- the survivors a client-side layer needs (GaussianDP's min_clients: its noise "
                       "shares are sized for them; lower min_clients, or declare more dropouts with "
                       "PairwiseMasking(dropout_fraction=...))")
            self._abort(
                stage,
                f"only {count} clients {what}, fewer than the threshold of "
                f"{self.plan.min_survivors} survivors (sampled {len(self.plan.sampled)}){why}",
            )

    def _check_failure(self, survivors, read: str, other_digests: dict | None):
        """The check slot failed: the masks did not cancel. Raises
        :class:`ServerMisbehaviourError` when signed evidence implicates the server (with the
        consistency check: contributors signed broadcast digests other than the server's),
        else a :class:`RoundAbortedError` with cause ``"unattributed_check_failure"``."""
        if other_digests:
            self._abort(
                "unmask",
                f"the aggregate failed to decode: the check slot {read} the {len(survivors)} contributors, so the "
                "pairwise masks did not cancel, and clients "
                f"{sorted(other_digests)[:10]} signed broadcast digests other than the server's at the "
                "consistency check. Clients saw inconsistent broadcasts (the model-inconsistency attack: the "
                "server sent different centres/parameters to different clients)",
                ServerMisbehaviourError,  # signed evidence: the runtime ends the fit
            )
        listed = ", ".join(map(str, survivors[:50])) + (f" and {len(survivors) - 50} more" if len(survivors) > 50 else "")
        signed = (" Every signature the server holds covers its own broadcast digest, so the broadcasts were "
                  "consistent and a contributor's input is the likelier fault." if self.consistency else "")
        self._abort(
            "unmask",
            f"the aggregate failed to decode: the check slot {read} the {len(survivors)} contributors, so the "
            "masks did not cancel: a client may have sent a corrupted masked input, or the server sent different "
            "broadcasts (binding: clients saw inconsistent broadcasts) or inconsistent share lists; masking alone "
            "cannot tell which (naming a client that sends a corrupted masked input needs validated aggregation, "
            f"e.g. range proofs, which this layer does not do).{signed} Contributors: {listed}",
            cause="unattributed_check_failure",
        )


_SHARE_LEN = 6 + 4 * shamir.n_limbs(32)  # one Shamir share of a 32-byte secret
_SHARE_CT_LEN = 12 + 2 * _SHARE_LEN + 16  # AES-CCM nonce, s-share || b-share, tag
_MISSING = object()


def _client_id(c):
    """``c`` as an int when it is an integer client id (not a bool), else None."""
    if type(c) is int:
        return c
    if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
        return int(c)
    return None


class RunHistory:
    """What the layer remembers of the rounds of a fit, to recognise replayed messages:
    16-byte prefixes of every public key advertised and of the SHA-256 of every masked input
    received (:func:`~protocols.masking.keys.masked_digest`). Both are fresh every round
    (new X25519 keys, a new self-mask seed), so a repeat is a replay or a copy and its sender
    is at fault. Only the server reads it: a pickled copy (e.g. the layer sent to a worker
    process) starts empty."""

    def __init__(self):
        self.keys: set[bytes] = set()
        self.masked: set[bytes] = set()

    def __reduce__(self):
        return (RunHistory, ())


class MaskingServer(RoundChecks, ServerSession):
    """The server's session of one round.

    Every reply is checked before it is used, and a reply that fails a check its sender
    alone can be blamed for leaves that client out of the rest of the round (as a dropout at
    that stage: the protocol's dropout recovery handles it) and is recorded in ``faults``
    (client -> the stage, the field and what is wrong):

    * ``advertise``: two distinct 32-byte X25519 keys of large order, the commitments
      (``commit``: ``H(b)`` and one per share dealt), the broadcast digest; a key advertised in
      an earlier round of the run (``history``: keys are fresh every round) is a replayed or
      copied key. One key advertised by two clients in one round cannot be attributed (a
      leaked key, or the server's collusion): both are left out of that round without a fault
      (``unattributed``, and a warning in the log).
    * ``share``: exactly one ciphertext of the right size for each neighbour that
      advertised keys.
    * ``masked_input``: a ``uint64`` vector of the round's length, not one received earlier
      in the run (a replayed masked input), and ``failed_shares``: peers whose share
      ciphertext to this client failed authentication. Such a peer is left out from the
      masked input on (it is treated as a dropout; its pairwise masks are removed only where
      a survivor used them) and recorded with that reason. If the server relays two honest
      clients' messages unchanged this never fires; a server that alters a ciphertext can
      only make a client be left out, never learn an input: the left-out client's self-mask
      seed is never reconstructed.
    * ``consistency_check``: a signature over the survivor list that verifies.
    * ``unmask``: each share a holder reveals must match the commitment its dealer made at
      advertise (verifiable shares); a holder revealing a wrong share is at fault and the
      secret is reconstructed from the remaining correct shares. A dealer whose committed
      shares reconstruct to a mask key that does not match its advertised key, or to a
      self-mask seed that does not match ``H(b)``, is at fault itself (the round then aborts:
      its masks cannot be removed).

    A failed check slot (the masks did not cancel) cannot be attributed by masking alone: a
    corrupted masked input looks like any other; see :meth:`RoundChecks._check_failure`.
    """

    def __init__(
        self,
        ctx: RoundContext,
        plan: RoundPlan,
        codec: FixedPointCodec,
        *,
        cipher: str = "auto",
        bind_broadcast: bool = True,
        registry: dict[int, bytes] | None = None,
        consistency: bool = False,
        history: RunHistory | None = None,
    ):
        if consistency and registry is None:
            raise ValueError("the consistency check needs the PKI directory (sign_keys=True)")
        self.ctx = ctx
        self.plan = plan
        self.codec = codec
        self.cipher = cipher
        self.digest = ctx.broadcast_digest if bind_broadcast else b""
        self.registry = registry
        self.history = RunHistory() if history is None else history
        self.adverts: dict[int, dict] = {}
        self.commits: dict[int, bytes] = {}  # advertise: H(b) || a commitment per share dealt
        self.client_digests: dict[int, bytes] = {}  # advertise: the broadcast digest each client got
        self.cipher_out: dict[int, dict[int, bytes]] = {}
        self.u1: set[int] = set()
        self.u2: set[int] = set()
        self.u3: list[int] = []
        self.reported: dict[int, frozenset] = {}  # survivor -> peers it did not mask with (failed_shares)
        self.acc = np.zeros(plan.length, dtype=np.uint64)
        self.revealed: dict[str, dict[int, list]] = {"b": {}, "s": {}}  # kind -> owner -> [(holder, share)]
        self._unmask_msg = None
        self.consistency = bool(consistency)
        self.statement_digest = ctx.broadcast_digest
        self.signatures: dict[int, bytes] = {}  # consistency check: U4 -> signature over U3
        self.other_digests: dict[int, bytes] = {}  # signed digests other than the server's
        #: clients left out of the round without a fault (a key two clients advertised)
        self.unattributed: dict[int, str] = {}
        self._holder_lists: dict[int, list[int]] = {}
        self.n_unmask_replies = 0

    def _fault(self, client: int, stage: str, why: str) -> None:
        self.faults.setdefault(int(client), f"stage {stage!r}: {why}")

    # ------------------------------------------------------------------ messages
    def messages(self, stage, alive):
        alive = [int(c) for c in alive]
        if stage == "advertise":
            return {c: {"stage": "advertise"} for c in alive}
        if stage == "share":
            live = [c for c in alive if c in self.u1]
            if self.plan.graph.kind == "complete":
                keyset = {v: self.adverts[v] for v in sorted(self.u1)}
                return {c: {"keys": keyset} for c in live}
            adverts, u1, neighbours = self.adverts, self.u1, self.plan.graph.neighbours
            return {c: {"keys": {v: adverts[v] for v in [c] + neighbours(c).tolist() if v in u1}} for c in live}
        if stage == "masked_input":
            live = [c for c in alive if c in self.u2]
            out = {c: {} for c in live}
            for u in sorted(self.u2):
                for v, blob in self.cipher_out[u].items():
                    if v in out:
                        out[v][u] = blob
            return out
        if stage == "consistency_check" and self.consistency:
            surv = tuple(sorted(self.u3))
            u3 = set(surv)
            return {c: {"survivors": surv} for c in alive if c in u3}
        if stage == "unmask":
            surv = tuple(sorted(self.u3))
            dropped = tuple(sorted(self.u2 - set(self.u3)))
            self._unmask_msg = {"survivors": surv, "dropped": dropped}
            if not self.consistency:
                u3 = set(surv)
                return {c: self._unmask_msg for c in alive if c in u3}
            signers = [c for c in alive if c in self.signatures]
            if self.plan.graph.kind == "complete":
                msg = {**self._unmask_msg, "signatures": dict(self.signatures)}
                return {c: msg for c in signers}
            out = {}
            for c in signers:
                near = [c] + self.plan.graph.neighbours(c).tolist()
                out[c] = {**self._unmask_msg, "signatures": {v: self.signatures[v] for v in near if v in self.signatures}}
            return out
        raise RoundAbortedError(f"unknown stage {stage!r}", round=self.ctx.round, stage=stage)

    # ------------------------------------------------------------------ receive
    def receive(self, stage, replies):
        if not isinstance(replies, dict):
            raise TypeError(f"receive({stage!r}, replies): replies must be a dict {{client id: reply}}")
        if stage == "advertise":
            self._receive_adverts(replies)
            self._need(stage, len(self.u1), "advertised keys")
        elif stage == "share":
            self._receive_ciphertexts(replies)
            self._need(stage, len(self.u2), "completed the share stage")
        elif stage == "masked_input":
            self._receive_masked(replies)
            self._need(stage, len(self.u3), "sent masked input")
        elif stage == "consistency_check" and self.consistency:
            self._receive_signatures(replies)
            need = self.plan.consistency_quorum
            if len(self.signatures) < need:
                self._abort(
                    stage,
                    f"only {len(self.signatures)} clients signed the survivor list, fewer than the "
                    f"quorum of {need} every client needs before it unmasks",
                )
        elif stage == "unmask":
            self._receive_shares(replies)

    def _receive_adverts(self, replies) -> None:
        stage, members, registry = "advertise", self.plan.members, self.registry
        commit_len = 32 + 2 * keys.SHARE_COMMIT_LEN * self.plan.holders_per_client
        good: dict[int, dict] = {}
        for c, adv in replies.items():
            c = _client_id(c)
            if c is None or c not in members:
                continue  # not a sampled client: nobody to attribute it to
            if not isinstance(adv, dict):
                self._fault(c, stage, f"the reply is a {type(adv).__name__}, not the advertised keys")
                continue
            why = None
            for name in ("c_pk", "s_pk"):
                pk = adv.get(name)
                if type(pk) is not bytes or len(pk) != 32:
                    why = f"field {name!r} is not a 32-byte X25519 public key"
                elif keys.is_small_order(pk):
                    why = f"field {name!r} is a point of small order (every agreement with it is all zeros)"
                if why:
                    break
            if why is None and adv["c_pk"] == adv["s_pk"]:
                why = "fields 'c_pk' and 's_pk' are the same key"
            commit, digest = adv.get("commit"), adv.get("digest", b"")
            if why is None and (type(commit) is not bytes or len(commit) != commit_len):
                why = f"field 'commit' is not {commit_len} bytes (H(b) and a commitment to each share dealt)"
            if why is None and (type(digest) is not bytes or len(digest) > 64):
                why = "field 'digest' is not a broadcast digest (bytes, at most 64)"
            if why is None and registry is not None:
                try:
                    keys.verify(registry.get(c, b""), adv.get("sig") or b"",
                                keys.advert_message(self.plan.rid, c, adv["c_pk"], adv["s_pk"]))
                except keys.CryptoFailure:
                    why = "field 'sig' does not verify under the client's registered identity key"
            if why:
                self._fault(c, stage, why)
                continue
            good[c] = adv
        # keys are fresh every round: one advertised earlier in the run is replayed or copied
        seen = self.history.keys
        for c, adv in good.items():
            for name in ("c_pk", "s_pk"):
                if adv[name][:16] in seen:
                    self._fault(c, stage, f"field {name!r} repeats a public key advertised in an earlier round of "
                                          "this run (a replayed or copied key; keys are fresh every round)")
                    break
        owners: dict[bytes, list[int]] = {}
        for c, adv in good.items():
            seen.update((adv["c_pk"][:16], adv["s_pk"][:16]))
            if c not in self.faults:
                owners.setdefault(adv["c_pk"], []).append(c)
                owners.setdefault(adv["s_pk"], []).append(c)
        for holders in owners.values():
            if len(holders) > 1:  # one key, two clients this round: a leaked key or the server's collusion
                for c in holders:
                    others = sorted(set(holders) - {c})
                    self.unattributed.setdefault(
                        c, f"stage 'advertise': advertised the same public key as client(s) {others} this round "
                           "(a leaked key or the server's collusion; not attributable), left out of the round")
        if self.unattributed:
            log.warning("pairwise masking round %d: clients %s advertised one public key between them; all of "
                        "them are left out of this round (not attributable: a leaked key or the server's "
                        "collusion)", self.ctx.round, sorted(self.unattributed))
        for c, adv in good.items():
            if c in self.faults or c in self.unattributed:
                continue
            self.adverts[c] = {"c_pk": adv["c_pk"], "s_pk": adv["s_pk"], "sig": adv.get("sig")}
            self.commits[c] = adv["commit"]
            self.client_digests[c] = adv.get("digest", b"")
        self.u1 = set(self.adverts)

    def _key_list_peers(self, u: int) -> set[int]:
        """The neighbours of ``u`` in the key list the server sent it (those that advertised)."""
        if self.plan.graph.kind == "complete":
            return self.u1 - {u}
        return self.u1.intersection(self.plan.graph.neighbours(u).tolist())

    def _receive_ciphertexts(self, replies) -> None:
        stage, u1 = "share", self.u1
        for u, cts in replies.items():
            u = _client_id(u)
            if u is None or u not in u1:
                continue
            if not isinstance(cts, dict):
                self._fault(u, stage, f"the reply is a {type(cts).__name__}, not a dict {{neighbour id: share ciphertext}}")
                continue
            expected = self._key_list_peers(u)
            if not (len(cts) == len(expected) and ints_within(cts.keys(), expected)):
                why, ids = None, []
                for v in cts:
                    vi = _client_id(v)
                    if vi is None:
                        why = f"the reply has the key {v!r}, which is not a client id"
                        break
                    ids.append(vi)
                if why is None:
                    extra, missing = sorted(set(ids) - expected), sorted(expected - set(ids))
                    if len(set(ids)) != len(ids):
                        why = "the reply names a neighbour twice"
                    elif extra:
                        why = f"the reply has a ciphertext for client {extra[0]}, who is not a neighbour that advertised keys"
                    elif missing:
                        why = f"the reply has no ciphertext for neighbour {missing[0]}, who advertised keys"
                if why is not None:
                    self._fault(u, stage, why)
                    continue
                cts = {int(v): blob for v, blob in cts.items()}
            wrong = next((v for v, blob in cts.items() if type(blob) is not bytes or len(blob) != _SHARE_CT_LEN), _MISSING)
            if wrong is not _MISSING:
                self._fault(u, stage, f"the ciphertext for client {wrong} is not {_SHARE_CT_LEN} bytes")
                continue
            self.cipher_out[u] = dict(cts)
        self.u2 = set(self.cipher_out)

    def _receive_masked(self, replies) -> None:
        stage, u2, length = "masked_input", self.u2, self.plan.length
        accepted: dict[int, tuple[np.ndarray, bytes]] = {}
        reports: dict[int, list[int]] = {}
        for u in sorted((c for c in map(_client_id, replies) if c is not None and c in u2)):
            reply = replies[u] if u in replies else next(r for c, r in replies.items() if _client_id(c) == u)
            failed: list[int] = []
            if isinstance(reply, dict):
                if set(reply) != {"masked", "failed_shares"}:
                    self._fault(u, stage, "the reply is neither a masked vector nor {'masked', 'failed_shares'}")
                    continue
                y, listed = reply["masked"], reply["failed_shares"]
                ids = [_client_id(v) for v in listed] if isinstance(listed, (list, tuple)) else [None]
                if None in ids:
                    self._fault(u, stage, "field 'failed_shares' is not a list of client ids")
                    continue
                if len(set(ids)) != len(ids):
                    self._fault(u, stage, "field 'failed_shares' names a client twice")
                    continue
                stranger = next((v for v in ids if v == u or u not in self.cipher_out.get(v, ())), None)
                if stranger is not None:
                    self._fault(u, stage, f"field 'failed_shares' names client {stranger}, who sent it no share "
                                          "ciphertext")
                    continue
                failed = ids
            else:
                y = reply
            if not isinstance(y, np.ndarray) or y.dtype != np.uint64 or y.shape != (length,):
                self._fault(u, stage, f"field 'masked' is not a uint64 vector of length {length}")
                continue
            digest = keys.masked_digest(np.ascontiguousarray(y))
            if digest in self.history.masked:
                self._fault(u, stage, "field 'masked' repeats a masked input received earlier in this run "
                                      "(a replayed input)")
                continue
            accepted[u] = (y, digest)
            if failed:
                reports[u] = failed
        by_digest: dict[bytes, list[int]] = {}
        for u, (_, digest) in accepted.items():
            by_digest.setdefault(digest, []).append(u)
        self.history.masked.update(by_digest)
        for same in by_digest.values():
            if len(same) > 1:  # two clients, one masked vector this round: not attributable
                for u in same:
                    self.unattributed.setdefault(
                        u, f"stage 'masked_input': sent the same masked vector as client(s) "
                           f"{sorted(set(same) - {u})} this round (not attributable), left out of the round")
                    del accepted[u]
                log.warning("pairwise masking round %d: clients %s sent one masked vector between them; all of "
                            "them are left out of this round", self.ctx.round, sorted(same))
        # a peer whose share ciphertext failed at a receiver is left out from here on; the
        # receiver did not mask with it, and its masks are removed where survivors used them
        for u in sorted(reports):
            if u not in accepted:
                continue  # the reporter itself is left out: its report changes nothing
            for v in reports[u]:
                self._fault(v, "share", f"its share ciphertext to client {u} failed authentication (client {v}, "
                                        "or the server that relayed it, altered it)")
        left_out = set(self.faults) | set(self.unattributed)
        for u in sorted(accepted):
            if u in left_out:
                continue
            np.add(self.acc, accepted[u][0], out=self.acc)
            self.u3.append(u)
            if u in reports:
                self.reported[u] = frozenset(reports[u])

    def _receive_signatures(self, replies) -> None:
        stage, u3 = "consistency_check", set(self.u3)
        statement = keys.consistency_message(self.plan.rid, self.statement_digest, self.u3)
        for c, sig in replies.items():
            c = _client_id(c)
            if c is None or c not in u3:
                continue
            if type(sig) is not bytes:
                self._fault(c, stage, f"the reply is a {type(sig).__name__}, not a signature")
                continue
            identity = self.registry.get(c, b"")
            try:
                keys.verify(identity, sig, statement)
            except keys.CryptoFailure:
                other = self.client_digests.get(c)
                if other is not None and other != self.statement_digest:
                    try:  # signed over the broadcast digest it reported: evidence of another broadcast
                        keys.verify(identity, sig, keys.consistency_message(self.plan.rid, other, self.u3))
                        self.other_digests[c] = other
                        continue
                    except keys.CryptoFailure:
                        pass
                self._fault(c, stage, "the signature over the survivor list does not verify")
                continue
            self.signatures[c] = sig

    def _holders(self, owner: int) -> list[int]:
        """The owner's possible holders, ascending (itself and its neighbours): the order of its commitments."""
        if self.plan.graph.kind == "complete":
            return self.plan.sampled
        found = self._holder_lists.get(owner)
        if found is None:
            found = self._holder_lists[owner] = sorted(self.plan.graph.neighbours(owner).tolist() + [owner])
        return found

    def _committed(self, owner: int, holder: int, kind: str) -> bytes:
        holders = self._holders(owner)
        i = bisect.bisect_left(holders, holder)
        n = keys.SHARE_COMMIT_LEN
        start = 32 + 2 * n * i + (n if kind == "b" else 0)
        return self.commits[owner][start : start + n]

    def _receive_shares(self, replies) -> None:
        stage, rid, graph = "unmask", self.plan.rid, self.plan.graph
        survivors = set(self.u3)
        dropped = self.u2 - survivors
        asked = set(self.signatures) if self.consistency else survivors
        for r, reply in replies.items():
            r = _client_id(r)
            if r is None or r not in asked:
                continue
            self.n_unmask_replies += 1
            if not (isinstance(reply, dict) and isinstance(reply.get("b"), dict) and isinstance(reply.get("s"), dict)):
                self._fault(r, stage, "the reply is not {'b': {owner: share}, 's': {owner: share}}")
                continue
            why, got = None, []
            for kind, allowed, what in (("b", survivors, "a survivor"), ("s", dropped, "a dropped client")):
                for o, share in reply[kind].items():
                    oi = _client_id(o)
                    if oi is None:
                        why = f"field {kind!r} has the key {o!r}, which is not a client id"
                    elif oi not in allowed:
                        why = f"field {kind!r} has a share of client {oi}, who is not {what}"
                    elif oi != r and not graph.is_neighbour(oi, r):
                        why = f"field {kind!r} has a share of client {oi}, whose shares it does not hold"
                    elif type(share) is not bytes or len(share) != _SHARE_LEN:
                        why = f"field {kind!r}: the share of client {oi} is not {_SHARE_LEN} bytes"
                    elif keys.share_commitment(rid, oi, r, kind, share) != self._committed(oi, r, kind):
                        why = (f"field {kind!r}: its share of client {oi} does not match the commitment client {oi} "
                               "made at advertise (a wrong share)")
                    if why:
                        break
                    got.append((kind, oi, share))
                if why:
                    break
            if why:
                self._fault(r, stage, why)  # none of its shares is used
                continue
            for kind, o, share in got:
                self.revealed[kind].setdefault(o, []).append((r, share))

    # ------------------------------------------------------------------ result
    def _collect(self, kind: str, owners: list[int]) -> list[list[bytes]]:
        """For each owner, the verified shares of ``kind`` its holders revealed (sorted by holder)."""
        found = self.revealed[kind]
        out = []
        for owner in owners:
            shares = [sh for _, sh in sorted(found.get(owner, ()), key=lambda item: item[0])]
            if len(shares) < self.plan.t_share:
                self._abort(
                    "unmask",
                    f"only {len(shares)} {kind}-shares of client {owner} came back, threshold is "
                    f"{self.plan.t_share} ({self.n_unmask_replies} clients answered unmask)",
                )
            out.append(shares)
        return out

    def _reconstruct(self, kind: str, owners: list[int]) -> list[bytes | None]:
        """The owners' secrets; None for an owner whose committed shares do not parse as
        shares of one 32-byte secret (that dealer is at fault)."""
        if not owners:
            return []
        groups = self._collect(kind, owners)
        t = self.plan.t_share
        batch = shamir.reconstruct_many if self.plan.graph.kind == "complete" else reconstruct_per_holder_set
        try:
            return batch(groups, t)
        except shamir.ShareError:
            pass
        out: list[bytes | None] = []
        for group in groups:  # one by one, to name the dealers
            try:
                secret = shamir.reconstruct_many([group], t)[0]
            except shamir.ShareError:
                secret = None
            out.append(secret if secret is not None and len(secret) == 32 else None)
        return out

    def result(self):
        plan = self.plan
        if not self.u3:
            self._abort("unmask", "no masked input was received")
        survivors = sorted(self.u3)
        dropped = sorted(self.u2 - set(survivors))
        b_seeds = self._reconstruct("b", survivors)
        s_keys = self._reconstruct("s", dropped)
        # the dealers' secrets must match what they committed to at advertise
        rid = plan.rid
        bad = []
        for o, b in zip(survivors, b_seeds):
            if b is None or keys.seed_commitment(rid, o, b) != self.commits[o][:32]:
                self._fault(o, "share", "its committed self-mask shares do not reconstruct to the seed H(b) it "
                                        "committed to at advertise (inconsistent shares)")
                bad.append(o)
        for v, s_sk in zip(dropped, s_keys):
            if s_sk is None or keys.x25519_public(s_sk) != self.adverts[v]["s_pk"]:
                self._fault(v, "share", "its committed mask-key shares do not reconstruct to the key it advertised "
                                        "(inconsistent shares)")
                bad.append(v)
        if bad:
            self._abort("unmask", f"the masks of clients {sorted(bad)[:10]} cannot be removed: the shares they dealt "
                                  "do not reconstruct to the secrets they committed to")
        acc = self.acc.copy()
        expander = MaskExpander(plan.length, self.cipher)
        expander.add_signed(acc, (), b_seeds)
        surv_set = set(survivors)
        reported = self.reported
        for v, s_sk in zip(dropped, s_keys):
            # the survivors that masked with v: its neighbours that did not report its ciphertext
            peers = [u for u in plan.graph.neighbours(v).tolist() if u in surv_set and v not in reported.get(u, ())]
            sk = keys.load_x25519(s_sk)
            for u in peers:
                seed = keys.kdf(
                    keys.x25519_agree(sk, self.adverts[u]["s_pk"]),
                    keys.mask_seed_info(plan.rid, u, v, self.digest),
                )
                # survivor u added +PRG(s_uv) if u < v else -PRG(s_uv): remove it
                expander.add(acc, seed, -1 if u < v else +1)
        check = int(acc[-1])
        if check != len(survivors):
            self._check_failure(survivors, f"reads {check} instead of", self.other_digests)
        sums = self.codec.decode(acc[:-1], tuple(self.ctx.specs))
        return sums, tuple(survivors)
