"""Client populations whose records are made on demand: cross-device studies.

A :class:`ClientPopulation` is a read-only sequence of per-client record arrays that holds
none of them: ``population[i]`` asks its loader for client ``i``'s records each time. A
:class:`~securefkm.federation.Federation` given one streams its clients: only the clients
sampled in the current round exist (their records, runtimes and protocol sessions), and
they are dropped when the next round begins, keeping only the per-client state that
persists (a participation counter, a secure mode's local centres). Memory then grows with
the cohort a round samples, not with the population. On the same seeds the fit, its
transcript and its privacy accounting are the ones a list of the same arrays gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..exceptions import InputError
from ..validation import check_float, check_int


class ClientPopulation(Sequence):
    """``n_clients`` clients whose records ``load(i)`` makes when they are needed.

    Parameters
    ----------
    load : callable
        ``load(i) -> ndarray`` of shape ``(sizes[i], n_features)``: client ``i``'s records.
        Called again whenever the client is needed, so it must return the same records each
        time (read them from storage, or draw them from a generator seeded by ``i``).
    sizes : int or sequence of int
        Records per client: one number for every client, or one per client. A fit plans
        from these public sizes without loading anyone.
    n_features : int
        Features per record.
    """

    def __init__(self, load: Callable[[int], np.ndarray], sizes, n_features: int):
        if not callable(load):
            raise InputError(f"ClientPopulation: load must be a function load(i) -> records of client i, got {load!r}.")
        if isinstance(sizes, (int, np.integer)):
            raise InputError("ClientPopulation: sizes must be a sequence (one size per client); "
                             "use ClientPopulation.uniform(load, n_clients, records, n_features) for one size.")
        arr = np.asarray(sizes)
        if arr.ndim != 1 or not len(arr):
            raise InputError("ClientPopulation: sizes must be a non-empty 1-D sequence of record counts, one per client.")
        if arr.dtype.kind not in "iu" or arr.min() < 1:
            raise InputError("ClientPopulation: sizes must hold whole numbers of records, each at least 1.")
        self._sizes = arr.astype(np.int64)  # checked as one array: a population may hold millions
        self._sizes.setflags(write=False)
        self.load = load
        self.n_features = check_int(n_features, "n_features", minimum=1)

    @classmethod
    def uniform(cls, load: Callable[[int], np.ndarray], n_clients: int, records: int, n_features: int):
        """A population of ``n_clients`` clients of ``records`` records each."""
        n = check_int(n_clients, "n_clients", minimum=1)
        return cls(load, np.full(n, check_int(records, "records", minimum=1)), n_features)

    @property
    def sizes(self) -> np.ndarray:
        """Records per client (public: what the clients declare), read-only."""
        return self._sizes

    @property
    def n_clients(self) -> int:
        return len(self._sizes)

    @property
    def n_samples(self) -> int:
        return int(self._sizes.sum())

    @property
    def clients(self) -> ClientPopulation:
        """The population itself (what a FederatedDataset's ``clients`` is to a fit)."""
        return self

    def pooled(self):
        raise InputError("a ClientPopulation is never pooled: its records are made client by client when a round "
                         "needs them; draw the records you want to score (population[i]) and pool those.")

    def __len__(self) -> int:
        return len(self._sizes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"client {i} is outside 0..{len(self) - 1}")
        X = np.asarray(self.load(i), dtype=np.float64)
        if X.shape != (int(self._sizes[i]), self.n_features):
            raise InputError(f"ClientPopulation: load({i}) returned shape {X.shape}, not the declared "
                             f"({self._sizes[i]}, {self.n_features}); make load return the same records each time.")
        return X

    def __repr__(self) -> str:
        return f"ClientPopulation({len(self):,} clients, {self.n_samples:,} records, {self.n_features} features)"


class _BlobLoader:
    """Client ``i``'s records: ``records`` draws around the population's centres from a
    generator seeded by (``random_state``, ``i``), so each client is made alone."""

    def __init__(self, centres: np.ndarray, records: int, spread: float, box: float, random_state: int):
        self.centres, self.records, self.spread, self.box, self.random_state = centres, records, spread, box, random_state

    def __call__(self, i: int) -> np.ndarray:
        rng = np.random.default_rng([self.random_state, int(i)])
        which = rng.integers(0, len(self.centres), self.records)
        X = self.centres[which] + rng.normal(scale=self.spread, size=(self.records, self.centres.shape[1]))
        return np.clip(X, -self.box, self.box)


def blob_population(n_clients: int, records: int = 10, n_features: int = 2, n_centres: int = 5, *,
                    spread: float = 0.5, box: float = 6.0, random_state: int = 0) -> ClientPopulation:
    """A synthetic cross-device population: ``n_clients`` clients of ``records`` records around
    ``n_centres`` centres drawn uniformly in ``[-box + 2, box - 2]^d`` (Gaussian spread
    ``spread``), records clipped to ``[-box, box]^d`` (the public domain to declare).

    Every client's records come from a generator seeded by ``(random_state, i)``: the same
    on every call and independent of the other clients, so no client is held in memory."""
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    records = check_int(records, "records", minimum=1)
    d = check_int(n_features, "n_features", minimum=1)
    k = check_int(n_centres, "n_centres", minimum=1)
    spread = check_float(spread, "spread", minimum=0.0)
    box = check_float(box, "box", minimum=2.0, min_inclusive=False)  # the centres lie 2 inside it
    rng = np.random.default_rng([random_state, 2**32 - 1])
    centres = rng.uniform(-box + 2, box - 2, size=(k, d))
    return ClientPopulation.uniform(_BlobLoader(centres, records, float(spread), float(box), int(random_state)),
                                    n_clients, records, d)
