"""Attacks on federated clustering: what the server can still learn.

Passive attacks read only a :class:`~securefkm.transcript.Transcript`
(``Attack(...).evaluate(transcript, dataset)``); active attacks act only through a
malicious :class:`~securefkm.federation.ServerPolicy` (``Attack(...).evaluate(estimator,
dataset)``). Every attack returns a :class:`LeakageReport`; the dataset is used only to
score the attack against the ground truth.
"""

from .active import ActiveAggregateDifferencing, CraftedCentroids, ModelInconsistency, Sybil
from .passive import AggregateDifferencing, Differencing, SmallClusterDisclosure
from .report import LeakageReport, score_reconstructions

__all__ = [
    "ActiveAggregateDifferencing",
    "CraftedCentroids",
    "ModelInconsistency",
    "Sybil",
    "AggregateDifferencing",
    "Differencing",
    "LeakageReport",
    "SmallClusterDisclosure",
    "score_reconstructions",
]
