"""A domain declared as a ball, ``GaussianDP(clip=R, centre=c)``: its sensitivities, clipping
and projection about the centre, the same fit as the origin ball on translated data, the
starts inside the ball, every DP mode and every estimator with a DP start, and bad input."""

import math
import warnings

import numpy as np
import pytest

from protocols.dp import GaussianDP
from protocols.dp.budget import Budget
from protocols.dp.radius import auto_radius
from securefkm.domain import Ball
from securefkm.exceptions import InputError
from securefkm.messages import FieldSpec
from securefkm.registry import make_estimator

CENTRE = np.array([3.0, 4.0])  # norm 5
R = 2.0
SET_VALUED = ("aligning", "kfed", "child-parent", "fcm")
ALGORITHMS = ("dwf", "ewf", "minibatch", "aligning", "kfed", "child-parent", "fcm", "fcm-fedavg")
STACKS = {
    "central": lambda **kw: [GaussianDP(1.0, 1e-5, **kw)],
    "distributed+masking": lambda **kw: [GaussianDP(1.0, 1e-5, mode="distributed", **kw), "masking"],
    "distributed+paillier": lambda **kw: [GaussianDP(1.0, 1e-5, mode="distributed", **kw), "paillier"],
    "local": lambda **kw: [GaussianDP(1.0, 1e-5, mode="local", **kw)],
}


def _origin_clients(seed=0, n_clients=4, per=60):
    """Three 2-D clusters inside the ball of radius R at the origin."""
    rng = np.random.default_rng(seed)
    means = np.array([[-1.0, -0.5], [1.0, 0.5], [0.3, -1.2]])
    out = []
    for _ in range(n_clients):
        X = means[rng.integers(0, 3, per)] + rng.normal(0, 0.25, (per, 2))
        out.append(Ball(0.0, R).project(X))
    return out


def _inside(points, centre, radius, slack=1e-9):
    return bool(np.all(np.linalg.norm(points - centre, axis=1) <= radius * (1 + slack)))


def _layer(**kw):
    dp = GaussianDP(1.0, 1e-5, clip=R, centre=CENTRE, **kw)
    dp._d = 2  # set by setup() from the data
    return dp


def test_sensitivity_of_every_field_kind_uses_the_ball():
    dp = _layer()
    count = FieldSpec("n", (3,), "count", integer=True)
    total = FieldSpec("s", (3, 2), "sum", weighted_by="n")
    assert dp.centred_pairs((count, total)) == {"s": "n"}
    assert dp.sensitivity(count, 2) == 1.0
    assert dp.sensitivity(total, 2, centred=True) == R  # centred on the ball's centre: R, not |c| + R
    assert dp.sensitivity(total, 2) == 5.0 + R  # a sum noised uncentred: the largest record norm
    assert dp.sensitivity(FieldSpec("d", (3,), "distance"), 2) == 2 * R
    assert dp.sensitivity(FieldSpec("q", (1,), "score"), 2) == (2 * R) ** 2
    assert dp.sensitivity(FieldSpec("m", (3, 2), "mean"), 2) == 2 * R
    assert dp.sensitivity(FieldSpec("m", (3, 2), "mean", cells=3), 2) == pytest.approx(math.sqrt(3) * 2 * R)
    local = GaussianDP(1.0, 1e-5, clip=R, centre=CENTRE, mode="local")
    local._d = 2
    assert local.sensitivity(FieldSpec("v", (3, 2), "value"), 2) == pytest.approx(2 * R * math.sqrt(3))
    # the round's sigmas use the centred bound: the same as the origin ball's
    origin = GaussianDP(1.0, 1e-5, clip=R)
    origin._d = 2
    dp.budget = origin.budget = Budget(1.0, 1.0, 1e-5, "prv", None)  # z = 1, as after a fit's setup
    assert dp.field_sigmas((count, total)) == origin.field_sigmas((count, total))
    # switched off, the sums are bounded by the largest record norm
    off = _layer(centre_sums=False)
    assert off.centred_pairs((count, total)) == {}


def test_records_are_clipped_onto_the_ball_about_its_centre():
    dp = _layer()
    X = np.array([CENTRE + [0.6, 0.8], CENTRE + [3.0, 4.0], CENTRE - [0.0, 10.0], [0.0, 0.0]])
    out = dp.geometry(X.shape[1]).clip_to_ball(X)
    np.testing.assert_array_equal(out[0], X[0])  # inside: unchanged
    np.testing.assert_allclose(out[1], CENTRE + [1.2, 1.6])  # distance 5 -> R, same direction
    np.testing.assert_allclose(out[2], CENTRE - [0.0, 2.0])
    np.testing.assert_allclose(out[3], CENTRE - 2.0 * CENTRE / 5.0)  # the origin lies outside this ball
    assert _inside(out, CENTRE, R)
    # released means are projected into the ball (post-processing)
    specs = (FieldSpec("n", (2,), "count", integer=True), FieldSpec("s", (2, 2), "sum", weighted_by="n"))
    n = np.array([2.0, 4.0])
    S = np.array([CENTRE + [0.5, 0.0], CENTRE + [6.0, 8.0]]) * n[:, None]
    means = dp.post_processing.projected({"n": n, "s": S}, specs)["s"] / n[:, None]
    np.testing.assert_allclose(means, [CENTRE + [0.5, 0.0], CENTRE + [1.2, 1.6]])


def test_radius_rounds_use_the_balls_diameter():
    clients = [X + CENTRE for X in _origin_clients()]
    est = make_estimator("dwf", n_clusters=3, random_state=0, crypto="ideal",
                         protection=[GaussianDP(1.0, 1e-5, clip=R, centre=CENTRE, rng="seeded")])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients)
    report = est.protection_report_["GaussianDP"]
    assert report["radius"] == pytest.approx(auto_radius(2 * R, 3, 2)) == pytest.approx(0.8 * R / math.sqrt(3))


@pytest.mark.parametrize("stack", list(STACKS))
def test_a_translated_ball_gives_the_translated_fit(stack):
    """centre=c on the data moved by c is the origin ball's fit moved by c (same seeds, seeded noise)."""
    clients = _origin_clients()
    fits = []
    for c in (None, CENTRE):
        data = clients if c is None else [X + c for X in clients]
        est = make_estimator("dwf", n_clusters=3, random_state=0, crypto="ideal",
                             protection=STACKS[stack](clip=R, centre=c, rng="seeded"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(data)
        fits.append(est)
    origin, moved = fits
    assert origin.dp_plan_.rounds == moved.dp_plan_.rounds
    if origin.dp_plan_.start is not None:
        np.testing.assert_allclose(moved.dp_plan_.start, origin.dp_plan_.start + CENTRE, atol=1e-12)
    np.testing.assert_allclose(moved.cluster_centers_, origin.cluster_centers_ + CENTRE, atol=1e-6)
    assert moved.privacy_spent_ == origin.privacy_spent_


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_estimator_starts_from_the_ball_under_every_mode(name, stack):
    """No init_bounds: the ball alone serves the sensitivity and the start."""
    clients = [X + CENTRE for X in _origin_clients()]
    params = {"secure_mode": True} if name in SET_VALUED else {}
    est = make_estimator(name, n_clusters=3, random_state=0, crypto="ideal",
                         protection=STACKS[stack](clip=R, centre=CENTRE), **params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients)
    eps, delta = est.privacy_spent_
    assert 0 < eps <= 1.0 and delta == 1e-5
    assert _inside(est.cluster_centers_, CENTRE, R)
    assert est.dp_plan_ is not None
    if est.dp_plan_.start is not None:
        assert _inside(est.dp_plan_.start, CENTRE, R / 2)


def test_starts_are_drawn_in_the_ball():
    from protocols.dp.planning import plan, spread_start
    from securefkm.algorithms._kmeans import uniform_in_bounds
    from securefkm.algorithms._seeding import _private_seeding_centres

    ball = Ball(CENTRE, R)
    low, high = (np.asarray(b) for b in ball)
    np.testing.assert_array_equal(low, CENTRE - R)
    np.testing.assert_array_equal(high, CENTRE + R)
    rng = np.random.default_rng(0)
    assert _inside(uniform_in_bounds(ball, 500, 2, rng), CENTRE, R)
    spread = spread_start(8, low, high, seed=1, ball=ball)
    assert spread.shape == (8, 2) and _inside(spread, CENTRE, R / 2)
    p = plan(3, 2, 1.0, 1e-5, low, high, 100, seed=3, ball=ball)  # e >= 0.1: the spread start
    assert p.start is not None and _inside(p.start, CENTRE, R / 2)
    # private seeding: noisy bucket means pushed outside are projected back; missing ones drawn in the ball
    counts = np.array([50.0, 40.0, -1.0, -2.0, -1.5])
    sums = np.array([CENTRE + [9.0, 0.0], CENTRE + [0.5, 0.5], [0, 0], [0, 0], [0, 0]]) * np.maximum(counts, 1)[:, None]
    seeds = _private_seeding_centres({"bucket_counts": counts, "bucket_sums": sums}, 4, rng, ball)
    assert seeds.shape == (4, 2) and _inside(seeds, CENTRE, R)
    assert any(np.allclose(s, CENTRE + [R, 0.0]) for s in seeds)


def test_bad_ball_input_is_refused_with_the_fix():
    with pytest.raises(InputError, match="clip"):
        GaussianDP(1.0, 1e-5, clip=-1.0)
    with pytest.raises(InputError, match="clip=R"):
        GaussianDP(1.0, 1e-5, centre=[1.0, 2.0])
    with pytest.raises(InputError, match="clip=R"):
        GaussianDP(1.0, 1e-5, bounds=(-1, 1), centre=0.0)
    with pytest.raises(InputError, match="finite"):
        GaussianDP(1.0, 1e-5, clip=1.0, centre=[0.0, np.inf])
    with pytest.raises(InputError, match="radius"):
        Ball(0.0, 0.0)
    est = make_estimator("dwf", n_clusters=3, random_state=0, crypto="ideal",
                         protection=[GaussianDP(1.0, 1e-5, clip=R, centre=[1.0, 2.0, 3.0])])
    with pytest.raises(InputError, match="3 entries but the data has n_features=2"):
        est.fit(_origin_clients())


def test_the_ball_round_trips_through_pickle_and_the_layer_repr():
    import pickle

    ball = Ball(CENTRE, R)
    again = pickle.loads(pickle.dumps(ball))
    assert isinstance(again, Ball) and again.radius == R and np.array_equal(again.centre, CENTRE)
    assert tuple(again) == tuple(ball)
    assert "centre=[3.0, 4.0]" in repr(GaussianDP(1.0, 1e-5, clip=R, centre=CENTRE))


def test_private_seeding_buckets_are_voronoi_cells_with_three_points_per_axis():
    from securefkm.algorithms._seeding import lsh_buckets, seeding_broadcast, seeding_candidates, voronoi_buckets

    assert voronoi_buckets(7, 4) and voronoi_buckets(8, 5)  # 128 >= 81, 256 >= 243
    assert not voronoi_buckets(6, 4) and not voronoi_buckets(8, 6) and not voronoi_buckets(10, 3)
    ball = Ball([0.5, -0.5, 1.0, 0.0], 2.0)
    params = seeding_broadcast("private", 16, init_bounds=ball, rng=np.random.default_rng(0), n_features=4).params
    assert params["bits"] == 7 and params["radius"] == 2.0 and params["centre"] == [0.5, -0.5, 1.0, 0.0]
    C = seeding_candidates(params, 4)
    assert C.shape == (128, 4) and _inside(C, ball.centre, 2.0)
    np.testing.assert_array_equal(C, seeding_candidates(dict(params), 4))  # every client draws the same points
    X = ball.sample(300, 4, np.random.default_rng(1))
    nearest = ((X[:, None, :] - C[None]) ** 2).sum(axis=2).argmin(axis=1)
    np.testing.assert_array_equal(lsh_buckets(X, params), nearest)
    box = {k: v for k, v in params.items() if k not in ("centre", "radius")}
    Cb = seeding_candidates(box, 4)
    assert np.all(Cb >= np.asarray(ball[0])) and np.all(Cb <= np.asarray(ball[1]))
    assert lsh_buckets(X, {**params, "bits": 5}).max() < 32  # 32 < 81: hyperplane buckets


def test_seeding_buckets_reach_ten_bits_only_for_many_clusters():
    from securefkm.algorithms._seeding import lsh_bits

    assert lsh_bits(10, 64) == 6 and lsh_bits(42, 16) == 8  # about 6 buckets per cluster, as before
    assert lsh_bits(43, 16) == 9 and lsh_bits(64, 128) == 9 and lsh_bits(200, 8) == 10


def test_a_ball_fit_transcript_saves_in_a_checkpoint():
    """A deployment checkpoints the transcript: the declared ball is told in plain values."""
    from securefkm import WeightedFederatedKMeans
    from securefkm.flower._state_codec import dumps, loads

    rng = np.random.default_rng(0)
    clients = [rng.normal(scale=0.3, size=(40, 2)) + 1.0 for _ in range(6)]
    est = WeightedFederatedKMeans(n_clusters=2, protection=[GaussianDP(1.0, 1e-5, clip=2.0, centre=[1.0, 1.0])],
                                  random_state=0, backend="local")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients)
    back = loads(dumps(est.transcript_, magic=b"T"), magic=b"T")
    assert back.meta["domain_ball"] == {"centre": [1.0, 1.0], "radius": 2.0}
    assert [list(v) for v in back.meta["init_bounds"]] == [[-1.0, -1.0], [3.0, 3.0]]
    assert len(back.rounds) == len(est.transcript_.rounds)
