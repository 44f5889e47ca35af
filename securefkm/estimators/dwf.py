"""Estimator for DWF / EWF k-means (Holzer et al. 2023)."""

from __future__ import annotations

from ..validation import check_float, check_int
from ..algorithms._candidate_vote import DEFAULT_MUTANTS
from ..algorithms.dwf import WeightedFederatedKMeansAlgorithm
from ..federation.runtime import MAX_ABORTED_ROUNDS, MAX_CLIENT_FAULTS
from .base import FederatedClusterer, resolve_init

DEFAULT_MAX_ROUNDS = 300


class WeightedFederatedKMeans(FederatedClusterer):
    """Dynamically (DWF) or equally (EWF) weighted federated k-means.

    Parameters
    ----------
    n_clusters : int
    weighting : {"dynamic", "equal"}
        "dynamic" weights each client's local centre by its cluster count (eq. 7, DWF);
        "equal" weights clients equally (eq. 8, EWF).
    learning_rate, momentum : float
        eta in (0, 1] and mu in [0, 1) of eq. 6. The paper's experiments use 0.01 and 0.8
        with 5 local steps; learning_rate=1, momentum=0 and one local step is exact
        distributed Lloyd.
    max_local_steps : int
        Lloyd steps each client runs per round (Algorithm 2).
    clients_per_round : int or float
        Clients sampled per round: a count or a fraction of all clients.
    max_rounds : int or None
        Maximal global rounds per run (max_global). None (default): 300 without DP. With a
        ``GaussianDP(bounds=...)`` layer, ``init="auto"`` and one-step DWF: the rounds of the
        DP plan (:mod:`protocols.dp.planning`: rounds, start, radius and shrinkage chosen from
        k, d, epsilon, delta, the box and the number of records, declared public; see
        ``dp_plan_`` and the layer's ``report()["plan"]``). With any other GaussianDP layer
        (``clip=`` instead of ``bounds``, an explicit ``init``, other steps) whose per-round
        noise is not fixed: the plan's number of rounds only, with the estimator's own start.
        Pass a number to opt out.
    tol : float
        Stop when the Frobenius movement of the centres is below tol.
    patience : int or None
        Also stop when the movement did not decrease over the last ``patience`` rounds
        (the paper's N_steps = 300).
    n_init : int
        Runs from different seeds; the run with the lowest federated score (a final
        sum-only score request to all clients, Algorithm 4) is kept.
    init : "auto", "k-means++", "random", "kfed", "uniform" or array (n_clusters, n_features)
        "auto" is k-FED seeding without protection (the paper's suggestion, sec. 2.3: on
        non-IID clients k-means++ on one random client puts every seed in that client's
        blob) and, under protection, "private": a seeding round of per-bucket counts and
        coordinate sums over a data-independent partition of ``init_bounds``, protected by
        the same layers (and DP budget) as the training rounds. With ``aggregation="median"``
        it is "uniform": k data-free points in ``init_bounds`` (a seeding round is a mean of
        counts and sums, which malicious clients move; pass ``n_init`` > 1 to keep the best of
        several by the federated score).
    init_bounds : (low, high) or None
        Declared data range, for init="uniform" and for the median's vote bins.
    aggregation : {"mean", "median"}
        "mean" (default): d_j of eq. 3-4, the count-weighted mean of the local centres.
        "median": the coordinate-wise median of the clients' local means, from a vote
        histogram sum-field (``vote_bins`` bins of the declared box ``init_bounds``), so it
        runs under secure aggregation; robust to malicious clients (bound:
        :func:`protocols.influence.median_shift_bound`; docs/protocols/robust-aggregation.md).
        Needs ``init_bounds``; DWF only; GaussianDP refuses it (no record-level bound on votes).
    vote_bins : int
        Bins per coordinate of the median's vote histogram (default 64).
    vote_weight : {"client", "records"}
        A client's vote weighs 1 (default) or its count in the cluster.
    refine_rounds : int or None
        Candidate-vote refinement rounds between the start and the training rounds (PE-means's
        generations, arXiv 2606.00342: every record votes for its nearest of the centres and
        their mutants, a count field of sensitivity 1; the server re-clusters the candidates
        by their votes). None (default): the DP plan's rule (:mod:`protocols.dp.planning`:
        3 rounds when k >= 16 and 4 <= d <= 64), 0 otherwise; an int >= 0 sets it.
    prior_weight : float >= 0 or None
        EWF with one local step: the weight m of the broadcast centre in each local centre,
        c_ij = (S_ij + m C_j) / (n_ij + m) (m pseudo-records at C_j; 0 is eq. 8). One record then
        moves c_ij by at most the domain's diameter / (1 + m), the sensitivity record-level DP
        noises (docs/protocols/differential-privacy.md). None (default): 0, except under a
        budget-led GaussianDP plan (``max_rounds`` unset), which uses n / (clients k), the public
        records per client per cluster (:func:`protocols.dp.planning.ewf_prior_weight`), and
        reports it in ``dp_plan_``. With ``init="auto"`` that plan also starts as DWF's (a private
        seeding round or the spread points) and plans EWF's rounds from its own noise level.
    protection : list of layers
        Protection stack (``protocols``); empty means plain sums.
    dropout_rate : float or dict
        Simulated dropouts (probability per client and round, or a schedule).
    random_state, verbose, crypto, backend, n_workers, max_aborted_rounds, max_client_faults, record, transcript_path
        ``crypto="ideal"`` swaps the secure aggregator for its ideal functionality (same release;
        studies only, see docs/protocols/ideal-functionality.md).
    """

    def __init__(
        self,
        n_clusters=8,
        *,
        weighting="dynamic",
        learning_rate=1.0,
        momentum=0.0,
        max_local_steps=1,
        clients_per_round=1.0,
        max_rounds=None,
        tol=1e-6,
        patience=None,
        n_init=1,
        init="auto",
        init_bounds=None,
        protection=None,
        dropout_rate=None,
        random_state=None,
        verbose=0,
        crypto="real",
        backend="auto",
        n_workers=None,
        max_aborted_rounds=MAX_ABORTED_ROUNDS,
        max_client_faults=MAX_CLIENT_FAULTS,
        record=None,
        transcript_path=None,
        aggregation="mean",
        vote_bins=64,
        vote_weight="client",
        refine_rounds=None,
        prior_weight=None,
    ):
        self.n_clusters = n_clusters
        self.weighting = weighting
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.max_local_steps = max_local_steps
        self.clients_per_round = clients_per_round
        self.max_rounds = max_rounds
        self.tol = tol
        self.patience = patience
        self.n_init = n_init
        self.init = init
        self.init_bounds = init_bounds
        self.protection = protection
        self.dropout_rate = dropout_rate
        self.random_state = random_state
        self.verbose = verbose
        self.crypto = crypto
        self.backend = backend
        self.n_workers = n_workers
        self.max_aborted_rounds = max_aborted_rounds
        self.max_client_faults = max_client_faults
        self.record = record
        self.transcript_path = transcript_path
        self.aggregation = aggregation
        self.vote_bins = vote_bins
        self.vote_weight = vote_weight
        self.refine_rounds = refine_rounds

        self.prior_weight = prior_weight

    def _refine_rounds(self):
        """``refine_rounds`` validated: None (the plan's rule) or an int >= 0."""
        if self.refine_rounds is None:
            return None
        from ..exceptions import InputError

        try:
            return check_int(self.refine_rounds, "refine_rounds", minimum=0)
        except InputError as exc:
            raise InputError(f"{exc} Pass refine_rounds=None (the DP plan's rule), 0 (no refinement) or a "
                             "number of candidate-vote rounds.") from None

    def _n_runs(self):
        return check_int(self.n_init, "n_init", minimum=1)

    def _max_rounds(self):
        return DEFAULT_MAX_ROUNDS if self.max_rounds is None else self.max_rounds

    def plans_dp_rounds(self) -> bool:
        return True

    def _plan_dp(self, data, layers, seed):
        from ._dp_planning import ewf_plan_for_estimator, plan_for_estimator, rounds_plan_for_estimator

        if self.weighting == "equal":
            return ewf_plan_for_estimator(self, data, layers, seed, self._prior_weight())
        return plan_for_estimator(self, data, layers, seed) or rounds_plan_for_estimator(self, data, layers)

    def _prior_weight(self):
        """The validated ``prior_weight``: None (left to the plan) or a float >= 0."""
        return None if self.prior_weight is None else check_float(self.prior_weight, "prior_weight", minimum=0.0)

    def _make_algorithm(self, n_features, n_clients):
        plan = getattr(self, "dp_plan_", None)
        init_bounds = self._declared_bounds(n_features)  # init_bounds or the DP layer's box (one declaration)
        if self.aggregation == "median":
            self._refuse_dp_votes()
        if plan is not None and plan.private_start:
            init = "private"
        elif self.aggregation == "median" and isinstance(self.init, str) and self.init == "auto":
            init = "uniform"  # a seeding round is a mean of counts and sums: malicious clients move it
        else:
            init = plan.start if plan is not None and plan.start is not None else resolve_init(
                self.init, self._protection_layers(), init_bounds, n_clusters=self.n_clusters, n_features=n_features,
                default_plain="kfed", default_protected="private",
            )
        refine = self._refine_rounds()
        if plan is not None and plan.refine_rounds:
            refine_kw = dict(refine_rounds=plan.refine_rounds, refine_mutants=plan.refine_mutants,
                             refine_records=plan.n_records)
        else:
            refine_kw = dict(refine_rounds=refine or 0, refine_mutants=DEFAULT_MUTANTS)
        return WeightedFederatedKMeansAlgorithm(
            self.n_clusters,
            weighting=self.weighting,
            learning_rate=self.learning_rate,
            momentum=self.momentum,
            max_local_steps=self.max_local_steps,
            tol=self.tol,
            patience=self.patience,
            init=init,
            init_bounds=init_bounds,
            score_round=self._n_runs() > 1,
            seeding_noise=plan.noise_level if plan is not None and plan.private_start else None,
            aggregation=self.aggregation,
            vote_bins=self.vote_bins,
            vote_weight=self.vote_weight,
            **refine_kw,
            prior_weight=plan.prior_weight if plan is not None and plan.prior_weight is not None
            else self._prior_weight() or 0.0,
        )

    def _refuse_dp_votes(self):
        """aggregation='median' under record-level DP: refused here, naming what works."""
        from ..exceptions import ProtectionConfigError

        for layer in self._protection_layers():
            if hasattr(layer, "field_sigmas"):  # a DP noise layer (GaussianDP)
                raise ProtectionConfigError(
                    f"aggregation='median' cannot run under {layer.name}: its vote histogram (sum-field 'votes', "
                    "kind 'value') has no record-level bound the DP layer can noise (one record moves its client's "
                    "vote in every coordinate). Use aggregation='mean' with DP, or aggregation='median' with secure "
                    "aggregation only (PairwiseMasking, Paillier).")
