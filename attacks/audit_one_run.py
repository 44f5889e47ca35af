"""A one-run DP audit of what the server releases: m canaries, one fit, two lower bounds.

What is audited
---------------
One fit of DWF k-means (:class:`securefkm.algorithms.dwf.WeightedFederatedKMeansAlgorithm`,
one local step: per-cluster counts and coordinate sums) under the real
:class:`protocols.dp.layer.GaussianDP` layer, run by the real runtime
(:class:`securefkm.federation.Federation`: the clients' ``client_data`` clipping, the
algorithm's client update, the layer's noise in the mode asked for, the aggregator, the
server-side hooks, the accountant). The claim is the layer's own
``report()["privacy_spent"]`` after the run: every round of the run is charged there and
every round's release is scored here.

* ``mode="central"``: the server noises the decoded sum (plain sum aggregator; the release
  is the noised aggregate the algorithm receives);
* ``mode="distributed"``: every client adds a noise share and the sum goes through
  :class:`protocols.masking.PairwiseMasking` -- ``crypto="real"`` (default) runs the masking
  protocol, ``crypto="ideal"`` its ideal functionality, which releases the same sum (with
  seeded noise the two give the same bounds, ``tests/test_audit_one_run.py``); the release
  is the decoded noisy sum. The layer is built
  with ``min_clients`` = all clients and ``missing_shares=0``: every share is sized for all
  clients, so an honest round carries exactly the calibrated noise (with the default
  allowance for dropouts and colluders an honest round carries *more* noise than the claim
  assumes, and no audit can reach the claim);
* ``mode="local"``: every client noises its own message; the release is each client's
  message (what the server receives), and a canary is scored from its own client's message.

Canary design (each canary alone in its coordinates, at full sensitivity)
------------------------------------------------------------------------
k = ``n_canaries`` clusters; centre j = clip * u_j, u_j the unit vector at angle 2 pi j / k
in the first two coordinates. Canary j = ``canary_scale`` * clip * u_j, held by client
j mod n_clients, included in the fit with probability 1/2 (i.i.d., ``random_state``).
The layer clips it onto centre j, so it adds exactly 1 to count j and clip * u_j to sum row
j: its whole L2 sensitivity (counts Delta = 1, sums Delta = clip) lies in cells no other
canary touches. ``background_per_cell`` non-canary records at 0.5 clip * u_j (held by
another client) make every cell non-empty. The server is the auditor's: it broadcasts the
same centres in every round (DP must hold for any broadcast; an active server can choose
them), so each canary gets fresh evidence in each of the ``rounds`` rounds.

Threat model (white-box, as in Steinke, Nasr & Jagielski 2023 sec. 5 and Xiang et al. 2025)
--------------------------------------------------------------------------------------
The auditor knows every non-canary record, the broadcast, the layer's claimed sigmas and
which cell each canary would occupy; it does not know the inclusion bits or the noise. Per
canary j and round t it subtracts the noise-free non-canary contribution from the released
count w and sum row S and forms the likelihood-ratio statistic of the claimed Gaussian
mechanism, ``(w - w0)/sigma_w^2 + ((S - S0) . u_j) clip / sigma_S^2``; the score is the sum
over rounds divided by sqrt(T) mu_1 (mu_1^2 = 1/sigma_w^2 + clip^2/sigma_S^2, the claimed
per-round GDP parameter), so that under the claim it is N(0, 1) for an excluded and
N(sqrt(T) mu_1, 1) for an included canary. Guesses: the r canaries whose score is farthest
from sqrt(T) mu_1 / 2, "in" above it, "out" below.

Two lower bounds from the same guesses (``attacks.audit``)
----------------------------------------------------------
* ``epsilon_fdp`` -- :func:`attacks.audit.gdp_one_run_epsilon`: the f-DP order-statistics
  bound (derivation in its docstring). *Assumption*: the release restricted to the canaries'
  cells is a product over canaries of channels each with Gaussian trade-off >= G_mu (true of
  GaussianDP as designed: independent noise per entry, each canary alone in its cells); it
  then holds with probability >= 1 - alpha, and the epsilon reported is that of the refuted
  mu-GDP curve at ``delta`` (Dong, Roth & Su 2019, Cor. 2.13).
* ``epsilon_steinke`` -- :func:`attacks.audit.one_run_epsilon` (Steinke et al. 2023,
  Thm 3.1 / App. D): valid for any (epsilon, delta)-DP mechanism, no product assumption.

The guess count r of each bound is chosen before the run from the claim alone (the r whose
*expected* outcome under the claimed mechanism gives the largest bound), so no
multiple-testing correction is needed.

Black-box audit (weaker)
------------------------
The same canaries scored from the fit's released final centres only (``cluster_centers_``):
score = the radial coordinate (centre_j . u_j) of centre j; the canary pulls it from
0.5 clip towards clip. Guess counts: Bonferroni over a fixed list. Only the last round's
noise enters the centres, so this bound cannot exceed the epsilon of one round.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy import stats

from securefkm.exceptions import InputError
from securefkm.validation import check_random_state

from .audit import (
    BROKEN,
    _broken_layer,
    _prob,
    gdp_mu_to_epsilon,
    gdp_one_run_epsilon,
    gdp_one_run_mu,
    one_run_epsilon,
)

MODES = ("central", "distributed", "local")
CRYPTO = ("ideal", "real")
#: candidate guess fractions r / m; the white-box bounds take the best one *expected* under
#: the claim, the black-box audit takes all of them with a Bonferroni correction
GUESS_FRACTIONS = (1.0, 0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01)


# ---------------------------------------------------------------- guesses and bounds
def correct_guesses(scores, bits, r: int, centre: float) -> int:
    """Correct guesses when the r scores farthest from ``centre`` are guessed ("in" above it).

    Ties in the distance are broken by index (the scores are continuous)."""
    s = np.asarray(scores, dtype=np.float64)
    b = np.asarray(bits, dtype=bool)
    order = np.argsort(-np.abs(s - centre), kind="stable")[:r]
    return int(np.count_nonzero((s[order] > centre) == b[order]))


def _expected_correct(m: int, r: int, mu: float) -> int:
    """Correct guesses among the r most confident under independent mu-GDP channels, at its
    mean: r q(t_r) with F-bar(t_r) = r/m (notation of :func:`attacks.audit.gdp_one_run_p_value`)."""
    a = 0.5 * mu
    if r >= m:
        return int(math.floor(r * stats.norm.cdf(a)))
    lo, hi = 0.0, 40.0 + a
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if stats.norm.sf(mid - a) + stats.norm.sf(mid + a) > r / m else (lo, mid)
    q = stats.norm.sf(hi - a) / (stats.norm.sf(hi - a) + stats.norm.sf(hi + a))
    return int(math.floor(r * q))


def planned_guesses(m: int, mu_claim: float, delta: float, alpha: float) -> dict[str, int]:
    """The guess count r of each bound, chosen from the claim only (before any score is seen):
    the candidate of :data:`GUESS_FRACTIONS` whose expected outcome gives the largest bound."""
    cands = sorted({max(1, int(f * m)) for f in GUESS_FRACTIONS if f * m >= 10} or {m})
    best = {}
    for name, bound in (("fdp", lambda r, v: gdp_one_run_mu(m, r, v, alpha, tol=1e-3)),
                        ("steinke", lambda r, v: one_run_epsilon(m, r, v, delta, alpha, tol=1e-3))):
        vals = [(bound(r, _expected_correct(m, r, mu_claim)), r) for r in cands]
        best[name] = max(vals)[1]
    return best


def one_run_bounds(scores, bits, centre: float, delta: float, alpha: float, guesses: dict[str, int]) -> dict:
    """Both one-run bounds of the same canaries at the guess counts ``guesses``."""
    m = int(np.size(scores))
    out: dict[str, Any] = {}
    r = guesses["fdp"]
    v = correct_guesses(scores, bits, r, centre)
    mu = gdp_one_run_mu(m, r, v, alpha)
    out.update(epsilon_fdp=gdp_mu_to_epsilon(mu, delta), mu_fdp=mu, r_fdp=r, correct_fdp=v)
    r = guesses["steinke"]
    v = correct_guesses(scores, bits, r, centre)
    out.update(epsilon_steinke=one_run_epsilon(m, r, v, delta, alpha), r_steinke=r, correct_steinke=v)
    return out


def bonferroni_bounds(scores, bits, centre: float, delta: float, alpha: float) -> dict:
    """Both bounds, best over :data:`GUESS_FRACTIONS` with alpha / (number of candidates)."""
    m = int(np.size(scores))
    cands = sorted({max(1, int(f * m)) for f in GUESS_FRACTIONS if f * m >= 10} or {m})
    a = alpha / len(cands)
    fdp, st = (0.0, None), (0.0, None)
    for r in cands:
        v = correct_guesses(scores, bits, r, centre)
        e = gdp_one_run_epsilon(m, r, v, delta, a)
        fdp = max(fdp, (e, r), key=lambda x: x[0])
        e = one_run_epsilon(m, r, v, delta, a)
        st = max(st, (e, r), key=lambda x: x[0])
    return {"epsilon_fdp": fdp[0], "r_fdp": fdp[1], "epsilon_steinke": st[0], "r_steinke": st[1],
            "candidates": len(cands)}


# ---------------------------------------------------------------- the audited fit
def background_cells(U: np.ndarray, clip: float, bg_owner: np.ndarray, per_cell: int, n_clients: int):
    """The noise-free per-client counts and sums of the non-canary records (the white-box
    auditor's knowledge): ``per_cell`` records at 0.5 clip u_j in cell j, held by client
    ``bg_owner[j]`` (each is nearest to centre j; tested against the algorithm's own cell sums)."""
    counts = [np.where(bg_owner == c, float(per_cell), 0.0) for c in range(n_clients)]
    sums = [cnt[:, None] * (0.5 * clip) * U for cnt in counts]
    return counts, sums


def _audit_algorithm(centres: np.ndarray):
    """DWF with one local step whose server broadcasts ``centres`` in every training round."""
    from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm

    class FixedBroadcastDWF(WeightedFederatedKMeansAlgorithm):
        def configure(self, state, round):
            b = super().configure(state, round)
            return replace(b, centres=centres) if b.action == "train" else b

    return FixedBroadcastDWF(len(centres), init=centres.copy(), tol=0.0, max_local_steps=1)


@dataclass
class OneRunAudit:
    """The bounds of one audited fit beside the layer's claim (all at ``delta``).

    ``epsilon_fdp`` / ``epsilon_steinke``: white-box bounds from the per-round releases;
    ``blackbox_epsilon_fdp`` / ``blackbox_epsilon_steinke``: from the final centres only.
    Each holds with probability >= ``confidence`` (the f-DP ones under the product
    assumption of the module docstring).
    """

    mode: str
    claimed_epsilon: float
    delta: float
    alpha: float
    epsilon_fdp: float
    epsilon_steinke: float
    blackbox_epsilon_fdp: float
    blackbox_epsilon_steinke: float
    n_canaries: int
    rounds: int
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def confidence(self) -> float:
        return 1.0 - self.alpha

    @property
    def ratio(self) -> float:
        """The tight (f-DP) white-box bound over the claim."""
        return self.epsilon_fdp / self.claimed_epsilon if self.claimed_epsilon > 0 else float("inf")

    @property
    def violates_claim(self) -> bool:
        """True when a white-box bound exceeds the claim (at the stated confidence)."""
        return bool(max(self.epsilon_fdp, self.epsilon_steinke) > self.claimed_epsilon)


def _check_int(v, name, minimum):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < minimum:
        raise InputError(f"{name} must be an int >= {minimum}, got {v!r}.")
    return int(v)


def one_run_audit(
    mode: str = "central",
    epsilon: float = 1.0,
    delta: float = 1e-5,
    n_canaries: int = 10_000,
    *,
    rounds: int = 1,
    n_clients: int = 4,
    n_features: int = 2,
    clip: float = 1.0,
    canary_scale: float = 2.0,
    background_per_cell: int = 1,
    crypto: str = "real",
    alpha: float = 0.05,
    layer_class=None,
    broken: str | None = None,
    noise_rng: str = "system",
    random_state=None,
) -> OneRunAudit:
    """Audit one DWF fit of ``rounds`` rounds under ``GaussianDP(epsilon, delta, clip, mode)``
    with ``n_canaries`` canaries (module docstring: design, threat model, bounds).

    ``layer_class``: a subclass of GaussianDP to audit instead (e.g. one with a planted bug);
    ``broken``: a bug from :data:`attacks.audit.BROKEN` planted the same way. ``noise_rng``:
    the layer's noise source, "system" (the OS CSPRNG, default) or "seeded" (keyed by
    ``random_state``: reproducible, for tests). ``random_state`` also draws the inclusion
    bits. ``crypto`` ("real", default, or "ideal"): the secure aggregator in distributed mode.
    """
    from protocols.dp.layer import GaussianDP
    from protocols.masking import PairwiseMasking
    from securefkm.federation import Federation

    if mode not in MODES:
        raise InputError(f"mode must be one of {MODES}, got {mode!r}.")
    if crypto not in CRYPTO:
        raise InputError(f"crypto must be 'ideal' or 'real', got {crypto!r}.")
    if broken not in BROKEN:
        raise InputError(f"broken must be one of {BROKEN}, got {broken!r}.")
    m = _check_int(n_canaries, "n_canaries", 10)
    rounds = _check_int(rounds, "rounds", 1)
    n_clients = _check_int(n_clients, "n_clients", 2)
    d = _check_int(n_features, "n_features", 2)
    background_per_cell = _check_int(background_per_cell, "background_per_cell", 0)
    alpha = _prob(alpha, "alpha")
    if not (isinstance(canary_scale, (int, float)) and canary_scale >= 1):
        raise InputError(f"canary_scale must be a number >= 1 (canaries at or beyond the clip radius), got {canary_scale!r}.")
    if noise_rng == "seeded" and random_state is None:
        raise InputError("noise_rng='seeded' keys the noise from random_state: pass random_state=<int>.")
    rng = check_random_state(random_state)
    seed = int(rng.integers(2**31))
    cls = layer_class if layer_class is not None else _broken_layer(GaussianDP, broken)
    if layer_class is not None and broken is not None:
        raise InputError("pass layer_class or broken, not both.")
    if not (isinstance(cls, type) and issubclass(cls, GaussianDP)):
        raise InputError(f"layer_class must be a subclass of GaussianDP, got {cls!r}.")

    # --- the data: centres on the clip circle, canaries beyond it, background inside
    ang = 2 * np.pi * np.arange(m) / m
    U = np.zeros((m, d))
    U[:, 0], U[:, 1] = np.cos(ang), np.sin(ang)
    clip = float(clip)
    centres = clip * U
    bits = rng.random(m) < 0.5
    owner = np.arange(m) % n_clients
    bg_owner = (owner + 1) % n_clients
    background = [np.repeat(0.5 * clip * U[bg_owner == c], background_per_cell, axis=0) for c in range(n_clients)]
    datas = []
    for c in range(n_clients):
        canaries = canary_scale * clip * U[(owner == c) & bits]
        datas.append(np.vstack([background[c], canaries]) if len(canaries) else background[c].copy())
    if any(len(X) == 0 for X in datas):
        raise InputError("a client holds no record; raise n_canaries or background_per_cell.")

    kw: dict[str, Any] = {"project_means": False, "rng": noise_rng}
    if mode == "distributed":
        kw.update(min_clients=n_clients, missing_shares=0)
    layer = cls(epsilon, delta, clip=clip, mode=mode, **kw)
    protection = [layer] + ([PairwiseMasking()] if mode == "distributed" else [])
    algorithm = _audit_algorithm(centres)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # central DP without a secure aggregator: the audit's choice
        fed = Federation(algorithm, datas, protection=protection, max_rounds=rounds, random_state=seed,
                         crypto=crypto, backend="local", record="full" if mode == "local" else "aggregates")
        state = fed.run()
    dp = next(la for la in fed.layers if isinstance(la, GaussianDP))
    rep = dp.report()
    claimed = float(rep["privacy_spent"][0])
    sig_w = float(rep["field_sigmas"]["weights"])
    sig_s = float(rep["field_sigmas"]["weighted_centres"])
    mu1 = math.sqrt(1 / sig_w**2 + clip**2 / sig_s**2)  # the claimed per-round GDP parameter
    z = float(rep["noise_multiplier"])

    # --- white-box scores: the releases minus the known non-canary contribution
    bg_counts, bg_sums = background_cells(U, clip, bg_owner, background_per_cell, n_clients)
    lr = np.zeros(m)
    records = [r for r in fed.transcript if r.action == "train" and r.aborted is None]
    for rec in records:
        if mode == "local":
            msgs = rec.plain_sums()
            w = np.empty(m)
            S = np.empty((m, d))
            for c in range(n_clients):
                mine = owner == c
                w[mine] = msgs[c]["weights"][mine] - bg_counts[c][mine]
                S[mine] = msgs[c]["weighted_centres"][mine] - bg_sums[c][mine]
        else:
            w = rec.aggregate["weights"] - sum(bg_counts)
            S = rec.aggregate["weighted_centres"] - sum(bg_sums)
        lr += w / sig_w**2 + np.einsum("ij,ij->i", S, U) * clip / sig_s**2
    T = len(records)
    scores = lr / (math.sqrt(T) * mu1)
    mu_claim = math.sqrt(T) / z  # the accountant's mu-GDP parameter of the run
    guesses = planned_guesses(m, mu_claim, delta, alpha)
    white = one_run_bounds(scores, bits, math.sqrt(T) * mu1 / 2, delta, alpha, guesses)

    # --- black-box scores: the final centres' radial coordinates
    rho = np.einsum("ij,ij->i", np.asarray(state.centres), U)
    rho_out = 0.5 * clip if background_per_cell else clip
    rho_in = (background_per_cell * 0.5 + 1) * clip / (background_per_cell + 1)
    black = bonferroni_bounds(rho, bits, 0.5 * (rho_in + rho_out), delta, alpha)

    details = {
        "white_box": white, "black_box": black, "mu_claimed": mu_claim, "noise_multiplier": z,
        "gdp_epsilon_of_claimed_mu": gdp_mu_to_epsilon(mu_claim, delta), "field_sigmas": rep["field_sigmas"],
        "n_included": int(bits.sum()), "crypto": crypto if mode == "distributed" else None,
        "layer": cls.__name__, "rounds_charged": rep["max_client_rounds"], "seconds": fed.elapsed,
    }
    return OneRunAudit(mode, claimed, float(delta), alpha, white["epsilon_fdp"], white["epsilon_steinke"],
                       black["epsilon_fdp"], black["epsilon_steinke"], m, T, details)
