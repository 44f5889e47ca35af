"""graph="auto" and the SecAgg+ degree/threshold from Bell et al. 2020's bounds."""

from __future__ import annotations

import numpy as np
import pytest

from protocols.masking import PairwiseMasking
from protocols.masking import graph as graph_module
from protocols.masking.graph import AUTO_COMPLETE_MAX, resolve_graph
from protocols.masking.params import bell_parameters
from securefkm.exceptions import InputError
from securefkm.layers import RoundContext, RunInfo
from securefkm.messages import FieldSpec

# (n, corrupt gamma, dropout delta, semi-malicious, degree k, threshold t), sigma = 40,
# eta = 20: the precomputed table of Bell et al.'s reference implementation (Google fcp,
# secagg/server/graph_parameter_finder_test.cc), which our search reproduces exactly
TABLE = [
    (100, 0.45, 0.45, False, 92, 46),
    (1000, 0.45, 0.45, False, 822, 417),
    (10, 0.33, 0.33, False, 8, 4),
    (100, 0.33, 0.33, False, 68, 34),
    (1000, 0.33, 0.33, False, 286, 150),
    (10000, 0.33, 0.33, False, 422, 221),
    (100000, 0.33, 0.33, False, 480, 251),
    (100, 0.3, 0.3, True, 92, 62),
    (1000, 0.3, 0.3, True, 872, 584),
    (10, 0.05, 0.33, False, 4, 2),
    (100, 0.05, 0.33, False, 28, 6),
    (1000, 0.05, 0.33, False, 72, 24),
    (10000, 0.05, 0.33, False, 86, 29),
    (1000, 0.05, 0.33, True, 398, 223),
    (10000, 0.05, 0.33, True, 746, 420),
    (10, 0.33, 0.05, False, 4, 4),
    (100, 0.33, 0.05, False, 34, 29),
    (1000, 0.33, 0.05, False, 78, 60),
    (10000, 0.33, 0.05, False, 92, 70),
    (1000, 0.33, 0.05, True, 132, 109),
    (10000, 0.33, 0.05, True, 178, 146),
]


@pytest.mark.parametrize("n, gamma, delta, malicious, k, t", TABLE)
def test_reproduces_reference_table(n, gamma, delta, malicious, k, t):
    assert bell_parameters(n, gamma, delta, 40, 20, malicious) == (k, t)


def test_defaults_and_monotonicity():
    # the layer's defaults (gamma 0.05, delta 0.1, sigma 40, eta 20)
    assert bell_parameters(1000) == (36, 19)
    assert bell_parameters(10000) == (42, 22)
    assert bell_parameters(1000, malicious=True) == (78, 52)
    # stricter security needs a larger degree; so does a larger corrupt fraction
    assert bell_parameters(1000, security_bits=80)[0] > 36
    assert bell_parameters(1000, corrupt_fraction=0.2)[0] > 36


def test_no_valid_degree_below_complete(monkeypatch):
    # 10 clients with 40% corrupt and 40% dropping: only the complete graph
    bounds = {"corrupt_fraction": 0.4, "dropout_fraction": 0.4}
    assert bell_parameters(10, 0.4, 0.4) is None
    monkeypatch.setattr(graph_module, "AUTO_COMPLETE_MAX", 5)
    assert resolve_graph(10, "auto", None, bounds) == ("complete", 9, None)
    with pytest.raises(InputError, match="relax corrupt_fraction, dropout_fraction"):
        resolve_graph(10, "sparse", None, bounds)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"graph": "ring"}, "graph must be one of"),
        ({"corrupt_fraction": 0.5, "dropout_fraction": 0.5}, "lower corrupt_fraction or dropout_fraction"),
        ({"corrupt_fraction": 0.3, "dropout_fraction": 0.35, "sign_keys": True}, "corrupt_fraction \\+ 2 \\* dropout_fraction"),
        ({"corrupt_fraction": 1.0}, "corrupt_fraction must be a fraction"),
        ({"security_bits": 0}, "security_bits"),
    ],
)
def test_bad_parameters_refused(kw, match):
    with pytest.raises(InputError, match=match):
        PairwiseMasking(**kw)


def _plan(layer, n):
    info = RunInfo(algorithm=None, n_clients=n, n_features=1, clients_per_round=n, max_rounds=1, planned_rounds=1)
    ctx = RoundContext(0, 0, "sum", tuple(range(n)), (FieldSpec("x", (2,), "sum"),), info, b"D" * 32)
    layer.setup(info)
    return layer.plan(ctx)


def test_auto_is_complete_while_cheap_then_bell_sparse():
    small = _plan(PairwiseMasking(), AUTO_COMPLETE_MAX)
    assert small.graph.kind == "complete" and small.t_share == (2 * AUTO_COMPLETE_MAX) // 3 + 1
    big = _plan(PairwiseMasking(), 1000)
    assert (big.graph.kind, big.graph.degree, big.t_share) == ("sparse", 36, 19)
    assert {len(big.graph.neighbours(u)) for u in range(0, 1000, 97)} == {36}
    signed = _plan(PairwiseMasking(sign_keys=True), 1000)
    assert (signed.graph.degree, signed.t_share) == (78, 52)
    forced = _plan(PairwiseMasking(graph="complete"), 150)
    assert forced.graph.kind == "complete" and forced.graph.degree == 149
    # an explicit threshold still wins over Bell's
    assert _plan(PairwiseMasking(threshold=20), 1000).t_share == 20
    assert np.array_equal(big.graph.order, _plan(PairwiseMasking(), 1000).graph.order)
