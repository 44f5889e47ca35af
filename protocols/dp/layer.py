"""GaussianDP: record-level differential privacy for the sum-fields of every round.

Each round's released sum-fields get independent discrete Gaussian noise calibrated so that
the round is one Gaussian mechanism of L2 sensitivity 1 after normalising each field by its
per-record bound (``count`` 1, ``sum`` R or the box's half-diagonal when centred, ``score``
(2R)^2, ``value`` only in local mode); the accountant (PRV by default) composes the rounds
each client's records took part in, without amplification by client sampling. Three modes
say who adds the noise: ``central`` (the server, after a secure aggregator's exact sum, or
the aggregator's other party when it adds the noise itself), ``distributed`` (each client a
share, under PairwiseMasking or Paillier; Kairouz, Liu & Steinke 2021) and ``local`` (each
client all of it).

The mechanism, the proof of the joint sensitivity, the lattice rounding term, weighted round
schedules, each mode's trust model and the clipping rules are in
docs/protocols/dp-mechanism.md; how to call the layer is in docs/protocols/differential-privacy.md.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from securefkm.domain import Ball, check_centre
from securefkm.validation import check_bounds, check_choice, check_float, check_int
from securefkm.exceptions import InputError, ProtectionConfigError
from securefkm.layers import Layer
from securefkm.messages import AggregatedUpdate, Update

from .accounting import _check_accountant
from .budget import Budget
from .calibration import Calibration, weighted_pairs
from .geometry import DomainGeometry
from .modes import STRATEGIES, Distributed, Mode
from .noise import RNGS, keystream, noise_on_lattice, noise_on_lattice_many
from .postprocessing import PostProcessor
from .radius import RadiusBound
from .scheduling import RoundSchedule

MODES = ("central", "distributed", "local")


class CentralDPWarning(UserWarning):
    """``GaussianDP(mode="central")`` without a secure aggregator: the server sees every
    client's exact update; only what it releases afterwards is differentially private."""


class DeltaWarning(UserWarning):
    """``delta`` above 1/n for n records: a mechanism may then release a whole record outright
    with probability delta and still meet the guarantee (Dwork & Roth 2014, sec. 2.3)."""


DOMAIN_MISSING = (
    "GaussianDP needs the records' domain for its sensitivity: pass bounds=(low, high) (records must lie in "
    "this box) or clip=R (records are clipped to this L2 norm) to GaussianDP, or init_bounds=(low, high) to "
    "the estimator (the same box then serves the sensitivity and the start)."
)
DOMAIN_MISSING_CLI = (
    "--protection dp needs the records' domain: add bounds=[low,high] or clip=R to the dp layer "
    "(e.g. 'dp:epsilon=1:delta=1e-5:bounds=[0,8]'), or pass --param init_bounds=[low,high]."
)
SHRINKS = ("coordinate", "vector", "hierarchical", "step")


def _check_weights(weights, name: str, example: str) -> dict | None:
    """``{action: positive weight}`` or None; anything else is refused naming ``name``."""
    if weights is None:
        return None
    if not isinstance(weights, dict) or not all(isinstance(a, str) for a in weights):
        raise InputError(f"{name} must be a dict {{action: weight}} (e.g. {example}), got {weights!r}.")
    return {a: check_float(w, f"{name}[{a!r}]", minimum=0.0, min_inclusive=False) for a, w in weights.items()}


class GaussianDP(Layer):
    """Record-level (epsilon, delta)-DP Gaussian noise on every round's released fields.

    The mechanism, its proofs and each mode's trust model: docs/protocols/dp-mechanism.md.

    Parameters
    ----------
    epsilon, delta : float
        The target for the whole fit (all runs and rounds); ``privacy_spent_`` never exceeds it.
    clip : float, optional
        Radius R > 0 of the ball domain: a record farther than R from ``centre`` is moved
        radially onto the ball's surface. The ball also serves an estimator's start when it
        has no ``init_bounds``.
    centre : float or array of n_features floats, optional
        The ball's centre (with ``clip``; default the origin). Sums are noised translated by
        it, so their sensitivity is R, not ``|centre| + R``.
    bounds : (low, high), optional
        The records' box (numbers or per-feature arrays); a record outside is refused, not
        clipped. Default: the estimator's ``init_bounds``. One of ``clip`` or ``bounds`` is needed.
    mode : {"central", "distributed", "local"}
        Who adds the noise: the server (or an aggregator that adds it itself, e.g.
        ``ValidatedAggregation``'s Helper), each client a share under a secure aggregator, or
        each client all of it.
    accountant : {"prv", "rdp"}
        The privacy accountant (opacus's); "prv" is tight, "rdp" an upper bound.
    min_clients : int, optional
        Distributed mode: survivors the noise is sized for. Default: the survivors the secure
        aggregator is designed for (``Aggregator.designed_survivors``: with PairwiseMasking all
        but its ``dropout_fraction`` of ``clients_per_round``), which then refuses to decode a
        sum of fewer.
    missing_shares : int, optional
        Distributed mode: noise shares a released sum may lack (dropped clients and surviving
        clients that add no noise). Default: ``clients_per_round - min_clients`` plus the
        aggregator's declared colluders (``Aggregator.designed_corrupt``, PairwiseMasking's 5%);
        each share is sized for the remaining clients.
    noise_multiplier : float, optional
        Skip calibration and use this z; the target is still enforced (a round that would pass
        it is refused).
    allow_plain_set_fields : bool
        Central and distributed modes: let set-fields (e.g. explicitly requested k-means++
        seeding) through un-noised; ``privacy_spent_`` is then infinite.
    count_share : float, "auto" or None
        Share of each round's sensitivity budget for the count fields. "auto":
        ``1 / (1 + 2 sqrt(d))`` for a round of counts and d-wide sums; None: equal shares.
    round_weights : dict, optional
        ``{action: w}`` (default 1): a round of that action gets noise multiplier
        ``z / sqrt(w)``, i.e. w times a weight-1 round's share; z is calibrated so the planned
        schedule meets the target.
    last_round_weights : dict, optional
        ``{action: w}``: the last planned round of that action in each run gets weight w (the DP
        plan's ``{"train": R - 1}``); needs the algorithm's ``planned_sequence``.
    shrink : {"coordinate", "vector", "hierarchical", "step"}, optional
        Shrink noisy per-cluster means (post-processing with the public sigmas); the DP plan
        picks "step" when left unset.
    centre_sums : bool
        Sums that declare their weights are noised translated by the domain's centre
        (sensitivity the box's half-diagonal, or the ball's radius).
    project_means : bool
        Project every released noisy mean into the records' domain (post-processing).
    rng : {"system", "seeded"}
        Noise from the OS CSPRNG, or from ChaCha20 keystreams keyed by the fit's
        ``random_state`` and a (run, round, action, owner, field) label: reproducible studies
        only (whoever knows the seed can subtract the noise); the Flower app refuses it.
    radius : float or "auto", optional
        Lloyd rounds after the first clip records to this distance from their nearest
        broadcast centre and noise the sums relative to it; "auto": the DP plan's radius.
    n_records : int, optional
        The number of records the DP plan treats as public (default: the data's, in
        simulation); deployments must declare it.
    """

    side = "client"

    def __init__(
        self,
        epsilon,
        delta,
        clip=None,
        bounds=None,
        mode: str = "central",
        accountant: str = "prv",
        min_clients=None,
        missing_shares=None,
        noise_multiplier=None,
        allow_plain_set_fields: bool = False,
        count_share: float | str | None = "auto",
        round_weights: dict | None = None,
        last_round_weights: dict | None = None,
        shrink: str | None = None,
        centre_sums: bool = True,
        project_means: bool = True,
        rng: str = "system",
        radius: float | str | None = None,
        n_records: int | None = None,
        centre=None,
    ):
        self.rng = check_choice(rng, "rng", RNGS)
        self.n_records = None if n_records is None else check_int(n_records, "n_records", minimum=1)
        self.plan = None  # set by an estimator's DP plan (protocols.dp.planning)
        if radius is None or (isinstance(radius, str) and radius == "auto"):
            self.radius = radius
        else:
            self.radius = check_float(radius, "radius", minimum=0.0, min_inclusive=False)
        self.centre_sums = bool(centre_sums)
        self.project_means = bool(project_means)
        self.epsilon = check_float(epsilon, "epsilon", minimum=0.0, min_inclusive=False)
        if count_share is None or (isinstance(count_share, str) and count_share == "auto"):
            self.count_share = count_share
        else:
            self.count_share = check_float(
                count_share, "count_share", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False
            )
        self.schedule = RoundSchedule(
            _check_weights(round_weights, "round_weights", "{'init.private': 0.5}"),
            _check_weights(last_round_weights, "last_round_weights", "{'train': 2.0}"),
        )
        self.radius_bound = RadiusBound()  # inactive until a fit's setup plans it
        self.budget: Budget | None = None  # calibrated in setup
        self._aggregator = None  # the stack's aggregator (validate_stack)
        self.shrink = None if shrink is None else check_choice(shrink, "shrink", SHRINKS)
        self.delta = check_float(delta, "delta", minimum=0.0, maximum=1.0, min_inclusive=False, max_inclusive=False)
        self.mode = check_choice(mode, "mode", MODES)
        self.accountant_name = _check_accountant(accountant)
        if clip is not None and bounds is not None:
            raise InputError(
                "GaussianDP takes one data domain: clip= (records are clipped to this L2 norm) or "
                "bounds=(low, high) (records must lie in this box), not both; e.g. GaussianDP(epsilon=1, "
                "delta=1e-5, bounds=(-2, 2))."
            )
        # neither: the domain comes from the estimator's init_bounds at fit time (declare_domain);
        # a fit without any declared domain is refused in validate_stack (DOMAIN_MISSING)
        self.clip = None if clip is None else check_float(clip, "clip", minimum=0.0, min_inclusive=False)
        if centre is not None and clip is None:
            raise InputError(
                "GaussianDP(centre=...) is the centre of the ball domain: pass clip=R with it (records within "
                "R of centre, e.g. GaussianDP(epsilon=1, delta=1e-5, clip=1.0, centre=[0.5, 2.0])); a box "
                "bounds=(low, high) has its own centre."
            )
        self.centre = check_centre(centre, "centre")
        self.bounds = check_bounds(bounds, "bounds")
        self.min_clients = None if min_clients is None else check_int(min_clients, "min_clients", minimum=1)
        self.missing_shares = None if missing_shares is None else check_int(missing_shares, "missing_shares", minimum=0)
        self._honest_shares = None  # distributed: the noise shares every released sum is sure to hold
        self._colluders = 0  # of the missing shares, those of clients that survive but add no noise
        self.noise_multiplier = (
            None if noise_multiplier is None else check_float(noise_multiplier, "noise_multiplier", minimum=0.0, min_inclusive=False)
        )
        self.allow_plain_set_fields = bool(allow_plain_set_fields)
        # distributed noise only makes sense under a secure aggregator (instance attribute
        # shadows the base-class ClassVar; the runtime reads it per instance).
        self.requires_secure_aggregator = self._strategy.requires_secure_aggregator
        self._repr_params = {"epsilon": self.epsilon, "delta": self.delta}
        if bounds is not None:  # the data domain the sensitivity assumes: part of what was declared
            self._repr_params["bounds"] = tuple(v.tolist() if v.ndim else float(v) for v in self.bounds)
        if clip is not None:
            self._repr_params["clip"] = clip
        if centre is not None:
            self._repr_params["centre"] = self.centre.tolist()
        self._repr_params["mode"] = self.mode
        if self.rng != "system":
            self._repr_params["rng"] = self.rng
        self._seed = None
        self._codec = None
        self._cap = None
        self._sens_factor = 1.0
        self._d = None
        self._last_sigmas: dict[str, float] = {}
        self._tau = 0.0

    @property
    def round_weights(self) -> dict | None:
        return self.schedule.round_weights

    @property
    def last_round_weights(self) -> dict | None:
        return self.schedule.last_round_weights

    @property
    def z(self) -> float | None:
        """The fit's noise multiplier (a weight-1 round's), once set up."""
        return None if self.budget is None else self.budget.z

    def _z_for(self, action, ctx=None) -> float:
        """Noise multiplier of a round of ``action`` (``ctx``: that round)."""
        return self.schedule.multiplier(self.budget.z, action, ctx)

    # ------------------------------------------------------------------ domain and calibration
    def geometry(self, d: int) -> DomainGeometry:
        """The declared domain in ``d`` dimensions (asked by every client several times a round:
        kept per (d, bounds, centre) object)."""
        key = (d, id(self.bounds), id(self.centre))
        cached = self.__dict__.get("_geometry_cache")
        if cached is None or cached[0] != key:
            cached = (key, DomainGeometry(d, self.bounds, self.clip, self.centre))
            self.__dict__["_geometry_cache"] = cached
        return cached[1]

    @property
    def calibration(self) -> Calibration:
        """The sensitivities and sigmas of this layer's rounds, from its current settings and stack."""
        strategy = self._strategy
        agg = self._aggregator if self.mode == "central" else None
        return Calibration(self.geometry, self.mode, strategy.noises_everything,
                           lambda spec: strategy.lattice_step(self, spec),
                           None if agg is None else agg.release_noise_grid,
                           count_share=self.count_share, centre_sums=self.centre_sums,
                           sens_factor=self._sens_factor)

    @property
    def post_processing(self) -> PostProcessor:
        """What is done to this layer's released values (projection, shrinkage), from its settings."""
        return PostProcessor(self.geometry, self._d, self.shrink, self.plan, self.project_means, self.radius_bound)

    def sensitivity(self, spec, d: int, centred: bool = False, radius: float | None = None) -> float:
        """Per-record L2 sensitivity of one field (:meth:`Calibration.sensitivity`)."""
        return self.calibration.sensitivity(spec, d, centred, radius)

    def centred_pairs(self, specs) -> dict[str, str]:
        """{sum field: its weights field} noised translated by the domain's centre."""
        return self.calibration.centred_pairs(specs, self._d)

    def weighted_pairs(self, specs) -> dict[str, str]:
        """{sum field: its count field} for the d-wide sums that declare their weights."""
        return weighted_pairs(specs, self._d)

    def aggregator_noises(self, specs) -> bool:
        """Whether the secure aggregator, not the server, adds this round's central noise."""
        return self.calibration.aggregator_noises(specs)

    def _noised_specs(self, specs):
        return tuple(s for s in specs if s.kind != "value" or self._strategy.noises_everything)

    def field_sigmas(
        self, specs, extra_deltas: dict | None = None, action: str | None = None, ctx=None
    ) -> dict[str, tuple[float, float, float]]:
        """{name: (sigma_f, gamma_f, Delta'_f)} for the fields released together in a round of
        ``action`` (``ctx``: the round, for its radius bound, see :mod:`protocols.dp.radius`)."""
        return self.calibration.field_sigmas(specs, self._d, self._z_for(action, ctx),
                                             self.radius_bound.round_radius(ctx), extra_deltas)

    def release_noise(self, specs, ctx) -> tuple[dict[str, float], dict[str, str], np.ndarray | None]:
        """What an aggregator that adds this round's central noise itself needs (public
        quantities only): ``({field: sigma}, {centred sum field: its count field}, centres)``,
        centres the (rows, d) points the centred sums are translated by (the broadcast centres
        in a radius round, else the box centre per row), or None without centred fields."""
        specs = self._noised_specs(specs)
        sigmas = {k: v[0] for k, v in self.field_sigmas(specs, action=ctx.action, ctx=ctx).items()}
        pairs = self.centred_pairs(specs)
        if not pairs:
            return sigmas, pairs, None
        rows = self.radius_bound.row_centres(ctx, pairs)
        if rows is None:
            n_rows = next(s.shape[0] for s in specs if s.name in pairs)
            rows = np.broadcast_to(self.geometry(self._d).centre, (n_rows, self._d))
        return sigmas, pairs, np.array(rows, dtype=np.float64)

    # ------------------------------------------------------------------ hooks
    def declared_domain(self):
        """The declared domain: the box ``bounds``, or the ball (``clip`` about ``centre``) as a
        :class:`securefkm.domain.Ball` (also the pair of its bounding box), or None."""
        if self.clip is not None:
            return Ball(self.centre, self.clip)
        return self.bounds

    def with_plan(self, plan: dict, **settings) -> GaussianDP:
        """A copy of this layer with a DP plan's settings (``radius``, ``shrink``,
        ``round_weights``, ``last_round_weights``), built through the constructor so that every
        setting passes the layer's own checks; ``plan`` (the plan's description) is kept for the
        report. The layer itself is not changed (:mod:`protocols.dp.planning` swaps the copy
        into the fit's protection list)."""
        import inspect

        params = {}
        for name in inspect.signature(type(self).__init__).parameters:
            if name != "self":
                params[name] = self.accountant_name if name == "accountant" else getattr(self, name)
        unknown = set(settings) - {"radius", "shrink", "round_weights", "last_round_weights"}
        if unknown:
            raise InputError(f"GaussianDP.with_plan: a plan sets radius, shrink, round_weights and "
                             f"last_round_weights, not {', '.join(sorted(unknown))}.")
        layer = type(self)(**{**params, **settings})
        layer._repr_params = dict(self._repr_params)  # the repr says what the user declared
        layer.plan = plan
        return layer

    def declare_domain(self, bounds) -> None:
        """Take the box declared elsewhere (the estimator's ``init_bounds``) as this layer's
        ``bounds`` when it was built with neither ``clip`` nor ``bounds``: the domain is declared
        once and serves both the sensitivity and the start."""
        if self.clip is not None or self.bounds is not None:
            return
        if bounds is None:
            raise InputError(DOMAIN_MISSING, cli=DOMAIN_MISSING_CLI)
        self.bounds = check_bounds(bounds, "init_bounds")
        self._repr_params = {**{k: v for k, v in self._repr_params.items() if k != "mode"},
                             "bounds": tuple(v.tolist() if v.ndim else float(v) for v in self.bounds),
                             "mode": self.mode}
        self.__dict__.pop("_geometry_cache", None)

    def validate_stack(self, stack, algorithm):
        from protocols.min_cluster import MinClusterSize

        if self.clip is None and self.bounds is None:
            raise InputError(DOMAIN_MISSING, cli=DOMAIN_MISSING_CLI)
        from protocols.participation import ParticipationCap
        from protocols.rounding import Rounding

        aggs = [layer for layer in stack if layer.side == "aggregator"]
        caps = [layer for layer in stack if isinstance(layer, ParticipationCap)]
        self._cap = caps[0] if caps else None
        self._secure_aggregator = bool(aggs)
        self._aggregator = aggs[0] if aggs else None
        me = next(i for i, layer in enumerate(stack) if layer is self)
        for i, layer in enumerate(stack):
            if isinstance(layer, Rounding) and (i < me or not self._strategy.noises_on_clients):
                raise ProtectionConfigError(
                    f"Rounding runs before GaussianDP(mode={self.mode!r}) adds its noise, which changes the "
                    "per-record sensitivity (one record can move a rounded count by a whole multiple). "
                    + ("Place Rounding after GaussianDP (rounding noised values is post-processing)."
                       if self._strategy.noises_on_clients else
                       "In central mode the noise is added on the server, after every client layer: drop "
                       "Rounding or use mode='distributed' with Rounding after GaussianDP.")
                )
        # Suppression before the noise lets one record switch a whole cluster of p records.
        self._sens_factor = 1.0
        for i, layer in enumerate(stack):
            if isinstance(layer, MinClusterSize) and (i < me or not self._strategy.noises_on_clients):
                self._sens_factor = max(1.0, float(layer.p))
        refusal = aggs[0].client_noise_refusal(self.mode) if aggs else None
        if refusal is not None:
            raise ProtectionConfigError(refusal)
        self._strategy.check_stack(self, aggs[0] if aggs else None)
        if getattr(algorithm, "uses_set_fields", False) and not (
                self.allow_plain_set_fields and not self._strategy.noises_everything):
            raise ProtectionConfigError(set_fields_message(algorithm, self.mode))
        fix = getattr(algorithm, "dp_value_fix", None)
        if fix is not None and not self._strategy.noises_everything:
            raise ProtectionConfigError(value_fields_message(algorithm, self.mode, fix))

    def setup(self, info):
        d = info.n_features
        if self.rng == "seeded":
            if info.random_state is None:
                raise InputError(
                    "GaussianDP(rng='seeded') keys its noise from the fit's random_state, which is None; pass "
                    "random_state=<int> to the estimator, or use rng='system' (the OS CSPRNG, the default)."
                )
            self._seed = int(info.random_state)
        self._warn_about_trust_and_delta(info)
        if self.bounds is not None:
            for b in self.bounds:
                if b.ndim == 1 and b.shape[0] != d:
                    raise InputError(f"bounds arrays have length {b.shape[0]}, the data has n_features={d}.")
        check_centre(self.centre, "GaussianDP centre", d)
        self._d = d
        self.radius_bound = RadiusBound()
        if self.radius is not None:
            domain = self.geometry(d)
            sides = None
            if self.clip is None and self.radius == "auto":  # a box's sides cap the auto radius
                low, high = domain.box
                sides = high - low
            self.radius_bound = RadiusBound.for_fit(self.radius, info, domain.diameter, domain.centred_radius, sides)
        rounds = info.planned_rounds
        if self._cap is not None:
            rounds = min(rounds, self._cap.max_rounds)
        self.schedule.setup(info, rounds)
        self.budget = Budget.for_schedule(self.epsilon, self.delta, self.accountant_name, self.schedule,
                                          self.noise_multiplier)
        self._strategy.setup(self, info)

    def _warn_about_trust_and_delta(self, info):
        """Fit-time warnings: central noise with the server seeing plain updates, and a
        delta that allows releasing a record (checked when the record count is known: in simulation)."""
        if self.mode == "central" and not getattr(self, "_secure_aggregator", False):
            warnings.warn(
                "GaussianDP(mode='central') without a secure aggregator: the server receives every client's "
                "exact update and adds the noise itself; only what it releases (centres, transcripts of the "
                "noised aggregate) is differentially private. Add PairwiseMasking() or Paillier() after the "
                "layer, or use mode='distributed' with PairwiseMasking() so the server sees only noised sums.",
                CentralDPWarning,
                stacklevel=2,
            )
        n = sum(info.client_sizes) if info.client_sizes else 0
        if n and self.delta > 1.0 / n:
            warnings.warn(
                f"GaussianDP delta={self.delta:g} is above 1/n = {1.0 / n:.3g} for the n={n} records: a mechanism "
                "that publishes a randomly chosen record with probability delta meets such a guarantee, so it "
                f"says little. Use delta well below 1/n (e.g. 1/(n ln n) = {1.0 / (n * math.log(max(n, 2))):.3g}).",
                DeltaWarning,
                stacklevel=2,
            )

    def before_round(self, ctx):
        specs = ctx.specs
        for s in specs:
            if s.kind == "value" and not self._strategy.noises_everything:
                raise ProtectionConfigError(self.calibration.value_message(s))
        refusal = self._strategy.round_refusal(self, ctx)
        if refusal is not None:
            raise refusal
        if not specs and not self._strategy.noises_everything:
            return
        cap = self._cap.max_rounds if self._cap is not None else None
        refusal = self.budget.refusal(ctx, self._z_for(ctx.action, ctx), cap, self.schedule.planned)
        if refusal is not None:
            raise refusal

    def survivors_needed(self, ctx) -> int:
        """Distributed mode: ``min_clients``, the survivors the noise shares are sized for. A
        secure aggregator that honours it (PairwiseMasking, Paillier) aborts before decoding a sum of
        fewer: nothing is released, nothing charged, and the round is retried; the check
        after decoding below stays for aggregators that do not."""
        return self._strategy.survivors_needed(self, ctx)

    def client_data(self, X, client, ctx):
        if self.clip is not None:  # onto the ball about its centre, then the round's radius bound
            return self.radius_bound.clip(self.geometry(X.shape[1]).clip_to_ball(X), ctx)
        low, high = self.bounds
        bad = np.any((X < low) | (X > high), axis=1)
        if np.any(bad):
            i = int(np.flatnonzero(bad)[0])
            raise InputError(
                f"GaussianDP bounds: client {client.client_id} has {int(bad.sum())} record(s) outside the "
                f"declared box (first: row {i}); the sensitivity assumes records inside bounds=(low, high). "
                "Widen bounds, or use clip= to clip records explicitly."
            )
        return self.radius_bound.clip(X, ctx)

    def client_datas(self, Xs, clients, ctx):
        if self.clip is None and not self._any_outside_box(Xs):  # the common case: one check for all
            return [self.radius_bound.clip(X, ctx) for X in Xs]
        return [self.client_data(X, c, ctx) for X, c in zip(Xs, clients)]  # names the first offender

    _BOX_CHECK_ROWS = 1 << 16  # records checked per vectorised pass (bounds the temporary copy)

    def _any_outside_box(self, Xs) -> bool:
        """Whether some record of some client lies outside the box: the records of many clients
        concatenated and checked in one pass, ``_BOX_CHECK_ROWS`` at a time; True also for
        input the per-client check must judge (ragged widths, non-arrays)."""
        low, high = self.bounds
        i = 0
        while i < len(Xs):
            j, rows = i, 0
            while j < len(Xs) and (j == i or rows + len(Xs[j]) <= self._BOX_CHECK_ROWS):
                rows += len(Xs[j])
                j += 1
            try:
                block = np.concatenate(Xs[i:j]) if j - i > 1 else np.asarray(Xs[i])
                if block.ndim != 2 or ((block < low) | (block > high)).any():
                    return True
            except (ValueError, TypeError):
                return True
            i = j
        return False

    def _refuse_plain_items(self, update: Update, ctx) -> None:
        if update.items and not self._strategy.noises_everything and not self.allow_plain_set_fields:
            raise ProtectionConfigError(
                f"GaussianDP(mode={self.mode!r}): round action {ctx.action!r} sends set-fields "
                f"{sorted(update.items)} that this mode cannot noise. Use an init that sends no data "
                "(init_bounds / init='uniform' / an array / init='private'), GaussianDP(mode='local'), or "
                "pass allow_plain_set_fields=True to accept the leak (privacy_spent becomes infinite)."
            )

    def client_update(self, update: Update, client, ctx):
        return self.client_updates([update], [client], ctx)[0]

    def client_updates(self, updates, clients, ctx):
        # one path for a deployed client (a batch of one) and a round of simulated clients
        for update in updates:
            self._refuse_plain_items(update, ctx)
        return self._strategy.client_updates(self, self._domain_means(updates, ctx), clients, ctx)

    def _domain_means(self, updates, ctx):
        """Every client projects the rows of its ``mean`` fields into the declared domain before
        anything else (a function of its own message and the public box): the sensitivity of a
        ``mean`` field assumes rows inside the domain, which a broadcast centre outside it (an
        empty cluster's fallback) would break."""
        means = [s.name for s in ctx.specs if s.kind == "mean" and s.shape and s.shape[-1] == self._d]
        if not means:
            return updates
        domain = self.geometry(self._d)
        return [Update(sums={**u.sums, **{m: domain.project_rows(u.sums[m]) for m in means if m in u.sums}},
                       items=u.items) for u in updates]

    _noise_fine_many = staticmethod(noise_on_lattice_many)

    _noise_fine = staticmethod(noise_on_lattice)

    def _source(self, ctx, owner, field: str):
        """The noise's byte source: None (the OS CSPRNG) for ``rng="system"``; for ``"seeded"`` a
        keystream labelled by (run, round, action, owner, field), so the same noise is drawn
        whichever order, process or backend the clients run in."""
        if self.rng == "system":
            return None
        return keystream(self._seed, f"run={ctx.run}|round={ctx.round}|action={ctx.action}|owner={owner}|field={field}")

    def server_aggregate(self, agg: AggregatedUpdate, ctx):
        specs = self._noised_specs(agg.specs or ctx.specs)
        if not specs:
            return agg
        sigmas = self.field_sigmas(specs, action=ctx.action, ctx=ctx)
        self._last_sigmas = {k: v[0] for k, v in sigmas.items()}
        return self._strategy.server_aggregate(self, agg, ctx, specs, sigmas)

    def after_round(self, ctx, agg):
        released = bool(self._noised_specs(ctx.specs)) or (self._strategy.noises_everything and agg.items)
        if agg.items and not self._strategy.noises_everything:
            self.budget.plain_rounds += 1
        if released:
            self.budget.charge(agg.contributors, self._z_for(ctx.action, ctx))

    def after_aborted_round(self, ctx, leaked, error):
        """Charge what an aborted round let the server learn (the runtime derives ``leaked``):
        a decoded sum carrying the clients' noise (distributed: at the noise the survivors
        actually added, z * sqrt(n / min_clients); local), locally noised set-fields, or plain
        set-fields (privacy_spent becomes infinite, as in ``after_round``). Central mode: the
        decoded sum reached only the trusted curator and nothing was released: no charge."""
        if leaked.items and not self._strategy.noises_everything:
            self.budget.plain_rounds += 1
        z = self._strategy.aborted_noise(self, ctx, leaked)
        if z is not None:
            self.budget.charge(leaked.contributors, z)

    @property
    def _strategy(self) -> Mode:
        """Who adds the noise (:mod:`protocols.dp.modes`): derived from ``mode``, never saved."""
        return STRATEGIES[self.mode]

    def perturbs_client_messages(self) -> bool:
        return self._strategy.noises_on_clients  # central: the server noises exact updates

    def server_view(self, algorithm, aggregator):
        eps = f"(epsilon={self.epsilon:g}, delta={self.delta:g})"
        return self._strategy.server_view(self, eps, algorithm, aggregator)

    def report(self):
        budget = self.budget
        if budget is None:
            return {}
        eps, delta = budget.spent()
        last_index = self.schedule.last_index
        return {
            "privacy_spent": (eps, delta),
            "noise_multiplier": self.z,
            "round_noise_multipliers": (
                {a: self._z_for(a) for a in self.round_weights} if self.round_weights is not None else {}
            ),
            "last_round_noise_multipliers": (
                {a: self.z / math.sqrt(w) for a, w in self.last_round_weights.items() if a in last_index}
                if self.last_round_weights and self.z is not None else {}
            ),
            "planned_schedule": self.schedule.described(),
            "accountant": self.accountant_name,
            "mode": self.mode,
            "min_clients": self.min_clients if self.mode == "distributed" else None,
            "missing_shares": (None if self.mode != "distributed" or self._honest_shares is None
                               else Distributed.missing_statement(self)),
            "target": (self.epsilon, self.delta),
            "planned_compositions": self.schedule.planned,
            "max_client_rounds": budget.max_client_rounds,
            "field_sigmas": dict(self._last_sigmas),
            "kls21_tau": self._tau,
            "plain_set_field_rounds": budget.plain_rounds,
            "plan": self.plan,
            "radius": self.radius_bound.value,
            "summary": self._summary(),
        }

    def _summary(self) -> str:
        eps, delta = self.budget.accountant.spent()
        rounds = self.budget.max_client_rounds
        planned = f"planned by protocols.dp.planning ({self.plan['rounds']} Lloyd rounds), " if self.plan else ""
        sig = ", ".join(f"{k} {v:.4g}" for k, v in self._last_sigmas.items())
        return (
            f"GaussianDP({self.mode}): {planned}{rounds} noised round(s) per client, noise multiplier "
            f"{self.z:.4g} per round (last round's sigmas: {sig or 'none'}); spent epsilon={eps:.4g}, "
            f"delta={delta:.3g} of ({self.epsilon:g}, {self.delta:g})"
            + (f"; the number of records n={self.plan['records_declared_public']} is treated as public"
               if self.plan else "")
        )


def set_fields_message(algorithm, mode: str) -> str:
    """Why GaussianDP refuses an algorithm that sends per-client set-fields, and the call that works.

    A client's local centres and sizes are functions of all its records (its local clustering):
    one record can move every local centre and any number of records between local clusters, so
    no per-record sensitivity covers them, whoever adds the noise. The algorithm's secure mode
    under DP sends record-level sums instead (securefkm.estimators.aligning.record_level_dp)."""
    name = getattr(algorithm, "name", "this algorithm")
    param = getattr(algorithm, "secure_mode_param", None)
    why = (f"{name} sends each client's local centres and sizes (set-fields), which no per-record sensitivity "
           f"bounds (one record can change the client's whole local clustering), so GaussianDP(mode={mode!r}) "
           "cannot protect them. ")
    if param:
        return why + (f"Pass {param}=True to the estimator: under GaussianDP its rounds are record-level sums "
                      "(per global centre, the count and coordinate sum of a client's records nearest to it), "
                      "which central, distributed (with PairwiseMasking() or Paillier()) and local DP all protect.")
    return why + "Use an algorithm whose rounds are sums (e.g. 'dwf'); `securefkm algorithms` lists which DP modes apply."


def value_fields_message(algorithm, mode: str, fix: str) -> str:
    """Why GaussianDP refuses an algorithm whose options make its round fields values (local
    centres after several local steps, mini-batch updates): one record can move them without
    bound. Names the algorithm's options that make them bounded sums, and local DP, which
    projects whole values onto the domain."""
    name = getattr(algorithm, "name", "this algorithm")
    return (f"{name} with these options sends per-client values (e.g. local centres after several local steps) "
            f"that one record can change without bound, so GaussianDP(mode={mode!r}) has no sensitivity for "
            f"them. Pass {fix}, or use GaussianDP(mode='local', ...), which bounds whole values by projecting "
            "them onto the declared clip ball / bounds box.")


def refuse_seeded_noise(layers) -> None:
    """Raise :class:`ProtectionConfigError` if any layer is ``GaussianDP(rng="seeded")``.

    For deployments (the Flower app): seeded noise is recomputable by anyone who knows the
    seed, so it protects nothing against the server that chose it.
    """
    seeded = [layer for layer in layers if isinstance(layer, GaussianDP) and layer.rng == "seeded"]
    if seeded:
        raise ProtectionConfigError(
            "GaussianDP(rng='seeded') draws its noise from a stream keyed by the run's seed, which anyone "
            "holding the seed can recompute and subtract; it is for reproducible simulation studies only. "
            "Use GaussianDP(..., rng='system') (the default) in a deployment."
        )


def check_seeded_noise(layers, random_state) -> None:
    """Raise :class:`InputError` if a ``GaussianDP(rng="seeded")`` layer has no seed to key from.

    Estimators draw a fresh seed when ``random_state=None``; seeded noise keyed from it would
    be neither reproducible nor secret, so such a fit is refused before it starts.
    """
    if random_state is None and any(isinstance(la, GaussianDP) and la.rng == "seeded" for la in layers or ()):
        raise InputError(
            "GaussianDP(rng='seeded') keys its noise from the fit's random_state, which is None; pass "
            "random_state=<int> to the estimator, or use rng='system' (the OS CSPRNG, the default)."
        )

