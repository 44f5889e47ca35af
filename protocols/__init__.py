"""Protection layers: what the server may see.

``PairwiseMasking`` (secure aggregation with dropout recovery), ``Paillier`` (additively
homomorphic encryption with a separate key authority), ``GaussianDP`` (record-level
differential privacy with opacus accounting), ``Rounding``, ``ParticipationCap``,
``MinClusterSize`` and the ``FixedPointCodec`` the secure aggregators share. Each layer's
docstring states its trust model. Imported lazily: ``import protocols`` does not import
torch (opacus is loaded only when a DP layer is set up).
"""

from __future__ import annotations

from securefkm.lazy import lazy_exports

_EXPORTS = {
    "FixedPointCodec": "protocols.codec",
    "PairwiseMasking": "protocols.masking",
    "Paillier": "protocols.paillier",
    "KeyAuthority": "protocols.paillier",
    "GaussianDP": "protocols.dp",
    "Rounding": "protocols.rounding",
    "ParticipationCap": "protocols.participation",
    "MinClusterSize": "protocols.min_cluster",
    "ValidatedAggregation": "protocols.validated",
    "ValidationHelper": "protocols.validated",
}

__getattr__, __dir__, __all__ = lazy_exports("protocols", _EXPORTS)
