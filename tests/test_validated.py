"""Validated aggregation: the measurement layout, identification and exclusion of invalid
clients, the exact release of the valid ones, and the configurations it refuses."""

import warnings

import numpy as np
import pytest

from attacks.poisoning import PoisoningPolicy
from protocols import GaussianDP, PairwiseMasking
from protocols.validated import ValidatedAggregation
from protocols.validated.measurement import is_valid, layout_for
from securefkm import WeightedFederatedKMeans
from securefkm.exceptions import ProtectionConfigError
from securefkm.messages import FieldSpec

BOX = (0.0, 1.0)
SPECS = (FieldSpec("weights", (3,), "count", integer=True),
         FieldSpec("weighted_centres", (3, 2), "sum", weighted_by="weights"))


def _clients(n=10, seed=0, k=3, d=2):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.2, 0.8, size=(k, d))
    return [np.clip(centres[rng.integers(k, size=12)] + rng.normal(scale=0.05, size=(12, d)), 0, 1) for _ in range(n)]


def _dwf(crypto="ideal", init="auto", **kw):
    return WeightedFederatedKMeans(3, init=init, init_bounds=BOX, max_rounds=4, random_state=0, crypto=crypto,
                                   protection=[ValidatedAggregation(**kw)])


START = np.array([[0.2, 0.2], [0.5, 0.8], [0.8, 0.3]])


# ---------------------------------------------------------------- the measurement
def test_layout_decodes_the_exact_sum_of_encoded_values():
    lay = layout_for(SPECS, *BOX, frac_bits=16)
    rng = np.random.default_rng(1)
    ms, expect_c, expect_s = [], np.zeros(3), np.zeros((3, 2))
    for _ in range(7):
        X = rng.uniform(0, 1, size=(20, 2))
        lab = rng.integers(3, size=20)
        c = np.bincount(lab, minlength=3).astype(float)
        s = np.stack([X[lab == j].sum(axis=0) for j in range(3)])
        counts, shifted = lay.measurement({"weights": c, "weighted_centres": s})
        assert is_valid(counts, shifted, 20, lay.widths)
        ms.append((counts, shifted))
        expect_c += c
        expect_s += np.rint(s * 2**16) / 2**16  # what each client's encoding holds
    C = [sum(m[0][j] for m in ms) for j in range(3)]
    T = [[sum(m[1][j][e] for m in ms) for e in range(2)] for j in range(3)]
    out = lay.decode(C, T)
    np.testing.assert_array_equal(out["weights"], expect_c)
    np.testing.assert_array_equal(out["weighted_centres"], expect_s)


@pytest.mark.parametrize("case, valid", [
    ("boundary: all records in one cluster on the high corner", True),
    ("boundary: empty clusters, total = n_max", True),
    ("a count above n_max", False),
    ("a negative count", False),
    ("a fractional count", False),
    ("a sum one unit above count x high", False),
    ("a sum one unit below count x low", False),
    ("a NaN sum", False),
])
def test_validity_predicate(case, valid):
    lay = layout_for(SPECS, *BOX, frac_bits=16)
    c = np.array([5.0, 0.0, 0.0])
    s = np.array([[5.0, 5.0], [0, 0], [0, 0]])
    if "empty" in case:
        c, s = np.array([2.0, 3.0, 0.0]), np.array([[0.0, 0.0], [3.0, 0.0], [0, 0]])
    elif "above n_max" in case:
        c[1] = 1.0
        s[1] = 0.5
    elif "negative" in case:
        c[1] = -1.0
    elif "fractional" in case:
        c[0] = 4.5
    elif "above count" in case:
        s[0, 0] = 5.0 + 2**-16
    elif "below count" in case:
        c[1], s[1] = 0.0, [-(2**-16), 0.0]
    elif "NaN" in case:
        s[0, 1] = np.nan
    counts, shifted = lay.measurement({"weights": c, "weighted_centres": s})
    assert is_valid(counts, shifted, 5, lay.widths) is valid


def test_layout_refuses_fields_it_cannot_bound():
    with pytest.raises(ProtectionConfigError, match="'centres'.*WeightedFederatedKMeans"):
        layout_for((FieldSpec("centres", (3, 2), "mean"),) + SPECS, *BOX, frac_bits=16)
    with pytest.raises(ProtectionConfigError, match="fractional weights"):
        layout_for((FieldSpec("weights", (3,), "count"), SPECS[1]), *BOX, frac_bits=16)


# ---------------------------------------------------------------- in a fit
@pytest.mark.parametrize("kind", ["count-inflation", "sum-scaling", "inconsistent"])
def test_out_of_range_clients_are_named_excluded_and_the_rest_released_exactly(kind):
    data = _clients()
    bad = (2, 7)
    est = _dwf()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(data, client_policies={c: PoisoningPolicy(kind, box=BOX) for c in bad})
    assert set(est.transcript_.rounds[0].faults) == set(bad)  # the private seeding round's buckets
    first = next(r for r in est.transcript_.rounds if r.action == "train")
    assert set(first.faults) == set(bad)
    assert all("validity proof failed" in why for why in first.faults.values())
    assert first.contributors == tuple(c for c in range(10) if c not in bad)
    # the release is the exact sum of the honest clients' encoded updates
    lay = layout_for(first.specs, *BOX, frac_bits=16)
    centres = first.broadcasts[first.sampled[0]].centres
    expect = np.zeros((3, 2))
    for c in first.contributors:
        lab = np.argmin(((data[c][:, None, :] - centres[None]) ** 2).sum(-1), axis=1)
        for j in range(3):
            expect[j] += np.rint(data[c][lab == j].sum(axis=0) * lay.scale) / lay.scale
    np.testing.assert_array_equal(first.aggregate["weighted_centres"], expect)
    for r in est.transcript_.rounds:  # never a poisoned value in any release
        assert not set(r.contributors) & set(bad)


def test_adaptive_in_range_lie_is_not_detected():
    est = _dwf()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(_clients(), client_policies={3: PoisoningPolicy("adaptive", box=BOX)})
    assert not any(r.faults for r in est.transcript_.rounds)
    assert all(3 in r.contributors for r in est.transcript_.rounds)


def test_too_few_valid_clients_abort_with_nothing_released():
    est = WeightedFederatedKMeans(3, init_bounds=BOX, max_rounds=2, random_state=0, crypto="ideal",
                                  max_aborted_rounds=1, protection=[ValidatedAggregation(min_clients=9)])
    with warnings.catch_warnings(), pytest.raises(Exception, match="valid report"):
        warnings.simplefilter("ignore")
        est.fit(_clients(), client_policies={c: PoisoningPolicy("sum-scaling") for c in (0, 1)})


# ---------------------------------------------------------------- configuration
def test_refuses_noise_before_validation_and_points_to_central_dp():
    est = WeightedFederatedKMeans(3, init_bounds=BOX, random_state=0, protection=[
        GaussianDP(epsilon=1, delta=1e-5, mode="distributed"), ValidatedAggregation()])
    with pytest.raises(ProtectionConfigError, match="mode='central'"):
        est.fit(_clients())


def test_central_dp_runs_on_the_validated_sum():
    est = WeightedFederatedKMeans(3, init_bounds=BOX, random_state=0, crypto="ideal", protection=[
        GaussianDP(epsilon=2, delta=1e-5, mode="central"), ValidatedAggregation()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(_clients(n=20))
    assert est.privacy_spent_[0] <= 2 + 1e-9
    assert np.all((est.cluster_centers_ >= 0) & (est.cluster_centers_ <= 1))


def test_refuses_without_a_declared_box():
    est = WeightedFederatedKMeans(3, init=np.full((3, 2), 0.5) + np.arange(3)[:, None] * 0.1, random_state=0,
                                  protection=[ValidatedAggregation()])
    with pytest.raises(ProtectionConfigError, match="init_bounds"):
        est.fit(_clients())


def test_one_aggregator_only():
    with pytest.raises(ProtectionConfigError, match="aggregators"):
        WeightedFederatedKMeans(3, init_bounds=BOX, protection=[ValidatedAggregation(), PairwiseMasking()]).fit(_clients())


def test_the_influence_bound_is_reported_and_holds_against_the_adaptive_attack():
    data = _clients()
    honest = _dwf(init=START, max_records=12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        honest.fit(data)
    entry = honest.protection_report_["ValidatedAggregation"]
    assert "1 malicious client of declared 12 records moves a centre by at most" in entry["server_sees"]
    assert 0 < entry["influence_max"] < np.sqrt(2)
    # one adaptive liar (12 declared records) in the first training round: its move stays within the bound
    from protocols.influence import mean_shift_bound

    poisoned = _dwf(init=START, max_records=12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        poisoned.fit(data, client_policies={4: PoisoningPolicy("adaptive", box=BOX)})
    h = next(r for r in honest.transcript_.rounds if r.action == "train")
    p = next(r for r in poisoned.transcript_.rounds if r.action == "train")
    np.testing.assert_array_equal(h.broadcasts[0].centres, p.broadcasts[0].centres)
    C = h.aggregate["weights"] - _own_counts(data[4], h.broadcasts[0].centres)
    S = h.aggregate["weighted_centres"] - _own_sums(data[4], h.broadcasts[0].centres)
    mu = S / np.maximum(C, 1)[:, None]
    moved = np.linalg.norm(p.aggregate["weighted_centres"] / p.aggregate["weights"][:, None] - mu, axis=1)
    bound = mean_shift_bound(12, C, BOX, mu)
    assert np.all(moved <= bound + 1e-4)
    assert np.any(moved >= 0.95 * bound)  # the adaptive liar comes close to the bound: it is not loose


def _own_counts(X, centres):
    lab = np.argmin(((X[:, None] - centres[None]) ** 2).sum(-1), axis=1)
    return np.bincount(lab, minlength=len(centres)).astype(float)


def _own_sums(X, centres):
    lab = np.argmin(((X[:, None] - centres[None]) ** 2).sum(-1), axis=1)
    return np.stack([np.rint(X[lab == j].sum(0) * 2**16) / 2**16 for j in range(len(centres))])


def test_several_starts_score_their_runs_through_validation():
    """n_init > 1: the scoring round's inertia (a (1,) score field) is released in its declared shape."""
    est = WeightedFederatedKMeans(3, init="uniform", n_init=3, init_bounds=BOX, max_rounds=3, random_state=0,
                                  crypto="ideal", protection=[ValidatedAggregation()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(_clients())
    scored = [r for r in est.transcript_.rounds if r.action == "score"]
    assert len(scored) == 3 and all(np.shape(r.aggregate["inertia"]) == (1,) for r in scored)


def test_deployments_need_the_provisioned_helper():
    """Over Flower the Helper is the key authority service's: a spec with validation and no
    provisioning (directory, authority-url) is refused naming them."""
    from securefkm.exceptions import InputError
    from securefkm.flower.provision import requirements
    from securefkm.flower.spec import RunSpec, build_federation

    spec = RunSpec("dwf", {"n_clusters": 3, "init_bounds": [0.0, 1.0]}, ["validated"], 0)
    assert requirements(spec.protection) == requirements(["paillier"]).__class__(True, True, True)
    with pytest.raises(InputError, match="ValidatedAggregation.*provisioned node identities.*authority-url"):
        build_federation(spec, 4, 2, None)


def test_active_attacks_run_against_a_validated_fit():
    """The active attacks build their own federation from ``protection``: the estimator's
    declared box reaches ValidatedAggregation there too (estimator.declared_domain)."""
    from attacks import CraftedCentroids

    data = _clients()
    est = _dwf(init=START)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(data)
        report = CraftedCentroids(target=0, max_rounds=8).evaluate(est, data)
    # a round of the target alone is below min_clients: nothing is released about it
    assert report.records_recovered == 0 and report.to_dict()["extra"]["detected"]
    assert est.declared_domain(2) is not None
