"""A minimal sum-only algorithm for runtime-level tests of the aggregators: one action,
one integer count field and one float sum field (shared by the masking test files)."""

import numpy as np

from securefkm.algorithms.base import Algorithm, AlgorithmState
from securefkm.messages import Broadcast, FieldSpec, Update

SPECS = (FieldSpec("count", (1,), "count", integer=True), FieldSpec("total", (3,), "sum"))


class SumAlgorithm(Algorithm):
    """One action, one integer count field and one float sum field."""

    name = "test-sum"

    def init(self, n_clients, n_features, rng):
        return AlgorithmState(centres=np.zeros((1, n_features)))

    def configure(self, state, round):
        return Broadcast("sum", centres=state.centres, sample="all")

    def sum_fields(self, broadcast):
        return SPECS

    def client_update(self, X, broadcast, rng, memory=None):
        return Update(sums={"count": np.array([float(len(X))]), "total": X.sum(axis=0)})

    def aggregate(self, state, agg):
        return AlgorithmState(
            centres=(agg.sums["total"] / agg.sums["count"][0])[None, :],
            round=state.round + 1,
            extra={"sums": agg.sums, "contributors": agg.contributors},
        )

    def converged(self, state):
        return state.round >= 1


def _clients(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(int(rng.integers(3, 9)), 3)) * 10 for _ in range(n)]
