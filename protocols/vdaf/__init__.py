"""Prio3 from the VDAF draft (draft-irtf-cfrg-vdaf-20) and the clustering validity circuit.

``Field64``/``Field128`` (Sec. 6.1), ``XofTurboShake128`` (Sec. 6.2), the FLP of Sec. 7.3,
the draft's circuits (Sec. 7.4), :class:`Prio3` (Sec. 7.2) and :class:`ClusterValidity`.
"""
from .circuits import ClusterValidity, Count, Histogram, MultihotCountVec, Sum, SumVec
from .field import Field, Field64, Field128, FieldDecodeError
from .flp import FlpBBCGGI19, Mul, ParallelSum, PolyEval, Valid
from .prio3 import CLUSTER_VALIDITY_ID, Prio3, VdafError
from .xof import XofFixedKeyAes128, XofTurboShake128

__all__ = [
    "CLUSTER_VALIDITY_ID", "ClusterValidity", "Count", "Field", "Field64", "Field128", "FieldDecodeError",
    "FlpBBCGGI19", "Histogram", "Mul", "MultihotCountVec", "ParallelSum", "PolyEval", "Prio3", "Sum", "SumVec",
    "Valid", "VdafError", "XofFixedKeyAes128", "XofTurboShake128",
]
