"""``python -m securefkm.flower._supernode [flower-supernode args]``: a SuperNode that polls faster.

Flower 1.41's SuperNode sleeps 3 s whenever the SuperLink has no message for it, so every
protocol stage waits on average 1.5 s (and up to 3 s) before the node even sees its
message. securefkm's rounds have up to six stages, so for local deployments, tests and
benchmarks :class:`~securefkm.flower.deploy.LocalDeployment` (``fast_poll=True``) starts
SuperNodes through this launcher, which caps those idle sleeps at
``SECUREFKM_SUPERNODE_POLL`` seconds (default 0.1; ``LocalDeployment`` sets it from its
``poll_interval``, which grows with the nodes per core) and otherwise runs Flower's own
``flower-supernode`` unchanged. It also starts :mod:`securefkm.flower._superexec` in place
of ``flower-superexec``, so ClientApp processes are forked from a warm server instead of
importing Flower and securefkm for every message (``SECUREFKM_WARM_CLIENTS=0`` turns that
off). It relies on Flower internals (the ``time`` and ``subprocess`` modules used by
``flwr.supernode.start_client_internal``), checked against flwr 1.41; production nodes can
use the plain ``flower-supernode`` command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time as _time


class _CappedTime:
    def __init__(self, cap: float):
        self._cap = cap

    def sleep(self, seconds: float) -> None:
        _time.sleep(min(seconds, self._cap))

    def __getattr__(self, name):
        return getattr(_time, name)


class _WarmSuperExecSubprocess:
    """``subprocess`` stand-in: launches securefkm's warm SuperExec for ``flower-superexec``."""

    def __init__(self, module):
        self._module = module

    def Popen(self, args, *a, **kw):  # noqa: N802 - mirrors subprocess.Popen
        if isinstance(args, (list, tuple)) and args and args[0] == "flower-superexec":
            args = [sys.executable, "-m", "securefkm.flower._superexec", *args[1:]]
        return self._module.Popen(args, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._module, name)


def main() -> int:
    import flwr.supernode.start_client_internal as internal
    from flwr.supernode.cli import flower_supernode

    cap = float(os.environ.get("SECUREFKM_SUPERNODE_POLL", "0.1"))
    if getattr(internal, "time", None) is _time:
        internal.time = _CappedTime(cap)
    if os.environ.get("SECUREFKM_WARM_CLIENTS", "1") != "0" and getattr(internal, "subprocess", None) is subprocess:
        internal.subprocess = _WarmSuperExecSubprocess(subprocess)
    sys.argv[0] = "flower-supernode"
    return flower_supernode()


if __name__ == "__main__":
    sys.exit(main())
