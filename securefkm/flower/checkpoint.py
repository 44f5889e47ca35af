"""Crash-safe ServerApp: an atomic checkpoint after every completed round, and resuming from it.

The ServerApp (run config ``checkpoint-path``) drives the federation's rounds itself
(:func:`run_rounds`, the same loop as :meth:`Federation.run`) and after every completed
round writes one pickle, atomically (temporary file, ``fsync``, ``os.replace``, ``fsync`` of
the folder), holding:

* the checkpoint's own ``run_id`` (kept across restarts) and the spec it belongs to;
* the run index, the next round number, the algorithm's state and its object's fields,
  the finished restarts' states (``n_init > 1``);
* the federation's sampling RNG (and retry sampler), seed sequence, global round counter,
  transcript, abort count and the current run's aborted attempts;
* every layer's fields **except the secure aggregator's**: the DP accountant and noise
  schedule continue where they were, so a restarted ServerApp never re-spends budget it
  already spent, and the budget can never exceed the target (the accountant's own checks).

What is *not* restored, on purpose: the secure aggregator (masking keys, Paillier keys,
the key authority session). A restarted ServerApp builds it fresh: the round that was
interrupted is redone from the last completed state with fresh keys and masks (and a new
authority session, i.e. a new Paillier keypair); nothing of the interrupted attempt is
reused. Clients are new ClientApp instances in the new Flower run, so client-side state
is fresh too (docs/deployment.md, "Crash-safe ServerApp", lists what that means).

The file is written by the ServerApp and read back only by the ServerApp (trusted local
state: pickle). It holds the transcript, i.e. everything the server saw: protect it like
the server's memory.
"""

from __future__ import annotations

import logging
import os
import pickle
import secrets
import warnings
from pathlib import Path

import numpy as np

from ..exceptions import InputError, NoParticipantsError

log = logging.getLogger("securefkm.flower")

FORMAT = "securefkm-checkpoint/v1"


def write_atomic(path, payload: dict) -> None:
    """Pickle ``payload`` to ``path`` so that a crash leaves either the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
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


class Checkpoint:
    """The checkpoint file of one ServerApp run (``path``) for ``spec_json``."""

    def __init__(self, path, spec_json: str):
        self.path = Path(path)
        if not self.path.parent.is_dir():
            raise InputError(f"checkpoint-path {str(path)!r}: its folder does not exist; create it.")
        self.spec_json = spec_json
        self.saved = self._load()
        self.run_id = self.saved["run_id"] if self.saved else secrets.token_hex(8)
        self.resumed_from = None if self.saved is None else self.saved["rounds_done"]

    def _load(self) -> dict | None:
        if not self.path.is_file():
            return None
        with open(self.path, "rb") as fh:
            saved = pickle.load(fh)  # our own file (see module docstring)
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise InputError(f"{self.path} is not a securefkm checkpoint; remove it or choose another checkpoint-path.")
        if saved.get("spec") != self.spec_json:
            raise InputError(f"{self.path} is the checkpoint of another spec; remove it or choose another checkpoint-path.")
        return saved

    # ------------------------------------------------------------------ save / restore
    def save(self, federation, *, run: int, t: int, state, closing: bool, states: list, aborts=()) -> None:
        aggregator = federation.aggregator
        write_atomic(self.path, {
            "format": FORMAT,
            "run_id": self.run_id,
            "spec": self.spec_json,
            "rounds_done": len(federation.transcript),
            "run": run,
            "t": t,
            "closing": closing,
            "state": state,
            "states": list(states),
            "algorithm": dict(federation.algorithm.__dict__),
            "rng": federation.rng.bit_generator.state,
            # the runtime's retry sampler and abort count, where it has them (issue 19)
            "retry_rng": _rng_state(federation, "_retry_rng"),
            "n_aborted_rounds": getattr(federation, "n_aborted_rounds", 0),
            "aborts": list(aborts),
            "algo_seq": federation._algo_seq,
            "round_counter": federation._round_counter,
            "transcript": federation.transcript,
            "layers": [None if layer is aggregator else dict(layer.__dict__) for layer in federation.layers],
        })

    def restore(self, federation) -> dict | None:
        """Put the saved federation state back into a freshly built ``federation``."""
        saved = self.saved
        if saved is None:
            return None
        if len(saved["layers"]) != len(federation.layers):
            raise InputError(f"{self.path} does not match this run's protection stack; remove it.")
        federation.algorithm.__dict__.update(saved["algorithm"])
        federation.rng.bit_generator.state = saved["rng"]
        if saved.get("retry_rng") is not None and hasattr(federation, "_retry_rng"):
            federation._retry_rng.bit_generator.state = saved["retry_rng"]
        if hasattr(federation, "n_aborted_rounds"):
            federation.n_aborted_rounds = saved.get("n_aborted_rounds", 0)
        federation._algo_seq = saved["algo_seq"]
        federation._round_counter = saved["round_counter"]
        federation.transcript = saved["transcript"]
        for layer, fields in zip(federation.layers, saved["layers"]):
            if fields is not None:
                layer.__dict__.update(fields)
        log.warning("resuming run %s from %s: %d rounds done, redoing round %d with fresh keys",
                    self.run_id, self.path, saved["rounds_done"], saved["t"])
        return saved


def _rng_state(obj, name: str):
    rng = getattr(obj, name, None)
    return None if rng is None else rng.bit_generator.state


def run_rounds(federation, checkpoint: Checkpoint | None = None) -> list:
    """Every restart's final state, like ``[federation.run(r) for r in range(n_runs)]``.

    The loop is :meth:`Federation.run`'s (a training round budget of ``max_rounds``, then
    the algorithm's closing phase), with a checkpoint after every completed round and a
    resume from ``checkpoint`` if it holds one. Where the runtime retries aborted round
    attempts (``Federation._complete_round``), each round goes through it, so a resumed
    run retries exactly like an uninterrupted one.
    """
    algorithm = federation.algorithm
    complete = getattr(federation, "_complete_round", None)
    saved = checkpoint.restore(federation) if checkpoint is not None else None
    states = list(saved["states"]) if saved else []
    first = saved["run"] if saved else 0
    for run in range(first, federation.n_runs):
        if saved is not None and run == first:
            state, t, closing = saved["state"], saved["t"], saved["closing"]
            aborts = list(saved.get("aborts", []))
        else:
            rng = np.random.default_rng(federation._algo_seq.spawn(1)[0])
            state, t, closing = algorithm.init(federation.n_clients, federation.info.n_features, rng), 0, False
            aborts = []
        while not algorithm.converged(state):
            if not closing and state.round >= federation.max_rounds:
                close = getattr(algorithm, "close", None)
                if close is None:
                    break
                state, closing = close(state), True
                continue
            try:
                if complete is not None:
                    state, t = complete(state, run, t, aborts)
                else:
                    state, t = federation.run_round(state, run=run, round=t), t + 1
            except NoParticipantsError as exc:
                if state.centres is None or np.ndim(state.centres) != 2:
                    raise
                warnings.warn(f"run {run} stopped after {state.round} rounds: {exc}", stacklevel=2)
                break
            if checkpoint is not None:
                checkpoint.save(federation, run=run, t=t, state=state, closing=closing, states=states, aborts=aborts)
        states.append(state)
    return states
