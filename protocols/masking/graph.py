"""Who masks with whom, and how many holders must answer: the round's public plan.

* ``"complete"``: every pair of sampled clients agrees a mask (Bonawitz et al. 2017, CCS):
  ``n - 1`` key agreements and shares per client.
* ``"sparse"``: the SecAgg+ construction of Bell et al. 2020 (CCS, "Secure single-server
  aggregation with (poly)logarithmic overhead", Sec. 3-4): clients mask with, and share
  their secrets among, only their neighbours in a ``k``-regular graph with
  ``k = O(log n)``; ``k`` and ``t`` come from Bell et al.'s bounds (:mod:`.params`) for the
  layer's stated corrupt and dropout fractions unless given.
* ``"auto"`` (default): the complete graph while it is cheap (at most
  :data:`AUTO_COMPLETE_MAX` sampled clients, or when no sparse degree below ``n - 1`` meets
  the bounds), the sparse graph above that. As in Bell et al., the graph is a Harary graph ``H(k, n)`` (each node
  linked to the ``k/2`` nearest nodes on each side of a cycle) over a *random* cyclic order
  of the sampled clients. The order comes from a public seed that every party derives
  from the round id and the sampled set (SHA-256), so the server cannot hand a client a
  neighbourhood of its choice; it is public randomness, not a secret, hence numpy's
  generator keyed by that hash is adequate here.

Thresholds (Bonawitz et al. Sec. 6 / Theorem 6.5 for the active model): a client's secrets
are shared among its ``m`` holders (itself and its neighbours: ``m = n`` for the complete
graph, ``k + 1`` for the sparse one) with threshold ``t``. Default for the complete graph
and for an explicit ``neighbours``: ``t = floor(2m/3) + 1``: with at most ``n_C`` corrupted clients colluding with a malicious
server, the server cannot obtain both the self-mask and the mask key of one honest client
while ``t > (m + n_C) / 2``, i.e. for ``n_C < m/3``; and up to ``m - t`` (about a third)
holders may drop. Default for the sparse graph with Bell's degree: Bell's ``t`` (no client
has ``t`` corrupt neighbours, every client keeps ``t`` surviving ones, except with the stated
probabilities; :mod:`.params`). The round also needs at least ``min_survivors`` clients to send masked
input (the same fraction of the sampled set), so the server cannot isolate one client's
input by declaring the others dropped.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import struct
from dataclasses import dataclass, field

import numpy as np

from securefkm.exceptions import InputError

from .keys import DOMAIN
from .params import bell_parameters

GRAPHS = ("auto", "complete", "sparse")
#: ``graph="auto"`` keeps the complete graph up to this many sampled clients: at most
#: ``2 n (n - 1)`` = 19,800 key agreements a round (well under a second of X25519 here),
#: and no statistical failure probability nor assumed corrupt/dropout fractions
AUTO_COMPLETE_MAX = 100


def default_neighbours(n: int, **bounds) -> int:
    """Degree of the sparse graph for ``n`` clients from Bell et al. 2020's bounds
    (:func:`.params.bell_parameters`; ``bounds`` are its keyword arguments, the layer's
    defaults otherwise); ``n - 1`` (the complete graph) when no smaller degree meets them."""
    found = bell_parameters(int(n), **bounds)
    return n - 1 if found is None else found[0]


def resolve_threshold(threshold, m: int, name: str = "threshold") -> int:
    """Shamir threshold among ``m`` holders from an int, a fraction in (0, 1] or ``None``."""
    if threshold is None:
        t = (2 * m) // 3 + 1
    elif isinstance(threshold, numbers.Integral) and not isinstance(threshold, bool):
        t = int(threshold)
    elif isinstance(threshold, numbers.Real) and not isinstance(threshold, bool):
        t = math.ceil(float(threshold) * m - 1e-9)
    else:
        raise InputError(f"{name} must be an int, a fraction in (0, 1] or None, got {threshold!r}.")
    t = min(max(t, 1), m) if threshold is None else t
    if m >= 2 and t < 2:
        raise InputError(
            f"{name} resolves to {t} among {m} holders: a threshold of 1 hands every neighbour "
            "the client's secrets; use at least 2 (the default is floor(2m/3)+1)."
        )
    if t > m:
        raise InputError(f"{name}={t} exceeds the {m} holders of each secret; lower it or sample more clients.")
    return t


def check_threshold_arg(threshold) -> None:
    if threshold is None:
        return
    if isinstance(threshold, bool):
        raise InputError(f"threshold must be an int, a fraction in (0, 1] or None, got {threshold!r}.")
    if isinstance(threshold, numbers.Integral):
        if threshold < 2:
            raise InputError(f"threshold={threshold} must be >= 2 (t=1 reveals the secrets to every holder).")
        return
    if isinstance(threshold, numbers.Real):
        if not 0.0 < float(threshold) <= 1.0:
            raise InputError(f"threshold={threshold} as a fraction must be in (0, 1]; pass an int for a count.")
        return
    raise InputError(f"threshold must be an int, a fraction in (0, 1] or None, got {threshold!r}.")


@dataclass
class Graph:
    """The neighbourhoods of one round (public). ``complete`` or a Harary graph over ``order``."""

    sampled: tuple[int, ...]
    kind: str
    degree: int
    order: np.ndarray | None = None  # random cyclic order of the sampled ids (sparse)
    _pos: dict = field(default_factory=dict, repr=False)
    _offsets: np.ndarray | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, sampled, kind: str, neighbours: int | None, seed: bytes) -> Graph:
        sampled = tuple(int(c) for c in sampled)
        n = len(sampled)
        if kind not in ("complete", "sparse"):
            raise InputError(f"graph must be one of {GRAPHS}, got {kind!r}.")
        if kind == "complete":
            return cls(sampled, "complete", n - 1)
        k = default_neighbours(n) if neighbours is None else int(neighbours)
        k += k % 2
        if k >= n - 1:
            return cls(sampled, "complete", n - 1)
        rng = np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big")))
        order = np.asarray(sampled, dtype=np.int64)[rng.permutation(n)]
        g = cls(sampled, "sparse", k, order)
        g._pos = {int(c): i for i, c in enumerate(order.tolist())}
        return g

    def neighbours(self, u: int) -> np.ndarray:
        """Sorted ids of ``u``'s neighbours (excluding ``u``)."""
        if self.kind == "complete":
            arr = np.asarray(self.sampled, dtype=np.int64)
            return np.sort(arr[arr != u])
        offs = self._offsets
        if offs is None:  # the ring offsets +-1 .. +-degree/2, made once per graph
            half = self.degree // 2
            offs = self._offsets = np.concatenate([np.arange(1, half + 1), -np.arange(1, half + 1)])
        return np.sort(self.order[(self._pos[int(u)] + offs) % len(self.order)])

    def position(self, u: int) -> int | None:
        """``u``'s place on the sparse graph's ring (its neighbours are the ``degree / 2``
        places on either side); None for the complete graph."""
        return self._pos[int(u)] if self.kind == "sparse" else None

    def is_neighbour(self, u: int, v: int) -> bool:
        if u == v:
            return False
        if self.kind == "complete":
            return True
        n = len(self.order)
        d = (self._pos[int(u)] - self._pos[int(v)]) % n
        return min(d, n - d) <= self.degree // 2

    def __getstate__(self):
        return {"sampled": self.sampled, "kind": self.kind, "degree": self.degree, "order": self.order}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._offsets = None
        self._pos = {} if self.order is None else {int(c): i for i, c in enumerate(self.order.tolist())}


def ints_within(ids, allowed) -> bool:
    """Whether every id of ``ids`` (a set or a mapping's keys) is a plain ``int`` and one of
    ``allowed``: client ids as a process sends them, checked in bulk. A message that fails
    this is checked id by id, and the refusal names the id."""
    return all(type(i) is int for i in ids) and ids <= allowed


def graph_seed(rid: bytes, sampled) -> bytes:
    data = struct.pack(f"<{len(sampled)}q", *[int(c) for c in sampled])
    return hashlib.sha256(DOMAIN + b"|graph|" + rid + data).digest()


@dataclass
class RoundPlan:
    """Public facts of one masking round, derived identically by the server and each client."""

    rid: bytes
    sampled: tuple[int, ...]
    graph: Graph
    t_share: int  # Shamir threshold of each client's secrets among its holders
    min_survivors: int  # clients that must send masked input for the round to complete
    length: int  # words of the masked vector (fields + 1 check slot)
    members: frozenset = field(default=frozenset(), repr=False)
    survivors_floor: int = 0  # the client-side layers' minimum (distributed DP's min_clients)

    def __post_init__(self):
        self.members = frozenset(self.sampled)

    @property
    def holders_per_client(self) -> int:
        return self.graph.degree + 1

    @property
    def consistency_quorum(self) -> int:
        """Signatures over one survivor list a client needs from its holders before unmasking.

        ``max(t, floor(m/2) + 1)``: Bonawitz et al.'s ``t`` (the default ``t`` is already a
        strict majority), raised to a strict majority of the ``m`` holders when an explicit
        ``t <= m/2`` is chosen, so that two disjoint groups of honest holders can never both
        collect a quorum for two different survivor lists.
        """
        return max(self.t_share, self.holders_per_client // 2 + 1)


def resolve_graph(n: int, kind: str, neighbours, bounds: dict | None = None) -> tuple[str, int | None, int | None]:
    """``(kind, degree, Bell threshold)`` of a round with ``n`` sampled clients.

    ``"auto"`` resolves to ``"complete"`` for ``n <= AUTO_COMPLETE_MAX`` or when Bell et al.'s
    bounds admit no degree below ``n - 1``, else to ``"sparse"``. An explicit ``"sparse"``
    without ``neighbours`` takes Bell's degree and threshold; if there is none, an
    ``InputError`` says what to relax. The Bell threshold is ``None`` when the layer's
    default rule applies (complete graph, or an explicit ``neighbours``).
    """
    bounds = bounds or {}
    if kind == "complete" or (kind == "auto" and n <= AUTO_COMPLETE_MAX):
        return "complete", n - 1, None
    if neighbours is not None:
        return "sparse", int(neighbours), None
    found = bell_parameters(int(n), **bounds)
    if found is None:
        if kind == "auto":
            return "complete", n - 1, None
        raise InputError(
            f"graph='sparse': no degree below n - 1 = {n - 1} meets Bell et al.'s bounds for {n} clients with "
            f"{bounds or 'the default fractions'}; relax corrupt_fraction, dropout_fraction, security_bits or "
            "correctness_bits, pass neighbours= explicitly, or use graph='auto' (complete graph here)."
        )
    return "sparse", found[0], found[1]


def threshold_floor(kind: str, m: int, bell_t: int | None) -> int:
    """Smallest secure Shamir threshold among ``m`` holders.

    * Complete graph, or a sparse graph of an explicit degree: ``floor(m/2) + 1``, a strict
      majority. With ``t <= m/2`` two disjoint sets of holders can each reconstruct, so a
      server that tells one set "B dropped" and the other "B survived" (split view) collects
      both of B's secrets and strips B's masks (Bonawitz et al. 2017, Sec. 6).
    * Sparse graph of Bell et al.'s degree: Bell's ``t`` for the layer's declared corrupt and
      dropout fractions (:func:`.params.bell_parameters`; with ``sign_keys`` the semi-malicious
      bound, which exceeds half the holders): below it a client may have ``t`` corrupt
      neighbours with more than the stated probability.
    """
    if bell_t is not None:
        return int(bell_t)
    return min(int(m), int(m) // 2 + 1)


def minimums(n: int, kind: str, neighbours, threshold, bounds: dict | None = None, *,
             allow_insecure: bool = False) -> tuple[str, int, int, int, int | None]:
    """``(kind, degree, t, min_survivors, bell_t)`` of a round of ``n`` sampled clients: the
    graph, the Shamir threshold among each client's ``degree + 1`` holders and the fewest
    masked inputs the protocol decodes (complete graph: ``t``; sparse: ``t`` and the same
    fraction ``t / m`` of the sampled clients). The one derivation of these numbers, used by
    every round's plan and by the run's floor (:meth:`PairwiseMasking.setup`).

    A threshold below :func:`threshold_floor` raises :class:`InputError` naming
    ``threshold`` and the opt-in ``allow_insecure_threshold=True`` unless ``allow_insecure``.
    """
    kind, k, bell_t = resolve_graph(int(n), kind, neighbours, bounds)
    k = int(n) - 1 if kind == "complete" else k + k % 2
    if kind == "sparse" and k >= n - 1:
        kind, k, bell_t = "complete", int(n) - 1, None
    m = k + 1
    if kind == "complete":
        t = resolve_threshold(threshold, m)
        min_surv = t
    else:
        t = bell_t if threshold is None and bell_t is not None else resolve_threshold(threshold, m)
        min_surv = max(t, math.ceil(n * t / m - 1e-9))
    secure = threshold_floor(kind, m, bell_t if kind == "sparse" and neighbours is None else None)
    if t < secure and not allow_insecure:
        raise InputError(
            f"PairwiseMasking threshold={threshold!r} resolves to t={t} among the {m} holders of each "
            f"client's secrets ({kind} graph, {n} sampled clients), below the secure floor t={secure}: "
            + ("two disjoint sets of holders could each reconstruct a client's secrets, so a malicious server "
               "can unmask it by telling them different survivor lists. " if secure == m // 2 + 1 and m > 1 else
               "a client may then have t corrupt neighbours (Bell et al.'s bound for the declared corrupt "
               "fraction). ")
            + f"Use threshold >= {secure} (or the default), or pass allow_insecure_threshold=True to accept "
            "it (every report then says the threshold is insecure)."
        )
    return kind, k, t, min_surv, bell_t


def make_plan(rid: bytes, sampled, kind: str, neighbours, threshold, length: int, bounds: dict | None = None,
              survivors_floor: int = 0, *, allow_insecure: bool = False) -> RoundPlan:
    """``survivors_floor``: fewest masked inputs the round may decode, on top of the protocol's
    own minimum (the client-side layers' :meth:`securefkm.layers.Layer.survivors_needed` and the
    run's floor, :meth:`PairwiseMasking.run_floor`; capped at the sampled count).
    ``allow_insecure``: accept a threshold below :func:`threshold_floor`."""
    sampled = tuple(sorted(int(c) for c in sampled))
    n = len(sampled)
    kind, k, t, min_surv, _ = minimums(n, kind, neighbours, threshold, bounds, allow_insecure=allow_insecure)
    graph = Graph.build(sampled, kind, k, graph_seed(rid, sampled))
    floor = min(int(survivors_floor), n)
    return RoundPlan(rid, sampled, graph, t, max(min_surv, floor), length, survivors_floor=floor)
