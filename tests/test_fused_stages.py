"""A transport may fuse the aggregator's first stage into the update exchange
(``Transport.fuse_first_stage``, used by the Flower transport): same protocol, same result,
same transcript form, one exchange fewer."""

import numpy as np
import pytest

from protocols import PairwiseMasking
from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
from securefkm.federation import Federation


def _fit(clients, protection, fuse):
    algo = WeightedFederatedKMeansAlgorithm(4, init="uniform", init_bounds=(-12.0, 12.0))
    fed = Federation(algo, clients, protection=protection, max_rounds=4, random_state=3)
    fed.transport.fuse_first_stage = fuse
    seen = []
    exchange = fed.transport.exchange
    fed.transport.exchange = lambda stage, msgs: (seen.append(stage), exchange(stage, msgs))[1]
    state = fed.run()
    return state, fed.transcript, seen


@pytest.mark.parametrize("make", [lambda: [], lambda: [PairwiseMasking()]], ids=["plain", "masking"])
def test_fused_equals_separate(small_blobs, make):
    _, _, clients = small_blobs
    s_sep, t_sep, ex_sep = _fit(clients, make(), False)
    s_fus, t_fus, ex_fus = _fit(clients, make(), True)
    np.testing.assert_allclose(s_fus.centres, s_sep.centres, rtol=0, atol=1e-9)
    assert [[st.stage for st in r.stages] for r in t_fus] == [[st.stage for st in r.stages] for r in t_sep]
    first = "advertise" if ex_sep.count("advertise") else "input"
    assert first in ex_sep and first not in ex_fus
    assert len(ex_fus) == len(ex_sep) - ex_sep.count(first)
    for r_sep, r_fus in zip(t_sep, t_fus):  # the first stage's replies are recorded as before
        if r_sep.specs:
            assert sorted(r_fus.stages[1].received) == sorted(r_sep.stages[1].received)
