"""Attacks on federated clustering: what the server can still learn.

Passive attacks read only a :class:`~securefkm.transcript.Transcript`
(``Attack(...).evaluate(transcript, dataset)``); active attacks act only through a
malicious :class:`~securefkm.federation.ServerPolicy` (``Attack(...).evaluate(estimator,
dataset)``); poisoning attacks (:class:`Poisoning`) act through malicious clients
(:class:`~securefkm.federation.ClientPolicy`) and report how far they moved the centres. Every attack returns a :class:`LeakageReport`; the dataset is used only to
score the attack against the ground truth. ``audit_epsilon`` turns attack error rates into
empirical epsilon lower bounds; ``attacks.bench`` runs the attack/defence benchmark.
``evaluate(attack, estimator, data)`` runs any of them against a fitted estimator with the
right call; ``hold_out`` and ``membership_candidates`` prepare membership inference's
candidate records. Names are imported lazily (``evaluate`` and its helpers import nothing
heavy until called).
"""

from __future__ import annotations

from securefkm.lazy import lazy_exports

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
    "Poisoning": "attacks.poisoning",
    "PoisoningPolicy": "attacks.poisoning",
    "PoisoningReport": "attacks.poisoning",
    "membership_metrics": "attacks.membership",
    "dp_roc_violation": "attacks.membership",
    "audit_epsilon": "attacks.audit",
    "AuditResult": "attacks.audit",
    "audit_dp_game": "attacks.audit",
    "gaussian_dp_round_game": "attacks.audit",
    "run_dp_game": "attacks.audit",
    "DPGame": "attacks.audit",
    "clopper_pearson": "attacks.audit",
    "one_run_audit": "attacks.audit_one_run",
    "OneRunAudit": "attacks.audit_one_run",
    "run_benchmark": "attacks.bench",
    "evaluate": "attacks.evaluate",
    "membership_candidates": "attacks.evaluate",
    "hold_out": "attacks.evaluate",
}

__getattr__, __dir__, __all__ = lazy_exports("attacks", _EXPORTS)

# the function, bound now: the submodule of the same name would otherwise replace it as the
# package's attribute once imported (attacks/evaluate.py imports nothing heavy at load)
from .evaluate import evaluate, hold_out, membership_candidates  # noqa: E402
