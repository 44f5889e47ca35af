"""The capability table: generated from the code, shown by the CLI and the docs, complete."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from securefkm.capabilities import STACKS, capability_table, to_markdown
from securefkm.registry import ALGORITHMS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "algorithms" / "capabilities.md"


def test_every_algorithm_runs_under_every_stack():
    """No cell is "no": every algorithm runs under every protection, in its secure mode where
    the default mode sends set-fields; the set-valued ones say why."""
    table = capability_table()
    assert list(table) == list(ALGORITHMS)
    for name, row in table.items():
        assert list(row) == list(STACKS)
        for stack, cell in row.items():
            assert cell.status in ("yes", "secure_mode=True"), (name, stack, cell)
            if cell.status != "yes":
                assert "set-fields" in cell.reason
    for name in ("dwf", "ewf", "minibatch", "fcm-fedavg"):
        assert all(c.status == "yes" for c in table[name].values())
    for name in ("aligning", "kfed", "child-parent", "fcm"):
        assert table[name]["masking"].status == "secure_mode=True"
        assert table[name]["participation cap"].status == "yes"


def test_docs_page_is_the_generated_table():
    text = PAGE.read_text()
    start, end = "<!-- capability-table:start -->\n", "<!-- capability-table:end -->"
    shown = text[text.index(start) + len(start):text.index(end)]
    assert shown == to_markdown(), "regenerate docs/algorithms/capabilities.md from securefkm.capabilities.to_markdown()"


def test_cli_prints_it():
    out = subprocess.run([sys.executable, "-c", "import sys; from securefkm.cli import main; sys.exit(main([\"algorithms\"]))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == to_markdown()
