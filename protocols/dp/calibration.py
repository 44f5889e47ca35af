"""Calibration of :class:`~protocols.dp.GaussianDP`: each field's per-record sensitivity, the
split of a round's budget over its fields, and the noise standard deviation of every field
(the derivations: docs/protocols/dp-mechanism.md)."""

from __future__ import annotations

import math

from securefkm.exceptions import ProtectionConfigError
from securefkm.messages import FieldSpec

from .noise import FINE

#: rho: a cluster mean's typical distance from the point its sums are centred on, as a fraction of
#: the sum's radius (see :func:`auto_count_share`)
MEAN_OFFSET_FRACTION = 0.5


def auto_count_share(d: int) -> float:
    """``count_share="auto"``: the count fields' share c of a k-means round's sensitivity budget,
    c = 1 / (1 + sqrt(d) / rho) with rho = :data:`MEAN_OFFSET_FRACTION` = 1/2, i.e. 1 / (1 + 2 sqrt(d)).

    The mean S_j / n_j has error about (e_S - e_n mu_j) / n_j, mu_j the mean relative to the point
    the sums are centred on (the box centre, or the broadcast centre in a radius round), of expected
    squared norm z^2 (d R^2 / (1 - c) + ||mu_j||^2 / c) / n_j^2, minimised at
    c / (1 - c) = ||mu_j|| / (R sqrt(d)). The worst case ||mu_j|| = R gives 1 / (1 + sqrt(d)); a
    cluster mean is typically well inside the ball its records are bounded by, and rho = 1/2 is
    FastLloyd's split (Diaa et al. 2025: count and sum sigmas in the ratio (4d)^(1/4) / r). On
    the tuning seeds 1000-1099 of FastLloyd's grid, rho = 1/2 is better than or level with the
    worst case in every cell, and digits (eps 1) goes from 1.467 to 1.412 (the current figures:
    docs/protocols/dp-utility.md). Uses only d (public)."""
    return 1.0 / (1.0 + math.sqrt(d) / MEAN_OFFSET_FRACTION)


class Calibration:
    """Sensitivities and per-field sigmas of one layer's rounds, from explicit inputs.

    Parameters
    ----------
    geometry : callable
        ``d -> DomainGeometry``: the declared domain in d dimensions.
    mode : str
        The layer's mode (named in refusals).
    noises_everything : bool
        Whether the mode noises every field, ``value`` fields included (local mode).
    lattice_step : callable
        ``spec -> gamma_f``: the mode's lattice step of a field (0: the fine lattice).
    release_grid : callable or None
        ``spec -> step or None``: the secure aggregator's own noise lattice when it adds the
        central noise itself; None when it does not.
    count_share : float, "auto" or None
        The count fields' share of a round's sensitivity budget (see :meth:`field_weights`).
    centre_sums : bool
        Sums that declare their weights are noised translated by the domain's centre.
    sens_factor : float
        Multiplier of every per-record sensitivity (a ``MinClusterSize`` of p before the noise: p).
    """

    def __init__(self, geometry, mode: str, noises_everything: bool, lattice_step, release_grid=None,
                 count_share="auto", centre_sums: bool = True, sens_factor: float = 1.0):
        self.geometry = geometry
        self.mode = mode
        self.noises_everything = noises_everything
        self.lattice_step = lattice_step
        self.release_grid = release_grid
        self.count_share = count_share
        self.centre_sums = centre_sums
        self.sens_factor = sens_factor

    def centred_pairs(self, specs, d: int) -> dict[str, str]:
        """{sum field: its weights field} noised translated by the domain's centre (the box's,
        or the clip ball's; docs/protocols/dp-mechanism.md, "Centred sums")."""
        if not self.centre_sums:
            return {}
        return weighted_pairs(specs, d)

    def sensitivity(self, spec: FieldSpec, d: int, centred: bool = False, radius: float | None = None) -> float:
        """Per-record L2 sensitivity Delta_f of one field (before lattice rounding);
        ``centred``: a ``sum`` field noised as S - N c (the box's half-diagonal), or, in a
        radius-bounded round (``radius``), as S - N C with C the broadcast centres (r)."""
        f = self.sens_factor * math.sqrt(getattr(spec, "cells", 1))
        domain = self.geometry(d)
        if spec.kind == "count":
            return f * 1.0
        if spec.kind == "sum":
            if centred and radius is not None:
                return f * radius
            return f * (domain.centred_radius if centred else domain.radius)
        if spec.kind == "distance":
            return f * domain.diameter
        if spec.kind == "score":
            return f * domain.diameter ** 2
        if spec.kind == "mean":
            # each row, projected into the domain, is a (prior-weighted) mean of records: one record
            # changes at most ``cells`` rows, each by at most diameter / (1 + m) (FieldSpec.prior_weight;
            # docs/protocols/differential-privacy.md, "Prior-weighted means")
            return math.sqrt(getattr(spec, "cells", 1)) * domain.diameter / (1.0 + getattr(spec, "prior_weight", 0.0))
        if self.noises_everything and len(spec.shape) >= 1 and spec.shape[-1] == d:
            rows = spec.size // d
            return domain.diameter * math.sqrt(rows)  # already the whole range: no factor
        raise ProtectionConfigError(self.value_message(spec))

    def value_message(self, spec) -> str:
        return (
            f"GaussianDP(mode={self.mode!r}) cannot protect sum-field {spec.name!r}: its kind is 'value' "
            "(e.g. local centres after several local steps), which one record can change without bound. "
            "Change the algorithm so it sends plain sums (for DWF: max_local_steps=1 and weighting='dynamic'), "
            "or use GaussianDP(mode='local', ...), which bounds such fields by projecting them onto the "
            "declared clip ball / bounds box."
        )

    # ------------------------------------------------------------------ sigmas
    def aggregator_grid(self, spec: FieldSpec) -> float | None:
        """The secure aggregator's own noise lattice for ``spec`` when it adds the central noise."""
        return None if self.release_grid is None else self.release_grid(spec)

    def aggregator_noises(self, specs) -> bool:
        """Whether the secure aggregator, not the server, adds this round's central noise."""
        return any(self.aggregator_grid(s) is not None for s in specs)

    def steps(self, spec: FieldSpec) -> float:
        """Lattice step gamma_f of a field in the current mode (0 means: fine lattice)."""
        grid = self.aggregator_grid(spec)
        if grid is not None:
            return float(grid)
        return self.lattice_step(spec)

    def field_sigmas(self, specs, d: int, z: float, radius: float | None = None,
                     extra_deltas: dict | None = None) -> dict[str, tuple[float, float, float]]:
        """{name: (sigma_f, gamma_f, Delta'_f)} for the fields released together in a round at
        noise multiplier ``z`` (``radius``: the round's radius bound, see :mod:`protocols.dp.radius`)."""
        centred = self.centred_pairs(specs, d)
        deltas = {
            s.name: (self.sensitivity(s, d, s.name in centred, radius), s.size, self.steps(s), s.integer)
            for s in specs
        }
        for name, (delta, size) in (extra_deltas or {}).items():
            deltas[name] = (delta, size, 0.0, False)
        weights = self.field_weights(specs, deltas)
        on_grid = {s.name for s in specs if s.name in centred and self.aggregator_grid(s) is not None}
        out = {}
        for name, (delta, size, step, integer) in deltas.items():
            scale = 1.0 / math.sqrt(weights[name])
            if step == 0.0:
                step = z * scale * delta * FINE
            inflated = delta if integer else delta + math.sqrt(size) * step
            if name in on_grid:
                # the aggregator centres on the box or broadcast centre rounded to its lattice:
                # each record's centred contribution is longer by at most sqrt(d) step / 2
                inflated += math.sqrt(d) * step / 2
            out[name] = (z * scale * inflated, step, inflated)
        return out

    def field_weights(self, specs, deltas) -> dict[str, float]:
        """Share w_f of the round's sensitivity budget per field (sum 1): sigma_f = z Delta'_f / sqrt(w_f).

        ||g(D) - g(D')||^2 = sum_f w_f ||S_f(D) - S_f(D')||^2 / Delta'_f^2 <= sum_f w_f = 1, so
        any split is the same single Gaussian mechanism. Default: equal shares (w_f = 1/F).
        ``count_share=c`` gives the count fields c together and the other fields 1 - c: counts
        only divide the sums, so less noise on the sums usually helps the centres.

        ``count_share="auto"``, for a round of count fields and ``sum`` fields with rows of
        width d (k-means: counts n_j and coordinate sums S_j): :func:`auto_count_share`,
        c = 1 / (1 + 2 sqrt(d)). Other rounds (e.g. a score round): equal shares.
        """
        names = list(deltas)
        kinds = {s.name: s.kind for s in specs}
        counts = [n for n in names if kinds.get(n) == "count"]
        others = [n for n in names if n not in counts]
        share = self.count_share
        if share == "auto":
            sums = [s for s in specs if s.name in others and s.kind == "sum"]
            if len(sums) == len(others) and sums:
                width = sums[0].shape[-1] if len(sums[0].shape) > 1 else 1
                share = auto_count_share(width)
            else:
                share = None
        if share is None or not counts or not others:
            return {n: 1.0 / len(names) for n in names}
        w = {n: share / len(counts) for n in counts}
        w.update({n: (1.0 - share) / len(others) for n in others})
        return w


def weighted_pairs(specs, d: int) -> dict[str, str]:
    """{sum field: its count field} for the sums that declare their weights (row j is a
    weighted sum of records, the count field its total weight) and are d wide."""
    by_name = {s.name: s for s in specs}
    out = {}
    for s in specs:
        w = by_name.get(s.weighted_by) if s.kind == "sum" and s.weighted_by else None
        if w is not None and w.kind == "count" and w.shape == s.shape[:1] and s.shape[-1] == d:
            out[s.name] = w.name
    return out
