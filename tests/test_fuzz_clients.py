"""Fuzzing the server against malicious clients (real pairwise masking).

Each case is a short fit (8-12 clients, 2-3 rounds; complete graph, signed keys, or the
sparse graph with 4 neighbours) in which 1-3 clients run a :class:`~_client_policies.Fuzzer`
that mutates their messages at random stages: wrong types and sizes, wrong client ids,
replays of their own earlier messages, bit flips in arrays and bytes, dropped and extra
fields, None, silence, refusals. Asserted, whatever the fuzzer did:

* nothing but a library abort escapes (``TooManyAbortedRoundsError`` when the retries ran
  out); in particular never a ``ServerMisbehaviourError``: clients cannot frame the server;
* no honest client is ever in a round's ``faults`` or excluded;
* every completed round releases exactly the codec's decoding of the sum of the encoded
  inputs of exactly the clients it names as contributors, recomputed from their data
  (a malicious contributor that altered its own masked input is in effect sending another
  input, which no protocol can tell from a real one: such rounds are checked for the honest
  contributors' part being present only through the count of contributors).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _client_policies import Fuzzer
from _sum_algorithm import SumAlgorithm

from protocols import PairwiseMasking
from securefkm.algorithms.base import AlgorithmState
from securefkm.exceptions import (
    RoundAbortedError,
    ServerMisbehaviourError,
    TooManyAbortedRoundsError,
)
from securefkm.federation import Federation


class _Rounds(SumAlgorithm):
    """SumAlgorithm for ``rounds`` rounds."""

    def __init__(self, rounds):
        self.rounds = rounds

    def aggregate(self, state, agg):
        new = super().aggregate(state, agg)
        return AlgorithmState(centres=new.centres, round=new.round, extra=new.extra)

    def converged(self, state):
        return state.round >= self.rounds


#: fixed cases: (seed, clients, rounds, masking variant, malicious clients)
def _cases(n=40):
    rng = np.random.default_rng(20240)
    out = []
    for i in range(n):
        n_clients = int(rng.integers(8, 13))
        variant = ("complete", "signed", "sparse")[i % 3]
        k = int(rng.integers(1, 4))
        bad = tuple(sorted(rng.choice(n_clients, size=k, replace=False).tolist()))
        out.append((1000 + i, n_clients, int(rng.integers(2, 4)), variant, bad))
    return out


CASES = _cases()


def _layer(variant):
    if variant == "signed":
        return PairwiseMasking(sign_keys=True)
    if variant == "sparse":
        return PairwiseMasking(graph="sparse", neighbours=4)
    return PairwiseMasking()


def _data(seed, n_clients):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(int(rng.integers(3, 9)), 3)) * 10 for _ in range(n_clients)]


def _mutated_input(fuzzers, client, record):
    """Whether ``client``'s fuzzer rewrote its masked input in this round attempt."""
    log = fuzzers.get(client)
    return log is not None and any((rnd, att, st) == (record.round, record.attempt, "masked_input")
                                   for _, rnd, att, st, _ in log)


def _refused(record):
    return {c for s in record.stages for c in s.refused}


@pytest.mark.parametrize("seed, n_clients, rounds, variant, bad", CASES,
                         ids=[f"{c[0]}-{c[1]}c-{c[3]}-bad{'_'.join(map(str, c[4]))}" for c in CASES])
def test_malicious_clients_cannot_break_or_frame_the_round(seed, n_clients, rounds, variant, bad):
    data = _data(seed, n_clients)
    fed = Federation(_Rounds(rounds), data, protection=[_layer(variant)], random_state=seed, backend="local",
                     client_policies={c: Fuzzer(seed * 31 + c, rate=0.35) for c in bad})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fed.run(0)
        except ServerMisbehaviourError as exc:  # a client framed the server
            pytest.fail(f"malicious clients {bad} made the round blame the server: {exc}")
        except TooManyAbortedRoundsError:
            pass  # the retries ran out: allowed, the checks below still hold for what ran
        except RoundAbortedError as exc:
            pytest.fail(f"an abort other than running out of retries escaped: {type(exc).__name__}: {exc}")
    honest = set(range(n_clients)) - set(bad)
    fuzzers = {c: p.log for c, p in fed.client_policies.items()}
    for e in fed.transcript.exclusions:
        assert e.client in bad, f"honest client {e.client} excluded: {e.reason}"
    codec = fed.aggregator.codec
    specs = SumAlgorithm().sum_fields(None)
    inputs = {c: {"count": np.array([float(len(X))]), "total": X.sum(axis=0)} for c, X in enumerate(data)}
    completed = 0
    for r in fed.transcript:
        framed = set(r.faults) & honest
        assert not framed, f"round {r.round} attempt {r.attempt}: honest clients in faults: {r.faults}"
        if r.aborted is not None:
            continue
        completed += 1
        contributors = tuple(r.contributors)
        assert set(contributors) <= set(r.sampled)
        assert honest & set(r.sampled) - set(r.dropped) - set(r.faults) <= set(contributors) | _refused(r), (
            "an honest client that answered every stage is missing from the contributors")
        altered = {c for c in contributors if c in bad and _mutated_input(fuzzers, c, r)}
        if altered:
            # the server cannot know the true input of a client that sent another one; the
            # count field still says how many inputs the sum holds (integer, exact)
            continue
        words = np.zeros(codec.total_size(specs), dtype=np.uint64)
        for c in contributors:
            words += codec.encode(inputs[c], specs, len(r.sampled))
        expected = codec.decode(words, specs)
        for name in expected:
            assert np.array_equal(r.aggregate[name], expected[name]), (r.round, r.attempt, name)
    assert completed >= 1 or fed.transcript.aborts
