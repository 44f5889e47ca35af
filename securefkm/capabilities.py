"""Which protection each algorithm runs under, read from the code itself.

:func:`capability_table` builds, for every registered algorithm and every protection stack of
:data:`STACKS`, the federation a fit would run (:meth:`FederatedClusterer.make_federation` on a
few synthetic records: the same stack validation, DP setup and planning, no round run) and
records what happened: ``"yes"``; ``"secure_mode=True"`` when the algorithm's default mode is
refused and its secure (sum-only) mode is accepted; or ``"no"`` with the library's reason.
``securefkm algorithms`` prints it, and docs/algorithms/capabilities.md holds it (a docs test
checks that the page equals what this module generates).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .exceptions import InputError

_BOX = (-2.0, 2.0)


def _dp(mode):
    from protocols.dp import GaussianDP

    return GaussianDP(1.0, 1e-5, bounds=_BOX, mode=mode)


#: column name -> the protection list it tries (built fresh for every cell)
STACKS = {
    "masking": lambda: ["masking"],
    "paillier": lambda: ["paillier"],
    "DP central": lambda: [_dp("central")],
    "DP distributed + masking": lambda: [_dp("distributed"), "masking"],
    "DP distributed + Paillier": lambda: [_dp("distributed"), "paillier"],
    "DP local": lambda: [_dp("local")],
    "rounding + masking": lambda: [{"name": "rounding", "decimals": 2}, "masking"],
    "participation cap": lambda: [{"name": "cap", "max_rounds": 50}],
    "min cluster size": lambda: ["min-cluster"],
}


@dataclass(frozen=True)
class Cell:
    """One algorithm under one stack: ``status`` "yes", "secure_mode=True" or "no", and why."""

    status: str
    reason: str = ""


def _records() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.uniform(-1.0, 1.0, (20, 2)) for _ in range(4)]


def _accepts(name: str, protection, **params) -> str | None:
    """None if a fit of ``name`` under ``protection`` is set up, else the library's reason."""
    from .registry import make_estimator

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make_estimator(name, n_clusters=2, protection=protection, crypto="ideal", init_bounds=_BOX,
                           random_state=0, **params).make_federation(_records())
    except InputError as exc:
        return str(exc).split(". ")[0].split("; ")[0]
    return None


def cell(name: str, stack: str) -> Cell:
    """What :func:`capability_table` reports for algorithm ``name`` under ``stack``."""
    from .registry import estimator_class

    why = _accepts(name, STACKS[stack]())
    if why is None:
        return Cell("yes")
    import inspect

    cls, _ = estimator_class(name)
    if "secure_mode" in inspect.signature(cls).parameters and _accepts(name, STACKS[stack](), secure_mode=True) is None:
        return Cell("secure_mode=True", why)
    return Cell("no", why)


def capability_table() -> dict[str, dict[str, Cell]]:
    """``{algorithm: {stack: Cell}}`` for every registered algorithm and every stack."""
    from .registry import ALGORITHMS

    return {name: {stack: cell(name, stack) for stack in STACKS} for name in ALGORITHMS}


def to_markdown(table: dict[str, dict[str, Cell]] | None = None) -> str:
    """The table as markdown: one row per algorithm, then the reasons of the cells that are not "yes"."""
    from .registry import ALGORITHM_HELP

    table = capability_table() if table is None else table
    stacks = list(STACKS)
    lines = ["| algorithm | " + " | ".join(stacks) + " |", "|---|" + "---|" * len(stacks)]
    for name, row in table.items():
        lines.append(f"| `{name}` | " + " | ".join(row[s].status for s in stacks) + " |")
    lines.append("")
    lines.append("`secure_mode=True`: the default mode is refused and the algorithm's secure (sum-only) mode runs "
                 "(``securefkm.estimators``, each estimator's ``secure_mode``). Why the default mode is refused:")
    lines.append("")
    for name, row in table.items():
        reasons: dict[str, list[str]] = {}
        for s in stacks:
            c = row[s]
            if c.status != "yes":
                reasons.setdefault(_generic(c.reason), []).append(s)
        for why, where in reasons.items():
            lines.append(f"- `{name}` ({ALGORITHM_HELP.get(name, name)}), {', '.join(where)}: {why}.")
    return "\n".join(lines) + "\n"


def _generic(reason: str) -> str:
    """One reason for the stacks that share it (the layer or mode named in it left out)."""
    import re

    reason = re.sub(r"^(PairwiseMasking|Paillier) hides only sum-fields, but ", "a secure aggregator hides only "
                    "sum-fields, but ", reason)
    reason = re.sub(r"they would reach the server in plain while the fit reported \w+ as its protection",
                    "they would reach the server in plain", reason)
    return re.sub(r"GaussianDP\(mode='\w+'\)", "GaussianDP", reason)
