"""The estimators' side of DP planning: when a fit's DP settings are left to the budget,
which plan (:mod:`protocols.dp.planning`, a function of public quantities only) it runs, and
the fit's GaussianDP layer swapped for its copy carrying that plan
(:meth:`protocols.dp.GaussianDP.with_plan`). The rule itself, its constants and their
derivation live with the plan in :mod:`protocols.dp.planning`; this module reads the
estimator's hyper-parameters, which the protocol package does not know about.
"""

from __future__ import annotations

import numpy as np

from protocols.dp import planning as rule
from protocols.dp.planning import DPPlan, lloyd_rounds, noise_level, plan, spread_start


def rounds_plan_for_estimator(est, data, layers, records_per_cluster_factor: float = 1.0,
                              spread_seed=None) -> DPPlan | None:
    """Rounds for the budget when the full plan does not apply (an explicit ``init``,
    non-default DWF steps, or an estimator without the full plan): the same rule for R
    from the noise level e (a ball's radius takes the half-diagonal's place), the
    estimator's own start and options; n is the records a round is expected to sum (the
    public number of records times the fraction of clients sampled). Used by DWF outside the
    full plan, by mini-batch k-means and by fedavg fuzzy c-means (whose rounds have the
    same sensitivity: a record moves a count or a membership weight by at most 1 and a sum
    by at most the box's half-diagonal). Applies when ``max_rounds`` is unset, the stack holds
    one ``GaussianDP`` and the per-round noise is not fixed by ``noise_multiplier`` or
    ``round_weights``; else None (the estimator's own ``max_rounds`` default).

    ``records_per_cluster_factor`` rescales the records a round sums for a round whose noise
    is not Lloyd's (EWF's averaged local centres: :func:`ewf_plan_for_estimator`).

    ``spread_seed``: for an estimator whose start is left to the defaults (``init`` "auto"
    or None) with a declared domain (a box or a ball), the plan also starts from the spread points of the full plan
    when e >= E_p (no private seeding round spends budget), as DWF's plan does."""
    dp = budget_led_layer(est, layers)
    if dp is None:
        return None
    n = public_n(dp, data)
    # a round sums the records of the clients it samples: fewer records, relatively more noise
    per_round = max(1, round(n * _client_fraction(est, data) * records_per_cluster_factor))
    e, z1 = noise_level(int(est.n_clusters), data.n_features, dp.epsilon, dp.delta, per_round, dp.accountant_name)
    start = None
    init = getattr(est, "init", None)
    domain = start_domain(est, data.n_features)
    if (spread_seed is not None and domain is not None and e >= rule.NOISE_PRIVATE_START
            and (init is None or (isinstance(init, str) and init == "auto"))):
        low, high = (np.broadcast_to(np.asarray(b, dtype=np.float64), (data.n_features,)) for b in domain)
        start = spread_start(int(est.n_clusters), low, high, spread_seed, ball=_ball(domain))
    p = DPPlan(lloyd_rounds(e), start, e, z1, n)
    _apply(layers, dp, p)
    return p


def ewf_plan_for_estimator(est, data, layers, seed, prior_weight: float | None = None) -> DPPlan | None:
    """The plan of an EWF estimator whose DP settings are left to the budget, else None.

    Applies when :func:`budget_led_layer` finds the layer. The prior weight m of the local
    centres is ``prior_weight``, or when None :func:`protocols.dp.planning.ewf_prior_weight`
    (n / (clients k), public) with one local step and 0 with several (no bound below the
    diameter there). The rounds R follow the rounds rule from EWF's own noise level: that of a
    Lloyd round over :func:`protocols.dp.planning.ewf_round_records` records (times the fraction
    of clients sampled). With ``init="auto"``, one local step and a declared domain the start is
    that of DWF's full plan (:func:`protocols.dp.planning.plan` on the n records), with EWF's
    threshold: a private seeding round weighted R when DWF's noise level e is below
    :data:`~protocols.dp.planning.EWF_NOISE_PRIVATE_START`, else the spread points; otherwise
    the estimator's own start. With R >= 3 the last round is weighted R - 1, and the averages get
    the step shrinkage (``shrink="step"`` unless set), as in DWF's plan."""
    dp = budget_led_layer(est, layers)
    if dp is None:
        return None
    n = public_n(dp, data)
    k, d = int(est.n_clusters), data.n_features
    one_step = est.max_local_steps == 1
    m = (rule.ewf_prior_weight(n, data.n_clients, k) if one_step else 0.0) if prior_weight is None else prior_weight
    records = rule.ewf_round_records(k, d, data.n_clients * _client_fraction(est, data), m,
                                     cells=1 if one_step else k)
    e_rounds, z1 = noise_level(k, d, dp.epsilon, dp.delta, max(1, round(records)), dp.accountant_name)
    rounds = lloyd_rounds(e_rounds)
    start, private, e = None, False, e_rounds
    domain = start_domain(est, d)
    if one_step and domain is not None and isinstance(est.init, str) and est.init == "auto":
        low, high = domain
        # EWF keeps its own rounds: the candidate-vote refinement is planned for DWF only
        full = plan(k, d, dp.epsilon, dp.delta, low, high, n, seed, accountant=dp.accountant_name, ball=_ball(domain),
                    refine_rounds=0)
        e = full.noise_level  # DWF's: the seeding round's noise (it also sizes the seeding grid)
        # EWF's rounds move a centre only part of a Lloyd step: a private start pays off up to a
        # higher noise level than DWF's E_p (rule.EWF_NOISE_PRIVATE_START)
        private = e < rule.EWF_NOISE_PRIVATE_START
        start = None if private else full.start if full.start is not None else spread_start(
            k, *(np.broadcast_to(np.asarray(b, dtype=np.float64), (d,)) for b in domain), seed, ball=_ball(domain))
    p = DPPlan(rounds, start, e, z1, n, private_start=private, prior_weight=float(m), round_noise_level=e_rounds)
    settings = {} if dp.shrink is not None else {"shrink": "step"}  # the averages' step shrinkage, free
    if private:  # as in DWF's plan: the seeding round gets as much of the budget as the rounds together
        settings["round_weights"] = {"init.private": float(rounds)}
    if p.final_round_weight != 1.0:
        settings["last_round_weights"] = {"train": p.final_round_weight}
    _apply(layers, dp, p, **settings)
    return p


def start_domain(est, n_features: int):
    """The domain the estimator's start is drawn in: its ``init_bounds``, else the DP layer's
    box or ball (:meth:`securefkm.estimators.base.FederatedClusterer.declared_domain`)."""
    return est.declared_domain(n_features)


def _ball(domain):
    from ..domain import Ball

    return domain if isinstance(domain, Ball) else None


def _apply(layers, dp, p: DPPlan, **settings) -> None:
    """Swap ``dp`` in the fit's own ``layers`` for its validated copy carrying the plan
    (:meth:`GaussianDP.with_plan`): planning never sets a layer's attributes itself."""
    i = next(j for j, layer in enumerate(layers) if layer is dp)
    layers[i] = dp.with_plan(p.describe(), **settings)


def budget_led_layer(est, layers):
    """The stack's one GaussianDP layer when ``max_rounds`` is unset and the layer leaves its
    per-round noise to the budget (no ``noise_multiplier``, ``round_weights`` or
    ``last_round_weights``), else None."""
    from protocols.dp import GaussianDP

    dps = [la for la in layers if isinstance(la, GaussianDP)]
    if est.max_rounds is not None or len(dps) != 1:
        return None
    dp = dps[0]
    if dp.noise_multiplier is not None or dp.round_weights is not None or dp.last_round_weights is not None:
        return None
    return dp


def _client_fraction(est, data) -> float:
    """Expected fraction of the clients a round samples (``clients_per_round``: a fraction, or
    a count out of the public number of clients)."""
    c = getattr(est, "clients_per_round", 1.0)
    if isinstance(c, (int, np.integer)) and not isinstance(c, bool):
        return min(1.0, int(c) / max(1, data.n_clients))
    return min(1.0, float(c))


def public_n(dp, data) -> int:
    """The number of records the plan treats as public: the declared ``n_records``, else the data's."""
    return int(dp.n_records) if dp.n_records is not None else int(data.n_samples)


def _refine_rounds(est):
    """The estimator's ``refine_rounds`` (None: the plan's rule); 0 for an estimator whose
    algorithm has no candidate-vote rounds."""
    own = getattr(est, "_refine_rounds", None)
    return own() if callable(own) else 0


def plan_for_estimator(est, data, layers, seed, exact_lloyd: bool | None = None,
                       train_action: str = "train") -> DPPlan | None:
    """The plan for a DWF estimator whose DP settings are left to the defaults, else None.

    Applies when ``max_rounds`` and ``init`` are unset (None / "auto"), the estimator runs
    one-step dynamically weighted rounds (exact distributed Lloyd) and the stack holds one
    ``GaussianDP`` with a domain (``bounds``, or a ball: ``clip`` about ``centre``; the start is
    drawn in ``init_bounds`` when given, else in that domain) and neither ``noise_multiplier``
    nor ``round_weights``. The
    fit's ``layers`` get, in place of that layer, its copy with ``radius="auto"`` and
    ``shrink="step"`` unless set, and the plan for its report (:meth:`GaussianDP.with_plan`). ``exact_lloyd``: whether the estimator's rounds are exact
    distributed Lloyd rounds (None: read DWF's options; the set-valued algorithms' secure modes
    under DP pass True, their rounds being record-level Lloyd sums). ``train_action``: the
    broadcast action of the estimator's Lloyd rounds, whose last round the plan weights.
    """
    dp = budget_led_layer(est, layers)
    if exact_lloyd is None:
        exact_lloyd = (est.max_local_steps == 1 and est.weighting == "dynamic" and est.learning_rate == 1.0
                       and est.momentum == 0.0)
    if (
        dp is None
        or not (isinstance(est.init, str) and est.init == "auto")
        or not exact_lloyd
    ):
        return None
    domain = start_domain(est, data.n_features)
    if domain is None:
        return None
    n = public_n(dp, data)
    low, high = domain
    p = plan(int(est.n_clusters), data.n_features, dp.epsilon, dp.delta, low, high, n, seed,
             accountant=dp.accountant_name, ball=_ball(domain), refine_rounds=_refine_rounds(est))
    settings = {}
    if dp.radius is None:
        settings["radius"] = "auto"
    if dp.shrink is None:
        settings["shrink"] = "step"
    weights = {}
    if p.private_start:  # the seeding round gets as much of the budget as the Lloyd rounds together
        weights["init.private"] = float(p.rounds)
    if p.refine_rounds:  # each refinement round its own weight (rule.REFINE_WEIGHT)
        weights["refine"] = float(p.refine_weight)
    if weights:
        settings["round_weights"] = weights
    if p.final_round_weight != 1.0 and dp.last_round_weights is None:
        settings["last_round_weights"] = {train_action: p.final_round_weight}
    _apply(layers, dp, p, **settings)
    return p
