"""Lazy imports: package exports, so that ``import securefkm`` / ``protocols`` / ``attacks``
stay fast (no scikit-learn, torch or Flower until a name that needs them is used), and
optional modules (the compiled loops, which need numba)."""

from __future__ import annotations

import functools
import importlib


@functools.cache
def optional_module(name: str):
    """Module ``name``, imported on first use, or None when it cannot be imported (an
    optional dependency missing); asked once per process."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def lazy_exports(package: str, exports: dict[str, str]):
    """``(__getattr__, __dir__, __all__)`` for a package whose names live in ``exports``
    (name -> module)."""
    names = sorted(exports)

    def __getattr__(name):
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return names

    return __getattr__, __dir__, names
