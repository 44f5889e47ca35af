"""The securefkm ServerApp: the federation runtime driving Flower SuperNodes.

The ServerApp reads the run spec from the run config, waits until ``num-nodes`` SuperNodes
are connected, maps their sorted node ids to client ids ``0..n-1`` and runs the very same
:class:`~securefkm.federation.Federation` as an in-process fit, with a
:class:`~securefkm.flower.transport.FlowerTransport` instead of the in-process transport.
A round attempt whose nodes drop below the aggregator's threshold aborts and is retried by
the federation runtime (``max_aborted_rounds`` in the spec's params; docs/aborted-rounds.md).
The result (centres, transcript, privacy spent, aborted attempts, per-stage timings, the
errors clients reported) is written to the run config's ``result-path`` if one is given, in the
checkpoint's code-free format (:mod:`securefkm.flower._state_codec`).

Run config keys: :class:`~securefkm.flower.run_config.RunConfig` (each field is a key, with
'-' for '_'; its defaults are those of ``securefkm/flower/app/pyproject.toml``).

Paillier and masking with ``sign_keys=True`` need provisioned node identities
(:mod:`securefkm.flower.provision`): the ServerApp first runs one ``identify`` exchange in
which every SuperNode proves which directory key it holds (and, for Paillier, receives the
authority's signed public bundle), then maps client ``i`` to the node holding the
directory's ``i``-th key; Paillier decryptions go to the separate authority service
(:class:`~securefkm.flower.authority_client.RemoteAuthority`).
"""

from __future__ import annotations

import logging
import os
import time
import traceback

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ..exceptions import InputError
from ..federation import ServerPolicy
from ..protection_report import ProtectionReport
from .spec import RunSpec, build_federation
from .transport import FlowerTransport

log = logging.getLogger("securefkm.flower")

app = ServerApp()


def wait_for_nodes(grid, n_nodes: int, timeout: float, poll: float = 0.2) -> list[int]:
    """Sorted ids of exactly ``n_nodes`` connected SuperNodes, waiting up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        ids = sorted(int(n) for n in grid.get_node_ids())
        if len(ids) >= n_nodes or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    if len(ids) < n_nodes:
        raise InputError(
            f"only {len(ids)} of num-nodes={n_nodes} SuperNodes connected within {timeout:.0f} s; "
            "start the missing nodes or lower num-nodes."
        )
    if len(ids) > n_nodes:
        raise InputError(
            f"{len(ids)} SuperNodes are connected but num-nodes={n_nodes}; every connected node "
            "is a client, so set num-nodes to the number of nodes (or stop the extra ones)."
        )
    return ids


def identify_nodes(grid, node_ids, directory, *, bundle=None, stage_timeout: float = 60.0,
                   suspect_timeout: float = 3.0, poll_interval: float = 0.05, progress_path: str | None = None,
                   min_nodes: int | None = None):
    """One ``identify`` exchange: ``(client_nodes, timings)``, ``client_nodes[i]`` = node holding key ``i``.

    Each node gets a fresh challenge, its node id, the directory digest and (Paillier) the
    authority's signed bundle, and answers with the client id of its key in its own
    directory and an Ed25519 signature over all of it.

    Enrolment dropouts: a node that does not answer in time (it disappeared) is left out --
    ``client_nodes[i]`` is ``None`` for each directory entry no node proved to hold -- as
    long as at least ``min_nodes`` (default: all) identified; otherwise :class:`InputError`
    names the missing entries. A node that *answers* wrongly (refusal, bad signature, a
    taken client id) always stops the run: that is misconfiguration or an attack, not a dropout.
    """
    from .provision import IDENTIFY_STAGE, identify_payload, new_challenge, verify_identify

    probe = FlowerTransport(grid, node_ids, stage_timeout=stage_timeout, suspect_timeout=suspect_timeout,
                            poll_interval=poll_interval, progress_path=progress_path)
    challenge = new_challenge()
    fp = b"" if bundle is None else bundle.fingerprint
    messages = {
        c: {"challenge": challenge, "node_id": nid, "directory_digest": directory.digest, "bundle": bundle}
        for c, nid in probe.node_of.items()
    }
    replies, refused = probe.exchange(IDENTIFY_STAGE, messages)
    owner: dict[int, int] = {}
    problems: list[str] = []
    silent: list[int] = []
    for c, nid in probe.node_of.items():
        if c in refused:
            problems.append(f"node {nid} refused: {refused[c]}")
            continue
        if c not in replies:
            silent.append(nid)
            continue
        r = replies[c]
        cid = r.get("client_id") if isinstance(r, dict) else None
        sig = r.get("signature") if isinstance(r, dict) else None
        if not isinstance(cid, int) or not 0 <= cid < len(directory) or not isinstance(sig, bytes):
            problems.append(f"node {nid} sent a malformed identify reply")
        elif not verify_identify(directory.nodes[cid], sig, identify_payload(challenge, nid, cid, directory.digest, fp)):
            problems.append(f"node {nid} claims client {cid} ({directory.names[cid]}) but its signature does not verify")
        elif cid in owner:
            problems.append(f"nodes {owner[cid]} and {nid} both hold client {cid}'s key ({directory.names[cid]})")
        else:
            owner[cid] = nid
    missing = [i for i in range(len(directory)) if i not in owner]
    need = len(directory) if min_nodes is None else int(min_nodes)
    if problems or len(owner) < need:
        raise InputError(
            "node identification failed: "
            + (f"only {len(owner)} of {len(directory)} nodes identified, the run needs at least {need} "
               f"(run config 'min-nodes'); " if len(owner) < need else "")
            + (f"no node proved to hold the key of {[directory.names[i] for i in missing]}; " if missing else "")
            + "; ".join(problems + [f"node {n} did not answer within {stage_timeout:.0f} s" for n in silent])
            + ". Check every SuperNode's node config 'identity-key' / 'directory' (the same directory as "
            "the run config's) and that num-nodes equals the number of directory nodes."
        )
    if missing:
        log.warning("enrolment: %s did not identify (nodes %s silent); left out of the run, %d of %d remain",
                    [directory.names[i] for i in missing], silent, len(owner), len(directory))
    return [owner.get(i) for i in range(len(directory))], list(probe.timings)


class LeftOutPolicy(ServerPolicy):
    """The honest policy, minus the clients left out at enrolment: they are never sampled,
    so each round's protocol (e.g. the masking threshold) is planned for the nodes present."""

    def __init__(self, left_out):
        self.left_out = frozenset(left_out)

    def plan(self, state, round, broadcast, sampled, n_clients):
        return super().plan(state, round, broadcast, tuple(c for c in sampled if c not in self.left_out), n_clients)


def default_min_nodes(spec: RunSpec) -> int:
    """The fewest identified nodes a run starts with: 2, or Paillier's ``min_clients`` if larger."""
    from ..specs import find_layer

    paillier = find_layer(spec.protection, "paillier")
    return max(2, int(paillier.get("min_clients", 2))) if paillier is not None else 2


def server_provisioning(spec: RunSpec, directory, authority_url, tls: dict | None = None):
    """The ServerApp's :class:`ServerProvisioning` for ``spec`` (None if it needs none)."""
    needs = spec.requirements()
    if not needs.identity:
        return None
    from .provision import (
        RUN_AUTHORITY_URL,
        RUN_DIRECTORY,
        ServerProvisioning,
        directory_from_config,
    )

    if not directory:
        raise InputError(
            f"this spec's protection (Paillier or masking sign_keys=True) needs node identities: set the run "
            f"config {RUN_DIRECTORY!r} to the provisioned directory.json (path or JSON text; "
            "`securefkm provision directory`, docs/deployment.md)."
        )
    d = directory_from_config(directory, f"run config {RUN_DIRECTORY!r}")
    authority = helper = None
    if needs.authority:
        if not authority_url:
            raise InputError(
                f"protection {'validated' if needs.helper else 'paillier'!r} needs the key authority service: set "
                f"the run config {RUN_AUTHORITY_URL!r} to its address, e.g. 'http://127.0.0.1:8471' "
                "(`securefkm authority serve`, docs/deployment.md)."
            )
        from ..specs import find_layer
        from .authority_client import RemoteAuthority, RemoteHelper

        tls = tls or {}
        files = {"ca": tls.get("ca"), "cert": tls.get("cert"), "key": tls.get("key")}
        if find_layer(spec.protection, "paillier") is not None:
            authority = RemoteAuthority(authority_url, d, **files)
            authority.public_bundle()  # fail now, with the reason, if unreachable or not the pinned authority
        if needs.helper:
            helper = RemoteHelper(authority_url, d, **files)
            helper.public_bundle()  # the same checks, for the Helper's session
    return ServerProvisioning(d, authority, helper)


def run_federation(grid, spec: RunSpec, *, n_nodes: int, n_features: int, stage_timeout: float = 60.0,
                   suspect_timeout: float = 3.0, node_wait_timeout: float = 120.0,
                   poll_interval: float = 0.05, progress_path: str | None = None,
                   directory=None, authority_url: str | None = None, authority_tls: dict | None = None,
                   min_nodes: int | None = None, checkpoint_path: str | None = None,
                   checkpoint_key: str | None = None) -> dict:
    """Run the spec's fit over the Grid and return the result dict (see module docstring).

    A Paillier run holds one session of the key authority (fresh keys); it is ended --
    the authority destroys that private key -- when the run ends, however it ends.
    """
    checkpoint = None
    if checkpoint_path:  # a bad checkpoint is refused before any node is waited for
        from .checkpoint import Checkpoint

        checkpoint = Checkpoint(checkpoint_path, spec.to_json(), key_path=checkpoint_key)
    provisioning = server_provisioning(spec, directory, authority_url, authority_tls)
    try:
        return _run_federation(grid, spec, provisioning, n_nodes=n_nodes, n_features=n_features,
                               stage_timeout=stage_timeout, suspect_timeout=suspect_timeout,
                               node_wait_timeout=node_wait_timeout, poll_interval=poll_interval,
                               progress_path=progress_path, min_nodes=min_nodes, checkpoint=checkpoint)
    finally:
        for service in (() if provisioning is None else (provisioning.authority, provisioning.helper)):
            if service is None:
                continue
            try:
                service.end_session()
            except Exception as exc:  # the run's outcome matters more; the authority logs it too
                log.warning("could not end the key authority session: %s", exc)


def _run_federation(grid, spec, provisioning, *, n_nodes, n_features, stage_timeout, suspect_timeout,
                    node_wait_timeout, poll_interval, progress_path, min_nodes, checkpoint) -> dict:
    t0 = time.perf_counter()
    node_ids = wait_for_nodes(grid, n_nodes, node_wait_timeout)
    timings: list = []
    ordered = False
    if provisioning is not None:
        if len(provisioning.directory) != len(node_ids):
            raise InputError(
                f"the directory enrolls {len(provisioning.directory)} node(s) but num-nodes={len(node_ids)}; "
                "every SuperNode needs exactly one directory entry."
            )
        bundle = provisioning.authority.public_bundle() if provisioning.authority is not None else None
        node_ids, timings = identify_nodes(grid, node_ids, provisioning.directory, bundle=bundle,
                                           stage_timeout=stage_timeout, suspect_timeout=suspect_timeout,
                                           poll_interval=poll_interval, progress_path=progress_path,
                                           min_nodes=default_min_nodes(spec) if min_nodes is None else min_nodes)
        ordered = True
    transport = FlowerTransport(
        grid, node_ids, stage_timeout=stage_timeout, suspect_timeout=suspect_timeout,
        poll_interval=poll_interval, progress_path=progress_path, ordered=ordered,
    )
    transport.timings[:0] = timings
    policy = LeftOutPolicy(transport.left_out) if transport.left_out else None
    est, federation = build_federation(spec, len(node_ids), n_features, transport, provisioning=provisioning,
                                       server_policy=policy)
    t_rounds = time.perf_counter()
    if checkpoint is not None:
        from .checkpoint import run_rounds

        states = run_rounds(federation, checkpoint)
    else:
        states = [federation.run(r) for r in range(est._n_runs())]
    best = states[est._select_run(states)] if len(states) > 1 else states[0]
    return {
        "ok": True,
        "centres": best.centres,
        "n_iter": int(best.round),
        "federated_score": best.score,
        "transcript": federation.transcript,
        "privacy_spent": federation.privacy_spent(),
        # round attempts that aborted (nodes below the threshold ...) and were retried by the
        # runtime; each is in transcript.aborts with its cause (docs/aborted-rounds.md)
        "n_aborted_rounds": federation.n_aborted_rounds,
        "protection_report": ProtectionReport.from_federation(federation),
        "node_ids": list(transport.node_ids),  # node of client 0, 1, ...
        "errors": dict(transport.errors),
        "timings": list(transport.timings),
        "rounds_seconds": time.perf_counter() - t_rounds,
        "total_seconds": time.perf_counter() - t0,
        "spec": spec.to_json(),
        "run_id": None if checkpoint is None else checkpoint.run_id,
        "resumed_from": None if checkpoint is None else checkpoint.resumed_from,  # rounds done before a restart
    }


#: the result file's magic (the checkpoint's code-free format, no HMAC: the driver reads it)
RESULT_MAGIC = b"SFKM-RESULT/1\n"


def read_result(path) -> dict:
    """The result dict a ServerApp wrote to its ``result-path`` (never unpickled)."""
    from pathlib import Path

    from ._state_codec import StateCodecError, loads

    try:
        return loads(Path(path).read_bytes(), magic=RESULT_MAGIC)
    except StateCodecError as exc:
        raise InputError(f"result file {str(path)!r} is not a securefkm ServerApp result ({exc}).") from None


def _write_result(path: str, result: dict) -> None:
    from ._state_codec import dumps

    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(dumps(result, magic=RESULT_MAGIC))
    os.replace(tmp, path)


@app.main()
def main(grid: Grid, context: Context) -> None:
    from .run_config import RunConfig

    result_path = str(context.run_config.get("result-path", "") or "")
    try:
        cfg = RunConfig.from_flower(context.run_config)
        result = run_federation(
            grid,
            RunSpec.from_json(cfg.spec),
            n_nodes=cfg.num_nodes,
            n_features=cfg.n_features,
            stage_timeout=cfg.stage_timeout,
            suspect_timeout=cfg.suspect_timeout,
            node_wait_timeout=cfg.node_wait_timeout,
            poll_interval=cfg.poll_interval,
            progress_path=cfg.or_none("progress_path"),
            directory=cfg.or_none("directory"),
            authority_url=cfg.or_none("authority_url"),
            authority_tls={k: cfg.or_none(f"authority_{k}") for k in ("ca", "cert", "key")},
            min_nodes=cfg.or_none("min_nodes"),
            checkpoint_path=cfg.or_none("checkpoint_path"),
            checkpoint_key=cfg.or_none("checkpoint_key"),
        )
    except Exception as exc:
        log.error("securefkm run failed: %s: %s", type(exc).__name__, exc)
        if result_path:
            _write_result(result_path, {
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "error_type": type(exc).__name__,
                "traceback": traceback.format_exc(),
            })
        raise
    if result_path:
        _write_result(result_path, result)
    log.info("securefkm run finished: %d rounds (%d aborted and retried), privacy_spent=%s, client errors=%s",
             len(result["transcript"]), result["n_aborted_rounds"], result["privacy_spent"], result["errors"])
