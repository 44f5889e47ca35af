"""The federation runtime: rounds, sampling, dropouts, convergence, transcript."""

from .client import ClientRuntime, UpdateReply, UpdateRequest
from .client_policy import SILENT, ClientPolicy, PolicyContext, Refusal
from .convergence import frobenius_movement, has_converged
from .runtime import Federation, LocalTransport, ServerPolicy, StreamedRuntimes, Transport, clone_layers
from .sampling import Dropouts, sample_clients

__all__ = [
    "ClientPolicy",
    "ClientRuntime",
    "Dropouts",
    "Federation",
    "LocalTransport",
    "StreamedRuntimes",
    "PolicyContext",
    "Refusal",
    "SILENT",
    "ServerPolicy",
    "Transport",
    "UpdateReply",
    "UpdateRequest",
    "clone_layers",
    "frobenius_movement",
    "has_converged",
    "sample_clients",
]
