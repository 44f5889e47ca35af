"""The checkpoint codec under its flower name: :mod:`securefkm._codec` (the transcript file
uses it too, so it lives in the core package)."""

from .._codec import StateCodecError, classes, dumps, loads  # noqa: F401
