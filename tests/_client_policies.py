"""Malicious-client policies shared by the tests (importable by worker processes, so the
backends can be compared: tests/test_client_policies.py, tests/test_fuzz_clients.py)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from securefkm.federation import ClientPolicy
from securefkm.federation.client import UpdateReply
from securefkm.messages import Update


class Replace(ClientPolicy):
    """At ``stage`` (every round, or only ``rounds``), send ``value`` instead of the reply."""

    def __init__(self, stage, value, rounds=None):
        self.stage, self.value, self.rounds = stage, value, rounds

    def reply(self, stage, request, honest_reply, ctx):
        if stage == self.stage and (self.rounds is None or ctx.round in self.rounds):
            return copy.deepcopy(self.value)
        return honest_reply


class Silent(ClientPolicy):
    """Say nothing at ``stage``."""

    def __init__(self, stage):
        self.stage = stage

    def reply(self, stage, request, honest_reply, ctx):
        return self.SILENT if stage == self.stage else honest_reply


class Refuse(ClientPolicy):
    """Refuse ``stage`` with ``reason``."""

    def __init__(self, stage, reason="no"):
        self.stage, self.reason = stage, reason

    def reply(self, stage, request, honest_reply, ctx):
        return self.Refusal(self.reason) if stage == self.stage else honest_reply


class Replay(ClientPolicy):
    """At ``stage``, send the reply this client sent at that stage in its first round."""

    def __init__(self, stage):
        self.stage, self.kept = stage, None

    def reply(self, stage, request, honest_reply, ctx):
        if stage != self.stage:
            return honest_reply
        if self.kept is None:
            self.kept = copy.deepcopy(honest_reply)
            return honest_reply
        return copy.deepcopy(self.kept)


class Recorder(ClientPolicy):
    """Honest, but keeps (round, attempt, stage, type of the honest reply) of every message."""

    def __init__(self):
        self.log = []

    def reply(self, stage, request, honest_reply, ctx):
        self.log.append((ctx.run, ctx.round, ctx.attempt, stage, type(honest_reply).__name__))
        return honest_reply


class Poison(ClientPolicy):
    """Multiplies every sum-field of its update by ``factor`` before the client-side layers."""

    def __init__(self, factor):
        self.factor = factor

    def update(self, update, ctx):
        return Update(sums={k: np.asarray(v) * self.factor for k, v in update.sums.items()}, items=update.items)


# ------------------------------------------------------------------ fuzzing
def _flip(value, rng):
    """``value`` with one bit flipped somewhere (arrays, bytes), or None if nothing to flip."""
    if isinstance(value, np.ndarray) and value.size and value.dtype.kind in "uif":
        out = value.copy()
        raw = out.view(np.uint8).reshape(-1)
        i = int(rng.integers(raw.size))
        raw[i] ^= np.uint8(1 << int(rng.integers(8)))
        return out
    if isinstance(value, (bytes, bytearray)) and value:
        b = bytearray(value)
        b[int(rng.integers(len(b)))] ^= 1 << int(rng.integers(8))
        return bytes(b)
    return None


def _leaves(value, path=()):
    """Paths to the mutable leaves of a nested dict/list/tuple message."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(value, (list, tuple)) and len(value) <= 64:
        for i, v in enumerate(value):
            yield from _leaves(v, path + (i,))
    else:
        yield path


def _get(value, path):
    for p in path:
        value = value[p]
    return value


def _set(value, path, new):
    """A copy of ``value`` with the leaf at ``path`` replaced (tuples rebuilt)."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        out = dict(value)
        out[head] = _set(value[head], rest, new)
        return out
    items = list(value)
    items[head] = _set(value[head], rest, new)
    return type(value)(items) if isinstance(value, tuple) else items


MUTATIONS = ("bitflip", "type", "size", "ids", "replay", "drop_field", "none", "silent", "refuse", "extra_field")


class Fuzzer(ClientPolicy):
    """Mutates its client's messages at random: at each message, with probability ``rate``,
    one of :data:`MUTATIONS` (a bit flip in an array or bytes, a wrong type, a wrong size, a
    wrong client id, a replay of its own earlier message of the stage, a dropped field, None,
    silence, a refusal, an extra field). The randomness is keyed by (seed, run, round,
    attempt, client, stage), so every backend mutates identically. ``log`` keeps what it did."""

    def __init__(self, seed, rate=0.5, stages=None):
        self.seed, self.rate, self.stages = seed, rate, stages
        self.history: dict[str, list] = {}
        self.log: list = []

    def _rng(self, ctx, stage):
        return np.random.default_rng([self.seed, ctx.run, ctx.round, ctx.attempt, ctx.client_id,
                                      sum(map(ord, stage))])

    def reply(self, stage, request, honest_reply, ctx):
        past = self.history.setdefault(stage, [])
        rng = self._rng(ctx, stage)
        if (self.stages is not None and stage not in self.stages) or rng.random() >= self.rate:
            past.append(copy.deepcopy(honest_reply))
            return honest_reply
        kind = MUTATIONS[int(rng.integers(len(MUTATIONS)))]
        out = self._mutate(kind, stage, honest_reply, past, rng, ctx)
        past.append(copy.deepcopy(honest_reply))
        self.log.append((ctx.run, ctx.round, ctx.attempt, stage, kind))
        return out

    def _mutate(self, kind, stage, honest, past, rng, ctx):
        if kind == "silent":
            return self.SILENT
        if kind == "refuse":
            return self.Refusal("fuzzed refusal")
        if kind == "none":
            return None
        if kind == "type":
            return [b"\x00", 3.5, "x", {"a": 1}][int(rng.integers(4))]
        if kind == "replay":
            return copy.deepcopy(past[int(rng.integers(len(past)))]) if past else None
        body = honest.then if isinstance(honest, UpdateReply) else honest
        if isinstance(honest, UpdateReply):
            if honest.then is None:  # nothing fused: mutate the set-fields or the flags
                if kind == "drop_field" and honest.items:
                    return dataclasses.replace(honest, items={})
                return dataclasses.replace(honest, declined=3)
        leaves = list(_leaves(body))
        path = leaves[int(rng.integers(len(leaves)))] if leaves else ()
        leaf = _get(body, path) if path or not isinstance(body, (dict, list, tuple)) else body
        if kind == "bitflip":
            flipped = _flip(leaf, rng)
            new = _set(body, path, flipped) if flipped is not None else None
        elif kind == "size":
            if isinstance(leaf, np.ndarray):
                new = _set(body, path, np.concatenate([leaf.ravel(), leaf.ravel()[:1]]) if leaf.size else leaf[:0])
            elif isinstance(leaf, (bytes, bytearray)):
                new = _set(body, path, bytes(leaf) + b"\x01")
            else:
                new = _set(body, path, [leaf, leaf])
        elif kind == "ids":
            new = _set(body, path, [ctx.client_id, -1, 10**9][int(rng.integers(3))])
        elif kind == "drop_field" and isinstance(body, dict) and body:
            new = dict(body)
            new.pop(list(body)[int(rng.integers(len(body)))])
        elif kind == "extra_field" and isinstance(body, dict):
            new = dict(body)
            new["zz_extra"] = np.zeros(3)
        else:
            new = None
        if isinstance(honest, UpdateReply):
            return dataclasses.replace(honest, then=new)
        return new
