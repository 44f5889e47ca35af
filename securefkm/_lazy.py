"""Lazy package exports: ``import securefkm`` / ``protocols`` / ``attacks`` stay fast (no
scikit-learn, torch or Flower until a name that needs them is used)."""

from __future__ import annotations

import importlib


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
