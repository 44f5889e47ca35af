"""Validated aggregation: secure sums whose every input is proven valid (Prio3 with a Helper).

``ValidatedAggregation`` is an aggregator layer; ``ValidationHelper`` the second, non-colluding
aggregator it needs. See ``docs/protocols/validated-aggregation.md``.
"""

from .helper import HelperRefusal, ValidationHelper
from .ideal import IdealValidatedAggregation  # also registers it as the ideal functionality
from .layer import ValidatedAggregation

__all__ = ["HelperRefusal", "IdealValidatedAggregation", "ValidatedAggregation", "ValidationHelper"]
