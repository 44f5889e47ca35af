"""The docs: every Python block in README.md and docs/ runs as written, and the site builds.

Blocks of one page run in order in one namespace (a later block may use an earlier one's
names), in a temporary directory. Conventions, an HTML comment on the line just before the
opening fence (invisible on the site and on GitHub):

* ``<!-- docs-test: sketch -->`` -- not meant to run (needs a deployment, a user's files, or
  shows a signature); skipped, and the page says so in its text;
* ``<!-- docs-test: slow -->`` -- runs only with ``pytest -m slow``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"(?:<!--\s*docs-test:\s*(\w+)\s*-->\s*\n)?```python[^\n]*\n(.*?)\n```", re.S)


def python_blocks(path: Path) -> list[tuple[str | None, str, int]]:
    """(marker or None, source, line number) of each ```python block of a Markdown page."""
    text = path.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in _FENCE.finditer(text)]


def _pages(slow: bool):
    out = []
    for page in PAGES:
        blocks = [b for b in python_blocks(page) if b[0] != "sketch"]
        if blocks and any(b[0] == "slow" for b in blocks) == slow:
            out.append(pytest.param(page, id=str(page.relative_to(ROOT)),
                                    marks=[pytest.mark.slow] if slow else []))
    return out


def _run_page(page: Path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict = {"__name__": "__docs__"}
    for marker, source, line in python_blocks(page):
        if marker == "sketch":
            continue
        code = compile("\n" * (line) + source, str(page), "exec")  # tracebacks point at the page's lines
        exec(code, namespace)


@pytest.mark.parametrize("page", _pages(slow=False))
def test_docs_python_blocks_run(page, tmp_path, monkeypatch):
    _run_page(page, tmp_path, monkeypatch)


@pytest.mark.parametrize("page", _pages(slow=True))
def test_docs_python_blocks_run_slow(page, tmp_path, monkeypatch):
    _run_page(page, tmp_path, monkeypatch)


def test_every_block_is_run_or_marked():
    for page in PAGES:
        for marker, _source, line in python_blocks(page):
            assert marker in (None, "sketch", "slow"), f"{page}:{line}: unknown docs-test marker {marker!r}"


def test_mkdocs_build_strict(tmp_path):
    if shutil.which("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings-python is not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "estimators" / "index.html").exists()
