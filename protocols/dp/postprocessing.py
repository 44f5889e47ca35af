"""Post-processing of released sums by :class:`~protocols.dp.GaussianDP` (no privacy cost):
translation by the domain's centre ("Centred sums"), projection of noisy means into the records'
domain, and shrinkage of noisy means with the private-seeding estimators of
:mod:`securefkm.kernels`."""

from __future__ import annotations

import numpy as np

from .calibration import weighted_pairs
from .radius import RadiusBound

#: a relocated low-count row is put this fraction of the plan's radius from the cluster it joins
#: (:meth:`PostProcessor._relocated`; chosen over 0.25 and 1 on the tuning seeds of
#: docs/protocols/dp-utility.md, "Tuning protocol")
RELOCATION_STEP = 0.5


class PostProcessor:
    """What a :class:`~protocols.dp.GaussianDP` layer does to released values, from its
    settings: ``geometry`` (``d -> DomainGeometry``, the declared domain), ``d`` (the data's
    width, None before a fit), ``shrink``, ``plan`` (the DP plan's description, or None),
    ``project_means`` and the fit's :class:`~protocols.dp.radius.RadiusBound`."""

    def __init__(self, geometry, d: int | None, shrink: str | None = None, plan: dict | None = None,
                 project_means: bool = True, radius_bound: RadiusBound | None = None):
        self.geometry = geometry
        self.d = d
        self.shrink = shrink
        self.plan = plan
        self.project_means = project_means
        self.radius_bound = RadiusBound() if radius_bound is None else radius_bound

    def projected(self, sums: dict, specs, action=None, ctx=None, n_contributors: int | None = None) -> dict:
        """``project_means``: rows with a positive weight get their mean projected into the
        records' domain (docs/protocols/dp-mechanism.md); a new dict. Not in seeding
        rounds (``init.*``): they shrink the raw noisy bucket means (an empirical-Bayes
        estimate that needs them unbiased) and clip the result themselves. A ``mean`` field (each
        contributor's rows are points of the domain) released as a sum over ``n_contributors``
        (public: the round's contributors) gets its average projected the same way."""
        skip = not self.project_means or (action or "").startswith("init.")
        pairs = {} if skip else weighted_pairs(specs, self.d)
        out = dict(sums)
        rows, r = self.radius_bound.row_centres(ctx, pairs), self.radius_bound.round_radius(ctx)
        for s, w in pairs.items():
            n = np.asarray(out[w], dtype=np.float64)
            S = np.array(out[s], dtype=np.float64)
            pos = n > 0
            if pos.any():
                means = S[pos] / n[pos, None]
                if rows is not None:  # radius round: every (clipped) record is within r of its centre
                    means = self.radius_bound.project(means, rows[pos], r)
                S[pos] = self.geometry(self.d).project_rows(means) * n[pos, None]
            out[s] = S
        if not skip and n_contributors:  # 'mean' fields: one row per contributor, each in the domain
            for spec in specs:
                if spec.kind == "mean" and spec.shape and spec.shape[-1] == self.d:
                    S = np.asarray(out[spec.name], dtype=np.float64)
                    out[spec.name] = self.geometry(self.d).project_rows(S / n_contributors) * n_contributors
        return out

    def translate(self, sums: dict, pairs: dict[str, str], sign: int, ctx=None) -> dict:
        """A new dict: ``S + sign * N c`` for every centred pair, with the current values of N
        (never the caller's dict: noising writes into the result); c the box centre, or in a
        radius-bounded round the broadcast centre of each row. Elementwise: the fields may carry a
        leading axis of clients, each row computed exactly as alone."""
        out = dict(sums)
        if not pairs:
            return out
        rows = self.radius_bound.row_centres(ctx, pairs)
        c = self.geometry(self.d).centre if rows is None else rows
        for s, w in pairs.items():
            n = np.asarray(out[w], dtype=np.float64)
            # n[..., None]: a client's (k,) counts, or (clients, k) stacked by _distributed_shares
            out[s] = np.asarray(out[s], dtype=np.float64) + sign * n[..., None] * c
        return out

    def shrunk(self, sums, specs, sigmas, action, ctx=None, n_contributors: int | None = None):
        """``shrink=``: shrink the noisy per-row means of a (count, sum) round towards their
        overall mean (post-processing of the released sums with the layer's own, public sigmas).

        Applies to rounds whose noised fields are one ``count`` field of shape (m,) and one
        ``sum`` field of shape (m, d), m >= 2 (DWF's training round: counts n_j and coordinate
        sums S_j; d >= 3 except for ``"hierarchical"`` and, under a DP plan of R >= 3 rounds, the 2-D
        relocation of low-count rows, :meth:`_relocated`), except seeding rounds (``init.*``, which
        shrink their bucket means themselves). The rows with a positive noisy count get
        S_j' = n_j m_j' with m_j' the shrunk mean (``"coordinate"``:
        :func:`~securefkm.kernels.shrink_coordinates`, ``"vector"``: the James-Stein
        :func:`~securefkm.kernels.shrink_means`), so the algorithm's S_j' / n_j is m_j'.

        ``"hierarchical"`` (the DP plan's choice, :mod:`protocols.dp.planning`): the target is
        the overall mean sum_j S_j / sum_j n_j of *all* rows, itself shrunk towards the box centre
        (its per-coordinate noise variance is m sigma_sum^2 / (sum_j n_j)^2); rows are shrunk by the
        positive-part James-Stein factor max(0, 1 - (d - 2) v_j / ||m_j - t||^2) (no shrinkage in
        d <= 2, where it does not dominate); rows whose noisy count is below one count-noise sigma
        get the target as their mean, at weight sigma_count (their own mean is noise). Not the
        stronger plug-in factor (d instead of d - 2) of the step shrinkage: it put every
        noise-dominated row exactly on the target, so in the first round of a plan several centres
        coincided on the overall mean and the next round's cells were cut by the noise (iris at
        eps 0.5: 10% of the tuning seeds above 3 times the optimum).
        Only released values and the public sigmas are read: no privacy cost, nothing charged.

        A round whose one noised field is a ``mean`` field of shape (m, d) (EWF's local centres),
        released as a sum over the round's ``n_contributors`` (public), is the same estimate with
        exact counts: row j is n_contributors times a mean whose per-coordinate noise is
        sigma / n_contributors. It gets the same shrinkage with n_j = n_contributors and no
        count floor (:meth:`_shrunk_mean`).

        ``"step"`` (the DP plan's choice): each row's *step*
        m_j - c_j from its broadcast centre c_j (public: the round's input) is shrunk by the same
        plug-in factor max(0, 1 - d v_j / ||m_j - c_j||^2), v_j = sigma_sum^2 / n_j^2, and a row
        whose noisy count is below one count-noise sigma keeps c_j -- the prior of a Lloyd step is
        "no move", as FastLloyd's radius-bounded steps assume (Diaa et al. 2025), instead of the
        overall mean, which pulls all k noisy centres together. Rounds without broadcast centres
        use ``"hierarchical"``, and so does the first round of a multi-round plan (its centres are
        the data-independent start, not yet an estimate) unless the plan's noise level is high
        (``plan["first_round_prior"] == "start"``, :mod:`protocols.dp.planning`): there the
        hierarchical factors are 0 or small for most rows, the k centres collapse onto the overall
        mean and the next round's cells are drawn by the noise; shrinking towards the spread start
        keeps its k separated cells instead. In that first round a row below the count floor
        takes the hierarchical target (the overall mean), not its start point: a start point that
        drew no records sits in an empty part of the box and would stay there.
        """
        if self.shrink is None or (action or "").startswith("init."):
            return sums
        if len(specs) == 1 and specs[0].kind == "mean" and n_contributors:
            return self._shrunk_mean(sums, specs[0], sigmas, ctx, n_contributors)
        if len(specs) != 2:
            return sums
        kinds = {s.kind: s for s in specs}
        count, total = kinds.get("count"), kinds.get("sum")
        if count is None or total is None or len(count.shape) != 1 or len(total.shape) != 2:
            return sums
        m, d = total.shape
        hierarchical = self.shrink == "hierarchical"
        if count.shape[0] == m and m >= 2 and d < 3 and self._relocates_low_rows(ctx, m, d):
            sigma_count = sigmas[count.name][0]
            return {**sums, **self._relocated(np.asarray(sums[count.name], dtype=np.float64),
                                              np.asarray(sums[total.name], dtype=np.float64),
                                              np.asarray(ctx.broadcast.centres, dtype=np.float64),
                                              sigma_count, self._relocation_step(d), count.name, total.name)}
        if count.shape[0] != m or m < 2 or (d < 3 and not hierarchical):
            return sums
        from securefkm.kernels import shrink_coordinates, shrink_means

        n = np.asarray(sums[count.name], dtype=np.float64)
        S = np.asarray(sums[total.name], dtype=np.float64)
        sigma_sum, sigma_count = sigmas[total.name][0], sigmas[count.name][0]
        if self.shrink == "step":
            prev = self._step_prior(ctx, m, d)
            if prev is not None:
                empty = self.hierarchical_target(n, S, sigma_sum) if self._in_first_round(ctx) else None
                return {**sums, **self._shrunk_step(n, S, prev, sigma_sum, sigma_count, count.name, total.name, empty)}
            hierarchical = True
        if hierarchical:
            return {**sums, **self._shrunk_hierarchical(n, S, sigma_sum, sigma_count, count.name, total.name)}
        pos = n > 0
        if pos.sum() < 2:
            return sums
        means = S[pos] / n[pos, None]
        target = S[pos].sum(axis=0) / n[pos].sum()
        if self.shrink == "coordinate":
            shrunk = shrink_coordinates(means, n[pos], sigma_sum, target, sigma_count)
        else:
            shrunk = shrink_means(means, n[pos], sigma_sum, target)
        out = S.copy()
        out[pos] = shrunk * n[pos, None]
        return {**sums, total.name: out}

    def _shrunk_mean(self, sums, spec, sigmas, ctx, n_contributors: int) -> dict:
        """:meth:`shrunk` for a ``mean`` field summed over ``n_contributors``: the rows are
        n_contributors times their average, whose noise the (count, sum) shrinkage estimates with
        the exact count n_contributors for every row (count sigma 0: no row below the floor, no
        relocation). ``"step"`` and ``"hierarchical"`` as there; ``"coordinate"`` and ``"vector"``
        towards the overall mean of the rows."""
        if len(spec.shape) != 2 or spec.shape[-1] != self.d:
            return sums
        m, d = spec.shape
        hierarchical = self.shrink == "hierarchical"
        if m < 2 or (d < 3 and not hierarchical):
            return sums
        from securefkm.kernels import shrink_coordinates, shrink_means

        n = np.full(m, float(n_contributors))
        S = np.asarray(sums[spec.name], dtype=np.float64)
        sigma = sigmas[spec.name][0]
        if self.shrink == "step":
            prev = self._step_prior(ctx, m, d)
            if prev is not None:
                return {**sums, spec.name: self._shrunk_step(n, S, prev, sigma, 0.0, "", spec.name)[spec.name]}
            hierarchical = True
        if hierarchical:
            return {**sums, spec.name: self._shrunk_hierarchical(n, S, sigma, 0.0, "", spec.name)[spec.name]}
        means, target = S / n[:, None], S.sum(axis=0) / n.sum()
        if self.shrink == "coordinate":
            shrunk = shrink_coordinates(means, n, sigma, target, 0.0)
        else:
            shrunk = shrink_means(means, n, sigma, target)
        return {**sums, spec.name: shrunk * n[:, None]}

    def _relocates_low_rows(self, ctx, m: int, d: int) -> bool:
        """``shrink="step"`` in d <= 2 under a DP plan that asks for it
        (``plan["relocate_low_count_rows"]``, :mod:`protocols.dp.planning`), in a round with
        broadcast centres: see :meth:`_relocated`."""
        if self.shrink != "step" or not (self.plan or {}).get("relocate_low_count_rows"):
            return False
        centres = getattr(getattr(ctx, "broadcast", None), "centres", None)
        return centres is not None and np.shape(centres) == (m, d)

    def _relocation_step(self, d: int) -> float:
        """How far from the mean of the cluster it joins a relocated row is put: half the
        plan's radius r (half of the domain's half-diagonal without a radius)."""
        r = self.radius_bound.value
        return RELOCATION_STEP * (r if r is not None else self.geometry(d).centred_radius)

    @staticmethod
    def _relocated(n, S, prev, sigma_count, step, count_name, sum_name) -> dict:
        """2-D rows whose noisy count is below one count-noise sigma (their mean is noise: the
        centre drew few or no records) are moved next to the clusters with the largest noisy
        counts: the i-th such row (in row order) to m_b + min(||c_j - m_b||, step) u, m_b the noisy
        mean of the row with the i-th largest count (cycling) among the others and u the unit
        vector from m_b towards the row's own broadcast centre c_j; its count becomes the floor
        sigma_count. Other rows are left as released (no shrinkage in d <= 2). In a radius round
        the layer's projection onto B(c_j, r) then limits the move to r. Without it such a row's
        mean lands anywhere in the box (the noise over a count near 0), usually on a face or a
        corner, and the centre stays without records; next to a large cluster it splits it in
        the next round -- the usual repair of an empty k-means cluster, here decided from the
        released counts and the public sigma only (post-processing, no privacy cost). Unchanged
        when no row or every row is below the floor."""
        floor = max(sigma_count, 1e-9)
        low = n < floor
        if not low.any() or low.all():
            return {}
        big = np.flatnonzero(~low)
        big = big[np.argsort(-n[big], kind="stable")]
        out, n_out = S.copy(), n.copy()
        for i, j in enumerate(np.flatnonzero(low)):
            b = big[i % len(big)]
            mb = S[b] / n[b]
            away = prev[j] - mb
            dist = float(np.linalg.norm(away))
            new = mb + away * (min(dist, step) / dist) if dist > 0 else mb
            n_out[j] = floor
            out[j] = new * floor
        return {count_name: n_out, sum_name: out}

    def _in_first_round(self, ctx) -> bool:
        """The first Lloyd round of a plan with more than one (its centres are the start)."""
        rounds = (self.plan or {}).get("rounds", 1)
        return rounds > 1 and ctx is not None and ctx.round <= self.radius_bound.first_train

    def _step_prior(self, ctx, m: int, d: int):
        """The broadcast centres a ``"step"`` shrinkage shrinks towards, or None (hierarchical):
        none broadcast, or the first Lloyd round of a plan with more than one unless the plan
        says ``first_round_prior="start"``."""
        centres = getattr(getattr(ctx, "broadcast", None), "centres", None)
        if centres is None or np.shape(centres) != (m, d):
            return None
        if self._in_first_round(ctx) and (self.plan or {}).get("first_round_prior") != "start":
            return None
        return np.asarray(centres, dtype=np.float64)

    @staticmethod
    def _shrunk_step(n, S, prev, sigma_sum, sigma_count, count_name, sum_name, empty=None) -> dict:
        """Step shrinkage; a row below the count floor keeps its centre, or goes to ``empty``."""
        floor = max(sigma_count, 1e-9)
        pos = n >= floor
        out, n_out = S.copy(), n.copy()
        n_out[~pos] = floor
        out[~pos] = (prev[~pos] if empty is None else empty) * floor
        if pos.any():
            step = S[pos] / n[pos, None] - prev[pos]
            v = sigma_sum**2 / n[pos] ** 2
            factor = np.clip(1.0 - S.shape[1] * v / np.maximum((step**2).sum(axis=1), 1e-300), 0.0, 1.0)
            out[pos] = (prev[pos] + factor[:, None] * step) * n[pos, None]
        return {count_name: n_out, sum_name: out}

    def hierarchical_target(self, n, S, sigma_sum) -> np.ndarray | None:
        """The overall mean sum_j S_j / sum_j n_j, shrunk towards the domain's centre (None: no mass)."""
        from securefkm.kernels import shrink_means

        total = n.sum()
        if total <= 0:
            return None
        m, d = S.shape
        target = S.sum(axis=0) / total
        v = sigma_sum**2 * m / total**2
        return shrink_means(target[None], np.ones(1), np.sqrt(v), self.geometry(d).centre, plug_in=True)[0]

    def _shrunk_hierarchical(self, n, S, sigma_sum, sigma_count, count_name, sum_name) -> dict:
        from securefkm.kernels import shrink_means

        target = self.hierarchical_target(n, S, sigma_sum)
        if target is None:
            return {}
        floor = max(sigma_count, 1e-9)
        pos = n >= floor
        out, n_out = S.copy(), n.copy()
        n_out[~pos] = floor
        out[~pos] = target * floor
        if pos.any():
            means = S[pos] / n[pos, None]
            out[pos] = shrink_means(means, n[pos], sigma_sum, target) * n[pos, None]
        return {count_name: n_out, sum_name: out}
