"""Round scheduling and charging of :class:`~protocols.dp.GaussianDP`: per-action round
weights, the planned schedule the noise is calibrated for, and the per-client history the
accountant is charged with (docs/protocols/dp-mechanism.md, "Weighted round schedules")."""

from __future__ import annotations

import math
from collections import Counter

from .accounting import schedule_history


class Scheduling:
    """Mixin of :class:`~protocols.dp.GaussianDP`: noise levels per round and the charged history."""

    def _weight(self, action, ctx=None) -> float:
        """Weight of a round of ``action``; with ``ctx``, the last planned round of an action in
        ``last_round_weights`` gets that weight instead (see :meth:`_setup_last_rounds`)."""
        if ctx is not None and action is not None and self._is_last_round(action, ctx):
            return self.last_round_weights[action]
        if self.round_weights is None or action is None:
            return 1.0
        return self.round_weights.get(action, 1.0)

    def _z_for(self, action, ctx=None) -> float:
        """Noise multiplier of a round of ``action`` (``ctx``: that round): z / sqrt(round weight)."""
        return self.z / math.sqrt(self._weight(action, ctx))

    def _setup_last_rounds(self, info) -> None:
        """Round index (within a run) of the last planned round of each action in
        ``last_round_weights``, from the algorithm's ``planned_sequence(max_rounds)`` (the
        actions of one run's rounds in order; public). An algorithm without it, or whose
        sequence disagrees with its ``planned_rounds``, gets no last-round weights (neither in
        the calibration nor in the noise). The index is the runtime's round counter
        ``ctx.round``, the same on the server and on every client; an aborted round that
        released something moves the later rounds one index on, so the weight then falls on
        the round before the last -- the charge is always the noise actually used, and
        ``before_round`` refuses a round past the budget."""
        self._last_index = {}
        weights = self.last_round_weights
        if not weights:
            return
        algo = info.algorithm
        seq_of = getattr(algo, "planned_sequence", None)
        if not callable(seq_of):
            return
        try:
            seq = list(seq_of(info.max_rounds))
            one_run = int(algo.planned_rounds(info.max_rounds))
        except Exception:  # noqa: BLE001 - an algorithm without a usable sequence: no last-round weights
            return
        if len(seq) != one_run:
            return
        for action in weights:
            where = [i for i, a in enumerate(seq) if a == action]
            if where:
                self._last_index[action] = where[-1]

    def _is_last_round(self, action, ctx) -> bool:
        index = self._last_index.get(action)
        return index is not None and getattr(ctx, "round", None) == index

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
                last = self._last_index
                for action, n in actions.items():
                    if action in last and int(n) > 0:  # its last round in each run at its own weight
                        weights += ([self._weight(action)] * (int(n) - 1)
                                    + [self.last_round_weights[action]]) * n_runs
                    else:
                        weights += [self._weight(action)] * (int(n) * n_runs)
        if len(weights) != info.planned_rounds:
            weights = [max([1.0, *(self.round_weights or {}).values(),
                            *(self.last_round_weights or {}).values()])] * info.planned_rounds
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
