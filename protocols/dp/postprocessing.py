"""Post-processing of released sums by :class:`~protocols.dp.GaussianDP` (no privacy cost):
translation by the box centre ("Centred sums"), projection of noisy means into the records'
domain, and shrinkage of noisy means with the private-seeding estimators of
:mod:`securefkm.algorithms._seeding`."""

from __future__ import annotations

import numpy as np


class PostProcessing:
    """Mixin of :class:`~protocols.dp.GaussianDP`: what is done to released values."""

    def _projected(self, sums: dict, specs, action=None) -> dict:
        """``project_means``: rows with a positive weight get their mean projected into the
        records' domain (see "Means projected into the domain"); a new dict. Not in seeding
        rounds (``init.*``): they shrink the raw noisy bucket means (an empirical-Bayes
        estimate that needs them unbiased) and clip the result themselves."""
        skip = not self.project_means or (action or "").startswith("init.")
        pairs = {} if skip else self.weighted_pairs(specs)
        out = dict(sums)
        for s, w in pairs.items():
            n = np.asarray(out[w], dtype=np.float64)
            S = np.array(out[s], dtype=np.float64)
            pos = n > 0
            if pos.any():
                S[pos] = self._project_rows(S[pos] / n[pos, None], self._d) * n[pos, None]
            out[s] = S
        return out

    def _translate(self, sums: dict, pairs: dict[str, str], sign: int) -> dict:
        """A new dict: ``S + sign * N c`` for every centred pair, with the current values of N
        (never the caller's dict: noising writes into the result)."""
        out = dict(sums)
        if not pairs:
            return out
        c = self._box_centre(self._d)
        for s, w in pairs.items():
            out[s] = np.asarray(out[s], dtype=np.float64) + sign * np.outer(np.asarray(out[w], dtype=np.float64), c)
        return out

    def _project_rows(self, arr: np.ndarray, d: int) -> np.ndarray:
        rows = np.asarray(arr, dtype=np.float64).reshape(-1, d)
        if self.clip is not None:
            norms = np.linalg.norm(rows, axis=1)
            scale = np.minimum(1.0, self.clip / np.maximum(norms, 1e-300))
            rows = rows * scale[:, None]
        else:
            low, high = self.bounds
            rows = np.clip(rows, low, high)
        return rows.reshape(np.shape(arr))

    def _shrunk(self, sums, specs, sigmas, action):
        """``shrink=``: shrink the noisy per-row means of a (count, sum) round towards their
        overall mean (post-processing of the released sums with the layer's own, public sigmas).

        Applies to rounds whose noised fields are one ``count`` field of shape (m,) and one
        ``sum`` field of shape (m, d), d >= 3, m >= 2 (DWF's training round: counts n_j and
        coordinate sums S_j), except seeding rounds (``init.*``, which shrink their bucket means
        themselves). The rows with a positive noisy count get S_j' = n_j m_j' with m_j' the
        shrunk mean (``"coordinate"``: :func:`~securefkm.algorithms._seeding.shrink_coordinates`,
        ``"vector"``: the James-Stein :func:`~securefkm.algorithms._seeding.shrink_means`), so
        the algorithm's S_j' / n_j is m_j'. Only released values and the public sigmas are read:
        no privacy cost, nothing charged.
        """
        if self.shrink is None or (action or "").startswith("init.") or len(specs) != 2:
            return sums
        kinds = {s.kind: s for s in specs}
        count, total = kinds.get("count"), kinds.get("sum")
        if count is None or total is None or len(count.shape) != 1 or len(total.shape) != 2:
            return sums
        m, d = total.shape
        if count.shape[0] != m or m < 2 or d < 3:
            return sums
        from securefkm.algorithms._seeding import shrink_coordinates, shrink_means

        n = np.asarray(sums[count.name], dtype=np.float64)
        S = np.asarray(sums[total.name], dtype=np.float64)
        pos = n > 0
        if pos.sum() < 2:
            return sums
        means = S[pos] / n[pos, None]
        target = S[pos].sum(axis=0) / n[pos].sum()
        sigma_sum, sigma_count = sigmas[total.name][0], sigmas[count.name][0]
        if self.shrink == "coordinate":
            shrunk = shrink_coordinates(means, n[pos], sigma_sum, target, sigma_count)
        else:
            shrunk = shrink_means(means, n[pos], sigma_sum, target)
        out = S.copy()
        out[pos] = shrunk * n[pos, None]
        return {**sums, total.name: out}
