"""Transcripts on disk: a fit's rounds appended to a file as they happen, read back lazily.

A transcript at ``record="full"`` grows by every sampled client's message each round (about
``n_clusters x (n_features + 1)`` float64 values a client, more under masking or Paillier),
which at cross-device cohorts outgrows memory long before the round itself does.
``Federation(transcript_path=...)`` (and every estimator's ``transcript_path``) writes each
round to a file the moment it is recorded and keeps in memory only an index of offsets;
attacks, ``summary()`` and indexing read one round at a time.

File layout (all integers big-endian)::

    MAGIC (8 bytes: b"SFKMTRN\\x01")
    frame*: kind (1 byte) | payload length (8 bytes) | digest (32 bytes) | payload

``kind`` is ``H`` (header: format version and record level; the first frame), ``R`` (a
:class:`~securefkm.transcript.RoundRecord`), ``A`` (an
:class:`~securefkm.transcript.AbortedRound`), ``X`` (an
:class:`~securefkm.transcript.Exclusion`) or ``M`` (the transcript's ``meta``, written on
each :meth:`RoundFile.close`). A payload is the checkpoint codec's body
(:mod:`securefkm._codec`: tagged JSON and raw numeric arrays, allow-listed classes only), so
reading a file never runs code from it. ``digest`` chains the frames:
``SHA-256(previous digest | kind | length | payload)``, the first over ``SHA-256(MAGIC)``.
A flipped byte, a truncated or removed frame and reordered frames all fail the check, and
:attr:`RoundFile.digest` (the last frame's) commits to the whole file: keep it elsewhere to
detect a rewritten file, which the chain alone cannot (anyone may recompute it).

A file is complete when its last frame is ``M``. The file is append-only: rounds recorded
after a close (an attack driving more rounds) follow it, and the next close writes a newer
``M``. Reading an incomplete file (the writing process died) is refused unless asked for
with ``allow_incomplete=True``, which reads the whole frames written so far.
"""

from __future__ import annotations

import hashlib
import os
import struct
from array import array
from collections.abc import Sequence

from . import _codec
from .exceptions import SecureFKMError
from .transcript import RECORD_LEVELS, AbortedRound, Exclusion, RoundRecord, Transcript

MAGIC = b"SFKMTRN\x01"
VERSION = 1
#: the codec's magic inside each frame's payload
PAYLOAD_MAGIC = b"SFKM-TR\n"
#: the largest payload a reader accepts (one round's messages)
MAX_FRAME_BYTES = 1 << 36
_HEAD = struct.Struct(">cQ32s")
_KINDS = {b"H": dict, b"R": RoundRecord, b"A": AbortedRound, b"X": Exclusion, b"M": dict}


class TranscriptFileError(SecureFKMError, ValueError):
    """A transcript file that is not one, is damaged or incomplete; names the file and frame."""


def _chain(previous: bytes, kind: bytes, payload: bytes) -> bytes:
    return hashlib.sha256(previous + kind + struct.pack(">Q", len(payload)) + payload).digest()


class RoundFile(Sequence):
    """The rounds of a transcript in a file: a read-only sequence of
    :class:`~securefkm.transcript.RoundRecord` that is also the transcript's writer.

    Holds per round its offset, length and chain digests (80 bytes a round), never
    the records; ``rf[i]`` reads, checks and decodes round ``i``. Made by
    :meth:`create` (a new file) or :meth:`open` (an existing one).
    """

    def __init__(self, path, level: str):
        self.path = os.fspath(path)
        self.level = level
        # per round: payload offset and length, the chain digest before it and its own (80 bytes)
        self._offsets, self._lengths = array("Q"), array("Q")
        self._digests = bytearray()  # 64 bytes a round: previous digest | digest
        self.digest = hashlib.sha256(MAGIC).digest()
        self._fh = None
        self._writable = False

    # ---------------------------------------------------------------- writing
    @classmethod
    def create(cls, path, level: str = "full") -> "RoundFile":
        """A new transcript file at ``path`` (refused if it exists: a study's transcript is not
        overwritten by accident)."""
        if level not in RECORD_LEVELS:
            raise TranscriptFileError(f"level={level!r}: expected one of {RECORD_LEVELS}")
        try:
            fh = open(path, "xb")
        except FileExistsError:
            raise TranscriptFileError(
                f"transcript_path={os.fspath(path)!r} exists; pass a new path (or delete the old file)") from None
        except OSError as exc:
            raise TranscriptFileError(f"transcript_path={os.fspath(path)!r} cannot be created: {exc}") from None
        self = cls(path, level)
        fh.write(MAGIC)
        self._fh, self._writable = fh, True
        self._write(b"H", {"version": VERSION, "level": level})
        return self

    def _write(self, kind: bytes, value) -> None:
        if not self._writable:
            raise TranscriptFileError(f"{self.path}: opened for reading; a read transcript is not appended to")
        payload = _codec.dumps(value, magic=PAYLOAD_MAGIC)
        digest = _chain(self.digest, kind, payload)
        fh = self._handle()
        fh.seek(0, os.SEEK_END)
        offset = fh.tell() + _HEAD.size
        fh.write(_HEAD.pack(kind, len(payload), digest) + payload)
        if kind == b"R":
            self._index(offset, len(payload), self.digest, digest)
        self.digest = digest

    def append(self, record: RoundRecord) -> None:
        self._write(b"R", record)

    def log(self, entry) -> None:
        """Write an :class:`AbortedRound` or :class:`Exclusion` as it happens."""
        self._write(b"A" if isinstance(entry, AbortedRound) else b"X", entry)

    def close(self, meta: dict | None = None) -> None:
        """Write ``meta`` (the file is then complete) and release the file handle; reading
        still works (it reopens the file). Safe to call twice."""
        if self._writable and meta is not None:
            self._write(b"M", dict(meta))
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _handle(self):
        if self._fh is None:
            self._fh = open(self.path, "r+b" if self._writable else "rb")
        else:
            self._fh.flush()
        return self._fh

    # ---------------------------------------------------------------- reading
    @classmethod
    def open(cls, path, *, allow_incomplete: bool = False) -> tuple["RoundFile", dict, list, list]:
        """``(rounds, meta, aborts, exclusions)`` of the file at ``path``: the frames' headers
        are scanned (rounds are indexed, not read), the small frames decoded and checked."""
        path = os.fspath(path)
        try:
            fh = open(path, "rb")
        except OSError as exc:
            raise TranscriptFileError(f"{path!r} cannot be opened: {exc}") from None
        self = cls(path, "full")
        self._fh = fh
        if fh.read(len(MAGIC)) != MAGIC:
            fh.close()
            raise TranscriptFileError(f"{path}: not a securefkm transcript file (bad magic)")
        size = os.fstat(fh.fileno()).st_size
        meta, aborts, exclusions, frame, last = None, [], [], 0, None
        while True:
            offset = fh.tell()
            head = fh.read(_HEAD.size)
            if not head:
                break
            if len(head) < _HEAD.size:
                self._incomplete(allow_incomplete, frame, "its header is truncated")
                break
            kind, length, digest = _HEAD.unpack(head)
            if kind not in _KINDS:
                self._fail(frame, f"unknown frame kind {kind!r}")
            if length > MAX_FRAME_BYTES:
                self._fail(frame, f"declares {length} bytes, more than the {MAX_FRAME_BYTES} a frame may hold")
            if offset + _HEAD.size + length > size:
                self._incomplete(allow_incomplete, frame, "its payload is truncated")
                break
            if frame == 0 and kind != b"H":
                self._fail(frame, "the first frame is not the header")
            if kind == b"R":
                self._index(offset + _HEAD.size, length, self.digest, digest)
                self.digest = digest
                fh.seek(length, os.SEEK_CUR)
            else:
                value = self._decode(frame, kind, fh.read(length), self.digest, digest)
                self.digest = digest
                if kind == b"H":
                    if frame != 0:
                        self._fail(frame, "a second header")
                    if value.get("version") != VERSION or value.get("level") not in RECORD_LEVELS:
                        self._fail(frame, f"header {value!r}: expected version {VERSION} and a record level")
                    self.level = value["level"]
                elif kind == b"M":
                    meta = value
                elif kind == b"A":
                    aborts.append(value)
                else:
                    exclusions.append(value)
            last = kind
            frame += 1
        if frame == 0:
            self._fail(0, "no header frame (empty file)")
        if last != b"M":
            self._incomplete(allow_incomplete, frame, "the file ends before its closing meta frame: the fit that "
                                                      "wrote it did not finish")
        return self, meta or {}, aborts, exclusions

    def _fail(self, frame: int, why: str):
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        raise TranscriptFileError(f"{self.path}, frame {frame}: {why}")

    def _incomplete(self, allowed: bool, frame: int, why: str) -> None:
        if not allowed:
            self._fail(frame, why + "; pass allow_incomplete=True to read the whole frames before it")

    def _decode(self, frame: int, kind: bytes, payload: bytes, previous: bytes, digest: bytes):
        if _chain(previous, kind, payload) != digest:
            self._fail(frame, "fails its SHA-256 chain check: the file was altered, damaged or reordered")
        try:
            value = _codec.loads(payload, magic=PAYLOAD_MAGIC, max_bytes=MAX_FRAME_BYTES)
        except _codec.StateCodecError as exc:
            self._fail(frame, f"payload is not a transcript entry: {exc}")
        if type(value) is not _KINDS[kind]:
            self._fail(frame, f"a {kind.decode()} frame holds a {type(value).__name__}")
        return value

    def _index(self, offset: int, length: int, previous: bytes, digest: bytes) -> None:
        self._offsets.append(offset)
        self._lengths.append(length)
        self._digests += previous + digest

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"round {i} of a transcript of {n} rounds")
        fh = self._handle()
        fh.seek(self._offsets[j])
        d = bytes(self._digests[64 * j: 64 * j + 64])
        return self._decode_round(j, fh.read(self._lengths[j]), d[:32], d[32:])

    def _decode_round(self, j: int, payload: bytes, previous: bytes, digest: bytes) -> RoundRecord:
        if _chain(previous, b"R", payload) != digest:
            raise TranscriptFileError(f"{self.path}, round {j}: fails its SHA-256 chain check: the file was "
                                      "altered or damaged after it was written")
        try:
            value = _codec.loads(payload, magic=PAYLOAD_MAGIC, max_bytes=MAX_FRAME_BYTES)
        except _codec.StateCodecError as exc:
            raise TranscriptFileError(f"{self.path}, round {j}: payload is not a round record: {exc}") from None
        if type(value) is not RoundRecord:
            raise TranscriptFileError(f"{self.path}, round {j}: holds a {type(value).__name__}, not a RoundRecord")
        return value

    def __iter__(self):
        for j in range(len(self)):
            yield self[j]

    def verify(self) -> None:
        """Read and check every round (one at a time); :class:`TranscriptFileError` at the first
        that fails."""
        for _ in self:
            pass

    def __getstate__(self):
        # a copy (pickle, deepcopy) reads the same file and never writes to it: one writer
        if self._fh is not None:
            self._fh.flush()
        state = dict(self.__dict__)
        state["_fh"], state["_writable"] = None, False
        return state

    def __repr__(self) -> str:
        return f"RoundFile({self.path!r}, {len(self)} rounds, level={self.level!r})"


def file_transcript(path, meta: dict, level: str = "full") -> Transcript:
    """An empty :class:`~securefkm.transcript.Transcript` whose rounds, aborts and exclusions are
    written to a new file at ``path`` (the ``transcript_path`` of a fit)."""
    return Transcript(meta=meta, rounds=RoundFile.create(path, level), level=level)


def open_transcript(path, *, allow_incomplete: bool = False) -> Transcript:
    """The :class:`~securefkm.transcript.Transcript` in the file at ``path``, rounds read lazily.

    Every attack and ``summary()`` accept it like an in-memory transcript. Refused with
    :class:`TranscriptFileError`, naming the file and the frame, when the file is not a
    transcript, fails its checks, or is incomplete (unless ``allow_incomplete=True``)."""
    rounds, meta, aborts, exclusions = RoundFile.open(path, allow_incomplete=allow_incomplete)
    return Transcript(meta=meta, rounds=rounds, level=rounds.level, aborts=aborts, exclusions=exclusions)


def save_transcript(transcript: Transcript, path) -> None:
    """Write an in-memory transcript to a new file at ``path`` (read back with
    :func:`open_transcript`)."""
    if not isinstance(transcript, Transcript):
        raise TranscriptFileError(f"transcript: expected a Transcript, got {type(transcript).__name__}")
    out = RoundFile.create(path, transcript.level)
    try:
        for record in transcript.rounds:
            out.append(record)
        for entry in [*transcript.aborts, *transcript.exclusions]:
            out.log(entry)
    except BaseException:
        out.close()  # no meta frame: the partial file reads as incomplete
        raise
    out.close(transcript.meta)
