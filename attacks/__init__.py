"""Attacks on federated clustering: what the server can still learn.

Passive attacks read only a :class:`~securefkm.transcript.Transcript`
(``Attack(...).evaluate(transcript, dataset)``); active attacks act only through a
malicious :class:`~securefkm.federation.ServerPolicy` (``Attack(...).evaluate(estimator,
dataset)``). Every attack returns a :class:`LeakageReport`; the dataset is used only to
score the attack against the ground truth. ``audit_epsilon`` turns attack error rates into
empirical epsilon lower bounds; ``attacks.bench`` runs the attack/defence benchmark.
Names are imported lazily.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LeakageReport": "attacks.report",
    "score_reconstructions": "attacks.report",
    "SmallClusterDisclosure": "attacks.passive",
    "Differencing": "attacks.passive",
    "AggregateDifferencing": "attacks.passive",
    "CraftedCentroids": "attacks.active",
    "ModelInconsistency": "attacks.active",
    "ActiveAggregateDifferencing": "attacks.active",
    "Sybil": "attacks.active",
    "FuzzyEquationSolver": "attacks.fuzzy",
    "MembershipInference": "attacks.membership",
    "membership_metrics": "attacks.membership",
    "dp_roc_violation": "attacks.membership",
    "audit_epsilon": "attacks.audit",
    "AuditResult": "attacks.audit",
    "audit_dp_game": "attacks.audit",
    "gaussian_dp_round_game": "attacks.audit",
    "run_dp_game": "attacks.audit",
    "DPGame": "attacks.audit",
    "clopper_pearson": "attacks.audit",
    "run_benchmark": "attacks.bench",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'attacks' has no attribute {name!r}")


def __dir__():
    return __all__
