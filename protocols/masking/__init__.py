"""Pairwise-masking secure aggregation (Bonawitz et al. 2017; sparse graph of Bell et al. 2020)."""

from .client import MaskingClient
from .graph import Graph, RoundPlan, default_neighbours, make_plan, resolve_threshold
from .ideal import IdealMasking  # also registers it as PairwiseMasking's ideal functionality
from .layer import PairwiseMasking
from .prg import MaskExpander, expand, keystream_bytes
from .server import MaskingServer

__all__ = [
    "Graph",
    "IdealMasking",
    "MaskExpander",
    "MaskingClient",
    "MaskingServer",
    "PairwiseMasking",
    "RoundPlan",
    "default_neighbours",
    "expand",
    "keystream_bytes",
    "make_plan",
    "resolve_threshold",
]
