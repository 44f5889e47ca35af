"""Issue 19 in the Flower app: a round whose nodes drop below the threshold is retried and
the run goes on (the retry logic is the runtime's; the Flower transport only carries it)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from test_flower import (  # noqa: E402
    DEP_PARAMS,
    PARAMS,
    STAGE_TIMEOUT,
    _FakeGrid,
    _flower_env,  # noqa: F401  (autouse fixture: a private FLWR_HOME)
    clients,  # noqa: F401  (fixture)
    in_process,
    task_identity,  # noqa: F401  (fixture)
)

from securefkm.flower import _wire, clientapp  # noqa: E402
from securefkm.flower.deploy import LocalDeployment, descendants, write_client_csvs  # noqa: E402
from securefkm.flower.spec import RunSpec  # noqa: E402


class _SilentOnce(_FakeGrid):
    """A fake Grid whose listed nodes do not answer one (round attempt, stage), then recover."""

    def __init__(self, *a, silent=None, **k):
        super().__init__(*a, **k)
        self.silent = dict(silent or {})  # (global round, stage) -> node ids

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = m.object_id
            m.metadata.__dict__["_message_id"] = mid
            rec = m.content[_wire.RECORD_KEY]
            nid = m.metadata.dst_node_id
            if nid not in self.silent.get((rec["round"], rec["stage"]), ()):
                clientapp._FED_CACHE.clear()
                clientapp._DATA_CACHE.clear()
                self.replies[mid] = clientapp.handle_message(m, self.contexts[nid])
            ids.append(mid)
        return ids


def test_fake_grid_round_below_threshold_is_retried(tmp_path, clients, task_identity):  # noqa: F811
    """Three nodes, threshold 3: one node is silent at masked_input of round attempt 1, the
    attempt aborts, the round is retried with all three and the centres equal the in-process
    fit without dropouts."""
    from securefkm.flower.serverapp import run_federation

    spec = RunSpec("dwf", PARAMS, [{"name": "masking", "threshold": 3}], random_state=5)
    paths = [str(p) for p in write_client_csvs(clients, tmp_path)]
    node_ids = [900 - 37 * i for i in range(len(paths))]
    run_config = {"spec": spec.to_json(), "num-nodes": len(paths), "n-features": clients[0].shape[1]}
    grid = _SilentOnce(dict(zip(node_ids, paths)), run_config, silent={(1, "masked_input"): {node_ids[1]}})
    result = run_federation(grid, spec, n_nodes=len(paths), n_features=clients[0].shape[1],
                            stage_timeout=0.5, suspect_timeout=0.1, poll_interval=0.01)
    order = [node_ids.index(n) for n in result["node_ids"]]
    transcript = result["transcript"]
    (a,) = transcript.aborts
    assert (a.round, a.attempt, a.stage, a.cause) == (1, 0, "masked_input", "too_few_survivors")
    assert result["n_aborted_rounds"] == 1
    assert [(r.round, r.attempt, r.aborted is None) for r in transcript] == [
        (0, 0, True), (1, 0, False), (1, 1, True), (2, 0, True)]  # seeding, train (aborted, retried), train
    ref = in_process(spec, [clients[i] for i in order])
    np.testing.assert_array_equal(result["centres"], ref.cluster_centers_)


@pytest.mark.flower
@pytest.mark.slow
def test_deployment_round_with_a_paused_node_is_retried(clients, tmp_path):  # noqa: F811
    """Real processes on loopback: SuperNode 0 is paused (SIGSTOP) during round 1's masked
    input, so that round falls below the threshold of 3 and aborts; the node is resumed
    (SIGCONT) and the retried round completes with all three nodes."""
    paths = write_client_csvs(clients, tmp_path / "data")
    spec = RunSpec("dwf", DEP_PARAMS, [{"name": "masking", "threshold": 3}], random_state=6)
    paused: list[list[int]] = []
    timeout = min(STAGE_TIMEOUT, 20.0)

    def _signal_all(pids, sig):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    with LocalDeployment(paths, workdir=tmp_path / "flower",
                         env={"FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0"}) as dep:

        def on_progress(ev):
            if not paused and ev["event"] == "start" and ev["round"] == 1 and ev["stage"] == "masked_input":
                proc = dep.supernodes[0]
                pids = [proc.pid] + descendants(proc.pid)
                _signal_all(pids, signal.SIGSTOP)
                paused.append(pids)
            elif paused and ev["event"] == "start" and ev["round"] == 2:
                _signal_all(paused[0], signal.SIGCONT)

        t0 = time.perf_counter()
        try:
            result = dep.run(spec, stage_timeout=timeout, timeout=900, on_progress=on_progress)
        finally:
            if paused:
                _signal_all(paused[0], signal.SIGCONT)
        print(f"deployment with a paused node: {time.perf_counter() - t0:.1f} s")
        order = dep.client_order()
    assert paused
    (a,) = result.transcript.aborts
    assert (a.round, a.attempt, a.cause) == (1, 0, "too_few_survivors")
    done = [r for r in result.transcript if r.aborted is None]
    assert [(r.round, r.attempt) for r in done] == [(0, 0), (1, 1)] and len(done[-1].contributors) == 3
    ref = in_process(spec, [clients[i] for i in order])
    np.testing.assert_array_equal(result.centres, ref.cluster_centers_)
