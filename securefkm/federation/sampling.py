"""Client sampling and simulated dropouts."""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np

from ..validation import check_fraction_or_count
from ..exceptions import InputError


def resolve_sample(request, default_count: int, n_clients: int) -> int:
    """Number of clients a broadcast asks for (see :class:`~securefkm.messages.Broadcast`)."""
    if request is None:
        return default_count
    if request == "all":
        return n_clients
    if request == "one":
        return 1
    return check_fraction_or_count(request, "Broadcast.sample", n_clients)


def sample_clients(rng: np.random.Generator, n_clients: int, count: int, excluded=()) -> tuple[int, ...]:
    """A uniformly random subset of ``count`` client ids (sorted), without replacement.

    ``excluded`` (ids excluded for repeated faults) are never drawn: the sample is drawn
    uniformly from the remaining clients (all of them if fewer than ``count`` remain).
    Without exclusions the draw is exactly the one it always was."""
    if not excluded:
        if count >= n_clients:
            return tuple(range(n_clients))
        return tuple(sorted(rng.choice(n_clients, size=count, replace=False).tolist()))
    gone = np.unique(np.fromiter((int(c) for c in excluded), dtype=np.int64))
    gone = gone[(gone >= 0) & (gone < n_clients)]
    n_remaining = n_clients - len(gone)
    if count >= n_remaining:
        return tuple(np.setdiff1d(np.arange(n_clients), gone, assume_unique=True).tolist())
    picks = rng.choice(n_remaining, size=count, replace=False)
    # the picks index the remaining ids in order, found without listing them (a population may
    # hold millions): the i-th remaining id is i plus the excluded ids at or below it
    shifted = gone - np.arange(len(gone))
    return tuple(sorted((picks + np.searchsorted(shifted, picks, side="right")).tolist()))


class Dropouts:
    """Which sampled clients fail to answer, and at which protocol stage (simulation only).

    ``spec`` is one of:

    * ``0`` / ``None``: nobody drops;
    * a float ``p`` in [0, 1): every sampled client independently drops with probability
      ``p`` at a stage drawn uniformly among the aggregator's stages;
    * a mapping ``{round: [client, ...]}`` (drop before sending anything) or
      ``{round: {stage: [client, ...]}}`` (drop when that stage is reached). Rounds count
      from 0 across the whole fit, every round *attempt* counting: a round that aborts and
      is retried uses up two keys (docs/aborted-rounds.md).
    """

    def __init__(self, spec=None):
        self.rate = 0.0
        self.schedule: dict[int, dict[str | None, set[int]]] = {}
        if spec is None or (isinstance(spec, numbers.Real) and not isinstance(spec, bool) and spec == 0):
            return
        if isinstance(spec, numbers.Real) and not isinstance(spec, bool):
            if not 0.0 <= float(spec) < 1.0:
                raise InputError(f"dropout_rate must be in [0, 1), got {spec}.")
            self.rate = float(spec)
            return
        if isinstance(spec, Mapping):
            for rnd, entry in spec.items():
                if not isinstance(rnd, numbers.Integral):
                    raise InputError(f"dropout_rate schedule keys must be round numbers, got {rnd!r}.")
                if isinstance(entry, Mapping):
                    self.schedule[int(rnd)] = {str(k): {int(c) for c in v} for k, v in entry.items()}
                else:
                    self.schedule[int(rnd)] = {None: {int(c) for c in entry}}
            return
        raise InputError(
            "dropout_rate must be a probability in [0, 1) or a schedule "
            "{round: [clients]} / {round: {stage: [clients]}}, "
            f"got {type(spec).__name__}."
        )

    def plan(self, rng: np.random.Generator, round: int, sampled, stages: tuple[str, ...]) -> dict[int, str]:
        """Map each client that will drop this round to the stage at which it drops.

        Stage ``"update"`` means the client never computes nor sends anything.
        """
        out: dict[int, str] = {}
        entry = self.schedule.get(round, {})
        for stage, clients in entry.items():
            for c in clients:
                out[c] = stage if stage is not None else "update"
        if self.rate > 0:
            draws = rng.random(len(sampled))
            stage_idx = rng.integers(0, len(stages), size=len(sampled))
            for c, u, s in zip(sampled, draws, stage_idx):
                if u < self.rate and c not in out:
                    out[c] = stages[s]
        return out
