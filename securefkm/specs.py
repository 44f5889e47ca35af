"""Text specs of protection stacks, one grammar for the CLI and Python.

    "masking"                                   one layer by name
    "dp:epsilon=1:delta=1e-5:clip=2,masking"    a stack: layers split on ',', parameters on ':'
    ["dp:epsilon=1,delta=1e-5", "masking"]      a list: one layer per item, parameters split on
                                                ':' or ','
    '[{"name": "masking"}]'                     a JSON list of dicts

Values are JSON where they parse (``bounds=[-2,2]``, ``1e-5``, ``true``), else strings.
:func:`securefkm.registry.make_protection` turns the resulting dicts into layer objects.
"""

from __future__ import annotations

import json

from .exceptions import InputError


def split_top(text: str, seps: str) -> list[str]:
    """Split on any of ``seps`` outside brackets, so JSON values like bounds=[-2,2] stay whole."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += 1 if ch in "[{(" else (-1 if ch in "]})" else 0)
        if ch in seps and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def parse_kv(text: str) -> tuple[str, object]:
    """'key=value' -> (key with '-' as '_', JSON value or the raw string)."""
    if "=" not in text:
        raise InputError(f"expected key=value, got {text!r} (e.g. 'epsilon=1').")
    key, value = text.split("=", 1)
    try:
        value = json.loads(value)
    except json.JSONDecodeError:
        pass
    return key.strip().replace("-", "_"), value


def parse_layer(text: str, param_seps: str = ":") -> dict:
    """One layer spec 'name:key=value:...' -> {"name": name, key: value, ...}."""
    name, *params = split_top(text.strip(), param_seps)
    spec: dict = {"name": name.strip()}
    for p in params:
        if p.strip():
            k, v = parse_kv(p)
            spec[k] = v
    return spec


def parse_protection(text: str) -> list[dict]:
    """A whole stack as text (the CLI's ``--protection``): see the module docstring."""
    text = text.strip()
    if not text or text == "none":
        return []
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"protection {text!r} is not a valid JSON list ({exc}).") from None
    return [parse_layer(part) for part in split_top(text, ",")]


class LayerSpec(dict):
    """One protection layer spec in its one normal form: a dict ``{"name": ..., **params}``.

    :meth:`of` takes any spelling the library accepts for a layer spec -- a bare name
    (``"masking"``), a text spec (``"dp:epsilon=1:delta=1e-5"``) or a dict -- so code that
    asks "is this the DP layer, and what is its epsilon?" asks ``spec.name == "dp"`` and
    ``spec.get("epsilon")`` once instead of testing every spelling. It is a dict, so it
    serialises (JSON, a RunSpec) and builds layers (:func:`securefkm.registry.make_protection`)
    exactly as the dict it normalises.
    """

    @classmethod
    def of(cls, spec) -> LayerSpec:
        if isinstance(spec, LayerSpec):
            return spec
        if isinstance(spec, str):
            text = spec.strip()
            return cls(parse_layer(text, param_seps=":,") if (":" in text or "=" in text) else {"name": text})
        if isinstance(spec, dict):
            if not isinstance(spec.get("name"), str):
                raise InputError(f"a layer spec dict needs a 'name', got {spec!r} (e.g. {{'name': 'masking'}}).")
            return cls(spec)
        raise InputError(f"a layer spec is a name, a text spec or a dict, got {type(spec).__name__}.")

    @property
    def name(self) -> str:
        return self["name"]


def layer_specs(protection) -> list[LayerSpec]:
    """Every layer spec of ``protection`` (one text stack, or a list of specs) in normal form;
    layer objects are not specs and are refused (use them directly)."""
    if protection is None:
        return []
    if isinstance(protection, str):
        return [LayerSpec(p) for p in parse_protection(protection)]
    return [LayerSpec.of(p) for p in protection]


def find_layer(protection, name: str) -> LayerSpec | None:
    """The first spec of layer ``name`` in ``protection``, or None."""
    return next((s for s in layer_specs(protection) if s.name == name), None)
