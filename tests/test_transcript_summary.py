"""Transcript.summary() lists what the server saw round by round; the reprs stay short."""

from __future__ import annotations

import numpy as np
import pytest

from protocols import GaussianDP, PairwiseMasking
from securefkm import FederatedDataset, WeightedFederatedKMeans
from securefkm.transcript import AbortedRound, Exclusion, Transcript


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return FederatedDataset.from_arrays([rng.normal(c, 0.3, (30, 2)) for c in (0.0, 1.0, 2.0)])


@pytest.fixture(scope="module")
def masked(data):
    return WeightedFederatedKMeans(n_clusters=2, max_rounds=4, init_bounds=(-1, 3), random_state=0,
                                   protection=[PairwiseMasking()]).fit(data)


def test_summary_names_every_round_and_the_received_fields_with_shapes(masked):
    t = masked.transcript_
    text = t.summary()
    lines = text.splitlines()
    assert lines[0].startswith(f"Transcript: {len(t)} rounds over 1 run(s)") and "PairwiseMasking" in lines[0]
    for r in t:
        assert f"run {r.run} round {r.round} {r.action} (attempt {r.attempt})" in text
    assert text.count("clients: sampled 3 [0-2]; contributed 3 [0-2]; dropped none; refused none") == len(t)
    d = t.meta["n_features"]
    train = [r for r in t if r.action == "train"]
    assert train
    size = sum(int(np.prod(s.shape)) for s in train[0].specs)
    # the masked vector per client (one uint64 entry per summed value, plus the bookkeeping)
    masked_vec = train[0].stage("masked_input").received[0]
    assert masked_vec.size >= size
    assert f"masked_input: 3 clients, array ({masked_vec.size},) uint64" in text
    assert "advertise: 3 clients, fields c_pk 32 bytes" in text
    assert f"released aggregate: fields weights (2,), weighted_centres (2, {d})" in text
    assert f"broadcast: train, centres (2, {d}) to 3 clients" in text
    assert "aborted rounds" not in text and "excluded clients" not in text
    assert t.summary(rounds=False) == lines[0]


def test_summary_of_a_plain_fit_shows_the_plain_inputs_and_set_fields(data):
    t = WeightedFederatedKMeans(n_clusters=2, max_rounds=3, random_state=0).fit(data).transcript_
    text = t.summary()
    assert "input: 3 clients, fields weights (2,), weighted_centres (2, 2)" in text
    assert "set-fields in plain: 3 clients, fields centres (2, 2), sizes (2,)" in text


def test_summary_at_the_aggregates_level_says_the_messages_were_not_kept(data):
    t = WeightedFederatedKMeans(n_clusters=2, max_rounds=3, random_state=0, record="aggregates").fit(data).transcript_
    text = t.summary()
    assert "messages not kept (record='aggregates')" in text
    assert "released aggregate: fields weights (2,), weighted_centres (2, 2)" in text
    none = Transcript(level="none")
    assert none.summary().splitlines()[1] == "no round recorded (record='none')"


def test_summary_ends_with_the_aborted_rounds_and_the_exclusions():
    t = Transcript()
    t.aborts.append(AbortedRound(0, 3, 0, "too_few_survivors", "unmask", "2 of 3 survived"))
    t.exclusions.append(Exclusion(0, 1, 0, 4, 2, "malformed reply"))
    lines = t.summary().splitlines()
    assert "1 aborted round(s)" in lines[0]
    assert lines[-3] == "aborted rounds (retried): 1 too_few_survivors"
    assert lines[-2] == "  run 0 round 3 attempt 0: too_few_survivors at stage 'unmask': 2 of 3 survived"
    assert lines[-1].startswith("excluded clients: client 4 excluded at run 0 round 1 attempt 0 after 2 fault(s)")
    assert repr(t) == "Transcript(0 rounds, 0 runs, level='full', 1 aborted, 1 excluded)"


def test_reprs_are_short(data):
    est = WeightedFederatedKMeans(n_clusters=2, max_rounds=10, tol=0.0, random_state=0,
                                  protection=[GaussianDP(1.0, 1e-5, bounds=(-1, 3), mode="distributed"),
                                              PairwiseMasking()]).fit(data)
    t = est.transcript_
    assert len(t) >= 10
    assert len(repr(t)) < 200
    assert repr(t) == f"Transcript({len(t)} rounds, 1 run, level='full', 0 aborted, 0 excluded)"
    r = t[1]
    assert repr(r) == (f"RoundRecord(run 0, round 1, {r.action!r}, attempt 0: 3 sampled, 3 contributed, "
                       f"0 dropped, {len(r.stages)} stages)")
    rep = repr(est.protection_report_)
    assert "\n" not in rep and len(rep) < 300
    for layer in est.protection_report_:
        assert f"{layer}: " in rep
    assert "GaussianDP: only the noisy sum" in rep and "PairwiseMasking: one masked vector per client" in rep
    assert "epsilon=" in rep
