"""The messages of one federated round: what the server broadcasts, what a client returns.

These small types are the contract between algorithms (``securefkm.algorithms``), the
runtime (``securefkm.federation``), protection layers (``protocols``) and attacks
(``attacks``). See ``docs/architecture.md``.

An :class:`Update` has two kinds of fields, and the kind decides which protections apply:

* **sum-fields** (``Update.sums``): the server only needs their sum over the clients of a
  round (per-cluster counts, coordinate sums, inertia, fuzzy numerators), so secure
  aggregation and distributed noise apply. Their layout is declared *before* any client
  computes anything by :class:`FieldSpec` s, so that protocols can size vectors, check the
  fixed-point range and calibrate noise without looking at data.
* **set-fields** (``Update.items``): the server needs each client's own items (a list of
  local centres and their sizes). Only client-side layers (suppression, rounding, local
  noise) protect them.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .exceptions import InputError

FieldKind = Literal["count", "sum", "distance", "score", "mean", "value"]

#: What one record can change in a field, used by DP layers and by the fixed-point codec:
#:
#: * ``count`` -- each record adds a non-negative weight to the cells, at most 1 in total
#:   (crisp cluster counts, sums of fuzzy memberships u^m). L2 sensitivity 1.
#: * ``sum``   -- each record adds ``w_j * x`` to row j with ``sum_j w_j <= 1`` (coordinate sums,
#:   fuzzy numerators). L2 sensitivity ``max ||x||`` (the clipping norm).
#: * ``distance`` -- each record adds a distance to a centre (fuzzy spreads with q=1).
#:   Sensitivity ``2 * max ||x||`` when centres lie in the same ball.
#: * ``score`` -- each record adds a squared distance to a centre (inertia).
#:   Sensitivity ``(2 * max ||x||)**2`` when centres lie in the same ball.
#: * ``mean``  -- each client's rows are points of the records' domain (its local centres: means
#:   of its records, or the broadcast centre for an empty cluster) and one record changes at
#:   most ``cells`` of them. Sensitivity ``sqrt(cells)`` times the domain's diameter (the rows
#:   projected into the domain), or that over ``1 + prior_weight`` for rows that are prior-weighted
#:   means (see :class:`FieldSpec`).
#: * ``value`` -- anything else (a client's local centre coordinates, a client count): no
#:   record-level bound; record-level DP refuses such a field.
FIELD_KINDS: tuple[str, ...] = ("count", "sum", "distance", "score", "mean", "value")


@dataclass(frozen=True)
class FieldSpec:
    """Layout of one sum-field, known before any client computes.

    ``integer`` marks fields whose per-client values are whole numbers (crisp counts): the
    codec then encodes them without fractional bits and secure sums are bit-exact.
    ``cells`` is how many entries one record can change, each by up to its kind's bound
    (1 for crisp per-cluster fields; k when a record adds to every cluster, as the fuzzy
    spreads do): the L2 sensitivity is then ``sqrt(cells)`` times the kind's bound.
    For ``count`` and ``sum`` the kind's bound already covers a record spread over several
    cells with total weight at most 1 (fuzzy memberships), so ``cells`` stays 1 there.
    ``weighted_by`` (``sum`` fields of shape (k, d) only): the name of the ``count`` field of
    shape (k,) in the same message that holds this sum's weights, i.e. row j is
    ``sum_i w_ij x_i`` and the count field's entry j is ``sum_i w_ij`` for the same w. It lets
    a DP layer noise the translated sum ``S - N c`` (a smaller sensitivity when the records'
    box is not centred at the origin) and translate back after noising; declare it only when
    that identity holds exactly.
    ``prior_weight`` (``mean`` fields only): m >= 0 such that each row is the prior-weighted
    mean ``(S + m C) / (n + m)`` of the n records of its cell (S their sum) and a public point C,
    the row being C when n + m = 0, and one record enters or leaves the record sets of at most
    ``cells`` rows. One record then moves a row, projected into the domain, by at most
    ``diameter / (1 + m)`` (docs/protocols/differential-privacy.md, "Prior-weighted means"), so
    the L2 sensitivity is ``sqrt(cells) * diameter / (1 + m)``; 0 is the plain mean.
    """

    name: str
    shape: tuple[int, ...]
    kind: FieldKind
    integer: bool = False
    cells: int = 1
    weighted_by: str | None = None
    #: ``value`` fields of whole numbers only: every vector along the last axis is one-hot or
    #: all zero (a vote histogram); validated aggregation proves it of every client's field
    one_hot: bool = False
    prior_weight: float = 0.0

    def __post_init__(self):
        if self.kind not in FIELD_KINDS:
            raise InputError(f"FieldSpec.kind must be one of {FIELD_KINDS}, got {self.kind!r}.")
        if self.one_hot and (self.kind != "value" or not self.integer or len(self.shape) < 2):
            raise InputError(f"FieldSpec {self.name!r}: one_hot is for integer 'value' fields of at least two "
                             f"axes, got kind {self.kind!r}, integer={self.integer}, shape {self.shape}.")
        if self.weighted_by is not None and (self.kind != "sum" or len(self.shape) != 2):
            raise InputError(f"FieldSpec {self.name!r}: weighted_by is only for 'sum' fields of shape (k, d), "
                             f"got kind {self.kind!r} and shape {self.shape}.")
        m = self.prior_weight
        if isinstance(m, bool) or not isinstance(m, numbers.Real) or not math.isfinite(m) or m < 0:
            raise InputError(f"FieldSpec {self.name!r}: prior_weight must be a finite number >= 0, got {m!r}.")
        if m and self.kind != "mean":
            raise InputError(f"FieldSpec {self.name!r}: prior_weight is only for 'mean' fields, got kind "
                             f"{self.kind!r}; pass prior_weight=0.")

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def _canonical(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"__nd__": obj.dtype.str, "shape": list(obj.shape), "data": obj.tobytes().hex()}
    if isinstance(obj, dict):
        return {str(k): _canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj).hex()
    if isinstance(obj, float):
        return obj.hex()
    return obj


@dataclass(frozen=True)
class Broadcast:
    """What the server sends to a client at the start of a round.

    ``action`` names what the client must compute (``"train"``, ``"score"``,
    ``"init.kmeans++"`` ...); ``centres`` are the current global centres (or ``None``);
    ``params`` are JSON-able scalars the client needs. ``sample`` tells the runtime whom to
    ask: ``None`` (the run's ``clients_per_round``), ``"all"``, ``"one"``, an int count or a
    float fraction.
    """

    action: str
    centres: np.ndarray | None = None
    params: dict = field(default_factory=dict)
    sample: Any = None

    def digest(self) -> bytes:
        """SHA-256 over a canonical encoding of everything a client acts on.

        Secure-aggregation layers bind their masks to this digest so that a server that
        sends different broadcasts to different clients cannot decode the aggregate.
        """
        # a JSON header (the centres' dtype and shape, not their values), its length first,
        # then the centres' raw bytes in C order: hashing the bytes rather than their hex
        # inside the JSON costs a fifth (the server and each batch of clients compute it)
        centres = None if self.centres is None else np.asarray(self.centres)
        layout = None if centres is None else {"__nd__": centres.dtype.str, "shape": list(centres.shape)}
        header = json.dumps({"action": self.action, "centres": layout, "params": _canonical(self.params)},
                            sort_keys=True, separators=(",", ":")).encode()
        h = hashlib.sha256(len(header).to_bytes(8, "little") + header)
        if centres is not None:
            h.update(centres.tobytes())
        return h.digest()


@dataclass
class Update:
    """A client's reply: sum-fields (summed over clients) and set-fields (kept per client)."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)
    items: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class AggregatedUpdate:
    """What the server has after a round's aggregation and server-side layers.

    ``sums`` holds the sum over ``contributors`` of each sum-field (decoded, possibly with
    DP noise); ``items`` maps a contributing client id to its set-fields.
    ``n_contributors`` is known to the server under every aggregator (secure aggregation
    reveals who survived, not what they sent).
    """

    sums: dict[str, np.ndarray]
    items: dict[int, dict[str, np.ndarray]]
    contributors: tuple[int, ...]
    specs: tuple[FieldSpec, ...] = ()

    @property
    def n_contributors(self) -> int:
        return len(self.contributors)


def check_sums(sums: dict[str, np.ndarray], specs: tuple[FieldSpec, ...]) -> None:
    """Raise if a client's sum-fields do not match the declared layout (an algorithm bug)."""
    if len(sums) == len(specs):
        for spec in specs:
            if getattr(sums.get(spec.name), "shape", None) != spec.shape:
                break
        else:
            return
    names = {s.name for s in specs}
    if set(sums) != names:
        raise InputError(
            f"update sum-fields {sorted(sums)} do not match the declared fields {sorted(names)}."
        )
    for s in specs:
        if np.shape(sums[s.name]) != s.shape:
            raise InputError(
                f"sum-field {s.name!r} has shape {np.shape(sums[s.name])}, declared {s.shape}."
            )


def check_all_sums(sums_list, specs: tuple[FieldSpec, ...]) -> None:
    """:func:`check_sums` for each of many clients' sum-fields (one loop, no call per client)."""
    expected = [(s.name, s.shape) for s in specs]
    n = len(specs)
    for sums in sums_list:
        if len(sums) != n:
            check_sums(sums, specs)
            continue
        for name, shape in expected:
            if getattr(sums.get(name), "shape", None) != shape:
                check_sums(sums, specs)
                break


def stack_sums(sums_list: list[dict], specs: tuple[FieldSpec, ...]) -> dict[str, np.ndarray] | None:
    """{field: float64 array (clients, *shape)} of many clients' sum-fields, one conversion per
    field; None when some client's fields do not match the declared layout (what
    :func:`check_sums` refuses), for callers that then go client by client to name the error."""
    m = len(sums_list)
    if any(not isinstance(sums, dict) or len(sums) != len(specs) for sums in sums_list):
        return None
    out = {}
    for s in specs:
        try:  # a missing or ragged field fails the conversion or the shape
            arr = np.array([sums[s.name] for sums in sums_list], dtype=np.float64) if m else np.zeros((0, *s.shape))
        except (KeyError, ValueError, TypeError):
            return None
        if arr.shape != (m, *s.shape):
            return None
        out[s.name] = arr
    return out
