"""A round's sum-fields as the integer measurement the clustering validity circuit checks.

Validated aggregation proves facts about a client's per-cluster counts and the sums weighted
by them, so it applies to rounds whose sum-fields are exactly

* one ``count`` field of whole numbers, shape ``(k,)`` (crisp cluster counts), and
* fields whose entry ``(j, e)`` adds one bounded value per record counted in ``j``: the
  ``sum`` fields ``weighted_by`` that count (coordinate sums, each record in the declared box
  ``[low, high]``), and, next to a count of shape ``(1,)``, a ``score`` field (inertia: each
  record's squared distance to a centre of the box, in ``[0, diam^2]``) or a ``distance``
  field (``[0, diam]``);
* optionally one vote histogram (a ``value`` field declared ``one_hot``, shape ``(k, V, B)``:
  DWF's robust aggregation with ``vote_weight="client"``): per cluster, every coordinate one
  vote of 1 in one of B bins, or no votes at all.

The layout (:class:`Layout`) is derived from the round's :class:`~securefkm.messages.FieldSpec`
s and the declared box alone, so every party (client, server, helper) builds the same one.
Each value column ``e`` has an integer per-record range ``[lo_e, lo_e + w_e]`` after fixed-point
encoding with ``scale = 2**frac_bits`` (``lo_e = floor(low_e * scale)``, ``w_e = ceil(high_e *
scale) - lo_e``); a client's measurement is its counts ``c_j`` and shifted sums
``t_je = rint(S_je * scale) - c_j lo_e``, and it is valid iff every ``c_j >= 0``,
``sum_j c_j <= n_max`` and ``0 <= t_je <= c_j w_e`` (:func:`is_valid`, the plain predicate the
circuit proves and the ideal functionality applies).

Because the bounds are whole multiples of the encoding unit, an honest record inside the box
always yields a valid measurement: ``S_je scale`` lies in ``[c_j low_e scale, c_j high_e
scale]``, an interval with integer end points that rounding to the nearest integer cannot leave.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from securefkm.exceptions import ProtectionConfigError

#: per-record bound of the value fields next to a count of shape (1,)
_SCALAR_KINDS = ("score", "distance")


@dataclass(frozen=True)
class Layout:
    """Where a round's sum-fields sit in the measurement, and each column's encoded range."""

    count: str
    #: (field name, its number of columns) in column order
    columns: tuple[tuple[str, int], ...]
    k: int
    lo: tuple[int, ...]  # per column, encoded units
    widths: tuple[int, ...]  # per column, encoded units
    frac_bits: int
    #: a one-hot vote histogram field (name, coordinates, bins), or None
    votes: tuple[str, int, int] | None = None
    #: each value field's declared shape (its release is given that shape)
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def d(self) -> int:
        return len(self.widths)

    @property
    def scale(self) -> int:
        return 1 << self.frac_bits

    @property
    def vote_shape(self) -> tuple[int, int] | None:
        """``(coordinates, bins)`` of the vote histogram the circuit checks, or None."""
        return None if self.votes is None else (self.votes[1], self.votes[2])

    def key(self) -> tuple:
        """What fixes the circuit: equal keys give the same circuit for the same ``n_max``."""
        return (self.k, self.d, self.widths, self.vote_shape)

    # ------------------------------------------------------------------ client side
    def measurement(self, sums: dict[str, np.ndarray]) -> tuple:
        """A client's ``(counts, shifted sums)`` as Python integers, whatever their values: an
        invalid update gives an invalid measurement (its proof then fails), never an error
        here, so that a client that lies is caught by the proof, not by its own encoder."""
        raw_c = np.asarray(sums[self.count], dtype=np.float64).reshape(self.k)
        if not np.all(np.isfinite(raw_c)):
            raw_c = np.nan_to_num(raw_c, nan=-1.0, posinf=-1.0, neginf=-1.0)
        counts = [_to_int(v) for v in raw_c]
        blocks = []
        for name, width in self.columns:
            v = np.asarray(sums[name], dtype=np.float64).reshape(self.k, width)
            blocks.append(np.nan_to_num(v, nan=-1.0, posinf=-1.0, neginf=-1.0) if not np.all(np.isfinite(v)) else v)
        values = np.concatenate(blocks, axis=1) if blocks else np.zeros((self.k, 0))
        shifted = []
        for j in range(self.k):
            row = [int(np.rint(x * self.scale)) - counts[j] * self.lo[e] for e, x in enumerate(values[j])]
            shifted.append(row)
        if self.votes is None:
            return counts, shifted
        name, vd, vb = self.votes
        raw = np.asarray(sums[name], dtype=np.float64).reshape(self.k, vd, vb)
        raw = np.nan_to_num(raw, nan=-1.0, posinf=-1.0, neginf=-1.0)
        return counts, shifted, [[[_to_int(x) for x in b] for b in row] for row in raw]

    # ------------------------------------------------------------------ server side
    def decode(self, counts, shifted, votes=None) -> dict[str, np.ndarray]:
        """The released sums from the aggregate counts ``C_j`` and shifted sums ``T_je``:
        ``S_je = (T_je + C_j lo_e) / scale`` (exact integers until the one division), and the
        vote histogram as it was summed."""
        C = [int(c) for c in counts]
        out = {self.count: np.array(C, dtype=np.float64)}
        col = 0
        for name, width in self.columns:
            block = np.empty((self.k, width))
            for j in range(self.k):
                for e in range(width):
                    block[j, e] = (int(shifted[j][col + e]) + C[j] * self.lo[col + e]) / self.scale
            out[name] = block.reshape(dict(self.shapes).get(name, block.shape))
            col += width
        if self.votes is not None:
            name, vd, vb = self.votes
            out[name] = np.array([[[int(x) for x in b] for b in row] for row in votes], dtype=np.float64).reshape(
                self.k, vd, vb)
        return out


def _to_int(v: float) -> int:
    """A count as an integer; a fractional count is no count, mapped to -1 (invalid)."""
    r = float(np.rint(v))
    return int(r) if r == v else -1


def is_valid(counts, shifted, n_max: int, widths, votes=None) -> bool:
    """The clustering validity predicate (what the circuit proves): counts whole and
    non-negative with total at most ``n_max``, each shifted sum in ``[0, c_j w_e]``, and with
    a vote histogram, per cluster every coordinate one vote of 1 or none, all alike."""
    if any(c < 0 for c in counts) or sum(counts) > n_max:
        return False
    if not all(0 <= t <= c * w for c, row in zip(counts, shifted) for t, w in zip(row, widths)):
        return False
    for row in votes or ():
        totals = {sum(b) for b in row}
        if any(x not in (0, 1) for b in row for x in b) or len(totals) > 1 or totals - {0, 1}:
            return False
    return True


def layout_for(specs, low, high, frac_bits: int) -> Layout:
    """The measurement layout of a round, or :class:`ProtectionConfigError` naming the field
    validated aggregation cannot bound."""
    counts = [s for s in specs if s.kind == "count"]
    why = None
    if len(counts) != 1:
        why = f"it needs exactly one count field per round, got {[s.name for s in counts] or 'none'}"
    elif not counts[0].integer:
        why = f"count field {counts[0].name!r} holds fractional weights (fuzzy memberships), not whole counts"
    elif len(counts[0].shape) != 1:
        why = f"count field {counts[0].name!r} has shape {counts[0].shape}, not (k,)"
    if why is None:
        count = counts[0]
        k = count.shape[0]
        low = np.asarray(low, dtype=np.float64).ravel()
        high = np.asarray(high, dtype=np.float64).ravel()
        scale = 1 << frac_bits
        columns, lo, widths = [], [], []
        votes = None
        diam = float(np.linalg.norm(high - low)) if low.size else 0.0
        for s in specs:
            if s is count:
                continue
            if s.one_hot and s.kind == "value" and len(s.shape) == 3 and s.shape[0] == k and votes is None:
                votes = (s.name, int(s.shape[1]), int(s.shape[2]))
                continue
            if s.kind == "sum" and s.weighted_by == count.name and len(s.shape) == 2 and s.shape[0] == k:
                d = s.shape[1]
                lo_f = np.broadcast_to(low, (d,))
                hi_f = np.broadcast_to(high, (d,))
                lo_e = [int(np.floor(x * scale)) for x in lo_f]
                hi_e = [int(np.ceil(x * scale)) for x in hi_f]
                columns.append((s.name, d))
                lo += lo_e
                widths += [h - l for h, l in zip(hi_e, lo_e)]
            elif s.kind in _SCALAR_KINDS and k == 1 and s.shape in ((1,), (1, 1)):
                bound = diam**2 if s.kind == "score" else diam
                columns.append((s.name, 1))
                lo.append(0)
                widths.append(int(np.ceil(bound * scale)))
            else:
                why = (f"field {s.name!r} (kind {s.kind!r}, shape {s.shape}) is not a sum of one bounded value per "
                       f"record counted in {count.name!r}")
                break
    if why is not None:
        raise ProtectionConfigError(
            f"ValidatedAggregation cannot validate this round: {why}. It validates per-cluster counts and the "
            "coordinate sums weighted by them: use WeightedFederatedKMeans (DWF, dynamic weighting, "
            "max_local_steps=1) or MiniBatchFederatedKMeans with local_epochs=1, batch_size=None, client_rate=1, or use PairwiseMasking/Paillier "
            "without validation for this algorithm."
        )
    shapes = tuple((s.name, tuple(s.shape)) for s in specs if any(s.name == c for c, _ in columns))
    return Layout(count.name, tuple(columns), int(k), tuple(lo), tuple(widths), int(frac_bits), votes, shapes)
