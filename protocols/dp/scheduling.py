"""Round scheduling and charging of :class:`~protocols.dp.GaussianDP`: per-action round
weights, the planned schedule the noise is calibrated for, and the per-client history the
accountant is charged with (see "Weighted round schedules" in :mod:`protocols.dp.layer`)."""

from __future__ import annotations

import math
from collections import Counter

from .accounting import schedule_history


class Scheduling:
    """Mixin of :class:`~protocols.dp.GaussianDP`: noise levels per round and the charged history."""

    def _weight(self, action) -> float:
        if self.round_weights is None or action is None:
            return 1.0
        return self.round_weights.get(action, 1.0)

    def _z_for(self, action) -> float:
        """Noise multiplier of a round of ``action``: z / sqrt(round weight)."""
        return self.z / math.sqrt(self._weight(action))

    def _planned_schedule(self, info, rounds: int) -> list[tuple[float, int]]:
        """[(weight, rounds)] the calibration assumes for one client.

        From the algorithm's ``planned_actions(max_rounds)`` ({action: rounds per run}) when it
        has one and it adds up to the planned rounds; otherwise (unknown schedule) every planned
        round is assumed to carry the largest weight in use, which can only over-estimate the
        spend. With a ParticipationCap of R rounds a client is charged for at most R rounds, so
        the R heaviest planned rounds are kept.
        """
        algo = info.algorithm
        per_run = getattr(algo, "planned_actions", None)
        weights: list[float] = []
        if callable(per_run):
            try:
                one_run = int(algo.planned_rounds(info.max_rounds))
                actions = per_run(info.max_rounds)
            except Exception:  # noqa: BLE001 - an algorithm without a usable schedule
                one_run, actions = 0, None
            if actions and one_run > 0 and info.planned_rounds % one_run == 0 and sum(actions.values()) == one_run:
                n_runs = info.planned_rounds // one_run
                for action, n in actions.items():
                    weights += [self._weight(action)] * (int(n) * n_runs)
        if len(weights) != info.planned_rounds:
            weights = [max([1.0, *self.round_weights.values()])] * info.planned_rounds
        weights = sorted(weights, reverse=True)[: max(rounds, 1)]
        return sorted(Counter(weights).items())

    def _history(self) -> list[tuple[float, float, int]]:
        """Accountant history dominating every client's: per noise level, the most rounds any
        one client took at it (exact when all clients took the same rounds); kept up to date
        by :meth:`_charge` in ``_top``."""
        return self._history_of(self._top)

    @staticmethod
    def _history_of(top) -> list[tuple[float, float, int]]:
        return [(z, 1.0, n) for z, n in sorted(top.items()) if n > 0]

    def _within_plan(self, history) -> bool:
        """True if ``history`` is dominated by the schedule the noise was calibrated for, so its
        epsilon is within the target without asking the accountant (a PRV evaluation per round
        was most of an ideal DP round's cost). Sound because composition is monotone: a round at
        a larger noise multiplier is a post-processing of one at a smaller (add more noise), and
        dropping rounds cannot raise epsilon; the calibration made the planned schedule fit.
        Dominated: the rounds sorted by noise multiplier, the j-th has at least the j-th planned
        one's, and there are no more of them. False when z was given (nothing was calibrated)."""
        if self.noise_multiplier is not None or self._planned is None:
            return False
        calibrated = schedule_history(self.z, self._schedule or [(1.0, max(self._planned, 1))])
        plan = sorted(z for z, _, n in calibrated for _ in range(n))
        rounds = sorted(z for z, _, n in history for _ in range(int(n)))
        return len(rounds) <= len(plan) and all(r >= p for r, p in zip(rounds, plan))

    def _charge(self, contributors, z):
        """Charge each contributor one round at noise multiplier z (its actual noise: an
        under-noised aborted round is charged at its own, smaller z)."""
        top = self._top[z]
        for c in contributors:
            self._counts[c] += 1
            per = self._levels.setdefault(c, Counter())
            per[z] += 1
            top = max(top, per[z])
        self._top[z] = top
        self._acc.history = self._history()
