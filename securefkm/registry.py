"""Names for algorithms and protection layers, so the CLI, the benchmarks and the Flower app
can build identical objects from a small JSON-able spec.

    make_estimator("dwf", n_clusters=5, protection=[{"name": "masking"}])
    make_protection(["min-cluster", {"name": "dp", "epsilon": 1, "delta": 1e-5, "clip": 2}])

Classes are imported lazily: the core does not pay for what a spec does not name.
"""

from __future__ import annotations

import importlib
from typing import Any

from .exceptions import InputError

#: algorithm name -> (module, class, fixed parameters)
ALGORITHMS: dict[str, tuple[str, str, dict]] = {
    "dwf": ("securefkm.estimators.dwf", "WeightedFederatedKMeans", {"weighting": "dynamic"}),
    "ewf": ("securefkm.estimators.dwf", "WeightedFederatedKMeans", {"weighting": "equal"}),
    "minibatch": ("securefkm.estimators.minibatch", "MiniBatchFederatedKMeans", {}),
    "aligning": ("securefkm.estimators.aligning", "AligningFederatedKMeans", {}),
    "kfed": ("securefkm.estimators.oneshot", "OneShotFederatedKMeans", {"variant": "kfed"}),
    "child-parent": ("securefkm.estimators.oneshot", "OneShotFederatedKMeans", {"variant": "child-parent"}),
    "fcm": ("securefkm.estimators.fuzzy", "FederatedFuzzyCMeans", {"averaging": "kmeans"}),
    "fcm-fedavg": ("securefkm.estimators.fuzzy", "FederatedFuzzyCMeans", {"averaging": "fedavg"}),
}

ALGORITHM_HELP = {
    "dwf": "dynamically weighted federated k-means (Holzer et al. 2023)",
    "ewf": "equally weighted federated k-means (Holzer et al. 2023)",
    "minibatch": "mini-batch federated k-means (Triebe & Rajagopal 2019)",
    "aligning": "federated k-means with server-side weighted k-means (Garst & Reinders)",
    "kfed": "one-shot k-FED (Dennis et al. 2021)",
    "child-parent": "one-shot child/parent k-means",
    "fcm": "federated fuzzy c-means, k-means averaging (Stallmann & Wilbik 2022)",
    "fcm-fedavg": "federated fuzzy c-means, federated averaging (Stallmann & Wilbik 2022)",
}

#: layer name -> (module, class)
LAYERS: dict[str, tuple[str, str]] = {
    "masking": ("protocols.masking", "PairwiseMasking"),
    "paillier": ("protocols.paillier", "Paillier"),
    "dp": ("protocols.dp", "GaussianDP"),
    "rounding": ("protocols.rounding", "Rounding"),
    "cap": ("protocols.participation", "ParticipationCap"),
    "min-cluster": ("protocols.min_cluster", "MinClusterSize"),
    "validated": ("protocols.validated", "ValidatedAggregation"),
}


def layer_spec_name(layer) -> str:
    """The spec name (CLI ``--protection`` name) of a layer object, or its class name."""
    for name, (_module, cls) in LAYERS.items():
        if type(layer).__name__ == cls:
            return name
    return type(layer).__name__


def _load(module: str, name: str):
    return getattr(importlib.import_module(module), name)


def estimator_class(name: str):
    if name not in ALGORITHMS:
        raise InputError(f"unknown algorithm {name!r}; choose one of {', '.join(ALGORITHMS)}.")
    module, cls, fixed = ALGORITHMS[name]
    return _load(module, cls), dict(fixed)


def make_protection(specs) -> list:
    """Layers from names, text specs or dicts ``{"name": ..., **params}``; layer objects pass through.

    ``specs`` may be one text stack (``"masking"``, ``"dp:epsilon=1:delta=1e-5:clip=2,masking"``)
    or a list whose text items are one layer each (``"dp:epsilon=1,delta=1e-5,clip=2"``); the
    grammar is :mod:`securefkm.specs`, the same as the CLI's ``--protection``.
    """
    from .specs import parse_layer, parse_protection

    if specs is None:
        return []
    if isinstance(specs, str):
        specs = parse_protection(specs)
    elif not isinstance(specs, (list, tuple)):
        specs = [specs]  # a single layer object
    layers = []
    for spec in specs:
        if isinstance(spec, str) and spec.strip() not in LAYERS:
            spec = parse_layer(spec, param_seps=":,")
        if not isinstance(spec, (str, dict)):
            layers.append(spec)
            continue
        params: dict[str, Any] = {} if isinstance(spec, str) else dict(spec)
        name = spec if isinstance(spec, str) else params.pop("name", None)
        if name not in LAYERS:
            raise InputError(f"unknown protection layer {name!r}; choose from {', '.join(LAYERS)}.",
                             cli=f"unknown --protection layer {name!r}; choose from {', '.join(LAYERS)}.")
        layers.append(_construct(name, _load(*LAYERS[name]), params))
    return layers


def _construct(name: str, cls, params: dict):
    """``cls(**params)``, turning a missing or unknown parameter into an InputError that
    names it and shows both the Python and the ``--protection`` form."""
    import inspect

    sig = inspect.signature(cls)
    unknown = [k for k in params if k not in sig.parameters]
    missing = [p.name for p in sig.parameters.values()
               if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and p.name not in params]
    accepted = ", ".join(p for p in sig.parameters if p != "self")
    cli_example = f"{name}:" + ":".join(f"{k}=..." for k in (missing or list(params)[:1]))
    if unknown or missing:
        problem = (f"unknown parameter(s) {', '.join(unknown)}" if unknown else
                   f"missing required parameter(s) {', '.join(missing)}")
        raise InputError(
            f"{cls.__name__}: {problem}; it takes {accepted}.",
            cli=f"--protection {name}: {problem}; it takes {accepted} (e.g. '{cli_example}').",
        )
    try:
        return cls(**params)
    except InputError as exc:
        if exc.cli is None:
            exc.cli = f"--protection {name}: {exc}"
        raise
    except TypeError as exc:  # a value of the wrong type the constructor could not use
        raise InputError(f"{cls.__name__}: {exc}",
                         cli=f"--protection {name}: {exc} (values are JSON: numbers, [a,b], true)") from None


def make_estimator(name: str, protection=None, **params):
    cls, fixed = estimator_class(name)
    clash = set(fixed) & set(params)
    if clash:
        raise InputError(f"algorithm {name!r} fixes {sorted(clash)}; drop them from the parameters.")
    return cls(**fixed, **params, protection=make_protection(protection))
