"""The run specification that makes the ServerApp and every ClientApp build identical objects.

A :class:`RunSpec` names the estimator (``"dwf"``, ``"ewf"``, ... from
:mod:`securefkm.registry`), its parameters, the protection stack as layer specs
(``["masking"]``, ``[{"name": "dp", "epsilon": 1, ...}, "masking"]``) and the
``random_state``. It travels as one JSON string in Flower's run config (key ``spec``);
together with the number of clients and features (run config ``num-nodes`` and
``n-features``) it determines the algorithm, the layers after ``setup`` and the
:class:`~securefkm.layers.RunInfo` exactly as :meth:`FederatedClusterer.fit` would build
them in process, so a deployment reproduces the in-process run with the same seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..validation import check_int
from ..exceptions import InputError

#: estimator parameters that a deployment sets itself
_RESERVED = ("protection", "random_state", "dropout_rate")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


@dataclass
class RunSpec:
    """Estimator name + parameters + protection layer specs + seed, as JSON.

    ``protection`` holds layer *specs* (names or dicts ``{"name": ..., **params}``, see
    :func:`securefkm.registry.make_protection`), not layer objects: both sides build their
    own layers from them. ``random_state`` must be an int (the deployment draws one when the
    user gives ``None``), because every client derives its seeded randomness from it.
    """

    algorithm: str = "dwf"
    params: dict = field(default_factory=dict)
    protection: list = field(default_factory=list)
    random_state: int = 0

    def __post_init__(self):
        from ..registry import ALGORITHMS

        if self.algorithm not in ALGORITHMS:
            raise InputError(
                f"spec algorithm {self.algorithm!r} is unknown; choose one of {', '.join(ALGORITHMS)}."
            )
        if not isinstance(self.params, dict):
            raise InputError(f"spec params must be a dict of estimator parameters, got {self.params!r}.")
        clash = [k for k in _RESERVED if k in self.params]
        if clash:
            raise InputError(
                f"spec params must not contain {clash}: pass protection= and random_state= as "
                "their own fields (a deployment has real dropouts, no dropout_rate)."
            )
        if self.protection is None:
            self.protection = []
        if not isinstance(self.protection, (list, tuple)):
            raise InputError(
                "spec protection must be a list of layer specs, e.g. ['masking'] or "
                "[{'name': 'dp', 'epsilon': 1.0, 'delta': 1e-5, 'clip': 2.0}, 'masking']."
            )
        for i, layer in enumerate(self.protection):
            if not isinstance(layer, (str, dict)):
                raise InputError(
                    f"spec protection[{i}] is {layer!r}; a deployment needs layer specs (a name or "
                    "a dict with 'name' and the layer's parameters), not layer objects."
                )
        self.protection = list(self.protection)
        self.random_state = check_int(self.random_state, "random_state", minimum=0)

    # -------------------------------------------------------------- JSON
    def to_json(self) -> str:
        return json.dumps(
            {
                "algorithm": self.algorithm,
                "params": _jsonable(self.params),
                "protection": _jsonable(self.protection),
                "random_state": self.random_state,
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        try:
            raw = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise InputError(f"run config 'spec' is not valid JSON ({exc}); build it with RunSpec.to_json().") from None
        if not isinstance(raw, dict):
            raise InputError("run config 'spec' must be a JSON object with algorithm, params, protection, random_state.")
        unknown = set(raw) - {"algorithm", "params", "protection", "random_state"}
        if unknown:
            raise InputError(f"run config 'spec' has unknown keys {sorted(unknown)}.")
        return cls(**raw)

    def requirements(self):
        """What a deployment must provision for this spec (:func:`securefkm.flower.provision.requirements`):
        node identities for Paillier and masking ``sign_keys=True``, the key authority for Paillier."""
        from .provision import requirements

        return requirements(self.protection)

    # -------------------------------------------------------------- objects
    def estimator(self):
        """The estimator object the in-process run would use (parameters unchanged)."""
        from ..registry import make_estimator

        params = dict(self.params)
        if isinstance(params.get("init"), list):
            params["init"] = np.asarray(params["init"], dtype=np.float64)
        if isinstance(params.get("init_bounds"), list):
            params["init_bounds"] = tuple(params["init_bounds"])
        return make_estimator(self.algorithm, protection=self.protection, random_state=self.random_state, **params)


def build_federation(spec: RunSpec, n_clients: int, n_features: int, transport, *, server_policy=None, verbose=None,
                     provisioning=None):
    """(estimator, Federation) exactly as ``estimator.fit`` builds them, over ``transport``.

    Mirrors :meth:`securefkm.estimators.base.FederatedClusterer.fit`: same algorithm from
    ``_make_algorithm``, fresh copies of the layers, the same seed derivation from
    ``random_state``, the same RunInfo (``client_sizes`` is ``None`` over a transport).
    The ServerApp runs the rounds of this federation; each ClientApp builds the same one
    over a placeholder transport to obtain identical layers (after ``setup``) and RunInfo.

    ``provisioning`` (:class:`~securefkm.flower.provision.ServerProvisioning` or
    :class:`~securefkm.flower.provision.NodeProvisioning`) replaces the in-process PKI and
    key authority of Paillier / masking ``sign_keys`` with the deployment's before ``setup``;
    a spec that needs it and gets none is refused with the missing pieces named.
    """
    from ..federation import Federation

    n_clients = check_int(n_clients, "num-nodes", minimum=1)
    n_features = check_int(n_features, "n-features", minimum=1)
    est = spec.estimator()
    from protocols.dp import refuse_seeded_noise

    refuse_seeded_noise(est.protection)  # deployments never run recomputable DP noise
    if provisioning is not None:
        provisioning.apply(est.protection)
    elif spec.requirements():
        raise InputError(
            "this spec's protection (Paillier, ValidatedAggregation or masking sign_keys=True) needs "
            "provisioned node identities over Flower: give the run config 'directory' (and 'authority-url' for "
            "Paillier and ValidatedAggregation) and every SuperNode the node config 'identity-key' and 'directory'; "
            "`securefkm deploy` / deploy() provision a local deployment automatically "
            "(docs/deployment.md, 'Paillier and signed-key masking')."
        )
    n_clusters = check_int(est.n_clusters, "n_clusters", minimum=1)
    del n_clusters
    if getattr(est, "crypto", "real") != "real":
        raise InputError(
            f"crypto={est.crypto!r} is refused over Flower: the ideal functionality trusts one process "
            "with every client's input, which a deployment must never do; drop crypto (default 'real')."
        )
    layers, seed, _, algorithm, max_rounds = est._prepare(DeclaredFacts(n_clients, n_features, _declared_records(est)))
    federation = Federation(
        algorithm,
        None,
        protection=layers,
        clients_per_round=est.clients_per_round,
        dropout_rate=None,
        max_rounds=max_rounds,  # the DP plan's, from the declared record count, as a fit plans
        n_runs=est._n_runs(),
        random_state=seed,
        verbose=est.verbose if verbose is None else verbose,
        server_policy=server_policy,
        transport=transport,
        n_features=n_features,
    )
    return est, federation


class DeclaredFacts:
    """The public facts of a deployment's data that a fit's plan reads: the number of
    clients (nodes), of features, and of records (declared: ``GaussianDP(n_records=...)``;
    no node's data is read). A plan that needs the record count and has none is refused."""

    clients = None

    def __init__(self, n_clients: int, n_features: int, n_records: int | None):
        self.n_clients, self.n_features, self._n_records = int(n_clients), int(n_features), n_records

    @property
    def n_samples(self) -> int:
        if self._n_records is None:
            raise InputError(
                "this spec's GaussianDP plans its rounds and noise from the number of records, which a "
                "deployment does not read from the nodes: declare it, GaussianDP(n_records=N) (a dict spec "
                "{'name': 'dp', ..., 'n_records': N}, CLI 'dp:...:n_records=N'); `securefkm deploy` and "
                "deploy() count the CSVs' records for you. Or fix the rounds with max_rounds=."
            )
        return int(self._n_records)


def _declared_records(est):
    from protocols.dp import GaussianDP

    from ..estimators.base import resolve_protection

    for layer in resolve_protection(est.protection):
        if isinstance(layer, GaussianDP) and layer.n_records is not None:
            return int(layer.n_records)
    return None


class PlaceholderTransport:
    """A transport that only knows the client ids (the ClientApp's view of the federation)."""

    def __init__(self, n_clients: int):
        self._ids = list(range(n_clients))

    def client_ids(self):
        return self._ids

    def begin_round(self, ctx, stages):  # pragma: no cover - never driven
        raise RuntimeError("a client never drives rounds")

    def exchange(self, stage, messages):  # pragma: no cover - never driven
        raise RuntimeError("a client never drives rounds")
