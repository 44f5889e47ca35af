"""The round schedule of :class:`~protocols.dp.GaussianDP`: per-action round weights and the
planned schedule the noise is calibrated for (docs/protocols/dp-mechanism.md, "Weighted round
schedules")."""

from __future__ import annotations

import math
from collections import Counter


class RoundSchedule:
    """Round weights (``{action: w}``: a round of that action gets noise multiplier
    ``z / sqrt(w)``), the last planned round's weights, and the schedule one client's rounds
    are planned to take (set up for a fit by :meth:`setup`)."""

    def __init__(self, round_weights: dict | None = None, last_round_weights: dict | None = None):
        self.round_weights = round_weights
        self.last_round_weights = last_round_weights
        #: action -> round index (within a run) of its last planned round
        self.last_index: dict = {}
        #: rounds one client is planned to take (capped by a ParticipationCap)
        self.planned: int | None = None
        #: [(weight, rounds)] the calibration assumes, or None (every round at weight 1)
        self.steps: list[tuple[float, int]] | None = None

    def setup(self, info, rounds: int) -> None:
        """Plan ``rounds`` rounds for one client of the fit described by ``info``."""
        self.planned = rounds
        self.steps = None
        self.last_index = self._last_rounds(info)
        if self.round_weights is not None or self.last_index:
            self.steps = self.planned_schedule(info, rounds)

    def weight(self, action, ctx=None) -> float:
        """Weight of a round of ``action``; with ``ctx``, the last planned round of an action in
        ``last_round_weights`` gets that weight instead (see :meth:`_last_rounds`)."""
        if ctx is not None and action is not None and self.is_last_round(action, ctx):
            return self.last_round_weights[action]
        if self.round_weights is None or action is None:
            return 1.0
        return self.round_weights.get(action, 1.0)

    def multiplier(self, z: float, action, ctx=None) -> float:
        """Noise multiplier of a round of ``action`` (``ctx``: that round): z / sqrt(round weight)."""
        return z / math.sqrt(self.weight(action, ctx))

    def _last_rounds(self, info) -> dict:
        """Round index (within a run) of the last planned round of each action in
        ``last_round_weights``, from the algorithm's ``planned_sequence(max_rounds)`` (the
        actions of one run's rounds in order; public). An algorithm without it, or whose
        sequence disagrees with its ``planned_rounds``, gets no last-round weights (neither in
        the calibration nor in the noise). The index is the runtime's round counter
        ``ctx.round``, the same on the server and on every client; an aborted round that
        released something moves the later rounds one index on, so the weight then falls on
        the round before the last -- the charge is always the noise actually used, and
        ``before_round`` refuses a round past the budget."""
        weights = self.last_round_weights
        if not weights:
            return {}
        algo = info.algorithm
        seq_of = getattr(algo, "planned_sequence", None)
        if not callable(seq_of):
            return {}
        try:
            seq = list(seq_of(info.max_rounds))
            one_run = int(algo.planned_rounds(info.max_rounds))
        except Exception:  # noqa: BLE001 - an algorithm without a usable sequence: no last-round weights
            return {}
        if len(seq) != one_run:
            return {}
        last = {}
        for action in weights:
            where = [i for i, a in enumerate(seq) if a == action]
            if where:
                last[action] = where[-1]
        return last

    def is_last_round(self, action, ctx) -> bool:
        index = self.last_index.get(action)
        return index is not None and getattr(ctx, "round", None) == index

    def planned_schedule(self, info, rounds: int) -> list[tuple[float, int]]:
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
                last = self.last_index
                for action, n in actions.items():
                    if action in last and int(n) > 0:  # its last round in each run at its own weight
                        weights += ([self.weight(action)] * (int(n) - 1)
                                    + [self.last_round_weights[action]]) * n_runs
                    else:
                        weights += [self.weight(action)] * (int(n) * n_runs)
        if len(weights) != info.planned_rounds:
            weights = [max([1.0, *(self.round_weights or {}).values(),
                            *(self.last_round_weights or {}).values()])] * info.planned_rounds
        weights = sorted(weights, reverse=True)[: max(rounds, 1)]
        return sorted(Counter(weights).items())

    def described(self) -> list[tuple[float, int]]:
        """The planned schedule as the report gives it."""
        return list(self.steps) if self.steps is not None else [(1.0, self.planned)]
