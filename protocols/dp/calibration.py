"""Calibration of :class:`~protocols.dp.GaussianDP`: the declared domain's geometry, each
field's per-record sensitivity, the split of a round's budget over its fields, and the noise
standard deviation of every field (the proofs are in :mod:`protocols.dp.layer`)."""

from __future__ import annotations

import math

import numpy as np

from securefkm.exceptions import ProtectionConfigError
from securefkm.messages import FieldSpec

from .geometry import DomainGeometry
from .noise import FINE, min_share_variance

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
    """Mixin of :class:`~protocols.dp.GaussianDP`: sensitivities and per-field sigmas."""

    # ------------------------------------------------------------------ geometry
    def geometry(self, d: int) -> DomainGeometry:
        """The declared domain in ``d`` dimensions (asked by every client several times a round:
        kept per (d, bounds, centre) object)."""
        key = (d, id(self.bounds), id(self.centre))
        cached = self.__dict__.get("_geometry_cache")
        if cached is None or cached[0] != key:
            cached = (key, DomainGeometry(d, self.bounds, self.clip, self.centre))
            self.__dict__["_geometry_cache"] = cached
        return cached[1]

    def centred_pairs(self, specs) -> dict[str, str]:
        """{sum field: its weights field} noised translated by the domain's centre (the box's,
        or the clip ball's; docs/protocols/dp-mechanism.md, "Centred sums")."""
        if not self.centre_sums:
            return {}
        return self.weighted_pairs(specs)

    def weighted_pairs(self, specs) -> dict[str, str]:
        """{sum field: its count field} for the sums that declare their weights (row j is a
        weighted sum of records, the count field its total weight) and are d wide."""
        by_name = {s.name: s for s in specs}
        out = {}
        for s in specs:
            w = by_name.get(s.weighted_by) if s.kind == "sum" and s.weighted_by else None
            if w is not None and w.kind == "count" and w.shape == s.shape[:1] and s.shape[-1] == self._d:
                out[s.name] = w.name
        return out

    def sensitivity(self, spec: FieldSpec, d: int, centred: bool = False, radius: float | None = None) -> float:
        """Per-record L2 sensitivity Delta_f of one field (before lattice rounding);
        ``centred``: a ``sum`` field noised as S - N c (the box's half-diagonal), or, in a
        radius-bounded round (``radius``), as S - N C with C the broadcast centres (r)."""
        f = self._sens_factor * math.sqrt(getattr(spec, "cells", 1))
        if spec.kind == "count":
            return f * 1.0
        if spec.kind == "sum":
            if centred and radius is not None:
                return f * radius
            return f * (self.geometry(d).centred_radius if centred else self.geometry(d).radius)
        if spec.kind == "distance":
            return f * self.geometry(d).diameter
        if spec.kind == "score":
            return f * self.geometry(d).diameter ** 2
        if spec.kind == "mean":
            # each row is a point of the domain (a mean of records, or the broadcast centre); one
            # record changes at most ``cells`` rows, each by at most the domain's diameter
            return math.sqrt(getattr(spec, "cells", 1)) * self.geometry(d).diameter
        if self._strategy.noises_everything and len(spec.shape) >= 1 and spec.shape[-1] == d:
            rows = spec.size // d
            return self.geometry(d).diameter * math.sqrt(rows)  # already the whole range: no factor
        raise ProtectionConfigError(self._value_message(spec))

    def _value_message(self, spec) -> str:
        return (
            f"GaussianDP(mode={self.mode!r}) cannot protect sum-field {spec.name!r}: its kind is 'value' "
            "(e.g. local centres after several local steps), which one record can change without bound. "
            "Change the algorithm so it sends plain sums (for DWF: max_local_steps=1 and weighting='dynamic'), "
            "or use GaussianDP(mode='local', ...), which bounds such fields by projecting them onto the "
            "declared clip ball / bounds box."
        )

    # ------------------------------------------------------------------ sigmas
    def _noised_specs(self, specs):
        return tuple(s for s in specs if s.kind != "value" or self._strategy.noises_everything)

    def _aggregator_grid(self, spec: FieldSpec) -> float | None:
        """The secure aggregator's own noise lattice for ``spec`` when it adds the central noise."""
        agg = getattr(self, "_aggregator", None)
        return None if agg is None or self.mode != "central" else agg.release_noise_grid(spec)

    def aggregator_noises(self, specs) -> bool:
        """Whether the secure aggregator, not the server, adds this round's central noise."""
        return any(self._aggregator_grid(s) is not None for s in specs)

    def _steps(self, spec: FieldSpec) -> float:
        """Lattice step gamma_f of a field in the current mode (0 means: fine lattice)."""
        grid = self._aggregator_grid(spec)
        if grid is not None:
            return float(grid)
        return self._strategy.lattice_step(self, spec)

    def field_sigmas(
        self, specs, extra_deltas: dict | None = None, action: str | None = None, ctx=None
    ) -> dict[str, tuple[float, float, float]]:
        """{name: (sigma_f, gamma_f, Delta'_f)} for the fields released together in a round of
        ``action`` (``ctx``: the round, for its radius bound, see :mod:`protocols.dp.radius`)."""
        d = self._d
        z = self._z_for(action, ctx)
        centred = self.centred_pairs(specs)
        r = self.radius_bound.round_radius(ctx)
        deltas = {
            s.name: (self.sensitivity(s, d, s.name in centred, r), s.size, self._steps(s), s.integer) for s in specs
        }
        for name, (delta, size) in (extra_deltas or {}).items():
            deltas[name] = (delta, size, 0.0, False)
        weights = self._field_weights(specs, deltas)
        on_grid = {s.name for s in specs if s.name in centred and self._aggregator_grid(s) is not None}
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

    def release_noise(self, specs, ctx) -> tuple[dict[str, float], dict[str, str], np.ndarray | None]:
        """What an aggregator that adds this round's central noise itself needs (public
        quantities only): ``({field: sigma}, {centred sum field: its count field}, centres)``,
        centres the (rows, d) points the centred sums are translated by (the broadcast centres
        in a radius round, else the box centre per row), or None without centred fields."""
        specs = self._noised_specs(specs)
        sigmas = {k: v[0] for k, v in self.field_sigmas(specs, action=ctx.action, ctx=ctx).items()}
        pairs = self.centred_pairs(specs)
        if not pairs:
            return sigmas, pairs, None
        rows = self.radius_bound.row_centres(ctx, pairs)
        if rows is None:
            n_rows = next(s.shape[0] for s in specs if s.name in pairs)
            rows = np.broadcast_to(self.geometry(self._d).centre, (n_rows, self._d))
        return sigmas, pairs, np.array(rows, dtype=np.float64)

    def _field_weights(self, specs, deltas) -> dict[str, float]:
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

    def _share_variance(self, sigma: float, step: float) -> float:
        """Per-client lattice variance: sigma^2 / (step^2 H), H the honest shares every released
        sum holds (``_size_shares``), raised if needed so that the KLS21 tau of a sum of H
        shares stays <= 1e-6 (more noise only strengthens the guarantee)."""
        h = self._honest_shares or self.min_clients
        return max((sigma / step) ** 2 / h, min_share_variance(h))
