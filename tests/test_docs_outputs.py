"""Outputs shown in the docs are what the code prints.

A line of a ```python block of the form ``<expression>   # -> <shown output>`` is checked:
the page's blocks run in order in one namespace (as in ``tests/test_docs.py``), and at that
line the expression's ``repr`` must match the shown text, where ``...`` stands for any
characters (digits that may vary). A tuple may be shown without its outer parentheses.
Pages with a ``slow`` or ``sketch`` block are not checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from test_docs import PAGES, ROOT, python_blocks

_SHOWN = re.compile(r"^(?P<expr>[^#\s][^#]*?)\s+#\s*->\s*(?P<shown>.+?)\s*$")


def _checked_pages():
    out = []
    for page in PAGES:
        blocks = python_blocks(page)
        if any(m is not None for m, _, _ in blocks):
            continue
        if any(_SHOWN.match(line) for _, src, _ in blocks for line in src.splitlines()):
            out.append(pytest.param(page, id=str(page.relative_to(ROOT))))
    return out


def matches(shown: str, value) -> bool:
    pattern = ".*".join(re.escape(part) for part in shown.split("...")) + r"\Z"
    texts = [repr(value)]
    if isinstance(value, tuple):
        texts.append(", ".join(repr(v) for v in value))
    return any(re.match(pattern, t, re.S) for t in texts)


def test_matches():
    assert matches("(0.9999..., 1e-05), (-2.0, 4.0)", ((0.999999999999, 1e-05), (-2.0, 4.0)))
    assert not matches("(0.995..., 1e-05), (-2.0, 4.0)", ((0.999999999999, 1e-05), (-2.0, 4.0)))
    assert matches("0.0266..., 0.666...", (0.02666666666666667, 0.6666666666666666))


@pytest.mark.parametrize("page", _checked_pages())
def test_shown_outputs_are_what_the_code_prints(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__docs__"}
    checked = 0
    for _marker, source, first in python_blocks(page):
        lines = source.splitlines()
        start = 0
        for i, line in enumerate(lines):
            m = _SHOWN.match(line)
            if m is None:
                continue
            before = "\n" * (first + start) + "\n".join(lines[start:i])
            exec(compile(before, str(page), "exec"), namespace)
            value = eval(compile(m.group("expr"), f"{page}:{first + i + 1}", "eval"), namespace)
            assert matches(m.group("shown"), value), (
                f"{page.relative_to(ROOT)}:{first + i + 1}: shows {m.group('shown')!r}, the code gives {value!r}")
            checked += 1
            start = i + 1
        exec(compile("\n" * (first + start) + "\n".join(lines[start:]), str(page), "exec"), namespace)
    assert checked
