"""The round's small messages: the broadcast digest clients bind their masks to, the update
requests (one shared object per broadcast), the batch check of clients' sum-fields."""

import dataclasses

import numpy as np
import pytest

from securefkm.exceptions import InputError
from securefkm.federation.client import UpdateRequest
from securefkm.federation.runtime import _update_requests
from securefkm.messages import Broadcast, FieldSpec, check_all_sums


def test_digest_is_equal_for_equal_content_and_differs_for_any_change():
    C = np.random.default_rng(0).normal(size=(5, 3))
    b = Broadcast("train", C, {"max_local_steps": 1, "tol": 0.1})
    same = [Broadcast("train", C.copy(), {"tol": 0.1, "max_local_steps": 1}),
            Broadcast("train", np.asfortranarray(C), {"max_local_steps": 1, "tol": 0.1}, sample="all")]
    assert all(x.digest() == b.digest() for x in same)
    last_bit = C.copy()
    last_bit[4, 2] = np.nextafter(last_bit[4, 2], np.inf)
    changed = [
        Broadcast("score", C, b.params),
        Broadcast("train", last_bit, b.params),
        Broadcast("train", C.reshape(3, 5), b.params),  # the same bytes, another shape
        Broadcast("train", C.view(np.int64), b.params),  # the same bytes, another dtype
        Broadcast("train", C, {"max_local_steps": 2, "tol": 0.1}),
        Broadcast("train", C, {"max_local_steps": 1, "tol": np.nextafter(0.1, 1)}),
        Broadcast("train", None, b.params),
        Broadcast("train", np.zeros((0, 3)), b.params),
    ]
    digests = {x.digest() for x in changed} | {b.digest()}
    assert len(digests) == len(changed) + 1


def test_clients_sent_one_broadcast_share_one_immutable_request():
    b, other = Broadcast("train", np.zeros((2, 2))), Broadcast("train", np.ones((2, 2)))
    sampled = (0, 3, 5)
    requests = _update_requests(0, 4, sampled, {0: b, 3: b, 5: b}, None, {}, attempt=1)
    assert list(requests) == [0, 3, 5] and len({id(r) for r in requests.values()}) == 1
    assert requests[0] == UpdateRequest(0, 4, b, sampled, None, attempt=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        requests[0].broadcast = other
    # per-client broadcasts: one request per broadcast object
    requests = _update_requests(0, 4, sampled, {0: b, 3: other, 5: b}, None, {}, attempt=0)
    assert requests[0] is requests[5] and requests[3].broadcast is other
    # a fused first-stage message is the client's own: its own request
    requests = _update_requests(0, 4, sampled, {0: b, 3: b, 5: b}, "keys", {0: "m0", 3: "m3", 5: "m5"}, attempt=0)
    assert [r.then for r in requests.values()] == [("keys", "m0"), ("keys", "m3"), ("keys", "m5")]
    assert len({id(r) for r in requests.values()}) == 3


def test_a_round_sends_every_client_the_same_request_object(small_blobs):
    from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm
    from securefkm.federation import Federation

    X, _, clients = small_blobs
    fed = Federation(WeightedFederatedKMeansAlgorithm(4), clients, max_rounds=2, random_state=0, record="full")
    fed.run()
    sent = fed.transcript.rounds[-1].stages[0].sent
    assert len(sent) == len(clients) and len({id(r) for r in sent.values()}) == 1


def test_check_all_sums_names_the_client_field_at_fault():
    specs = (FieldSpec("counts", (3,), "count"), FieldSpec("sums", (3, 2), "sum"))
    good = {"counts": np.zeros(3), "sums": np.zeros((3, 2))}
    check_all_sums([good, dict(good), {"counts": [0.0, 1.0, 2.0], "sums": np.zeros((3, 2))}], specs)
    with pytest.raises(InputError, match=r"'sums' has shape \(2, 3\), declared \(3, 2\)"):
        check_all_sums([good, {"counts": np.zeros(3), "sums": np.zeros((2, 3))}], specs)
    with pytest.raises(InputError, match=r"do not match the declared fields"):
        check_all_sums([good, {"counts": np.zeros(3)}], specs)
    with pytest.raises(InputError, match=r"do not match the declared fields"):
        check_all_sums([good, {"counts": np.zeros(3), "other": np.zeros((3, 2))}], specs)
