"""Who adds GaussianDP's noise: one strategy object per mode.

:class:`~protocols.dp.GaussianDP` composes the calibration, the round schedule and the
accountant it shares by every mode with one of these strategies, which holds everything a
mode does differently: which messages it noises and where (the clients' updates, the
server's aggregate or none), what it requires of the stack, the floor of a round, what an
aborted round costs and what the server sees. Strategies are stateless; the fit's state
(``min_clients``, the noise shares, the accountant) lives on the layer they are given.
The mechanism and the proofs: docs/protocols/dp-mechanism.md.
"""

from __future__ import annotations

import math

import numpy as np

from securefkm.exceptions import InputError, ProtectionConfigError, RoundAbortedError
from securefkm.messages import AggregatedUpdate, Update, check_sums, stack_sums

from .noise import kls21_tau, min_share_variance
from .sampler import round_up_variance, sample_discrete_gaussian_batch

#: set-fields local mode can bound per record (by projection onto the domain)
SET_FIELDS_BOUNDED = ("centres",)


class Mode:
    """What every mode shares; a subclass overrides what its mode does differently."""

    name: str = ""
    #: the noise is added on the clients (their messages are not their exact updates)
    noises_on_clients = False
    #: every message is noised, set-fields and 'value' fields included (local mode)
    noises_everything = False
    requires_secure_aggregator = False

    def check_stack(self, dp, aggregator) -> None:
        """Mode-specific refusals of the stack (after the shared ones)."""

    def setup(self, dp, info) -> None:
        """Mode-specific sizing once the run's facts are known."""

    def round_refusal(self, dp, ctx) -> RoundAbortedError | None:
        """Why the round cannot carry the calibrated noise, or None."""
        return None

    def survivors_needed(self, dp, ctx) -> int:
        return 0

    def lattice_step(self, dp, spec) -> float:
        """Lattice step of a field (0: the fine lattice of the central and local modes)."""
        return 0.0

    def client_updates(self, dp, updates, clients, ctx) -> list:
        return list(updates)

    def server_aggregate(self, dp, agg: AggregatedUpdate, ctx, specs, sigmas) -> AggregatedUpdate:
        raise NotImplementedError

    def aborted_noise(self, dp, ctx, leaked) -> float | None:
        """The noise multiplier an aborted round's ``leaked`` release is charged at, or None:
        nothing released that this mode must charge."""
        return None

    def server_view(self, dp, eps: str, algorithm, aggregator) -> tuple[str, str]:
        raise NotImplementedError


def _done(dp, agg, sums, specs, ctx) -> AggregatedUpdate:
    """The released sums after the shared post-processing (projection into the domain)."""
    projected = dp.post_processing.projected(sums, specs, ctx.action, ctx, agg.n_contributors)
    return AggregatedUpdate(sums=projected, items=agg.items, contributors=agg.contributors, specs=agg.specs)


class Central(Mode):
    """The server (or an aggregator that adds the noise itself) noises the exact sum."""

    name = "central"

    def server_aggregate(self, dp, agg, ctx, specs, sigmas):
        if dp.aggregator_noises(specs):  # the aggregator's other party added the noise
            return _done(dp, agg, dp.post_processing.shrunk(dict(agg.sums), specs, sigmas, ctx.action, ctx, agg.n_contributors), specs, ctx)
        pairs = dp.centred_pairs(specs)
        post = dp.post_processing
        sums = post.translate(agg.sums, pairs, -1, ctx)
        for s in specs:
            sigma, step, _ = sigmas[s.name]
            sums[s.name] = dp._noise_fine(sums[s.name], sigma, step, dp._source(ctx, "server", s.name))
        return _done(dp, agg, post.shrunk(post.translate(sums, pairs, +1, ctx), specs, sigmas, ctx.action, ctx, agg.n_contributors), specs, ctx)

    def server_view(self, dp, eps, algorithm, aggregator):
        party = getattr(getattr(dp, "_aggregator", None), "noise_party", None)
        if party is not None:
            return (f"only the noisy sum {eps}: {party} adds the noise inside the secure aggregation, before the "
                    "server can decode the sum",
                    f"{party}: it must add the noise honestly and not collude with the server")
        sees = ("every client's exact sum-fields in plain (no secure aggregator)" if not aggregator.secure
                else "the exact sum of the clients' sum-fields (decoded by the secure aggregator)")
        return (f"{sees}; noise {eps} is added on the server and only what it releases afterwards is private",
                "the server (central DP): it sees the un-noised values and must add the noise honestly; "
                "it gives no protection against a curious server")


class Distributed(Mode):
    """Each client adds a share of the noise under a secure aggregator (Kairouz, Liu & Steinke 2021)."""

    name = "distributed"
    noises_on_clients = True
    requires_secure_aggregator = True

    def check_stack(self, dp, aggregator):
        codec = getattr(aggregator, "codec", None)
        if codec is None or getattr(codec, "resolution", None) is None:
            raise ProtectionConfigError(
                f"GaussianDP(mode='distributed') adds noise on the secure aggregator's integer lattice "
                f"but {getattr(aggregator, 'name', 'the aggregator')} exposes no codec.resolution; use "
                "PairwiseMasking() or Paillier() after GaussianDP in protection."
            )
        dp._codec = codec

    def setup(self, dp, info):
        if dp.min_clients is None:
            # the survivors the aggregator is designed to complete with (PairwiseMasking: all
            # but its dropout_fraction), so that its declared dropouts still leave the
            # calibrated noise in the sum; survivors_needed() makes it abort below that
            agg = dp._aggregator  # None only for a layer set up outside a validated stack
            dp.min_clients = int(agg.designed_survivors(info.clients_per_round)) if agg else info.clients_per_round
        if dp.min_clients > info.clients_per_round:
            raise ProtectionConfigError(
                f"GaussianDP min_clients={dp.min_clients} exceeds clients_per_round={info.clients_per_round}; "
                "no round could carry the calibrated noise. Lower min_clients or sample more clients."
            )
        self.size_shares(dp, info)

    @staticmethod
    def size_shares(dp, info):
        """The honest noise shares H every released sum holds, and the shares may be missing.

        Of ``clients_per_round`` = n sampled clients, a released sum can lack the noise share
        of ``n - min_clients`` clients that dropped (the aggregator decodes no fewer
        survivors) and of the clients that survive but add no noise (malicious, or colluding
        with the server: they know their own share). ``missing_shares`` M counts both;
        default: the dropouts plus the aggregator's declared colluders
        (``Aggregator.designed_corrupt``: PairwiseMasking's ``corrupt_fraction``, 5%). Each
        share then has variance sigma^2 / H with H = n - M, so a sum over any survivors of
        whom at most M - (n - min_clients) add nothing still carries >= sigma^2.
        """
        n = int(info.clients_per_round)
        dropped = n - int(dp.min_clients)
        agg = dp._aggregator
        if dp.missing_shares is None:
            corrupt = int(agg.designed_corrupt(n)) if agg is not None else 0
            missing = dropped + corrupt
        else:
            missing = int(dp.missing_shares)
            if missing < dropped:
                raise ProtectionConfigError(
                    f"GaussianDP missing_shares={missing} is below the {dropped} dropouts a round may "
                    f"complete with (clients_per_round={n} less min_clients={dp.min_clients}); a sum "
                    f"missing them would carry less noise than calibrated: pass missing_shares >= {dropped}."
                )
        if missing >= n:
            raise ProtectionConfigError(
                f"GaussianDP: {missing} of clients_per_round={n} noise shares may be missing "
                f"({dropped} dropouts + {missing - dropped} clients adding no noise), so no share is sure "
                "to reach the sum: sample more clients per round, or lower missing_shares / the "
                "aggregator's dropout_fraction and corrupt_fraction."
            )
        dp._colluders = missing - dropped
        dp._honest_shares = n - missing
        dp._info_clients = n

    @staticmethod
    def share_variance(dp, sigma: float, step: float) -> float:
        """Per-client lattice variance: sigma^2 / (step^2 H), H the honest shares every released
        sum holds (:meth:`size_shares`), raised if needed so that the KLS21 tau of a sum of H
        shares stays <= 1e-6 (more noise only strengthens the guarantee)."""
        h = dp._honest_shares or dp.min_clients
        return max((sigma / step) ** 2 / h, min_share_variance(h))

    @staticmethod
    def noise_factor(dp, n_contributors: int) -> float:
        """Noise std of a sum of ``n_contributors`` survivors' shares (at most ``_colluders`` of
        them adding nothing), relative to the calibrated sigma."""
        honest = max(int(n_contributors) - dp._colluders, 0)
        return math.sqrt(honest / dp._honest_shares) if dp._honest_shares else 0.0

    def round_refusal(self, dp, ctx):
        if ctx.specs and len(ctx.sampled) < dp.min_clients:
            return RoundAbortedError(
                f"GaussianDP(mode='distributed') needs at least min_clients={dp.min_clients} clients in a "
                f"round, {len(ctx.sampled)} were sampled (action {ctx.action!r}); the noise would be too small.",
                round=ctx.round,
                stage="before_round",
            )
        return None

    def survivors_needed(self, dp, ctx):
        if dp.min_clients is not None and dp._noised_specs(ctx.specs):
            return int(dp.min_clients)
        return 0

    def lattice_step(self, dp, spec):
        if spec.integer:
            return 1.0
        per = getattr(dp._codec, "resolution_for", None)
        return float(per(spec)) if per is not None else float(dp._codec.resolution)

    def client_updates(self, dp, updates, clients, ctx):
        """Every client's update plus its noise share N_Z(0, s^2) per field on the lattice
        (KLS21), all shares drawn in one pass of the sampler; each client's share still comes
        from its own byte source, so it is what that client alone would draw."""
        if ctx.specs and len(ctx.sampled) < dp.min_clients:
            return [None] * len(updates)  # the share would be too small: decline (KLS21, dropout-robust sizing)
        sigmas = dp.field_sigmas(ctx.specs, action=ctx.action, ctx=ctx)  # a 'value' field raises here too
        pairs = dp.centred_pairs(ctx.specs)
        steps = {s.name: sigmas[s.name][1] for s in ctx.specs}
        shares = {s.name: round_up_variance(Distributed.share_variance(dp, *sigmas[s.name][:2])) for s in ctx.specs}
        stacked = stack_sums([u.sums for u in updates], ctx.specs)
        if stacked is None:  # a malformed update (an algorithm bug): check_sums names the field
            for update in updates:
                check_sums(update.sums, ctx.specs)
            raise InputError("GaussianDP: a client's sum-fields are not numeric arrays; the noise cannot be added.")
        # every client's fields stacked along a first axis: the translation and the lattice
        # rounding are elementwise, so row i is bit for bit what client i computes alone; the
        # sampler still serves one request per (client, field) from that client's own source
        centred = dp.post_processing.translate(stacked, pairs, -1, ctx)
        lattices = {s.name: np.rint(centred[s.name] / steps[s.name]) for s in ctx.specs}
        requests = [(c, s) for c in clients for s in ctx.specs]  # client-major, fields in spec order
        sources = None if dp.rng == "system" else [dp._source(ctx, c.client_id, s.name) for c, s in requests]
        draws = sample_discrete_gaussian_batch(
            [shares[s.name] for _, s in requests], [s.size for _, s in requests], sources, flat=True,
        ).reshape(len(updates), -1)  # row i: client i's draws, its fields one after the other
        offset = 0
        for s in ctx.specs:
            lattices[s.name] += draws[:, offset:offset + s.size].reshape(lattices[s.name].shape)
            offset += s.size
        noisy = dp.post_processing.translate({s.name: lattices[s.name] * steps[s.name] for s in ctx.specs}, pairs, +1, ctx)
        names = [s.name for s in ctx.specs]
        rows = zip(*(list(noisy[name]) for name in names))  # client i's row of every field (views)
        return [Update(sums=dict(zip(names, row)), items=update.items) for row, update in zip(rows, updates)]

    def server_aggregate(self, dp, agg, ctx, specs, sigmas):
        m = dp.min_clients
        dp._tau = max(
            [dp._tau]
            + [kls21_tau(Distributed.share_variance(dp, sig, step), agg.n_contributors) for sig, step, _ in sigmas.values()]
        )
        if agg.n_contributors < m:
            # Under-noised sum already decoded: abort; the runtime sees that the aggregate
            # was released and charges it through after_aborted_round at the actual noise.
            factor = self.noise_factor(dp, agg.n_contributors)
            z_round = dp._z_for(ctx.action, ctx)
            raise RoundAbortedError(
                f"GaussianDP(mode='distributed'): only {agg.n_contributors} clients survived, fewer than "
                f"min_clients={m}; the aggregate carries too little noise and is discarded (charged at "
                f"noise multiplier {z_round * factor:.3g}). Lower min_clients to the aggregator's dropout threshold.",
                round=ctx.round,
                stage="server_aggregate",
            )
        return _done(dp, agg, dp.post_processing.shrunk(dict(agg.sums), specs, sigmas, ctx.action, ctx, agg.n_contributors), specs, ctx)

    def aborted_noise(self, dp, ctx, leaked):
        if not (leaked.sums and dp._noised_specs(ctx.specs)):
            return None
        z = dp._z_for(ctx.action, ctx)
        if leaked.n_contributors < dp.min_clients:
            z *= self.noise_factor(dp, leaked.n_contributors)
        return z

    @staticmethod
    def missing_statement(dp) -> str:
        missing = dp._info_clients - dp._honest_shares
        return (f"the noise of every released sum holds with up to {missing} of the "
                f"{dp._info_clients} sampled clients' noise shares missing ({missing - dp._colluders} "
                f"dropouts and {dp._colluders} surviving clients that add no noise: malicious, or colluding "
                f"with the server; each share is sized for the other {dp._honest_shares}); more clients "
                "that withhold their share lower the real epsilon (missing_shares=)")

    def server_view(self, dp, eps, algorithm, aggregator):
        assumed = (self.missing_statement(dp) if dp._honest_shares is not None else
                   "the noise shares the fit is sized for")
        return (f"only the noisy sum {eps}: each client adds a share of the noise under the secure aggregator",
                f"the secure aggregator's assumptions, and {assumed}")


class Local(Mode):
    """Each client noises its own message with the full noise."""

    name = "local"
    noises_on_clients = True
    noises_everything = True

    def client_updates(self, dp, updates, clients, ctx):
        """Every client noises its own sums (projected values) and bounded set-fields to the
        full sigma; all clients' draws in one pass of the sampler (``GaussianDP._noise_fine_many``)."""
        d = dp._d
        tasks, staged = [], []  # tasks: (dict to write, key, value, sigma, step, source)
        for update, client in zip(updates, clients):
            extra = {}
            items = dict(update.items)
            for name, arr in items.items():
                arr = np.asarray(arr)
                if name not in SET_FIELDS_BOUNDED or arr.size == 0:
                    if name == "sizes" or arr.size:
                        raise ProtectionConfigError(
                            f"GaussianDP(mode='local') cannot bound the set-field {name!r} per record "
                            f"(only {SET_FIELDS_BOUNDED} are bounded by projection); run the algorithm in its "
                            "record-level secure mode (secure_mode=True), whose rounds are per-cluster counts "
                            "and coordinate sums that every DP mode bounds."
                        )
                    continue
                rows = arr.size // d
                extra[name] = (dp.geometry(d).diameter * math.sqrt(rows), arr.size)
            noised = dp._noised_specs(ctx.specs)
            sigmas = dp.field_sigmas(noised, extra, action=ctx.action, ctx=ctx)
            pairs = dp.centred_pairs(noised)
            sums = dp.post_processing.translate(update.sums, pairs, -1, ctx)
            for s in ctx.specs:
                val = np.asarray(sums[s.name], dtype=np.float64)
                if s.kind in ("value", "mean"):
                    val = dp.geometry(d).project_rows(val)
                tasks.append((sums, s.name, val, *sigmas[s.name][:2], dp._source(ctx, client.client_id, s.name)))
            for name in extra:
                tasks.append((items, name, dp.geometry(d).project_rows(items[name]), *sigmas[name][:2],
                              dp._source(ctx, client.client_id, name)))
            staged.append((sums, items, pairs))
        noisy = dp._noise_fine_many(*[list(col) for col in zip(*tasks)][2:]) if tasks else []
        for (target, key, *_), value in zip(tasks, noisy):
            target[key] = value
        return [Update(sums=dp.post_processing.translate(sums, pairs, +1, ctx), items=items) for sums, items, pairs in staged]

    def server_aggregate(self, dp, agg, ctx, specs, sigmas):
        return _done(dp, agg, agg.sums, specs, ctx)

    def aborted_noise(self, dp, ctx, leaked):
        if (leaked.sums and dp._noised_specs(ctx.specs)) or leaked.items:
            return dp._z_for(ctx.action, ctx)
        return None

    def server_view(self, dp, eps, algorithm, aggregator):
        return (f"each client's update with that client's own Gaussian noise {eps} per record",
                "no one: every message is noised before it leaves the client")


STRATEGIES: dict[str, Mode] = {m.name: m for m in (Central(), Distributed(), Local())}
