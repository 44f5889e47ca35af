"""Computed epsilons kept on disk across processes: the file I/O of the accountant's memo.

A deployed client starts a fresh process per message and would otherwise import torch and
re-run the same calibration every time, so :mod:`protocols.dp.accounting` looks each
opacus result up here before computing it and stores it after. The table is one JSON file,
``dp-epsilons.json`` under ``SECUREFKM_CACHE_DIR`` (default ``~/.cache/securefkm``), keyed by
a string the caller makes (its inputs and the opacus version). A missing, corrupt or
unwritable file is ignored: a miss, and the value is computed again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_path() -> Path:
    """The table's file (``SECUREFKM_CACHE_DIR``, default ``~/.cache/securefkm``)."""
    root = os.environ.get("SECUREFKM_CACHE_DIR") or Path.home() / ".cache" / "securefkm"
    return Path(root) / "dp-epsilons.json"


def _read(path: Path) -> dict:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return table if isinstance(table, dict) else {}


def lookup(key: str) -> float | None:
    """The stored value of ``key``, or None (no file, no entry, or not a number)."""
    cached = _read(cache_path()).get(key)
    return float(cached) if isinstance(cached, (int, float)) else None


def store(key: str, value: float) -> None:
    """Add ``key: value`` to the table (atomically: concurrent processes never read a half
    file); an unwritable cache is ignored."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        table = _read(path)
        table[key] = value
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table))
        os.replace(tmp, path)
    except OSError:
        pass
