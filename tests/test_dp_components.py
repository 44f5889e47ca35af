"""GaussianDP's components on their own: the domain geometry, the calibration, the budget."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from protocols.dp.accounting import noise_multiplier_for
from protocols.dp.budget import Budget
from protocols.dp.calibration import Calibration, auto_count_share
from protocols.dp.geometry import DomainGeometry
from protocols.dp.radius import RadiusBound
from protocols.dp.scheduling import RoundSchedule
from securefkm.exceptions import PrivacyBudgetExceededError, ProtectionConfigError
from securefkm.messages import FieldSpec

COUNT = FieldSpec("n", (3,), "count", integer=True)
TOTAL = FieldSpec("S", (3, 2), "sum", weighted_by="n")


def test_geometry_of_a_box_and_of_a_ball():
    box = DomainGeometry(2, bounds=(np.array(0.0), np.array(2.0)))
    assert box.radius == pytest.approx(2 * math.sqrt(2)) and box.centred_radius == pytest.approx(math.sqrt(2))
    assert box.diameter == pytest.approx(2 * math.sqrt(2)) and box.centre.tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(box.project_rows(np.array([[-1.0, 3.0], [0.5, 0.5]])), [[0.0, 2.0], [0.5, 0.5]])
    ball = DomainGeometry(2, clip=1.0, centre=[3.0, 4.0])
    assert ball.radius == 6.0 and ball.centred_radius == 1.0 and ball.diameter == 2.0 and ball.box is None
    np.testing.assert_allclose(ball.project_rows(np.array([[3.0, 6.0]])), [[3.0, 5.0]])
    X = np.array([[3.0, 4.5], [6.0, 4.0]])
    np.testing.assert_allclose(ball.clip_to_ball(X), [[3.0, 4.5], [4.0, 4.0]])
    inside = np.array([[3.0, 4.5]])
    assert ball.clip_to_ball(inside) is inside  # nothing to clip: the records as given


def _calibration(**kw):
    box = DomainGeometry(2, bounds=(np.array(0.0), np.array(2.0)))
    settings = dict(mode="central", noises_everything=False, lattice_step=lambda spec: 0.0)
    settings.update(kw)
    return Calibration(lambda d: box, **settings)


def test_calibration_sensitivities_and_sigmas_from_explicit_inputs():
    cal = _calibration()
    assert cal.sensitivity(COUNT, 2) == 1.0
    assert cal.sensitivity(TOTAL, 2) == pytest.approx(2 * math.sqrt(2))  # the largest record norm
    assert cal.sensitivity(TOTAL, 2, centred=True) == pytest.approx(math.sqrt(2))  # the half-diagonal
    assert cal.sensitivity(TOTAL, 2, centred=True, radius=0.25) == 0.25
    assert _calibration(sens_factor=3.0).sensitivity(COUNT, 2) == 3.0  # suppression before the noise
    assert cal.centred_pairs((COUNT, TOTAL), 2) == {"S": "n"}
    assert _calibration(centre_sums=False).centred_pairs((COUNT, TOTAL), 2) == {}
    sig = cal.field_sigmas((COUNT, TOTAL), 2, z=2.0)
    c = auto_count_share(2)
    assert sig["n"][0] == pytest.approx(2.0 * 1.0 / math.sqrt(c))  # integer counts: no lattice term
    step = sig["S"][1]
    assert sig["S"][0] == pytest.approx(2.0 * (math.sqrt(2) + math.sqrt(6) * step) / math.sqrt(1 - c))
    with pytest.raises(ProtectionConfigError, match="kind is 'value'"):
        cal.sensitivity(FieldSpec("v", (3, 2), "value"), 2)
    assert _calibration(noises_everything=True).sensitivity(FieldSpec("v", (3, 2), "value"), 2) == pytest.approx(
        2 * math.sqrt(2) * math.sqrt(3))


def test_calibration_uses_the_aggregators_noise_grid_when_it_adds_the_noise():
    cal = _calibration(release_grid=lambda spec: 0.5)
    assert cal.aggregator_noises((COUNT, TOTAL)) and cal.steps(TOTAL) == 0.5
    assert not _calibration().aggregator_noises((COUNT, TOTAL))


def _fit(rounds):
    algo = SimpleNamespace(planned_actions=None, planned_sequence=None)
    return SimpleNamespace(algorithm=algo, max_rounds=rounds, planned_rounds=rounds)


def test_budget_calibrates_charges_and_refuses_a_round_past_the_target():
    schedule = RoundSchedule()
    schedule.setup(_fit(3), 3)
    budget = Budget.for_schedule(1.0, 1e-5, "prv", schedule)
    assert budget.z == noise_multiplier_for(1.0, 1e-5, 3, 1.0, accountant="prv")
    ctx = SimpleNamespace(sampled=(0, 1), round=0, action="train")
    for r in range(3):
        assert budget.refusal(SimpleNamespace(sampled=(0, 1), round=r, action="train"), budget.z, None, 3) is None
        budget.charge((0, 1), budget.z)
    assert dict(budget.counts) == {0: 3, 1: 3} and budget.max_client_rounds == 3
    assert budget.spent()[0] <= 1.0
    error = budget.refusal(ctx, budget.z, None, 3)
    assert isinstance(error, PrivacyBudgetExceededError) and "beyond the budget" in str(error)
    assert budget.refusal(ctx, budget.z, 3, 3) is None  # capped clients decline: nothing to refuse
    budget.plain_rounds += 1
    assert budget.spent()[0] == math.inf


def test_radius_bound_is_inactive_unless_planned():
    bound = RadiusBound()
    ctx = SimpleNamespace(action="train", round=5, broadcast=SimpleNamespace(centres=np.zeros((2, 2))))
    assert bound.round_radius(ctx) is None
    X = np.ones((3, 2))
    assert bound.clip(X, ctx) is X
    active = RadiusBound(0.5, ("train",), first_train=1)
    assert active.round_radius(ctx) == 0.5 and active.round_radius(SimpleNamespace(**{**vars(ctx), "round": 1})) is None
    np.testing.assert_allclose(np.linalg.norm(active.clip(X, ctx), axis=1), 0.5 * (1 - 1e-9))
