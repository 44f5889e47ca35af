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

import numpy as np

from securefkm.exceptions import RoundAbortedError, ServerMisbehaviourError
from securefkm.layers import RoundContext, ServerSession

from .. import shamir
from ..codec import FixedPointCodec
from . import keys
from .graph import RoundPlan, ints_within
from .prg import MaskExpander


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

    def _abort(self, stage: str, why: str, error=RoundAbortedError):
        raise error(
            f"pairwise masking aborted round {self.ctx.round} at stage {stage!r}: {why}; "
            "no aggregate was released",
            round=self.ctx.round,
            stage=stage,
        )

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


class MaskingServer(RoundChecks, ServerSession):
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
    ):
        if consistency and registry is None:
            raise ValueError("the consistency check needs the PKI directory (sign_keys=True)")
        self.ctx = ctx
        self.plan = plan
        self.codec = codec
        self.cipher = cipher
        self.digest = ctx.broadcast_digest if bind_broadcast else b""
        self.registry = registry
        self.adverts: dict[int, dict] = {}
        self.cipher_out: dict[int, dict[int, bytes]] = {}
        self.u1: set[int] = set()
        self.u2: set[int] = set()
        self.u3: list[int] = []
        self.acc = np.zeros(plan.length, dtype=np.uint64)
        self.unmask_replies: dict[int, dict] = {}
        self._unmask_msg = None
        self.consistency = bool(consistency)
        self.statement_digest = ctx.broadcast_digest
        self.signatures: dict[int, bytes] = {}  # consistency check: U4 -> signature over U3

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
        if stage == "advertise":
            for c, adv in replies.items():
                c = int(c)
                if c not in self.plan.members or not isinstance(adv, dict):
                    continue
                c_pk, s_pk = adv.get("c_pk"), adv.get("s_pk")
                if not (isinstance(c_pk, bytes) and isinstance(s_pk, bytes) and len(c_pk) == len(s_pk) == 32):
                    continue
                if self.registry is not None:
                    try:
                        keys.verify(
                            self.registry.get(c, b""), adv.get("sig") or b"",
                            keys.advert_message(self.plan.rid, c, c_pk, s_pk),
                        )
                    except keys.CryptoFailure:
                        continue  # an unauthenticated advert is treated as a dropout
                self.adverts[c] = {"c_pk": c_pk, "s_pk": s_pk, "sig": adv.get("sig")}
            self.u1 = set(self.adverts)
            self._need(stage, len(self.u1), "advertised keys")
        elif stage == "share":
            u1 = self.u1
            for u, cts in replies.items():
                u = int(u)
                if u in u1 and isinstance(cts, dict):
                    if ints_within(cts.keys(), u1):
                        self.cipher_out[u] = dict(cts)
                    else:
                        self.cipher_out[u] = {int(v): b for v, b in cts.items() if int(v) in u1}
            self.u2 = set(self.cipher_out)
            self._need(stage, len(self.u2), "completed the share stage")
        elif stage == "masked_input":
            for u in sorted(replies):
                y = replies[u]
                if int(u) not in self.u2:
                    continue
                if not isinstance(y, np.ndarray) or y.dtype != np.uint64 or y.shape != (self.plan.length,):
                    self._abort(stage, f"client {u} sent a malformed masked vector")
                np.add(self.acc, y, out=self.acc)
                self.u3.append(int(u))
            self._need(stage, len(self.u3), "sent masked input")
        elif stage == "consistency_check" and self.consistency:
            statement = keys.consistency_message(self.plan.rid, self.statement_digest, self.u3)
            u3 = set(self.u3)
            for c, sig in replies.items():
                c = int(c)
                if c not in u3 or not isinstance(sig, bytes):
                    continue
                try:
                    keys.verify(self.registry.get(c, b""), sig, statement)
                except keys.CryptoFailure:
                    continue  # an invalid signature counts as a dropout at this stage
                self.signatures[c] = sig
            need = self.plan.consistency_quorum
            if len(self.signatures) < need:
                self._abort(
                    stage,
                    f"only {len(self.signatures)} clients signed the survivor list, fewer than the "
                    f"quorum of {need} every client needs before it unmasks",
                )
        elif stage == "unmask":
            self.unmask_replies = {int(c): r for c, r in replies.items() if isinstance(r, dict)}

    # ------------------------------------------------------------------ result
    def _collect(self, kind: str, owners: list[int]) -> list[list[bytes]]:
        """For each owner, the shares of ``kind`` returned by its holders (sorted by holder)."""
        wanted = set(owners)
        found: dict[int, list[bytes]] = {o: [] for o in owners}
        for r in sorted(self.unmask_replies):
            sh = self.unmask_replies[r].get(kind)
            if not isinstance(sh, dict):
                continue
            for owner, share in sh.items():
                if owner in wanted and isinstance(share, bytes):
                    found[owner].append(share)
        for owner in owners:
            if len(found[owner]) < self.plan.t_share:
                self._abort(
                    "unmask",
                    f"only {len(found[owner])} {kind}-shares of client {owner} came back, threshold is "
                    f"{self.plan.t_share} ({len(self.unmask_replies)} clients answered unmask)",
                )
        return [found[o] for o in owners]

    def result(self):
        plan = self.plan
        if not self.u3:
            self._abort("unmask", "no masked input was received")
        survivors = sorted(self.u3)
        dropped = sorted(self.u2 - set(survivors))
        # complete graph: every secret is held at the same points, one Lagrange solve in all;
        # sparse graph: holder sets differ per client, so solve them all in one batch
        reconstruct = shamir.reconstruct_many if plan.graph.kind == "complete" else reconstruct_per_holder_set
        try:
            b_seeds = reconstruct(self._collect("b", survivors), plan.t_share)
            s_keys = reconstruct(self._collect("s", dropped), plan.t_share) if dropped else []
        except shamir.ShareError as exc:
            self._abort("unmask", f"secret reconstruction failed ({exc})")
        acc = self.acc.copy()
        expander = MaskExpander(plan.length, self.cipher)
        expander.add_signed(acc, (), b_seeds)
        surv_set = set(survivors)
        for v, s_sk in zip(dropped, s_keys):
            if keys.x25519_public(s_sk) != self.adverts[v]["s_pk"]:
                self._abort("unmask", f"the reconstructed mask key of dropped client {v} does not match its advertised key (bad shares)")
            peers = [u for u in plan.graph.neighbours(v).tolist() if u in surv_set]
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
            self._abort(
                "unmask",
                "the aggregate failed to decode: the check slot reads "
                f"{check} instead of the {len(survivors)} contributors, so the pairwise masks did not "
                "cancel. Clients saw inconsistent broadcasts (the model-inconsistency attack: the "
                "server sent different centres/parameters to different clients) or inconsistent "
                "share lists",
                ServerMisbehaviourError,  # the binding caught it: the runtime ends the fit
            )
        sums = self.codec.decode(acc[:-1], tuple(self.ctx.specs))
        return sums, tuple(survivors)
