"""Wire format of securefkm's protocol messages over Flower.

Every protocol message (an :class:`~securefkm.federation.client.UpdateRequest`, a masking
or Paillier stage message, a client's reply) is pickled into a ``bytes`` field of a Flower
``ConfigRecord``. Pickle is convenient but executes code on load, so the receiving side
(the ServerApp for replies, the ClientApp for requests) unpickles with
:class:`RestrictedUnpickler`, which only resolves plain containers, numpy arrays and
scalars, and *classes* of the ``securefkm``, ``protocols`` and ``phe`` packages (message
dataclasses, ciphertexts), never functions, and nothing from modules that start processes
or touch files. A peer that sends anything else gets a :class:`WireError`.

The client's own persistent state (its ClientRuntime state and aggregator session) never
leaves the node; it is stored with plain pickle in the node's ``context.state``.
"""

from __future__ import annotations

import importlib
import io
import pickle
from typing import Any

from ..exceptions import SecureFKMError

#: the one ConfigRecord key holding a securefkm message, and its fields
RECORD_KEY = "securefkm"
#: Flower message type: ``train.<action>``; the stage travels inside the record
ACTION = "securefkm"
MESSAGE_TYPE = f"train.{ACTION}"

_SAFE_BUILTINS = {
    "dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "bool", "str",
    "bytes", "bytearray", "slice", "range", "NoneType", "object",
}
_SAFE_GLOBALS = {
    ("copyreg", "_reconstructor"),
    ("collections", "OrderedDict"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "float64"),
    ("numpy", "int64"),
    ("numpy", "uint64"),
}
_CLASS_PACKAGES = ("securefkm", "protocols", "phe")
_DENIED_MODULES = (
    "securefkm.flower.deploy",
    "securefkm.flower.provision",
    "securefkm.flower.authority_service",
    "securefkm.flower._registry",
    "securefkm.cli",
    "securefkm.bench",
    "securefkm.demo",
    "securefkm.plotting",
    "securefkm.estimators",
    "securefkm.datasets",
)


class WireError(SecureFKMError, ValueError):
    """A peer sent bytes that are not a securefkm protocol message."""


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that only builds data: containers, numpy arrays, securefkm message classes."""

    def find_class(self, module: str, name: str):
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if (module, name) in _SAFE_GLOBALS:
            return super().find_class(module, name)
        root = module.split(".")[0]
        if root in _CLASS_PACKAGES and not module.startswith(_DENIED_MODULES):
            obj = getattr(importlib.import_module(module), name.split(".")[0], None)
            for part in name.split(".")[1:]:
                obj = getattr(obj, part, None)
            if isinstance(obj, type):
                return obj
        raise WireError(f"refusing to unpickle {module}.{name}: not a securefkm message type")


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    """Unpickle a peer's message with :class:`RestrictedUnpickler`."""
    if not isinstance(data, (bytes, bytearray)):
        raise WireError(f"expected bytes, got {type(data).__name__}")
    try:
        return RestrictedUnpickler(io.BytesIO(data)).load()
    except WireError:
        raise
    except Exception as exc:  # truncated or garbled payload
        raise WireError(f"malformed securefkm message ({type(exc).__name__}: {exc})") from None
