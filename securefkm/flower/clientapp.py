"""The securefkm ClientApp: one data owner's side of every round, over Flower.

Each SuperNode is started with ``--node-config "data-path='/path/to/its.csv'"``. For every
``train.securefkm`` message the ClientApp

1. reads the run spec from the run config and builds the algorithm, the protection layers
   (after ``setup``) and the RunInfo exactly as the server does
   (:func:`securefkm.flower.spec.build_federation`);
2. loads its records from ``data-path`` (numeric CSV, optional header row; NaN, inf and text
   are refused with an error naming the file, row and column);
3. restores its :class:`~securefkm.federation.ClientRuntime` persistent state
   (``ClientContext.state``: the algorithm's private memory and the protection layers'
   client-side secrets and counters) and its open aggregator session from Flower's
   ``context.state`` -- in a deployment each message may run in a fresh process;
4. answers the stage with :meth:`ClientRuntime.handle` and stores state and session back.

A client that cannot take part (bad data, a refused protocol message) answers with a
status and a reason instead of a payload, so the server records a refusal with that reason
and the other clients finish the round.

Wire format: the server's request is rebuilt with the explicit codec of
:mod:`securefkm.flower._wire` against the schema of its stage (never unpickled); a request
that fails it is refused, naming the stage and the field. The reply is encoded with the
same codec. The node's *own* persistent state (``context.state[STATE_KEY]``: its
``ClientRuntime`` state, open aggregator session, client id and the Paillier bundle it
verified) is written and read only by this node, never by a peer, and is stored with
pickle: it is the node's memory, as trusted as the node's disk.

Runs with Paillier or masking ``sign_keys=True`` need the node's provisioned identity
(node config ``identity-key`` and ``directory``, :mod:`securefkm.flower.provision`): the
``identify`` message, answered before any round, fixes this node's client id as the
position of its own key in its own directory and (Paillier) stores the authority's public
bundle after checking it against the authority key of that directory.
"""

from __future__ import annotations

import csv
import logging
import os
import pickle

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from ..validation import check_array
from ..exceptions import InputError
from ..federation.client import UPDATE_STAGE
from ..layers import ProtocolRefusal
from . import _wire

log = logging.getLogger("securefkm.flower")

STATE_KEY = "securefkm-client"

app = ClientApp()


# ---------------------------------------------------------------- local data
def read_client_csv(path: str) -> np.ndarray:
    """A client's records from a numeric CSV (one record per row, optional header row).

    Raises :class:`InputError` naming the file, the row and the column of the first cell
    that is not a finite number.
    """
    if not path:
        raise InputError(
            "this SuperNode has no data: start it with --node-config \"data-path='/path/to/data.csv'\"."
        )
    if not os.path.isfile(path):
        raise InputError(f"data-path {path!r} does not exist or is not a file; fix the SuperNode's --node-config.")
    with open(path, newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.reader(fh) if r and any(cell.strip() for cell in r)]
    if not rows:
        raise InputError(f"data-path {os.path.basename(path)!r} is empty; give this node at least one record.")

    def _is_number(cell: str) -> bool:
        try:
            float(cell)
            return True
        except ValueError:
            return False

    first_line = 1
    if not any(_is_number(c) for c in rows[0]):  # a header row
        rows, first_line = rows[1:], 2
    if not rows:
        raise InputError(f"data-path {os.path.basename(path)!r} has a header but no records.")
    width = len(rows[0])
    try:  # NumPy converts the strings in C; on failure the loop below names the bad cell
        out = np.array(rows, dtype=np.float64)
    except ValueError:
        out = _first_bad_cell(rows, width, os.path.basename(path), first_line)
    try:
        return check_array(out, f"data-path {os.path.basename(path)!r}")
    except InputError as exc:
        raise InputError(str(exc).replace("row ", "record ")) from None


def _first_bad_cell(rows: list[list[str]], width: int, name: str, first_line: int) -> np.ndarray:
    """Raise :class:`InputError` naming the first ragged row or non-numeric cell."""
    for i, row in enumerate(rows):
        if len(row) != width:
            raise InputError(
                f"data-path {name!r} line {i + first_line} has {len(row)} columns, "
                f"expected {width}; every record needs the same number of features."
            )
        for j, cell in enumerate(row):
            try:
                float(cell)
            except ValueError:
                raise InputError(
                    f"data-path {name!r} line {i + first_line} column {j + 1} is "
                    f"{cell.strip()[:40]!r}, not a number; clean or drop that record."
                ) from None
    raise InputError(f"data-path {name!r} could not be read as a numeric table.")


_DATA_CACHE: dict[tuple[str, float, int], np.ndarray] = {}
_FED_CACHE: dict[tuple[str, int, int], object] = {}


def _load_data(path: str) -> np.ndarray:
    st = os.stat(path) if path and os.path.isfile(path) else None
    key = (path, st.st_mtime if st else 0.0, st.st_size if st else -1)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = read_client_csv(path)
    return _DATA_CACHE[key]


def _federation(spec_json: str, n_clients: int, n_features: int, provisioning=None):
    from .spec import PlaceholderTransport, RunSpec, build_federation

    key = (spec_json, n_clients, n_features, None if provisioning is None else provisioning.key())
    if key not in _FED_CACHE:
        spec = RunSpec.from_json(spec_json)
        _, fed = build_federation(spec, n_clients, n_features, PlaceholderTransport(n_clients), verbose=0,
                                  provisioning=provisioning)
        # In process, clients share the server's algorithm object, on which ``init`` has set
        # attributes that ``sum_fields`` reads (e.g. DWF's ``n_features_``). Replay ``init`` on a
        # throw-away generator so the client's copy has them too (its result is discarded).
        fed.algorithm.init(n_clients, n_features, np.random.default_rng(0))
        _FED_CACHE.clear()
        _FED_CACHE[key] = fed
    return _FED_CACHE[key]


# ---------------------------------------------------------------- persistent state
def _load_state(context: Context) -> dict:
    rec = context.state.get(STATE_KEY) if hasattr(context.state, "get") else None
    if rec is None:
        return {}
    # written by this node only (never by a peer): plain pickle
    return pickle.loads(rec["blob"])


def _save_state(context: Context, saved: dict) -> None:
    context.state[STATE_KEY] = ConfigRecord({"blob": pickle.dumps(saved, protocol=pickle.HIGHEST_PROTOCOL)})


def make_runtime(context: Context, client_id: int, saved: dict):
    """The node's ClientRuntime, with its persistent state and open session restored."""
    from ..federation import ClientRuntime

    cfg = context.run_config
    n_clients = int(cfg["num-nodes"])
    n_features = int(cfg["n-features"])
    if not 0 <= client_id < n_clients:
        raise ProtocolRefusal(f"client id {client_id} outside 0..{n_clients - 1}")
    if "client_id" in saved and saved["client_id"] != client_id:
        raise ProtocolRefusal(
            f"the server addressed this node as client {client_id}, earlier as {saved['client_id']}"
        )
    path = str(context.node_config.get("data-path", ""))

    def load() -> np.ndarray:
        X = _load_data(path)
        if X.shape[1] != n_features:
            raise InputError(
                f"data-path {os.path.basename(path)!r} has {X.shape[1]} features, the run expects n-features={n_features}."
            )
        return X

    # The records are read on the node's first message (to learn their number) and then only
    # by the stages that compute on them: every message is a fresh process, and parsing the
    # CSV was most of a masking stage's client time.
    n_records = saved.get("n_records")
    X = load() if n_records is None else load
    provisioning = None
    if _needs_identity(str(cfg["spec"])):
        provisioning = _node_provisioning(context)
        if "client_id" not in saved:
            raise ProtocolRefusal("this run needs node identities but the server skipped the identify stage")
        provisioning.bundle = saved.get("bundle")
    fed = _federation(str(cfg["spec"]), n_clients, n_features, provisioning)
    check_node_policy(context.node_config, fed)
    runtime = ClientRuntime(
        client_id, X, fed.algorithm, fed.layers, fed.aggregator, fed.info, state=saved.get("state", {}),
        n_records=n_records,
    )
    runtime.session = saved.get("session")
    return runtime


def check_node_policy(node_config, fed) -> None:
    """Refuse a run whose declared facts fall below this node's own policy.

    The run's floor that clients enforce (clients per round, the masking threshold) comes from
    the run config, which the server ships. A node operator pins a floor of its own in the
    node config: ``min-clients-per-round`` (refuse a run that samples fewer clients per round),
    ``max-epsilon`` (refuse a run without differential privacy, or with a larger target
    epsilon) and ``allow-insecure-threshold`` (default false: refuse a masking threshold
    below the secure floor, ``PairwiseMasking(allow_insecure_threshold=True)``).
    """
    from protocols.dp import GaussianDP

    def number(key, kind):
        raw = node_config.get(key, 0)
        try:
            value = kind(raw)
        except (TypeError, ValueError):
            raise InputError(f"node config {key!r}={raw!r} is not a number; fix the SuperNode's --node-config.") from None
        return value

    floor = number("min-clients-per-round", int)
    if floor and fed.info.clients_per_round < floor:
        raise ProtocolRefusal(
            f"the run samples {fed.info.clients_per_round} clients per round, below this node's "
            f"min-clients-per-round={floor}"
        )
    max_eps = number("max-epsilon", float)
    if max_eps:
        dp = [layer for layer in fed.layers if isinstance(layer, GaussianDP)]
        if not dp:
            raise ProtocolRefusal(f"the run has no differential privacy; this node requires epsilon <= {max_eps:g}")
        if dp[0].epsilon > max_eps:
            raise ProtocolRefusal(f"the run's target epsilon {dp[0].epsilon:g} exceeds this node's max-epsilon={max_eps:g}")
    allow = str(node_config.get("allow-insecure-threshold", "false")).strip().lower() in ("1", "true", "yes")
    if not allow and any(getattr(layer, "allow_insecure_threshold", False) for layer in fed.layers):
        raise ProtocolRefusal(
            "the run's masking threshold is below the secure floor (allow_insecure_threshold=True); this "
            "node refuses it unless its node config sets allow-insecure-threshold=true"
        )


def _needs_identity(spec_json: str) -> bool:
    from .spec import RunSpec

    return bool(RunSpec.from_json(spec_json).requirements())


def _node_provisioning(context: Context):
    from .provision import NodeProvisioning

    return NodeProvisioning.from_node_config(context.node_config)


def identify(context: Context, message, saved: dict) -> tuple[dict, dict]:
    """Answer the ``identify`` stage: (reply, new saved state). Refuses anything inconsistent."""
    if not isinstance(message, dict) or not isinstance(message.get("challenge"), bytes):
        raise ProtocolRefusal("malformed identify request")
    prov = _node_provisioning(context)
    if message.get("directory_digest") != prov.directory.digest:
        raise ProtocolRefusal(
            "the server's directory differs from this node's directory file; distribute the same "
            "directory.json to the ServerApp (run config 'directory') and every SuperNode"
        )
    node_id = message.get("node_id")
    if not isinstance(node_id, int) or int(node_id) != int(context.node_id):
        raise ProtocolRefusal(f"identify request is for node {node_id!r}, this is node {context.node_id}")
    if "client_id" in saved and saved["client_id"] != prov.client_id:
        raise ProtocolRefusal(f"this node already took part as client {saved['client_id']}")
    bundle = message.get("bundle")
    fp = b""
    if bundle is not None:
        from protocols.paillier import PublicBundle

        from .authority_client import BundleView

        if not isinstance(bundle, PublicBundle):
            raise ProtocolRefusal("identify request carries a malformed Paillier bundle")
        try:
            BundleView(bundle, prov.directory)  # verified against this node's own trust anchor
        except ValueError as exc:
            raise ProtocolRefusal(f"refusing the Paillier public key: {exc}") from None
        fp = bundle.fingerprint
    signature = prov.sign_identify(message["challenge"], int(node_id), fp)
    saved = {**saved, "client_id": prov.client_id, "bundle": bundle, "session": None}
    return {"client_id": prov.client_id, "public_key": prov.public, "signature": signature}, saved


def _read_request(msg: Message) -> tuple[str, int, object]:
    """(stage, client id, request) of the server's message, each field checked; a message
    that is not a well-formed request of its stage is refused (:class:`ProtocolRefusal`)."""
    try:
        record = msg.content[_wire.RECORD_KEY]
        stage, client_id, data = record["stage"], record["client-id"], record["data"]
    except (KeyError, TypeError) as exc:
        raise ProtocolRefusal(f"malformed request: no securefkm record ({type(exc).__name__}: {exc})") from None
    if not isinstance(stage, str) or isinstance(client_id, bool) or not isinstance(client_id, int):
        raise ProtocolRefusal("malformed request: 'stage' must be a string and 'client-id' an int")
    try:
        payload = _wire.decode(stage, "request", data)
    except _wire.WireError as exc:
        raise ProtocolRefusal(f"malformed request for stage {stage[:40]!r}: {exc}") from None
    return stage, client_id, payload


def handle_message(msg: Message, context: Context) -> Message:
    """Answer one securefkm stage message (the body of the ClientApp)."""
    from .provision import IDENTIFY_STAGE

    saved = _load_state(context)
    stage = "?"
    reply: dict = {"stage": stage}
    try:
        stage, client_id, payload = _read_request(msg)
        reply["stage"] = stage
        if stage == IDENTIFY_STAGE:
            answer, saved = identify(context, payload, saved)
            reply.update(status="ok", data=_wire.encode(stage, "reply", answer))
            _save_state(context, saved)
            return Message(RecordDict({_wire.RECORD_KEY: ConfigRecord(reply)}), reply_to=msg)
        runtime = make_runtime(context, client_id, saved)
        answer = runtime.handle(stage, payload)
        if stage == UPDATE_STAGE and runtime.refusal is not None:
            # the client refused the round (its own encoder, or the run's floor): a refusal
            # naming why, as in simulation, not a decline the server would read as "nothing to send"
            raise ProtocolRefusal(runtime.refusal)
        fused = payload.then[0] if stage == UPDATE_STAGE and payload.then is not None else None
        reply.update(status="ok", data=_wire.encode(stage, "reply", answer, fused=fused))
        saved = {**saved, "client_id": client_id, "state": runtime.context.state, "session": runtime.session,
                 "n_records": runtime.context.n_records}
    except ProtocolRefusal as exc:
        log.warning("refused stage %s: %s", stage, exc)
        reply.update(status="refused", reason=f"refused: {exc}")
        saved = {**saved, "session": None}
    except Exception as exc:  # report, never crash the node: the others must finish
        log.error("stage %s failed: %s: %s", stage, type(exc).__name__, exc)
        reply.update(status="error", reason=f"{type(exc).__name__}: {exc}")
        saved = {**saved, "session": None}
    _save_state(context, saved)
    return Message(RecordDict({_wire.RECORD_KEY: ConfigRecord(reply)}), reply_to=msg)


@app.train(_wire.ACTION)
def _train(msg: Message, context: Context) -> Message:
    return handle_message(msg, context)
