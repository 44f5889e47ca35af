"""Whether numba is imported after a small and after a large piece of work, each run in a
fresh interpreter (the tests that small fits never pay numba's import or compilation)."""

from __future__ import annotations

import subprocess
import sys


def numba_imported(small: str, large: str) -> list[str]:
    """Run ``small`` then ``large`` (Python source, ``np`` and ``rng`` defined) in a fresh
    interpreter; ["False", "True"] when only the large work imported numba."""
    code = (
        "import sys, numpy as np\n"
        "rng = np.random.default_rng(0)\n"
        f"{small}\n"
        "small = 'numba' in sys.modules\n"
        f"{large}\n"
        "print(small, 'numba' in sys.modules)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
