"""Every algorithm under every DP mode: it fits, spends at most its budget, and its centres lie
in the declared box; refusals point to a call that works; the domain is declared once."""

import warnings

import numpy as np
import pytest

from protocols.dp import GaussianDP
from securefkm.exceptions import InputError, ProtectionConfigError
from securefkm.registry import make_estimator

BOX = (-2.0, 2.0)
SET_VALUED = ("aligning", "kfed", "child-parent", "fcm")
ALGORITHMS = ("dwf", "ewf", "minibatch", "aligning", "kfed", "child-parent", "fcm", "fcm-fedavg")
STACKS = {
    "central": lambda: [GaussianDP(1.0, 1e-5, bounds=BOX)],
    "central+masking": lambda: [GaussianDP(1.0, 1e-5, bounds=BOX), "masking"],
    "distributed+masking": lambda: [GaussianDP(1.0, 1e-5, bounds=BOX, mode="distributed"), "masking"],
    "distributed+paillier": lambda: [GaussianDP(1.0, 1e-5, bounds=BOX, mode="distributed"), "paillier"],
    "local": lambda: [GaussianDP(1.0, 1e-5, bounds=BOX, mode="local")],
}


@pytest.fixture(scope="module")
def clients():
    rng = np.random.default_rng(0)
    centres = np.array([[-1.0, -1.0], [1.0, 1.0], [1.0, -1.0]])
    return [np.clip(centres[rng.integers(0, 3, 60)] + rng.normal(0, 0.3, (60, 2)), *BOX) for _ in range(4)]


def _params(name):
    return {"secure_mode": True} if name in SET_VALUED else {}


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_algorithm_fits_under_every_dp_mode(name, stack, clients):
    est = make_estimator(name, n_clusters=3, random_state=0, protection=STACKS[stack](), crypto="ideal", **_params(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients)
    eps, delta = est.privacy_spent_
    assert 0 < eps <= 1.0 and delta == 1e-5
    assert np.all(est.cluster_centers_ >= BOX[0]) and np.all(est.cluster_centers_ <= BOX[1])
    assert est.dp_plan_ is not None and est.n_iter_ <= est.dp_plan_.rounds
    assert "spent epsilon" in est.protection_report_["GaussianDP"]["summary"]


@pytest.mark.parametrize("name", SET_VALUED)
def test_plain_set_valued_refusal_points_to_a_call_that_works(name, clients):
    """Plain set-valued + DP (any mode) is refused once, naming secure_mode=True, and that call works
    (before, masking asked for secure_mode=True, distributed DP then refused a 'value' field and
    local DP pointed back to the secure mode)."""
    for stack in ("distributed+masking", "local", "central"):
        est = make_estimator(name, n_clusters=3, random_state=0, protection=STACKS[stack](), crypto="ideal")
        with pytest.raises(ProtectionConfigError, match="secure_mode=True"):
            est.fit(clients)
        est.set_params(secure_mode=True)
        est.fit(clients)
        assert est.privacy_spent_[0] <= 1.0


def test_ewf_local_centres_have_the_diameter_as_sensitivity(clients):
    est = make_estimator("ewf", n_clusters=3, random_state=0, protection=STACKS["central"](), crypto="ideal")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients)
    layer = est.protection_report_  # the fit ran: the centres field was noised, not refused
    from securefkm.messages import FieldSpec
    dp = GaussianDP(1.0, 1e-5, bounds=BOX)
    dp._d = 2
    assert dp.sensitivity(FieldSpec("centres", (3, 2), "mean"), 2) == pytest.approx(np.sqrt(32))
    assert dp.sensitivity(FieldSpec("centres", (3, 2), "mean", cells=3), 2) == pytest.approx(np.sqrt(96))
    assert layer is not None


@pytest.mark.parametrize("name, params, fix", [
    ("dwf", {"max_local_steps": 3}, "max_local_steps=1"),
    ("minibatch", {"batch_size": 8}, "batch_size=None"),
    ("minibatch", {"local_epochs": 2}, "local_epochs=1"),
    ("minibatch", {"client_rate": 0.5}, "client_rate=1.0"),
])
@pytest.mark.parametrize("mode", ["central", "distributed+masking"])
def test_options_that_send_values_are_refused_at_setup_naming_the_fix(clients, name, params, fix, mode):
    """Options under which one record moves a round's fields without bound are refused when the
    federation is built (no round runs), naming the algorithm's options that make them sums and
    local DP; local DP (which projects whole values) runs them."""
    est = make_estimator(name, n_clusters=3, random_state=0, protection=STACKS[mode](), crypto="ideal", **params)
    with pytest.raises(ProtectionConfigError, match=fix) as info:
        est.make_federation(clients)
    assert "mode='local'" in str(info.value)
    local = make_estimator(name, n_clusters=3, random_state=0, protection=STACKS["local"](), crypto="ideal",
                           max_rounds=2, **params).fit(clients)
    assert local.privacy_spent_[0] <= 1.0 + 1e-9


def test_init_bounds_serves_as_the_dp_box(clients):
    est = make_estimator("dwf", n_clusters=3, random_state=0, init_bounds=BOX, crypto="ideal",
                         protection=[GaussianDP(1.0, 1e-5, mode="distributed"), "masking"])
    est.fit(clients)
    assert est.privacy_spent_[0] <= 1.0
    ref = make_estimator("dwf", n_clusters=3, random_state=0, crypto="ideal",
                         protection=[GaussianDP(1.0, 1e-5, mode="distributed", bounds=BOX), "masking"]).fit(clients)
    assert est.dp_plan_.rounds == ref.dp_plan_.rounds
    assert np.array_equal(est.dp_plan_.start, ref.dp_plan_.start)


def test_dp_without_any_domain_names_both_places(clients):
    est = make_estimator("dwf", n_clusters=3, random_state=0, protection=[GaussianDP(1.0, 1e-5)])
    with pytest.raises(InputError, match="init_bounds") as info:
        est.fit(clients)
    assert "bounds=(low, high)" in str(info.value)


def test_conflicting_domains_are_refused(clients):
    est = make_estimator("dwf", n_clusters=3, random_state=0, init_bounds=(-1, 2),
                         protection=[GaussianDP(1.0, 1e-5, bounds=BOX)])
    with pytest.raises(InputError, match="different"):
        est.fit(clients)


def test_dp_text_spec_without_bounds_takes_init_bounds(clients):
    est = make_estimator("dwf", n_clusters=3, random_state=0, init_bounds=[-2, 2], crypto="ideal",
                         protection="dp:epsilon=1:delta=1e-5:mode=distributed,masking")
    est.fit(clients)
    assert est.privacy_spent_[0] <= 1.0


@pytest.mark.parametrize("name", ["minibatch", "fcm-fedavg", "fcm"])
def test_rounds_only_plans_start_from_the_spread_points(name, clients):
    """Under bounds with the start left to the defaults and a noise level e >= E_p (here epsilon
    0.2 on 240 records), mini-batch and the fuzzy estimators start from the plan's
    data-independent spread points (no private seeding round spends budget), as DWF's plan
    does; below E_p (epsilon 1) they keep the private seeding round; an explicit init is kept."""
    noisy = [GaussianDP(0.2, 1e-5, bounds=BOX)]
    est = make_estimator(name, n_clusters=3, random_state=0, protection=noisy, crypto="ideal", **_params(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients)
    assert est.dp_plan_.noise_level >= 0.1 and est.dp_plan_.start is not None and est.dp_plan_.describe()["start"].startswith("spread")
    assert not any(r.action.startswith("init.") for r in est.transcript_)
    quiet = make_estimator(name, n_clusters=3, random_state=0, protection=STACKS["central"](), crypto="ideal",
                           **_params(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet.fit(clients)
    assert quiet.dp_plan_.noise_level < 0.1 and quiet.dp_plan_.start is None
    given = np.array([[-1.0, -1.0], [1.0, 1.0], [1.0, -1.0]])
    est = make_estimator(name, n_clusters=3, random_state=0, protection=[GaussianDP(0.2, 1e-5, bounds=BOX)],
                         crypto="ideal", init=given, **_params(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(clients)
    assert est.dp_plan_.start is None
