"""The privacy budget of a :class:`~protocols.dp.GaussianDP` fit: the calibrated noise
multiplier, the accountant, and the rounds each client was charged at each noise level."""

from __future__ import annotations

from collections import Counter

from securefkm.exceptions import PrivacyBudgetExceededError

from .accounting import PrivacyAccountant, noise_multiplier_for, noise_multiplier_for_schedule, schedule_history
from .scheduling import RoundSchedule


class Budget:
    """Noise multiplier z for the whole fit and the ledger of what every client was charged.

    ``calibrated`` is the schedule z was calibrated for (sorted per-round noise multipliers),
    None when z was given (``noise_multiplier=``): then every round asks the accountant.
    """

    def __init__(self, z: float, epsilon: float, delta: float, accountant: str, calibrated: list[float] | None):
        self.z = z
        self.epsilon = epsilon
        self.delta = delta
        self.accountant = PrivacyAccountant(z, epsilon, delta, accountant=accountant)
        self.calibrated = calibrated
        self.counts: Counter = Counter()  # client -> rounds charged
        self.levels: dict = {}  # client -> Counter(noise multiplier -> rounds)
        self.top: Counter = Counter()  # noise multiplier -> the most rounds any one client took at it
        self.plain_rounds = 0  # rounds that let set-fields through un-noised

    @classmethod
    def for_schedule(cls, epsilon, delta, accountant: str, schedule: RoundSchedule,
                     noise_multiplier: float | None = None) -> Budget:
        """z calibrated so that ``schedule`` (set up for the fit) meets (epsilon, delta), or the
        given ``noise_multiplier``."""
        if noise_multiplier is not None:
            return cls(noise_multiplier, epsilon, delta, accountant, None)
        if schedule.steps is not None:
            z = noise_multiplier_for_schedule(epsilon, delta, schedule.steps, accountant=accountant)
        else:
            z = noise_multiplier_for(epsilon, delta, schedule.planned, 1.0, accountant=accountant)
        steps = schedule.steps or [(1.0, max(schedule.planned, 1))]
        plan = sorted(zz for zz, _, n in schedule_history(z, steps) for _ in range(n))
        return cls(z, epsilon, delta, accountant, plan)

    def history(self) -> list[tuple[float, float, int]]:
        """Accountant history dominating every client's: per noise level, the most rounds any
        one client took at it (exact when all clients took the same rounds)."""
        return self.history_of(self.top)

    @staticmethod
    def history_of(top) -> list[tuple[float, float, int]]:
        return [(z, 1.0, n) for z, n in sorted(top.items()) if n > 0]

    def within_plan(self, history) -> bool:
        """True if ``history`` is dominated by the schedule the noise was calibrated for, so its
        epsilon is within the target without asking the accountant (a PRV evaluation per round
        was most of an ideal DP round's cost). Sound because composition is monotone: a round at
        a larger noise multiplier is a post-processing of one at a smaller (add more noise), and
        dropping rounds cannot raise epsilon; the calibration made the planned schedule fit.
        Dominated: the rounds sorted by noise multiplier, the j-th has at least the j-th planned
        one's, and there are no more of them. False when z was given (nothing was calibrated)."""
        if self.calibrated is None:
            return False
        rounds = sorted(z for z, _, n in history for _ in range(int(n)))
        return len(rounds) <= len(self.calibrated) and all(r >= p for r, p in zip(rounds, self.calibrated))

    def refusal(self, ctx, z: float, cap: int | None, planned: int) -> PrivacyBudgetExceededError | None:
        """The error refusing a round at noise multiplier z that would take a sampled client
        beyond the target, or None. A client at its participation ``cap`` declines the round
        and is not counted."""
        # the history after this round: per level the most rounds any one client took, so only
        # level z can grow, to one more than the most a sampled, uncapped client has at z
        levels = self.levels
        bump = max(((levels[c][z] if c in levels else 0) + 1 for c in ctx.sampled
                    if cap is None or self.counts[c] < cap), default=0)
        if bump <= self.top[z]:
            return None
        top = Counter(self.top)
        top[z] = bump
        after = self.history_of(top)
        if self.within_plan(after) or self.accountant._epsilon(after) <= self.epsilon:
            return None
        spent = self.accountant.spent()[0]
        needed = max((self.counts[c] + 1 for c in ctx.sampled), default=0)
        return PrivacyBudgetExceededError(
            f"GaussianDP: round {ctx.round} ({ctx.action!r}) would take a client to {needed} noised rounds, "
            f"beyond the budget epsilon={self.epsilon}, delta={self.delta} (spent so far epsilon={spent:.4g} "
            f"with noise multiplier {z:.4g}, calibrated for {planned} rounds). Raise epsilon, "
            "lower max_rounds, or add ParticipationCap(max_rounds=...).",
            round=ctx.round,
            stage="before_round",
        )

    def charge(self, contributors, z: float) -> None:
        """Charge each contributor one round at noise multiplier z (its actual noise: an
        under-noised aborted round is charged at its own, smaller z)."""
        top = self.top[z]
        for c in contributors:
            self.counts[c] += 1
            per = self.levels.setdefault(c, Counter())
            per[z] += 1
            top = max(top, per[z])
        self.top[z] = top
        self.accountant.history = self.history()

    def spent(self) -> tuple[float, float]:
        """(epsilon, delta) spent; epsilon infinite after a round with plain set-fields."""
        eps, delta = self.accountant.spent()
        return (float("inf"), self.delta) if self.plain_rounds else (eps, delta)

    @property
    def max_client_rounds(self) -> int:
        return max(self.counts.values(), default=0)
