"""The ServerApp's run config as one typed record, shared by the ServerApp and the deployments.

Flower hands the ServerApp a flat mapping of string keys (``flwr run --run-config``, with the
defaults of ``securefkm/flower/app/pyproject.toml``). :class:`RunConfig` names every key
once, with its type and default: ``LocalDeployment.run`` writes one with
:meth:`RunConfig.to_flower`, the ServerApp reads it with :meth:`RunConfig.from_flower`, which
refuses a key of the wrong type naming the key, and a test checks the app's pyproject.toml
defaults against these.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..exceptions import InputError


@dataclass(frozen=True)
class RunConfig:
    """One ServerApp run: the spec and how to run it (run config key = field name with '-')."""

    spec: str  #: JSON :class:`~securefkm.flower.spec.RunSpec`
    num_nodes: int = 3  #: SuperNodes (= clients) to wait for
    n_features: int = 2  #: columns of every client's CSV
    stage_timeout: float = 60.0  #: seconds per protocol stage before silent clients drop
    suspect_timeout: float = 3.0  #: extra seconds for a node that already missed a deadline
    node_wait_timeout: float = 120.0  #: seconds to wait for ``num_nodes`` nodes to connect
    poll_interval: float = 0.05  #: seconds between polls of the SuperLink for replies
    result_path: str = ""  #: where to write the result file ("": do not write)
    progress_path: str = ""  #: JSON-lines progress log ("": none)
    directory: str = ""  #: provisioned node directory, a path or the JSON text ("": none)
    authority_url: str = ""  #: the Paillier key authority service ("": none)
    authority_ca: str = ""  #: CA of the authority's TLS certificate (https)
    authority_cert: str = ""  #: the ServerApp's client certificate for the authority
    authority_key: str = ""  #: its private key
    min_nodes: int = 0  #: fewest nodes that must identify (0: 2, or Paillier's min_clients)
    checkpoint_path: str = ""  #: atomic checkpoint after every round, resumed from ("": none)
    checkpoint_key: str = ""  #: the checkpoint's HMAC key file ("": ``<checkpoint_path>.key``)

    @staticmethod
    def key(name: str) -> str:
        return name.replace("_", "-")

    def to_flower(self) -> dict:
        """The run config mapping (keys with '-') for ``flwr run --run-config``."""
        return {self.key(f.name): getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_flower(cls, cfg) -> RunConfig:
        """Read Flower's run config: every known key checked against its type; unknown keys
        (Flower's own) are ignored; ``spec`` is required."""
        values = {}
        for f in dataclasses.fields(cls):
            key = cls.key(f.name)
            if key not in cfg:
                if f.default is dataclasses.MISSING:
                    raise InputError(f"run config {key!r} is missing; build it with RunSpec(...).to_json().")
                continue
            raw = cfg[key]
            kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            if kind is str:
                value = "" if raw is None else str(raw)
            else:
                try:
                    if isinstance(raw, bool) or (kind is int and isinstance(raw, float) and not raw.is_integer()):
                        raise ValueError
                    value = kind(raw)
                except (TypeError, ValueError):
                    raise InputError(f"run config {key!r}={raw!r} is not {'an int' if kind is int else 'a number'}; "
                                     "fix the --run-config value.") from None
            values[f.name] = value
        return cls(**values)

    def or_none(self, name: str):
        """The field's value, ``None`` for an empty string or a 0 ``min_nodes`` (unset)."""
        value = getattr(self, name)
        return None if value in ("", 0) and name in _UNSET_ZERO | _STRINGS else value


_UNSET_ZERO = {"min_nodes"}
_STRINGS = {f.name for f in dataclasses.fields(RunConfig) if f.type in ("str", str)}
