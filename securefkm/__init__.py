"""securefkm: privacy-hardened federated clustering.

Estimators (scikit-learn style, ``fit`` takes a FederatedDataset or a list of per-client
arrays): WeightedFederatedKMeans (DWF/EWF), MiniBatchFederatedKMeans (Triebe),
AligningFederatedKMeans (Garst), OneShotFederatedKMeans (k-FED, child/parent),
FederatedFuzzyCMeans (Stallmann & Wilbik). Protection layers live in ``protocols``,
attacks in ``attacks``. Names are imported lazily so ``import securefkm`` stays fast.
"""

from __future__ import annotations

from .lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "WeightedFederatedKMeans": "securefkm.estimators.dwf",
    "MiniBatchFederatedKMeans": "securefkm.estimators.minibatch",
    "AligningFederatedKMeans": "securefkm.estimators.aligning",
    "OneShotFederatedKMeans": "securefkm.estimators.oneshot",
    "FederatedFuzzyCMeans": "securefkm.estimators.fuzzy",
    "select_n_clusters": "securefkm.estimators.fuzzy",
    "suggest_k_range": "securefkm.estimators.fuzzy",
    "FederatedDataset": "securefkm.datasets",
    "as_federated": "securefkm.datasets",
    "load_dataset": "securefkm.datasets",
    "Federation": "securefkm.federation",
    "Transcript": "securefkm.transcript",
    "open_transcript": "securefkm.transcript_file",
    "save_transcript": "securefkm.transcript_file",
    "Broadcast": "securefkm.messages",
    "Update": "securefkm.messages",
    "FieldSpec": "securefkm.messages",
    "InputError": "securefkm.exceptions",
    "RoundAbortedError": "securefkm.exceptions",
    "PrivacyBudgetExceededError": "securefkm.exceptions",
    "make_estimator": "securefkm.registry",
}

__getattr__, __dir__, __all__ = lazy_exports("securefkm", _EXPORTS)
__all__ = __all__ + ["__version__"]
