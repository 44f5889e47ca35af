"""The checkpoint's code-free format: exact round trips, and crafted bodies refused."""

from __future__ import annotations

import collections
import inspect
import json
import struct

import numpy as np
import pytest

from securefkm.flower import _state_codec as codec
from securefkm.flower._state_codec import StateCodecError, dumps, loads
from securefkm.messages import Broadcast, FieldSpec
from securefkm.transcript import AbortedRound

M = b"TEST/1\n"


def roundtrip(value, **kw):
    return loads(dumps(value, magic=M, **kw), magic=M, **({"refs": kw["refs"].values()} if "refs" in kw else {}))


def test_exact_roundtrip_of_every_tag():
    rng = np.random.default_rng(7)
    rng.random(3)
    seq = np.random.SeedSequence(123, spawn_key=(4,))
    seq.spawn(2)
    value = {
        "ints": [0, -1, (1 << 63) - 1, 1 << 63, -(1 << 200), 3 ** 500],
        "floats": [0.1, -0.0, 1e-308, float("nan"), float("inf"), -float("inf")],
        (1, "a"): frozenset({1, 2}),
        5: {b"\x00\xff", "s"},
        "bytes": bytes(range(256)),
        "counter": collections.Counter({3: 2, 7: 1}),
        "arrays": [np.arange(6, dtype=np.uint64).reshape(2, 3), np.array([1.5, np.nan]), np.zeros((0, 4)),
                   np.array([True, False]), np.int32(-5), np.float64(2.5), np.asfortranarray(np.eye(3))],
        "nested": ((1, (2, [3])),),
        "rng": rng,
        "seq": seq,
        "record": Broadcast(action="a", centres=np.ones((2, 2)), params={"k": 2}),
        "frozen": AbortedRound(run=0, round=1, attempt=0, cause="c", stage="s", message="m"),
        "spec": FieldSpec("sums", (2, 3), "value"),
    }
    back = roundtrip(value)
    assert list(back) == list(value)
    assert back["ints"] == value["ints"] and all(type(i) is int for i in back["ints"])
    f = back["floats"]
    assert f[:3] == value["floats"][:3] and str(f[1]) == "-0.0" and np.isnan(f[3]) and f[4:] == [np.inf, -np.inf]
    assert back[(1, "a")] == frozenset({1, 2}) and type(back[(1, "a")]) is frozenset
    assert back[5] == {b"\x00\xff", "s"} and back["bytes"] == value["bytes"]
    assert back["counter"] == value["counter"] and type(back["counter"]) is collections.Counter
    for a, b in zip(back["arrays"], value["arrays"]):
        assert type(a) is type(b) and a.dtype == b.dtype and np.shape(a) == np.shape(b)
        np.testing.assert_array_equal(a, b)
    assert back["nested"] == value["nested"]
    # the generator continues exactly where it was; the seed sequence spawns the same children
    np.testing.assert_array_equal(back["rng"].random(5), rng.random(5))
    assert back["seq"].spawn(1)[0].generate_state(4).tolist() == seq.spawn(1)[0].generate_state(4).tolist()
    assert back["record"].action == "a" and back["record"].params == {"k": 2}
    np.testing.assert_array_equal(back["record"].centres, np.ones((2, 2)))
    assert back["frozen"] == value["frozen"] and back["spec"] == value["spec"]


def test_references_are_rebound():
    class Layer:
        pass

    a, b = Layer(), Layer()
    back = loads(dumps({"x": [a, b, a]}, magic=M, refs={id(a): 0, id(b): 1}), magic=M, refs=["A", "B"])
    assert back == {"x": ["A", "B", "A"]}
    assert loads(dumps([a], magic=M, refs={id(a): 0}), magic=M) == [None]  # checked without its referents


def test_saving_refuses_what_it_cannot_read_back():
    class Secret:
        pass

    with pytest.raises(StateCodecError, match=r"state\['k'\]\[1\]: a .*Secret cannot be saved"):
        dumps({"k": [1, Secret()]}, magic=M)
    with pytest.raises(StateCodecError, match="dtype object"):
        dumps(np.array([None]), magic=M)
    with pytest.raises(StateCodecError, match="cannot be saved"):
        dumps(lambda: 0, magic=M)
    loop: list = []
    loop.append(loop)
    with pytest.raises(StateCodecError, match="cycle"):
        dumps(loop, magic=M)


def _body(body, arrays=()):
    header = json.dumps({"arrays": [[a.dtype.str, list(a.shape)] for a in arrays], "body": body}).encode()
    return M + struct.pack(">I", len(header)) + header + b"".join(a.tobytes() for a in arrays)


@pytest.mark.parametrize("body, why", [
    ({"$o": ["os.system", {}]}, "not one a checkpoint may hold"),
    ({"$o": ["securefkm.federation.workers.Shard", {}]}, "not one a checkpoint may hold"),
    ({"$o": ["builtins.eval", {}]}, "not one a checkpoint may hold"),
    ({"$o": ["securefkm.messages.Broadcast", {"$d": [[1, 2]]}]}, "str keys"),
    ({"$o": ["securefkm.messages.Broadcast"]}, "malformed"),
    ({"$pickle": "gASV"}, "unknown tag"),
    ({"$rng": ["Evil", {}]}, "unknown bit generator"),
    ({"$rng": ["PCG64", {"$d": [["bit_generator", "MT19937"]]}]}, "bad PCG64 state"),
    ({"$seq": {"entropy": 1}}, "bad SeedSequence"),
    ({"$a": 3}, "bad array index"),
    ({"$ref": -1}, "bad reference"),
    ({"$i": "zz"}, "bad int"),
    ({"$i": "f" * 5000}, "bad int"),
    ({"$f": "1e999"}, "bad float"),
    ({"$b": "***"}, "not base64"),
    ({"$d": [[[1, 2], 3]]}, "unhashable"),
    ({"$set": [{"$d": []}]}, "unhashable"),
    ({"a": 1, "b": 2}, "unexpected dict"),
])
def test_crafted_bodies_are_refused(body, why):
    with pytest.raises(StateCodecError, match=why):
        loads(_body(body), magic=M)


def test_crafted_frames_are_refused():
    with pytest.raises(StateCodecError, match="not allowed"):
        header = b'{"arrays":[["|O",[1]]],"body":0}'
        loads(M + struct.pack(">I", len(header)) + header + b"\0" * 8, magic=M)
    deep = {"$t": []}
    for _ in range(400):
        deep = {"$t": [deep]}
    with pytest.raises(StateCodecError, match="nested too deeply"):
        loads(_body(deep), magic=M)
    with pytest.raises(StateCodecError, match="bad magic"):
        loads(b"\x80\x04K\x01.", magic=M)
    good = dumps({"a": np.arange(4.0)}, magic=M)
    with pytest.raises(StateCodecError, match="truncated"):
        loads(good[:-3], magic=M)
    with pytest.raises(StateCodecError, match="trailing"):
        loads(good + b"\0", magic=M)


def test_no_loader_that_can_run_code():
    from securefkm.flower import checkpoint, deploy, serverapp

    for module in (codec, checkpoint, serverapp, deploy):
        source = inspect.getsource(module)
        assert "import pickle" not in source and "pickle.load" not in source, module.__name__


@pytest.mark.parametrize("protection", [["paillier"], [{"name": "masking", "sign_keys": True}],
                                        [{"name": "dp", "epsilon": 1, "delta": 1e-5, "bounds": [-12, 12],
                                          "mode": "local"}],
                                        [{"name": "dp", "epsilon": 1, "delta": 1e-5, "mode": "central"}, "validated"]])
def test_transcripts_of_every_stack_roundtrip(protection):
    """What a ServerApp saves (transcript, protection report) holds only allow-listed types."""
    from sklearn.datasets import make_blobs

    from securefkm.registry import make_estimator

    X, _ = make_blobs(120, centers=3, cluster_std=0.6, random_state=7)
    est = make_estimator("dwf", n_clusters=3, protection=protection, init_bounds=(-12, 12), max_rounds=2,
                         random_state=1).fit([X[i::3] for i in range(3)])
    back = roundtrip({"t": est.transcript_, "r": est.protection_report_})
    assert len(back["t"]) == len(est.transcript_)
    for r, q in zip(back["t"], est.transcript_):
        assert r.sampled == q.sampled and r.contributors == q.contributors
        assert [s.stage for s in r.stages] == [s.stage for s in q.stages]
        for k in q.aggregate:
            np.testing.assert_array_equal(r.aggregate[k], q.aggregate[k])
    assert str(back["r"]) == str(est.protection_report_)
