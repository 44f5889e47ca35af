"""Rounding, ParticipationCap and MinClusterSize: unit behaviour and a federated run."""

from __future__ import annotations

import numpy as np
import pytest

from protocols.min_cluster import MinClusterSize
from protocols.participation import ParticipationCap
from protocols.rounding import Rounding
from securefkm.exceptions import InputError
from securefkm.layers import ClientContext, RoundContext, RunInfo
from securefkm.messages import FieldSpec, Update


def _ctx(specs=()):
    info = RunInfo(algorithm=None, n_clients=3, n_features=2, clients_per_round=3, max_rounds=5, planned_rounds=5)
    return RoundContext(run=0, round=0, action="train", sampled=(0, 1, 2), specs=tuple(specs), info=info)


SPECS = (
    FieldSpec("weights", (3,), "count", integer=True),
    FieldSpec("weighted_centres", (3, 2), "sum"),
    FieldSpec("local", (3, 2), "value"),
    FieldSpec("inertia", (1,), "score"),
)


def _update():
    return Update(
        sums={
            "weights": np.array([1.0, 7.0, 2.0]),
            "weighted_centres": np.array([[1.0, 2.0], [7.0, 7.0], [4.0, -2.0]]),
            "local": np.array([[1.234, 2.0], [1.0, 1.0], [2.0, -1.0]]),
            "inertia": np.array([5.0]),
        },
        items={"centres": np.array([[0.123, 0.456], [1.0, 2.0], [3.0, 4.0]]), "sizes": np.array([1.0, 2.0, 9.0])},
    )


# ------------------------------------------------------------------------------ Rounding
def test_rounding_counts_to_multiple_and_values_to_decimals():
    out = Rounding(count_multiple=5, decimals=1).client_update(_update(), ClientContext(0, 10), _ctx(SPECS))
    np.testing.assert_array_equal(out.sums["weights"], [0.0, 5.0, 0.0])
    np.testing.assert_array_equal(out.items["sizes"], [0.0, 0.0, 10.0])
    np.testing.assert_allclose(out.sums["local"][0], [1.2, 2.0])
    np.testing.assert_allclose(out.items["centres"][0], [0.1, 0.5])
    # sums and scores untouched
    np.testing.assert_array_equal(out.sums["weighted_centres"], _update().sums["weighted_centres"])
    np.testing.assert_array_equal(out.sums["inertia"], [5.0])


def test_rounding_needs_a_parameter_and_validates():
    with pytest.raises(InputError, match="count_multiple"):
        Rounding()
    with pytest.raises(InputError, match="count_multiple"):
        Rounding(count_multiple=0)
    with pytest.raises(InputError, match="decimals"):
        Rounding(decimals=-1)


# ------------------------------------------------------------------------ ParticipationCap
def test_participation_cap_refuses_after_r_rounds_using_client_state():
    cap = ParticipationCap(max_rounds=2)
    client = ClientContext(0, 10)
    outs = []
    for _ in range(4):  # a round counts once the client's input left it (client_input_sent)
        outs.append(cap.client_update(_update(), client, _ctx(SPECS)))
        if outs[-1] is not None:
            cap.client_input_sent(client, _ctx(SPECS))
    assert [o is not None for o in outs] == [True, True, False, False]
    other = ClientContext(1, 10)  # per-client: another client still answers
    assert cap.client_update(_update(), other, _ctx(SPECS)) is not None
    with pytest.raises(InputError, match="max_rounds"):
        ParticipationCap(0)


def test_participation_cap_in_a_federation():
    from test_dp import CountSum, _clients

    from securefkm.federation import Federation

    fed = Federation(CountSum(rounds=5), _clients(n=3), protection=[ParticipationCap(2)], max_rounds=5)
    # every client refuses the third round: the run ends with the state of round 2
    with pytest.warns(UserWarning, match="declined 3"):
        state = fed.run()
    assert state.round == 2
    rounds = fed.transcript.rounds
    assert sum(r.aborted is None for r in rounds) == 2
    assert rounds[-1].aborted and set(rounds[-1].stages[0].received) <= {0, 1, 2}


# ------------------------------------------------------------------------- MinClusterSize
def test_min_cluster_size_suppresses_exactly_small_clusters():
    out = MinClusterSize(p=2).client_update(_update(), ClientContext(0, 10), _ctx(SPECS))
    # cluster 0 has weight 1 < 2: zeroed in every per-cluster field; others untouched
    np.testing.assert_array_equal(out.sums["weights"], [0.0, 7.0, 2.0])
    np.testing.assert_array_equal(out.sums["weighted_centres"][0], [0.0, 0.0])
    np.testing.assert_array_equal(out.sums["weighted_centres"][1:], _update().sums["weighted_centres"][1:])
    np.testing.assert_array_equal(out.sums["local"][0], [0.0, 0.0])
    np.testing.assert_array_equal(out.sums["inertia"], [5.0])  # not per-cluster (length 1 != 3)
    # set-fields: the size-1 local cluster is dropped from centres and sizes
    np.testing.assert_array_equal(out.items["sizes"], [2.0, 9.0])
    np.testing.assert_array_equal(out.items["centres"], [[1.0, 2.0], [3.0, 4.0]])


def test_min_cluster_size_p3_and_client_count_field():
    out = MinClusterSize(p=3).client_update(_update(), ClientContext(0, 10), _ctx(SPECS))
    np.testing.assert_array_equal(out.sums["weights"], [0.0, 7.0, 0.0])
    np.testing.assert_array_equal(out.items["sizes"], [9.0])
    specs = (FieldSpec("inertia", (1,), "score"), FieldSpec("count", (1,), "count"))
    small = Update(sums={"inertia": np.array([4.0]), "count": np.array([2.0])})
    out = MinClusterSize(p=3).client_update(small, ClientContext(0, 2), _ctx(specs))
    np.testing.assert_array_equal(out.sums["inertia"], [0.0])
    np.testing.assert_array_equal(out.sums["count"], [0.0])
    with pytest.raises(InputError, match="p"):
        MinClusterSize(p=0)


def test_importing_small_layers_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, protocols.rounding, protocols.participation, protocols.min_cluster, protocols.dp; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plain_sum_adds_clients_one_after_the_other_in_contributor_order():
    """The plain aggregate is the clients' values added one after the other in contributor
    order (0 + x_1 + x_2 + ...; the secure aggregators decode to the same bits), with values
    of wildly different scales (where the order shows) and float32 replies; a one-value field
    is numpy's sum of the column."""
    from securefkm import layers

    rng = np.random.default_rng(5)
    specs = (FieldSpec("s", (4, 3), "sum"), FieldSpec("c", (4,), "count"), FieldSpec("one", (1,), "score"))
    ctx = _ctx(specs)
    replies = {}
    for c in (2, 0, 1, 5, 3):
        scale = 10.0 ** rng.uniform(-6, 9)
        replies[c] = {"s": rng.normal(size=(4, 3)) * scale, "c": (rng.normal(size=4) * scale).astype(np.float32),
                      "one": rng.normal(size=1) * scale}
    server = layers.PlainSum().server_session(ctx)
    server.receive("input", replies)
    sums, contributors = server.result()
    assert contributors == (0, 1, 2, 3, 5)
    for name in ("s", "c"):
        expected = np.zeros(specs[0].shape if name == "s" else (4,))
        for c in contributors:
            expected = expected + np.asarray(replies[c][name], dtype=np.float64)
        assert sums[name].dtype == np.float64 and sums[name].tobytes() == expected.tobytes(), name
    assert sums["one"].tobytes() == np.sum([replies[c]["one"] for c in contributors], axis=0).tobytes()
