"""What the server of a fit saw, in words, per protection layer: ``protection_report_``.

A stack's reprs say what the user declared; this report says what that declaration bought:
for each layer (and for the aggregator that actually ran, :class:`~securefkm.layers.PlainSum`
when the stack has none) what the server receives, and whom the guarantee trusts. It is
built from the layers' own :meth:`~securefkm.layers.Layer.server_view` statements and their
``report()`` facts (privacy spent, key sizes ...), so a layer that protects less than its
name suggests (central DP, an aggregator that lets set-fields through) says so here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LayerView:
    """One layer's part of the report."""

    layer: str  #: the layer's repr, as declared
    sees: str  #: what the server receives under this layer, in words
    trust: str  #: who must be trusted (and not collude) for the layer's guarantee
    facts: dict = field(default_factory=dict)  #: the layer's ``report()``

    def to_dict(self) -> dict:
        return {"layer": self.layer, "server_sees": self.sees, "trust": self.trust, **self.facts}


class ProtectionReport(Mapping):
    """Per-layer statements of a fit; a read-only mapping ``layer name -> dict``.

    ``report["GaussianDP"]["privacy_spent"]`` reads a layer's facts as before; each entry also
    holds ``server_sees`` and ``trust``. ``summary()`` is a table, ``to_dict()`` plain data.
    """

    def __init__(self, views: list[LayerView], names: list[str], plain_set_fields: str | None = None):
        self.views = list(views)
        self._by_name = dict(zip(names, self.views))
        #: what reaches the server in plain outside every layer (set-fields), or None
        self.plain_set_fields = plain_set_fields

    @classmethod
    def from_federation(cls, federation) -> ProtectionReport:
        algorithm, aggregator = federation.algorithm, federation.aggregator
        layers = list(federation.layers)
        if aggregator not in layers:  # PlainSum: the aggregator that actually ran
            layers.append(aggregator)
        views, names = [], []
        for layer in layers:
            sees, trust = layer.server_view(algorithm, aggregator)
            views.append(LayerView(repr(layer), sees, trust, dict(layer.report())))
            names.append(layer.name)
        plain = None
        if getattr(algorithm, "uses_set_fields", False):
            plain = (f"{getattr(algorithm, 'name', 'the algorithm')} sends each client's local centres and "
                     "sizes (set-fields) to the server in plain; only client-side layers (local noise, "
                     "rounding, suppression) change them")
        return cls(views, names, plain)

    # Mapping interface: the per-layer facts (backward compatible with the old dict)
    def __getitem__(self, name: str) -> dict:
        return self._by_name[name].to_dict()

    def __iter__(self):
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    @property
    def privacy_spent(self) -> tuple[float, float] | None:
        for view in self.views:
            spent = view.facts.get("privacy_spent")
            if spent is not None:
                return spent
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"layers": [v.to_dict() for v in self.views], "plain_set_fields": self.plain_set_fields,
                "privacy_spent": self.privacy_spent}

    def summary(self) -> str:
        """A table: one row per layer, what the server sees and whom it trusts."""
        rows = [(v.layer.split("(")[0], v.sees, v.trust) for v in self.views]
        w = max(len(r[0]) for r in rows) if rows else 5
        lines = ["Protection report (what the server saw)", f"{'layer':<{w}}  server sees / trust"]
        for name, sees, trust in rows:
            lines.append(f"{name:<{w}}  sees:  {sees}")
            lines.append(f"{'':<{w}}  trust: {trust}")
        if self.plain_set_fields:
            lines.append(f"{'(plain)':<{w}}  {self.plain_set_fields}")
        spent = self.privacy_spent
        if spent is not None:
            lines.append(f"{'(DP)':<{w}}  privacy spent: epsilon={spent[0]:.4g}, delta={spent[1]:.3g}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        """One line: each layer with what the server sees under it, in a few words."""
        parts = [f"{v.layer.split('(')[0]}: {_gist(v.sees)}" for v in self.views]
        spent = self.privacy_spent
        tail = f"; epsilon={spent[0]:.3g}" if spent is not None else ""
        plain = "; set-fields in plain" if self.plain_set_fields else ""
        return f"ProtectionReport({'; '.join(parts)}{plain}{tail})"


def _gist(sees: str, width: int = 60) -> str:
    """The head of a layer's ``sees`` statement (up to its first parenthesis, colon or
    semicolon), with a warning kept when the statement carries one ("AND ...", INSECURE)."""
    head = sees
    for stop in (" (", ":", ";", ", and "):
        head = head.split(stop, 1)[0]
    head = head.strip().rstrip(",")
    if len(head) > width:
        head = head[: width - 3].rstrip() + "..."
    if "INSECURE" in sees:
        head += " [INSECURE threshold]"
    return head
