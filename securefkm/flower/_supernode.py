"""``python -m securefkm.flower._supernode [flower-supernode args]``: a SuperNode that polls faster.

Flower 1.41's SuperNode sleeps 3 s whenever the SuperLink has no message for it, so every
protocol stage waits on average 1.5 s (and up to 3 s) before the node even sees its
message. securefkm's rounds have up to five stages, so for local deployments, tests and
benchmarks :class:`~securefkm.flower.deploy.LocalDeployment` (``fast_poll=True``) starts
SuperNodes through this launcher, which caps those idle sleeps at
``SECUREFKM_SUPERNODE_POLL`` seconds (default 0.1) and otherwise runs Flower's own
``flower-supernode`` unchanged. It relies on a Flower internal (the ``time`` module used by
``flwr.supernode.start_client_internal``), checked against flwr 1.41; production nodes can
use the plain ``flower-supernode`` command.
"""

from __future__ import annotations

import os
import sys
import time as _time


class _CappedTime:
    def __init__(self, cap: float):
        self._cap = cap

    def sleep(self, seconds: float) -> None:
        _time.sleep(min(seconds, self._cap))

    def __getattr__(self, name):
        return getattr(_time, name)


def main() -> int:
    import flwr.supernode.start_client_internal as internal
    from flwr.supernode.cli import flower_supernode

    cap = float(os.environ.get("SECUREFKM_SUPERNODE_POLL", "0.1"))
    if getattr(internal, "time", None) is _time:
        internal.time = _CappedTime(cap)
    sys.argv[0] = "flower-supernode"
    return flower_supernode()


if __name__ == "__main__":
    sys.exit(main())
