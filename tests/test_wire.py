"""The Flower wire codec (securefkm.flower._wire): every stage message round-trips, every
decoder refuses what is not a message of its stage, and no peer's bytes can run code."""

from __future__ import annotations

import base64
import builtins
import json
import os
import pickle
import struct

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402

from securefkm.federation.client import UpdateReply, UpdateRequest  # noqa: E402
from securefkm.flower import _wire, clientapp  # noqa: E402
from securefkm.flower.spec import RunSpec  # noqa: E402
from securefkm.flower.transport import FlowerTransport  # noqa: E402
from securefkm.messages import Broadcast  # noqa: E402

from test_flower import UNIFORM, _fake_run, authority_service, clients, task_identity  # noqa: E402,F401

W = _wire.WireError


def _share_ct() -> int:
    from protocols import shamir

    return 12 + 16 + 2 * (6 + 4 * shamir.n_limbs(32))


CT = _share_ct()


def frame(body, arrays=()) -> bytes:
    """Hand-made wire bytes: what a malicious peer can send."""
    header = json.dumps({"arrays": [[a.dtype.str, list(a.shape)] for a in arrays], "body": body}).encode()
    return _wire.MAGIC + struct.pack(">I", len(header)) + header + b"".join(a.tobytes() for a in arrays)


def b64(n: int, fill: int = 1) -> str:
    return base64.b64encode(bytes([fill]) * n).decode()


# ---------------------------------------------------------------- round trips of real runs
@pytest.fixture
def recorded(monkeypatch):
    """Every (stage, direction, fused, message, bytes) encoded during a fake-Grid run."""
    seen = []
    encode = _wire.encode

    def spy(stage, direction, message, *, fused=None):
        data = encode(stage, direction, message, fused=fused)
        seen.append((stage, direction, fused, message, data))
        return data

    monkeypatch.setattr(_wire, "encode", spy)
    return seen


def _check_round_trips(seen):
    kinds = set()
    for stage, direction, fused, message, data in list(seen):  # re-encoding below records too
        decoded = _wire.decode(stage, direction, data, fused=fused)
        assert type(decoded) is type(message) or (isinstance(message, tuple) and isinstance(decoded, tuple))
        assert _wire.encode(stage, direction, decoded, fused=fused) == data  # field for field the same
        kinds.add((stage, direction) if fused is None else (stage, direction, fused))
        if isinstance(message, UpdateRequest):
            assert decoded.broadcast.digest() == message.broadcast.digest()  # what masks are bound to
            if message.then is not None:
                kinds.add((message.then[0], "request"))
    return kinds


def test_plain_and_masking_messages_round_trip(tmp_path, clients, task_identity, recorded):
    for i, protection in enumerate([[], ["masking"]]):
        spec = RunSpec("dwf", UNIFORM, protection, random_state=5)
        result, _ = _fake_run(tmp_path / str(i), clients, spec)
        assert result["errors"] == {}
    kinds = _check_round_trips(recorded)
    assert {("update", "request"), ("update", "reply", "input"), ("input", "request"),
            ("update", "reply", "advertise"), ("advertise", "request"), ("share", "request"), ("share", "reply"),
            ("masked_input", "request"), ("masked_input", "reply"), ("unmask", "request"),
            ("unmask", "reply")} <= kinds
    masked = [m for s, d, _, m, _ in recorded if (s, d) == ("masked_input", "reply")]
    assert all(m.dtype == np.uint64 and m.ndim == 1 for m in masked)


def test_signed_masking_and_identify_round_trip(tmp_path, clients, task_identity, recorded):
    from securefkm.flower.provision import provision_local

    pki = provision_local(tmp_path / "pki", 3)
    spec = RunSpec("dwf", UNIFORM, [{"name": "masking", "sign_keys": True}], random_state=13)
    result, _ = _fake_run(tmp_path, clients, spec, node_configs=[pki.node_config(i) for i in range(3)],
                          directory=str(pki.directory_path))
    assert result["errors"] == {}
    kinds = _check_round_trips(recorded)
    assert {("identify", "request"), ("identify", "reply"), ("consistency_check", "request"),
            ("consistency_check", "reply"), ("unmask", "request")} <= kinds
    unmask = [m for s, d, _, m, _ in recorded if (s, d) == ("unmask", "request")]
    assert all(isinstance(m["signatures"], dict) and m["signatures"] for m in unmask)


def test_paillier_messages_round_trip(tmp_path, clients, task_identity, authority_service, recorded):
    pki, url, service, tls = authority_service
    spec = RunSpec("dwf", UNIFORM, ["paillier"], random_state=12)
    result, _ = _fake_run(tmp_path, clients, spec, node_configs=[pki.node_config(i) for i in range(3)],
                          directory=str(pki.directory_path), authority_url=url, authority_tls=tls, stage_timeout=10)
    assert result["errors"] == {}
    kinds = _check_round_trips(recorded)
    assert {("encrypted_input", "request"), ("update", "reply", "encrypted_input")} <= kinds
    replies = [m.then for s, d, f, m, _ in recorded if f == "encrypted_input" and m.then is not None]
    assert replies and all(isinstance(c, int) and c.bit_length() > 2048 for r in replies for c in r.ciphertexts)
    ident = [m for s, d, _, m, _ in recorded if (s, d) == ("identify", "request")]
    assert ident and all(m["bundle"].n.bit_length() == 2048 for m in ident)


def test_every_registered_message_has_both_directions():
    stages = {s for s, _ in _wire.MESSAGES.keys()}
    assert stages == {"update", "input", "advertise", "share", "masked_input", "consistency_check", "unmask",
                      "encrypted_input", "identify", "validated_input"}
    assert all((s, d) in _wire.MESSAGES for s in stages for d in ("request", "reply"))


def test_validated_aggregation_messages_round_trip_and_refuse_bad_fields():
    from protocols.validated import helper as H

    ticket = H.ValidationTicket(b"t" * 16, 0, 3, 1, b"d" * 32, 3, (65536, 65536), 16, 2)
    request = H.ValidationRequest(H.HelperBundle(b"a" * 32, b"b" * 32, b"c" * 64), ticket)
    assert _wire.decode(H.STAGE, "request", _wire.encode(H.STAGE, "request", request)) == request
    reply = H.ValidatedReport(5, b"n" * 16, b"p", b"leader", b"sealed", b"s" * 64)
    assert _wire.decode(H.STAGE, "reply", _wire.encode(H.STAGE, "reply", reply)) == reply
    with pytest.raises(_wire.WireError, match="report_nonce"):
        _wire.encode(H.STAGE, "reply", H.ValidatedReport(5, b"short", b"p", b"l", b"s", b"s" * 64))


def test_direct_round_trips_of_hand_built_messages():
    b = Broadcast("train", np.arange(6.0).reshape(3, 2), {"m": 2.0, "low": [-1.0, 1e-300], "flag": True, "x": None}, "all")
    req = UpdateRequest(1, 4, b, (0, 2, 7), then=("advertise", {"stage": "advertise"}), attempt=2)
    out = _wire.decode("update", "request", _wire.encode("update", "request", req))
    assert (out.run, out.round, out.sampled, out.then, out.attempt) == (1, 4, (0, 2, 7), ("advertise", {"stage": "advertise"}), 2)
    np.testing.assert_array_equal(out.broadcast.centres, b.centres)
    assert out.broadcast.params == b.params and out.broadcast.digest() == b.digest()
    out.broadcast.centres[0, 0] = 9.0  # a decoded array is the receiver's own, writable copy
    rep = UpdateReply(items={"centres": np.ones((2, 2)), "sizes": np.array([3, 4])}, then={"c_pk": b"a" * 32, "s_pk": b"b" * 32, "sig": None,
                                                                                                 "commit": b"c" * 96, "digest": b"d" * 32})
    got = _wire.decode("update", "reply", _wire.encode("update", "reply", rep, fused="advertise"), fused="advertise")
    assert got.then == rep.then and got.items["sizes"].dtype == np.int64 and got.declined is None
    declined = UpdateReply(declined="MinClusterSize declined")
    assert _wire.decode("update", "reply", _wire.encode("update", "reply", declined, fused="input"), fused="input") == declined


# ---------------------------------------------------------------- decoders refuse
ADVERT = {"c_pk": b64(32), "s_pk": b64(32, 2), "sig": None, "commit": b64(96), "digest": b64(32)}


@pytest.mark.parametrize("body, field", [
    ({**ADVERT, "c_pk": b64(31)}, "c_pk': 31 bytes, expected 32"),
    ({**ADVERT, "s_pk": 7}, "s_pk': expected base64 bytes, got int"),
    ({**ADVERT, "sig": b64(65)}, "sig': 65 bytes, expected 64"),
    ({**ADVERT, "c_pk": "@@@@"}, "c_pk': not valid base64"),
    ({"c_pk": b64(32), "s_pk": b64(32), "commit": b64(32), "digest": b64(32)}, "missing field(s) ['sig']"),
    ({**ADVERT, "extra": 1}, "unexpected field(s) ['extra']"),
    ([1, 2], "expected an object, got list"),
])
def test_advertise_reply_schema(body, field):
    with pytest.raises(W, match="malformed advertise reply: field .*" + _esc(field)):
        _wire.decode("advertise", "reply", frame(body))


def _esc(s: str) -> str:
    import re

    return re.escape(s)


@pytest.mark.parametrize("pairs, why", [
    ([["1", b64(CT)]], "expected an int, got str"),
    ([[True, b64(CT)]], "expected an int, got bool"),
    ([[-1, b64(CT)]], "int -1 outside"),
    ([[1.0, b64(CT)]], "expected an int, got float"),
    ([[1, b64(CT)], [1, b64(CT)]], "client id 1 listed twice"),
    ([[1]], "expected a [client id, value] pair"),
    ({"1": b64(CT)}, "expected a list of [client id, value] pairs"),
    ([[1, b64(10)]], "10 bytes, expected"),
])
def test_share_reply_ids_and_sizes(pairs, why):
    with pytest.raises(W, match=_esc(why)):
        _wire.decode("share", "reply", frame(pairs))


def test_share_ciphertext_size_is_exact():
    from protocols import shamir

    size = 12 + 16 + 2 * (6 + 4 * shamir.n_limbs(32))
    assert _wire.decode("share", "reply", frame([[3, b64(size)]])) == {3: b"\x01" * size}
    for n in (size - 1, size + 1, 1 << 20):
        with pytest.raises(W, match=f"field '\\[3\\]': {n} bytes|more than"):
            _wire.decode("share", "reply", frame([[3, b64(n)]]))


def test_masked_input_reply_arrays():
    ok = np.arange(5, dtype=np.uint64)
    np.testing.assert_array_equal(_wire.decode("masked_input", "reply", frame(0, [ok])), ok)
    with pytest.raises(W, match=r"dtype <f8, expected one of \['<u8'\]"):
        _wire.decode("masked_input", "reply", frame(0, [ok.astype(np.float64)]))
    with pytest.raises(W, match="array of 2 dimensions, expected"):
        _wire.decode("masked_input", "reply", frame(0, [ok.reshape(1, 5)]))
    with pytest.raises(W, match="expected an array index below 1"):
        _wire.decode("masked_input", "reply", frame(1, [ok]))
    with pytest.raises(W, match="expected an array index below 0"):
        _wire.decode("masked_input", "reply", frame([1, 2, 3]))
    good = frame(0, [ok])
    with pytest.raises(W, match="truncated"):
        _wire.decode("masked_input", "reply", good[:-1])
    with pytest.raises(W, match="1 trailing bytes"):
        _wire.decode("masked_input", "reply", good + b"\x00")
    with pytest.raises(W, match="1 array\\(s\\) sent but not part of the message"):
        _wire.decode("masked_input", "reply", frame(0, [ok, ok]))
    for dtype in ("|O", "|V8", ">u8", "<M8[s]", "<U3"):  # object, structured, big-endian, datetime, text
        header = json.dumps({"arrays": [[dtype, [1]]], "body": 0}).encode()
        with pytest.raises(W, match="is not allowed on the wire"):
            _wire.decode("masked_input", "reply", _wire.MAGIC + struct.pack(">I", len(header)) + header + b"\0" * 8)
    header = json.dumps({"arrays": [["<u8", [1 << 39, 1 << 39]]], "body": 0}).encode()  # huge declared shape
    with pytest.raises(W, match="truncated"):
        _wire.decode("masked_input", "reply", _wire.MAGIC + struct.pack(">I", len(header)) + header)


def test_framing_refusals():
    for data, why in [(b"", "bad magic"), (b"garbage", "bad magic"), (_wire.MAGIC + b"\0\0\0\x09{", "truncated header"),
                      (_wire.MAGIC + b"\0\0\0\x01{", "header is not JSON"), ("text", "expected bytes, got str")]:
        with pytest.raises(W, match=_esc(why)):
            _wire.decode("consistency_check", "reply", data)
    dup = b'{"arrays":[],"body":{"survivors":[1],"survivors":[2]}}'
    with pytest.raises(W, match="appears twice"):
        _wire.decode("consistency_check", "request", _wire.MAGIC + struct.pack(">I", len(dup)) + dup)
    deep = ("[" * 100000 + "]" * 100000).encode()
    with pytest.raises(W):
        _wire.decode("consistency_check", "request", _wire.MAGIC + struct.pack(">I", len(deep)) + deep)
    with pytest.raises(W, match="stage 'nope' has no reply message"):
        _wire.decode("nope", "reply", frame(None))
    with pytest.raises(W, match="expected exactly|must hold exactly"):
        _wire.decode("input", "request", _wire.MAGIC + struct.pack(">I", 2) + b"[]")


def _request(**over):
    base = {"run": 0, "round": 1, "broadcast": {"action": "train", "centres": None, "params": {}, "sample": None},
            "sampled": [0, 1, 2], "then": None, "attempt": 0}
    return {**base, **over}


@pytest.mark.parametrize("body, why", [
    (_request(sampled=[0, "1"]), "sampled[1]': expected an int, got str"),
    (_request(sampled=[0, True]), "sampled[1]': expected an int, got bool"),
    (_request(sampled=[0, 1.5]), "sampled[1]': expected an int, got float"),
    (_request(round="1"), "round': expected an int, got str"),
    (_request(attempt=-1), "attempt': int -1 outside"),
    (_request(then=["unknown", None]), "'unknown' is not a stage that can be fused"),
    (_request(then=["update", None]), "'update' is not a stage that can be fused"),
    (_request(then=["advertise", {"stage": "share"}]), "is not one of ['advertise']"),
    (_request(broadcast={"action": "train", "centres": None, "params": {"a": {"b": {"c": {"d": {"e": 1}}}}}, "sample": None}),
     "nested deeper than 4"),
    (_request(broadcast={"action": "train", "centres": None, "params": {}, "sample": [1]}), "nested deeper than 0"),
    (_request(broadcast={"action": "train", "centres": 0, "params": {}, "sample": None}), "expected an array index"),
    (_request(broadcast={"action": "x" * 300, "centres": None, "params": {}, "sample": None}), "at most 256"),
    ({k: v for k, v in _request().items() if k != "attempt"}, "missing field(s) ['attempt']"),
    ({**_request(), "__class__": "os.system"}, "unexpected field(s) ['__class__']"),
])
def test_update_request_schema(body, why):
    with pytest.raises(W, match="malformed update request: .*" + _esc(why)):
        _wire.decode("update", "request", frame(body))


def test_update_request_centres_dtype_and_reply_fused_stage():
    body = _request(broadcast={"action": "train", "centres": 0, "params": {}, "sample": None})
    with pytest.raises(W, match=r"centres': array of dtype <i8"):
        _wire.decode("update", "request", frame(body, [np.zeros((2, 2), dtype=np.int64)]))
    reply = {"items": {}, "declined": None, "then": ADVERT, "then_refused": None}
    # a reply that answers a stage the request did not fuse is refused
    with pytest.raises(W, match="then': expected null, got dict"):
        _wire.decode("update", "reply", frame(reply))
    # the answer is checked against the fused stage's reply schema
    with pytest.raises(W, match=r"then\[encrypted_input\]'"):
        _wire.decode("update", "reply", frame(reply), fused="encrypted_input")
    assert _wire.decode("update", "reply", frame(reply), fused="advertise").then["c_pk"] == b"\x01" * 32
    bad_items = {**reply, "items": {"centres": 0}, "then": None}
    header_arrays = [np.array([object()], dtype=object)]
    with pytest.raises((W, ValueError)):
        _wire.decode("update", "reply", frame(bad_items, header_arrays), fused="advertise")


def test_paillier_schema_refusals():
    ct = format((1 << 6000) + 5, "x")
    contribution = {"client_id": 1, "nonce": b64(16), "digest": b64(32), "ciphertexts": [ct], "signature": b64(64)}
    got = _wire.decode("encrypted_input", "reply", frame(contribution))
    assert got.ciphertexts == ((1 << 6000) + 5,) and got.client_id == 1
    for over, why in [({"ciphertexts": [format(1 << 6144, "x")]}, "ciphertexts[0]': expected a hexadecimal int of at most 6144 bits"),
                      ({"ciphertexts": ["0x12"]}, "not a lower-case hexadecimal int"),
                      ({"ciphertexts": [12345]}, "expected a hexadecimal int"),
                      ({"ciphertexts": ["-5"]}, "not a lower-case hexadecimal int"),
                      ({"client_id": -3}, "client_id': int -3 outside"),
                      ({"signature": b64(63)}, "signature': 63 bytes, expected 64"),
                      ({"nonce": b64(65)}, "nonce': 65 bytes, expected 1..64")]:
        with pytest.raises(W, match=_esc(why)):
            _wire.decode("encrypted_input", "reply", frame({**contribution, **over}))


def test_encoder_refuses_what_its_schema_does_not_allow():
    with pytest.raises(W, match="c_pk': 33 bytes"):
        _wire.encode("advertise", "reply", {"c_pk": b"x" * 33, "s_pk": b"y" * 32, "sig": None,
                                            "commit": b"c" * 96, "digest": b"d" * 32})
    with pytest.raises(W, match="not plain JSON data"):
        b = Broadcast("train", None, {"f": open})
        _wire.encode("update", "request", UpdateRequest(0, 0, b, (0,)))
    with pytest.raises(W, match="expected a UpdateReply|expected a UpdateRequest"):
        _wire.encode("update", "request", UpdateReply())


# ---------------------------------------------------------------- no code from a peer's bytes
class _Open:
    """Unpickling this opens (creates) ``path``: a stand-in for any side effect."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


def _gadgets(path):
    from securefkm.federation.workers import Shard

    class _ShardGadget:
        def __reduce__(self):  # the reviewed attack: Shard(payload) calls pickle.loads(payload)
            return (Shard, (pickle.dumps(_Open(path)),))

    class _System:
        def __reduce__(self):
            return (os.system, (f"touch {path}",))

    return {"shard": pickle.dumps(_ShardGadget()), "open": pickle.dumps(_Open(path)), "system": pickle.dumps(_System())}


def test_the_gadgets_are_real(tmp_path):
    """Under plain pickle each gadget does create its file (so the refusals below mean something)."""
    for name, data in _gadgets(str(tmp_path / "probe")).items():
        target = tmp_path / "probe"
        try:
            pickle.loads(data)
        except Exception:
            pass
        assert target.exists(), name
        target.unlink()


class _Reply:
    def __init__(self, mid, data, status="ok"):
        self.content = {_wire.RECORD_KEY: {"status": status, "data": data}}
        self.metadata = type("M", (), {"reply_to_message_id": mid})()

    def has_error(self):
        return False


class _GadgetGrid:
    def __init__(self, data):
        self.data, self.sent = data, []

    def push_messages(self, messages):
        self.sent.extend(messages)
        return [f"m{i}" for i in range(len(messages))]

    def pull_messages(self, ids):
        return [_Reply(i, self.data) for i in ids]


@pytest.mark.parametrize("gadget", ["shard", "open", "system"])
@pytest.mark.parametrize("stage", ["masked_input", "update", "encrypted_input", "identify"])
def test_server_refuses_a_pickle_gadget_reply_without_side_effect(tmp_path, task_identity, gadget, stage):
    target = tmp_path / "pwned"
    grid = _GadgetGrid(_gadgets(str(target))[gadget])
    transport = FlowerTransport(grid, [11, 12], stage_timeout=5, poll_interval=0.001)
    transport.begin_round(type("Ctx", (), {"round": 3})(), (stage,))
    if stage == "update":
        messages = {c: UpdateRequest(0, 3, Broadcast("train"), (0, 1)) for c in (0, 1)}
    elif stage == "identify":
        messages = {c: {"challenge": b"c" * 16, "node_id": 11 + c, "directory_digest": b"d" * 32, "bundle": None} for c in (0, 1)}
    elif stage == "encrypted_input":
        messages = {c: None for c in (0, 1)}
        from protocols.paillier.authority import EncryptRequest, PublicBundle, RoundTicket

        messages = {c: EncryptRequest(PublicBundle(7, b"a" * 32, b"s" * 64), RoundTicket(b"n" * 16, 0, 3, b"d" * 32, 1, 2)) for c in (0, 1)}
    else:
        messages = {c: {1 - c: b"\0" * CT} for c in (0, 1)}
    replies, refused = transport.exchange(stage, messages)
    assert replies == {}
    assert not target.exists()
    for c in (0, 1):
        assert refused[c].startswith(f"refused: malformed reply from client {c} to stage {stage!r}")
        assert "bad magic" in refused[c]
        assert transport.faults[c] == refused[c]
    transport.begin_round(type("Ctx", (), {"round": 4})(), (stage,))
    assert transport.faults == {}  # per round


def test_server_refuses_a_reply_with_an_unknown_status_or_no_record(tmp_path, task_identity):
    grid = _GadgetGrid(b"")
    transport = FlowerTransport(grid, [5], stage_timeout=5, poll_interval=0.001)
    transport.begin_round(type("Ctx", (), {"round": 0})(), ("masked_input",))
    grid.pull_messages = lambda ids: [_Reply(i, b"", status="weird") for i in ids]
    _, refused = transport.exchange("masked_input", {0: {}})
    assert "client 0 to stage 'masked_input': unknown status 'weird'" in refused[0] and 0 in transport.faults


def test_client_refuses_a_pickle_gadget_request_without_side_effect(tmp_path, task_identity):
    target = tmp_path / "pwned"
    for gadget, data in _gadgets(str(target)).items():
        for stage in ("update", "unmask", "identify", "encrypted_input"):
            record = ConfigRecord({"stage": stage, "client-id": 0, "round": 0, "data": data})
            msg = Message(content=RecordDict({_wire.RECORD_KEY: record}), dst_node_id=1, message_type=_wire.MESSAGE_TYPE)
            msg.metadata.__dict__["_message_id"] = msg.object_id
            ctx = Context(run_id=1, node_id=1, node_config={"data-path": ""}, state=RecordDict(),
                          run_config={"spec": RunSpec("dwf", UNIFORM, []).to_json(), "num-nodes": 2, "n-features": 2})
            reply = clientapp.handle_message(msg, ctx)
            rec = reply.content[_wire.RECORD_KEY]
            assert rec["status"] == "refused", (gadget, stage)
            assert rec["reason"].startswith(f"refused: malformed request for stage {stage!r}: malformed {stage} request")
            assert not target.exists()


def test_client_refuses_a_request_with_a_bad_record(task_identity):
    record = ConfigRecord({"stage": "update", "client-id": "0", "round": 0, "data": b""})
    msg = Message(content=RecordDict({_wire.RECORD_KEY: record}), dst_node_id=1, message_type=_wire.MESSAGE_TYPE)
    msg.metadata.__dict__["_message_id"] = msg.object_id
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    rec = clientapp.handle_message(msg, ctx).content[_wire.RECORD_KEY]
    assert rec["status"] == "refused" and "'client-id' an int" in rec["reason"]
