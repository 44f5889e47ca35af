"""Transcripts on disk (securefkm.transcript_file): the same records as in memory, read lazily,
and every damaged, truncated, reordered or hostile file refused with the file and frame named."""

from __future__ import annotations

import gc
import os
import pickle
import warnings

import numpy as np
import pytest
from _backend_cases import make_clients, released
from _client_policies import Replace

from attacks import AggregateDifferencing, SmallClusterDisclosure
from protocols import GaussianDP, PairwiseMasking
from securefkm import _codec, open_transcript, save_transcript
from securefkm.exceptions import InputError
from securefkm.registry import make_estimator
from securefkm.transcript import RoundRecord
from securefkm.transcript_file import (_HEAD, MAGIC, PAYLOAD_MAGIC, RoundFile, TranscriptFileError, _chain)


def _fit(path=None, *, record=None, policies=None, clients=None, algorithm="dwf", **kw):
    params = dict(n_clusters=3, random_state=0, init_bounds=(-2.0, 7.0), max_rounds=4, backend="local",
                  protection=[PairwiseMasking()], dropout_rate={1: {"masked_input": [2]}, 2: [4]})
    params.update(kw)
    est = make_estimator(algorithm, record=record, transcript_path=None if path is None else str(path), **params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(make_clients() if clients is None else clients, client_policies=policies)


def _bytes(entry) -> bytes:
    """An entry's exact encoding: two entries are equal iff every field and array is."""
    return _codec.dumps(entry, magic=PAYLOAD_MAGIC)


def _same(a, b, *, exact=True):
    """``exact``: every record's encoding equal (fits without fresh key material); else what
    the server obtained (``released``: everything but the keys, masks and shares, which real
    cryptography draws afresh in every fit)."""
    assert len(a) == len(b) and a.level == b.level
    if exact:
        assert [_bytes(r) for r in a] == [_bytes(r) for r in b]
    else:
        assert released(a) == released(b)
    assert [_bytes(x) for x in a.aborts] == [_bytes(x) for x in b.aborts]
    assert [_bytes(x) for x in a.exclusions] == [_bytes(x) for x in b.exclusions]
    assert _bytes(a.meta) == _bytes(b.meta)
    assert a.summary() == b.summary()


def test_masked_fit_with_dropouts_faults_and_exclusions_records_what_memory_records(tmp_path, monkeypatch):
    """Masking, a dropout at the masked-input stage, a dropped client, a malformed client that is
    excluded after two faults: the file holds every round as the runtime recorded it, bit for
    bit, and the fit releases what the in-memory fit releases."""
    written = []
    append = RoundFile.append
    monkeypatch.setattr(RoundFile, "append", lambda self, r: (written.append(_bytes(r)), append(self, r)))
    policies = {3: Replace("update", "garbage")}
    mem = _fit(policies=policies)
    disk = _fit(tmp_path / "t.sfkt", policies=policies)
    np.testing.assert_array_equal(mem.cluster_centers_, disk.cluster_centers_)
    assert mem.transcript_.exclusions and len(mem.transcript_) >= 4
    assert isinstance(disk.transcript_.rounds, RoundFile) and len(written) == len(mem.transcript_)
    back = open_transcript(tmp_path / "t.sfkt")
    assert [_bytes(r) for r in back] == [_bytes(r) for r in disk.transcript_] == written
    assert any(s.stage == "masked_input" and s.received for r in back for s in r.stages)
    _same(mem.transcript_, back, exact=False)


_MATRIX = {
    "dwf-ideal-masking": ("dwf", {"crypto": "ideal"}, lambda: [PairwiseMasking()]),
    "dwf-ideal-paillier": ("dwf", {"crypto": "ideal"}, lambda: ["paillier"]),
    "dwf-ideal-validated": ("dwf", {"crypto": "ideal"}, lambda: ["validated"]),
    "dwf-paillier": ("dwf", {}, lambda: ["paillier"]),
    "dwf-validated": ("dwf", {}, lambda: ["validated"]),
    "ewf-dp-local": ("ewf", {"init_bounds": (-2.0, 8.0)}, lambda: [GaussianDP(2.0, 1e-5, bounds=(-2.0, 8.0), mode="local", rng="seeded")]),
    "kfed-secure-ideal-masking": ("kfed", {"crypto": "ideal", "secure_mode": True}, lambda: [PairwiseMasking()]),
    "fcm-ideal-masking": ("fcm-fedavg", {"crypto": "ideal"}, lambda: [PairwiseMasking()]),
    "minibatch-dp-distributed": ("minibatch", {"crypto": "ideal", "init_bounds": (-2.0, 8.0)}, lambda: [
        GaussianDP(2.0, 1e-5, bounds=(-2.0, 8.0), mode="distributed", rng="seeded"), PairwiseMasking()]),
}


@pytest.mark.parametrize("case", list(_MATRIX))
def test_every_algorithm_and_protection_records_the_same_on_disk(tmp_path, case):
    """Each protection's transcript entries (the ideal functionalities' sealed handles, Paillier
    ciphertexts, validation reports, DP releases) survive the file: the same records, bit for
    bit, and the same centres as the in-memory fit."""
    name, params, protection = _MATRIX[case]
    kw = dict(algorithm=name, protection=protection(), dropout_rate=None, **params)
    mem, disk = _fit(**kw), _fit(tmp_path / "t.sfkt", **kw)
    np.testing.assert_array_equal(mem.cluster_centers_, disk.cluster_centers_)
    _same(mem.transcript_, open_transcript(tmp_path / "t.sfkt"), exact=params.get("crypto") == "ideal")


def test_an_ideal_functionality_handle_is_written_without_the_input(monkeypatch):
    """A sealed input still holding its value (not yet opened) is written as its digest only
    (the file is the server's view), and a file whose handle carries more is refused."""
    from protocols.masking.ideal import Sealed

    body = _codec.dumps(Sealed(np.arange(3.0), b"d" * 32), magic=PAYLOAD_MAGIC)
    back = _codec.loads(body, magic=PAYLOAD_MAGIC)
    assert back.digest == b"d" * 32 and back._value is None
    monkeypatch.setattr(Sealed, "_codec_state", lambda self: {"digest": self.digest, "_value": self._value})
    smuggled = _codec.dumps(Sealed(np.arange(3.0), b"d" * 32), magic=PAYLOAD_MAGIC)
    monkeypatch.undo()
    with pytest.raises(_codec.StateCodecError, match="Sealed: bad fields"):
        _codec.loads(smuggled, magic=PAYLOAD_MAGIC)


def test_aborted_rounds_are_logged_and_read_back(tmp_path):
    kw = dict(dropout_rate={1: {"masked_input": [0, 1, 2, 3, 4]}})
    mem, disk = _fit(**kw), _fit(tmp_path / "t.sfkt", **kw)
    assert [a.round for a in mem.transcript_.aborts] == [1]
    _same(mem.transcript_, open_transcript(tmp_path / "t.sfkt"), exact=False)
    assert any(r.aborted for r in open_transcript(tmp_path / "t.sfkt"))


@pytest.mark.parametrize("record", ["aggregates", "none"])
def test_record_levels_apply_to_the_file(tmp_path, record):
    mem, disk = _fit(record=record), _fit(tmp_path / "t.sfkt", record=record)
    back = open_transcript(tmp_path / "t.sfkt")
    assert back.level == record and (len(back) == 0) == (record == "none")
    _same(mem.transcript_, back)
    assert all(not s.received for r in back for s in r.stages)


def test_attacks_read_the_file_as_they_read_memory(tmp_path):
    """A plain fit (the server reads every client's cells): the same claims from the file."""
    clients = make_clients(n_clients=120)  # 3 records a client: cells of one record
    kw = dict(protection=[], dropout_rate=None, clients=clients)
    mem, disk = _fit(**kw), _fit(tmp_path / "t.sfkt", **kw)
    back = open_transcript(tmp_path / "t.sfkt")
    for attack in (SmallClusterDisclosure(), AggregateDifferencing()):
        a, b = attack.evaluate(mem.transcript_, clients), attack.evaluate(back, clients)
        assert a.to_dict() == b.to_dict()
    assert SmallClusterDisclosure().evaluate(back, clients).n_claims > 0


def test_distributed_dp_fit_spends_the_same_and_records_the_same(tmp_path):
    dp = dict(protection=[GaussianDP(epsilon=1.0, delta=1e-5, mode="distributed", rng="seeded"), PairwiseMasking()],
              dropout_rate=None, max_rounds=None, init_bounds=(-4.0, 9.0))
    mem, disk = _fit(**dp), _fit(tmp_path / "t.sfkt", **dp)
    assert mem.privacy_spent_ == disk.privacy_spent_
    _same(mem.transcript_, open_transcript(tmp_path / "t.sfkt"), exact=False)


def _live_records() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is RoundRecord)


def test_no_round_is_held_in_memory(tmp_path):
    """A file-backed transcript keeps per round its index entry (offset, length, two chain
    digests: 80 bytes), never the record: after the fit no RoundRecord is alive, where the
    in-memory fit holds one per round."""
    before = _live_records()
    kw = dict(max_rounds=12, dropout_rate=None, protection=[], tol=0.0)
    mem = _fit(**kw)
    assert _live_records() - before == len(mem.transcript_) == 13
    del mem
    disk = _fit(tmp_path / "t.sfkt", **kw)
    rf = disk.transcript_.rounds
    assert _live_records() - before == 0 and len(rf) == 13
    assert len(rf._digests) == 64 * 13 and rf._offsets.itemsize == rf._lengths.itemsize == 8
    disk.transcript_[5]  # a read is decoded, returned and not kept
    assert _live_records() - before == 0

def test_an_existing_path_is_refused_naming_the_argument(tmp_path):
    path = tmp_path / "t.sfkt"
    path.write_bytes(b"results of another study")
    with pytest.raises(TranscriptFileError, match="transcript_path=.*exists"):
        _fit(path)
    assert path.read_bytes() == b"results of another study"


def test_rounds_after_a_close_follow_it_and_the_newer_meta_wins(tmp_path):
    est = make_estimator("dwf", n_clusters=3, random_state=0, init_bounds=(-2.0, 7.0), backend="local",
                         transcript_path=str(tmp_path / "t.sfkt"))
    fed, _ = est.make_federation(make_clients(), max_rounds=2)
    state = fed.run(0)
    fed.close()
    n = len(open_transcript(tmp_path / "t.sfkt"))
    assert n == len(fed.transcript) >= 2
    fed.run_round(state, run=0, round=n)
    with pytest.raises(TranscriptFileError, match="closing meta frame"):
        open_transcript(tmp_path / "t.sfkt")
    fed.transcript.meta["note"] = "driven on"
    fed.close()
    back = open_transcript(tmp_path / "t.sfkt")
    assert len(back) == n + 1 and back.meta["note"] == "driven on"


def test_save_transcript_round_trips_an_in_memory_transcript(tmp_path):
    mem = _fit(policies={3: Replace("update", "garbage")})
    save_transcript(mem.transcript_, tmp_path / "t.sfkt")  # the same object: exact
    _same(mem.transcript_, open_transcript(tmp_path / "t.sfkt"))
    with pytest.raises(TranscriptFileError, match="expected a Transcript"):
        save_transcript([1, 2], tmp_path / "u.sfkt")


def test_a_read_transcript_pickles_by_path(tmp_path):
    disk = _fit(tmp_path / "t.sfkt")
    copy = pickle.loads(pickle.dumps(disk))  # a fitted estimator is picklable
    _same(disk.transcript_, copy.transcript_)  # the same file: exact
    with pytest.raises(TranscriptFileError, match="opened for reading"):
        copy.transcript_.rounds.append(disk.transcript_[0])


# ---------------------------------------------------------------- damaged and hostile files
def _frames(data: bytes):
    """(offset of the frame's header, kind, payload) of each frame."""
    out, pos = [], len(MAGIC)
    while pos < len(data):
        kind, length, _ = _HEAD.unpack_from(data, pos)
        out.append((pos, kind, data[pos + _HEAD.size: pos + _HEAD.size + length]))
        pos += _HEAD.size + length
    return out


def _rebuild(frames) -> bytes:
    """A file of ``(kind, payload)`` frames with a valid chain (what a forger could write)."""
    import hashlib

    digest, out = hashlib.sha256(MAGIC).digest(), [MAGIC]
    for kind, payload in frames:
        digest = _chain(digest, kind, payload)
        out.append(_HEAD.pack(kind, len(payload), digest) + payload)
    return b"".join(out)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("t") / "good.sfkt"
    _fit(path, policies={3: Replace("update", "garbage")}, dropout_rate={1: {"masked_input": [0, 1, 2, 3, 4]}})
    return path.read_bytes()


def _write(tmp_path, data: bytes):
    path = tmp_path / "bad.sfkt"
    path.write_bytes(data)
    return path


def test_a_flipped_byte_in_a_round_fails_when_that_round_is_read(tmp_path, good):
    frames = _frames(good)
    rounds = [f for f in frames if f[1] == b"R"]
    at = rounds[1][0] + _HEAD.size + len(rounds[1][2]) // 2
    t = open_transcript(_write(tmp_path, good[:at] + bytes([good[at] ^ 1]) + good[at + 1:]))
    t[0]
    with pytest.raises(TranscriptFileError, match=r"bad\.sfkt, round 1: fails its SHA-256 chain check"):
        t[1]


def test_a_flipped_byte_in_a_logged_entry_fails_at_open(tmp_path, good):
    (pos, _, payload), = [f for f in _frames(good) if f[1] == b"A"][:1]
    at = pos + _HEAD.size + len(payload) - 3
    with pytest.raises(TranscriptFileError, match=r"frame \d+: fails its SHA-256 chain check"):
        open_transcript(_write(tmp_path, good[:at] + bytes([good[at] ^ 0x40]) + good[at + 1:]))


def test_a_removed_or_reordered_frame_breaks_the_chain(tmp_path, good):
    frames = _frames(good)
    pos = [f[0] for f in frames] + [len(good)]
    r1, r2 = [i for i, f in enumerate(frames) if f[1] == b"R"][1:3]
    removed = good[:pos[r1]] + good[pos[r1 + 1]:]
    with pytest.raises(TranscriptFileError, match="chain check"):
        list(open_transcript(_write(tmp_path, removed)))
    swapped = good[:pos[r1]] + good[pos[r2]:pos[r2 + 1]] + good[pos[r1 + 1]:pos[r2]] + good[pos[r1]:pos[r1 + 1]] \
        + good[pos[r2 + 1]:] if r2 == r1 + 1 else None
    if swapped is not None:
        with pytest.raises(TranscriptFileError, match="chain check"):
            list(open_transcript(_write(tmp_path, swapped)))


def test_a_truncated_file_is_refused_unless_asked_for(tmp_path, good):
    frames = _frames(good)
    cut = frames[-1][0] + 10  # inside the closing meta frame's header
    path = _write(tmp_path, good[:cut])
    with pytest.raises(TranscriptFileError, match=r"bad\.sfkt, frame \d+: its header is truncated.*allow_incomplete"):
        open_transcript(path)
    back = open_transcript(path, allow_incomplete=True)
    assert len(back) == sum(f[1] == b"R" for f in frames) and back.meta == {}
    mid = frames[2][0] + _HEAD.size + 5  # inside a round's payload
    assert len(open_transcript(_write(tmp_path, good[:mid]), allow_incomplete=True)) == sum(
        f[1] == b"R" for f in frames[:2])


@pytest.mark.parametrize("data, why", [
    (b"", "bad magic"),
    (pickle.dumps({"rounds": []}), "bad magic"),
    (MAGIC, "no header frame"),
    (MAGIC + _HEAD.pack(b"Z", 0, bytes(32)), "unknown frame kind"),
    (MAGIC + _HEAD.pack(b"R", 1 << 40, bytes(32)), "more than the"),
])
def test_files_that_are_not_transcripts_are_refused(tmp_path, data, why):
    with pytest.raises(TranscriptFileError, match=why):
        open_transcript(_write(tmp_path, data))


class _Marker:
    def __reduce__(self):
        return (os.system, ("touch marker-of-code-execution",))


def test_a_pickle_payload_with_a_valid_chain_is_never_unpickled(tmp_path, good, monkeypatch):
    """A forger who recomputes the chain still cannot make the reader run code: payloads are
    decoded by the codec, which builds allow-listed classes only."""
    monkeypatch.chdir(tmp_path)
    frames = [(k, p) for _, k, p in _frames(good)]
    evil = [frames[0], (b"R", pickle.dumps(_Marker())), *frames[1:]]
    t = open_transcript(_write(tmp_path, _rebuild(evil)))
    with pytest.raises(TranscriptFileError, match="round 0: payload is not a round record"):
        t[0]
    with pytest.raises(TranscriptFileError, match="payload is not a transcript entry"):
        open_transcript(_write(tmp_path, _rebuild([frames[0], (b"A", pickle.dumps(_Marker())), *frames[1:]])))
    assert not (tmp_path / "marker-of-code-execution").exists()


def test_a_frame_of_the_wrong_type_is_refused(tmp_path, good):
    frames = [(k, p) for _, k, p in _frames(good)]
    meta = _codec.dumps({"a": 1}, magic=PAYLOAD_MAGIC)
    t = open_transcript(_write(tmp_path, _rebuild([frames[0], (b"R", meta), *frames[1:]])))
    with pytest.raises(TranscriptFileError, match="holds a dict, not a RoundRecord"):
        t[0]
    with pytest.raises(TranscriptFileError, match="the first frame is not the header"):
        open_transcript(_write(tmp_path, _rebuild(frames[1:])))
    with pytest.raises(TranscriptFileError, match="a second header"):
        open_transcript(_write(tmp_path, _rebuild([frames[0], *frames])))
    bad_header = (b"H", _codec.dumps({"version": 99, "level": "full"}, magic=PAYLOAD_MAGIC))
    with pytest.raises(TranscriptFileError, match="expected version 1"):
        open_transcript(_write(tmp_path, _rebuild([bad_header, *frames[1:]])))


def test_the_digest_commits_to_the_whole_file(tmp_path, good):
    a = open_transcript(_write(tmp_path, good)).rounds.digest
    frames = [(k, p) for _, k, p in _frames(good)]
    meta = (b"M", _codec.dumps({"forged": True}, magic=PAYLOAD_MAGIC))
    forged = open_transcript(_write(tmp_path, _rebuild([*frames[:-1], meta]))).rounds.digest
    assert a != forged and a == RoundFile.open(_write(tmp_path, good))[0].digest


def test_attacks_refuse_a_transcript_recorded_with_less_from_a_file(tmp_path):
    _fit(tmp_path / "t.sfkt", record="aggregates")
    with pytest.raises(InputError, match="record='aggregates'"):
        SmallClusterDisclosure().evaluate(open_transcript(tmp_path / "t.sfkt"), make_clients())


def test_the_file_format_is_pinned():
    """Files written today stay readable: the magic and the frame header (kind 1 byte, length
    8, digest 32) are the documented ones; changing them needs a new version."""
    assert _HEAD.size == 41 and _HEAD.format == ">cQ32s" and MAGIC == b"SFKMTRN\x01"


def test_a_shared_cohort_tuple_and_centres_array_are_written_once():
    """Every client's request holds the same cohort tuple and every broadcast the same centres:
    written once and referred to, so a round's bytes grow with its clients, not their square;
    read back, the references are one object again."""
    cohort = tuple(range(1000))
    centres = np.arange(6.0).reshape(3, 2)
    value = [{"sampled": cohort, "centres": centres} for _ in range(200)]
    body = _codec.dumps(value, magic=PAYLOAD_MAGIC)
    assert len(body) < len(_codec.dumps(cohort, magic=PAYLOAD_MAGIC)) + 200 * 80
    back = _codec.loads(body, magic=PAYLOAD_MAGIC)
    assert all(v["sampled"] is back[0]["sampled"] == cohort for v in back)
    assert all(v["centres"] is back[0]["centres"] for v in back)
    np.testing.assert_array_equal(back[-1]["centres"], centres)


@pytest.mark.parametrize("body, why", [
    ('[{"$T": 0}]', "bad tuple reference"),                                   # before any tuple
    ('[{"$t": [1, {"$T": 0}]}]', "bad tuple reference"),                     # to itself, being read
    ('[{"$t": [{"$t": [1]}]}, {"$T": 0}]', "only stand for a tuple of scalars"),  # a nested one
])
def test_hostile_tuple_references_are_refused(body, why):
    from securefkm._frame import frame

    import json

    data = frame(json.loads(body), [], magic=PAYLOAD_MAGIC)
    with pytest.raises(_codec.StateCodecError, match=why):
        _codec.loads(data, magic=PAYLOAD_MAGIC)
