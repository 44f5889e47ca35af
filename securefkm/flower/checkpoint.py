"""Crash-safe ServerApp: an atomic, authenticated checkpoint after every completed round.

The ServerApp (run config ``checkpoint-path``) drives the federation's rounds itself
(:func:`run_rounds`, the same loop as :meth:`Federation.run`) and after every completed
round writes one file, atomically (temporary file, ``fsync``, ``os.replace``, ``fsync`` of
the folder), holding:

* the checkpoint's own ``run_id`` (kept across restarts) and the spec it belongs to;
* the run index, the next round number, the algorithm's state and its object's fields,
  the finished restarts' states (``n_init > 1``);
* the federation's sampling RNG (and retry sampler), seed sequence, global round counter,
  transcript, abort count and the current run's aborted attempts;
* every layer's fields **except the secure aggregator's**: the DP accountant and noise
  schedule continue where they were, so a restarted ServerApp never re-spends budget it
  already spent, and the budget can never exceed the target (the accountant's own checks).
  A layer's reference to another layer (the DP layer's link to the aggregator, say) is
  saved as a reference and rebound to the restarted federation's layer.

What is *not* restored, on purpose: the secure aggregator (masking keys, Paillier keys,
the key authority session). A restarted ServerApp builds it fresh: the round that was
interrupted is redone from the last completed state with fresh keys and masks (and a new
authority session, i.e. a new Paillier keypair); nothing of the interrupted attempt is
reused. Clients are new ClientApp instances in the new Flower run, so client-side state
is fresh too (docs/deployment.md, "Crash-safe ServerApp", lists what that means).

The format cannot run code: tagged JSON and raw numeric arrays
(:mod:`securefkm.flower._state_codec`, an allow-list of the library's record classes),
laid out as ``MAGIC`` | HMAC-SHA256 (32 bytes) | body. The HMAC covers the magic and the
body under a 32-byte key kept in a separate file (run config ``checkpoint-key``; default
``<checkpoint-path>.key``, created with mode 0600 beside the first checkpoint). The tag is
checked before anything of the body is parsed: a tampered, truncated or foreign file, or
one written under another key, is refused with the file named and the fix. Keep the key
where whoever can write the checkpoint folder cannot, if that is in your threat model.
The checkpoint holds the transcript, i.e. everything the server saw: protect it like the
server's memory.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import logging
import os
import secrets
from pathlib import Path

from ..exceptions import InputError
from ._state_codec import StateCodecError, dumps, loads

log = logging.getLogger("securefkm.flower")

FORMAT = "securefkm-checkpoint/v3"
MAGIC = b"SFKM-CKPT/2\n"
_TAG = 32
_KEY_BYTES = 32
_FIELDS = {"format", "run_id", "spec", "rounds_done", "resume", "n_aborted_rounds", "aborts", "round_counter",
           "transcript", "layers"}
#: the part of the state taken from the last resumable round (Algorithm.resumable)
_RESUME = {"run", "t", "closing", "state", "states", "algorithm", "rng", "retry_rng", "algo_seq"}
#: the resume point of a checkpoint written before any resumable round: the fit's start
_AFRESH = {"run": 0, "t": 0, "closing": False, "state": None, "states": [], "algorithm": None, "rng": None,
           "retry_rng": None, "algo_seq": None}


def write_atomic(path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tag(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, MAGIC + body, hashlib.sha256).digest()


class CheckpointKey:
    """The HMAC key of a checkpoint: 32 random bytes, hex, in a file of its own (mode 0600)."""

    def __init__(self, path, checkpoint=None):
        self.path = Path(path)
        self.checkpoint = checkpoint

    def read(self) -> bytes | None:
        if not self.path.is_file():
            return None
        text = self.path.read_text(encoding="ascii", errors="replace").strip()
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) != _KEY_BYTES:
            raise InputError(f"checkpoint-key {str(self.path)!r} (of checkpoint {str(self.checkpoint)!r}) is not a "
                             f"checkpoint key ({_KEY_BYTES} bytes in hex); give the key file the checkpoint was "
                             "written with, or remove both.")
        return key

    def create(self) -> bytes:
        key = secrets.token_bytes(_KEY_BYTES)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(key.hex() + "\n")
        return key


class Checkpoint:
    """The checkpoint file of one ServerApp run (``path``) for ``spec_json``, authenticated
    under the key in ``key_path`` (default ``<path>.key``)."""

    def __init__(self, path, spec_json: str, key_path=None):
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise InputError(f"checkpoint-path {str(path)!r}: its folder does not exist; create it.")
        self.key_file = CheckpointKey(self.path.with_name(self.path.name + ".key") if not key_path else key_path,
                                      self.path)
        if not self.key_file.path.parent.is_dir():
            raise InputError(f"checkpoint-key {str(key_path)!r}: its folder does not exist; create it.")
        self.spec_json = spec_json
        self._key = self.key_file.read()
        self._payload = self._load()
        #: what the file on disk holds (``run_id``, ``rounds_done``, ``run``, ``t``), ``None`` if none
        self.info = None if self._payload is None else dict(self._payload)
        self._resume = None
        self.run_id = self._payload["run_id"] if self._payload else secrets.token_hex(8)
        self.resumed_from = None if self._payload is None else self._payload["rounds_done"]

    def _refuse(self, why: str, fix: str = "remove it (and its key file) to start the run afresh"):
        raise InputError(f"checkpoint {str(self.path)!r} {why}; {fix}.")

    def _read_body(self) -> bytes | None:
        if not self.path.is_file():
            return None
        data = self.path.read_bytes()
        if not data.startswith(MAGIC):
            if data[:1] == b"\x80":
                self._refuse("is in the pickle format of an older securefkm, which can run code and is not read")
            if MAGIC.startswith(data):
                self._refuse("is truncated")
            self._refuse("is not a securefkm checkpoint", "remove it or choose another checkpoint-path")
        if len(data) < len(MAGIC) + _TAG:
            self._refuse("is truncated")
        if self._key is None:
            self._refuse(f"has no key: its key file {str(self.key_file.path)!r} is missing",
                         "restore the key file it was written with (run config 'checkpoint-key'), "
                         "or remove the checkpoint")
        tag, body = data[len(MAGIC):len(MAGIC) + _TAG], data[len(MAGIC) + _TAG:]
        if not hmac.compare_digest(tag, _tag(self._key, body)):
            self._refuse(f"fails its HMAC-SHA256 check under {str(self.key_file.path)!r}: it was altered, "
                         "truncated or written under another key",
                         "remove it to start the run afresh, or give the key it was written with "
                         "(run config 'checkpoint-key')")
        return body

    def _load(self):
        body = self._read_body()
        if body is None:
            return None
        try:
            # authenticated: written by this ServerApp under its key; refs resolved at restore
            saved = loads(body, magic=b"")
        except StateCodecError as exc:
            self._refuse(f"cannot be read ({exc})")
        if not isinstance(saved, dict) or set(saved) != _FIELDS or saved["format"] != FORMAT:
            self._refuse("is not a securefkm checkpoint of this version", "remove it or choose another checkpoint-path")
        if saved["spec"] != self.spec_json:
            self._refuse("is the checkpoint of another spec", "remove it or choose another checkpoint-path")
        self._body = body
        resume = saved["resume"] or _AFRESH
        if not isinstance(resume, dict) or set(resume) != _RESUME:
            self._refuse("is not a securefkm checkpoint of this version", "remove it or choose another checkpoint-path")
        return {"run_id": saved["run_id"], "rounds_done": saved["rounds_done"], "run": resume["run"], "t": resume["t"]}

    # ------------------------------------------------------------------ save / restore
    @staticmethod
    def _refs(federation) -> list:
        return [*federation.layers, federation.algorithm]

    def save(self, federation, *, run: int, t: int, state, closing: bool, states: list, aborts=()) -> None:
        aggregator = federation.aggregator
        refs = self._refs(federation)
        if federation.algorithm.resumable(state):
            snapshot = {
                "run": run,
                "t": t,
                "closing": closing,
                "state": state,
                "states": list(states),
                "algorithm": dict(federation.algorithm.__dict__),
                "rng": federation.rng.bit_generator.state,
                # the runtime's retry sampler, where it has one
                "retry_rng": _rng_state(federation, "_retry_rng"),
                "algo_seq": federation._algo_seq,
            }
            # a copy: the federation goes on mutating its generators and states in place
            self._resume = copy.deepcopy(snapshot, {id(obj): obj for obj in refs})
        payload = {
            "format": FORMAT,
            "run_id": self.run_id,
            "spec": self.spec_json,
            "rounds_done": len(federation.transcript),
            # the last state a restarted (memory-less) client population can go on from;
            # None: none yet, a restart begins the fit afresh (with the budget already spent)
            "resume": self._resume,
            # what the server has seen and spent so far, up to the last completed round
            "n_aborted_rounds": getattr(federation, "n_aborted_rounds", 0),
            "aborts": list(aborts),
            "round_counter": federation._round_counter,
            "transcript": federation.transcript,
            "layers": [None if layer is aggregator else dict(layer.__dict__) for layer in federation.layers],
        }
        try:
            body = dumps(payload, magic=b"", refs={id(obj): i for i, obj in enumerate(refs)})
        except StateCodecError as exc:
            raise InputError(f"the run's state cannot be checkpointed: {exc}") from None
        if self._key is None:
            self._key = self.key_file.create()
        write_atomic(self.path, MAGIC + _tag(self._key, body) + body)

    def restore(self, federation) -> dict | None:
        """Put the saved federation state back into a freshly built ``federation``."""
        if self._payload is None:
            return None
        saved = loads(self._body, magic=b"", refs=self._refs(federation))
        if len(saved["layers"]) != len(federation.layers) or any(
                (fields is None) != (layer is federation.aggregator)
                for layer, fields in zip(federation.layers, saved["layers"])):
            self._refuse("does not match this run's protection stack")
        resume = saved["resume"]
        if resume is not None:
            self._resume = copy.deepcopy(resume, {id(obj): obj for obj in self._refs(federation)})
            federation.algorithm.__dict__.update(resume["algorithm"])
            federation.rng.bit_generator.state = resume["rng"]
            if resume["retry_rng"] is not None and hasattr(federation, "_retry_rng"):
                federation._retry_rng.bit_generator.state = resume["retry_rng"]
            federation._algo_seq = resume["algo_seq"]
        else:  # no resumable state yet: the fit starts afresh from the federation as built
            resume = _AFRESH
        if hasattr(federation, "n_aborted_rounds"):
            federation.n_aborted_rounds = saved["n_aborted_rounds"]
        # never reuse a protocol round id: the counter is the latest one, not the resume point's
        federation._round_counter = saved["round_counter"]
        federation.transcript = saved["transcript"]
        for layer, fields in zip(federation.layers, saved["layers"]):
            if fields is not None:
                layer.__dict__.update(fields)
        redo = sum(1 for r in saved["transcript"].rounds if r.run == resume["run"] and r.round >= resume["t"])
        log.warning("resuming run %s from %s: %d rounds done, redoing round %d with fresh keys%s",
                    self.run_id, self.path, saved["rounds_done"], resume["t"],
                    f" (and the {redo - 1} before it that the clients' lost memory needs)" if redo > 1 else "")
        saved = {**saved, **resume}
        return saved


def _rng_state(obj, name: str):
    rng = getattr(obj, name, None)
    return None if rng is None else rng.bit_generator.state


def run_rounds(federation, checkpoint: Checkpoint | None = None) -> list:
    """Every restart's final state, like ``[federation.run(r) for r in range(n_runs)]``,
    through :meth:`Federation.run` itself, with a checkpoint after every completed round
    and a resume from ``checkpoint`` if it holds one."""
    saved = checkpoint.restore(federation) if checkpoint is not None else None
    states = list(saved["states"]) if saved else []
    first = saved["run"] if saved else 0
    for run in range(first, federation.n_runs):
        resume = None
        if saved is not None and run == first and saved["state"] is not None:
            resume = (saved["state"], saved["t"], saved["closing"], saved["aborts"])

        def on_round(state, t, closing, aborts, run=run):
            if checkpoint is not None:
                checkpoint.save(federation, run=run, t=t, state=state, closing=closing, states=states, aborts=aborts)

        states.append(federation.run(run, resume=resume, on_round=on_round))
    return states
