"""The by-hand deployment walk-throughs of docs/deployment.md run as written (bash, loopback).

Each block is run from a fresh directory with a trap that stops every process it started,
also on failure; it must print the fitted centres and no client error.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("flwr")

PAGE = Path(__file__).resolve().parents[1] / "docs" / "deployment.md"


def walkthrough(heading: str) -> str:
    text = PAGE.read_text()
    start = text.index(heading)
    m = re.compile(r"```bash\n(.*?)\n```", re.S).search(text, start)
    return m.group(1)


def _run(script: str, tmp_path, timeout: float):
    if shutil.which("flower-superlink") is None:
        pytest.skip("flower-superlink is not on PATH")
    env = {**os.environ, "HOME": str(tmp_path)}
    # stop what the walk-through started, however it ends (its own last line does the same)
    guarded = "trap 'kill $(jobs -p) 2>/dev/null; wait' EXIT\nset -e\n" + script
    proc = subprocess.run(["bash", "-c", guarded], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.flower
@pytest.mark.slow  # about 5 minutes on 2 busy cores
def test_masking_walkthrough_runs_as_written(tmp_path):
    out = _run(walkthrough("## By hand, step by step"), tmp_path, timeout=300)
    assert re.search(r"\[\[\s*-?\d", out), out[-2000:]  # the centres
    assert out.rstrip().endswith("{}"), out[-2000:]  # no client errors


@pytest.mark.flower
@pytest.mark.slow
def test_paillier_walkthrough_runs_as_written(tmp_path):
    out = _run(walkthrough("### Paillier by hand"), tmp_path, timeout=600)
    assert re.search(r"\[\[\s*-?\d", out) and "{}" in out, out[-2000:]
