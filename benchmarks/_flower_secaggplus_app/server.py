"""ServerApp of the SecAgg+ benchmark app: FedAvg over Flower's ``SecAggPlusWorkflow``, timed per round.

Run config keys: see ``pyproject.toml`` next to this module. With ``poll-interval > 0`` the
Grid's ``send_and_receive`` polls the SuperLink at that interval instead of Flower's fixed
3 s (same push/pull calls, only the sleep differs), so Flower's protocol is timed with the
same polling as securefkm's ``FlowerTransport``.
"""

from __future__ import annotations

import json
import os
import time
import traceback

from flwr.serverapp import ServerApp

from benchmarks.protocols_secaggplus import secaggplus_server_main

app = ServerApp()


class PolledGrid:
    """Forwards everything to ``grid``; ``send_and_receive`` polls every ``interval`` seconds."""

    def __init__(self, grid, interval: float):
        self._grid = grid
        self._interval = float(interval)

    def __getattr__(self, name):
        return getattr(self._grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        pending = set(self._grid.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        out = []
        while pending:
            got = list(self._grid.pull_messages(pending))
            out.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            if not pending or (end is not None and time.monotonic() >= end):
                break
            time.sleep(self._interval)
        return out


def _write(path: str, result: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, path)


@app.main()
def main(grid, context) -> None:
    cfg = context.run_config
    result_path = str(cfg.get("result-path", "") or "")
    poll = float(cfg.get("poll-interval", 0.0))
    timings: list = []
    t0 = time.perf_counter()
    try:
        secaggplus_server_main(
            PolledGrid(grid, poll) if poll > 0 else grid,
            context,
            n=int(cfg["num-nodes"]),
            length=int(cfg["length"]),
            num_shares=int(cfg["num-shares"]),
            threshold=int(cfg["reconstruction-threshold"]),
            num_rounds=int(cfg["num-rounds"]),
            timings=timings,
            timeout=float(cfg.get("stage-timeout", 300.0)),
        )
    except Exception as exc:
        if result_path:
            _write(result_path, {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        raise
    if result_path:
        _write(result_path, {
            "ok": True,
            "rounds_s": [t for t in timings if isinstance(t, float)],
            "rounds_cpu_s": [t[1] for t in timings if isinstance(t, tuple) and t[0] == "cpu"],
            "rounds_wall": [list(t[1:]) for t in timings if isinstance(t, tuple) and t[0] == "wall"],
            "max_error": next((t[1] for t in timings if isinstance(t, tuple) and t[0] == "max_error"), None),
            "total_s": time.perf_counter() - t0,
            "node_ids": sorted(int(n) for n in grid.get_node_ids()),
        })
