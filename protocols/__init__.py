"""Protection layers: what the server may see.

``PairwiseMasking`` (secure aggregation with dropout recovery), ``Paillier`` (additively
homomorphic encryption with a separate key authority), ``GaussianDP`` (record-level
differential privacy with opacus accounting), ``Rounding``, ``ParticipationCap``,
``MinClusterSize`` and the ``FixedPointCodec`` the secure aggregators share. Each layer's
docstring states its trust model. Imported lazily: ``import protocols`` does not import
torch (opacus is loaded only when a DP layer is set up).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "FixedPointCodec": "protocols.codec",
    "PairwiseMasking": "protocols.masking",
    "Paillier": "protocols.paillier",
    "KeyAuthority": "protocols.paillier",
    "GaussianDP": "protocols.dp",
    "Rounding": "protocols.rounding",
    "ParticipationCap": "protocols.participation",
    "MinClusterSize": "protocols.min_cluster",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'protocols' has no attribute {name!r}")


def __dir__():
    return __all__
