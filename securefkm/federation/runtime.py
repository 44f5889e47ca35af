"""The server side of the round path.

:class:`Federation` drives the rounds of one fit for any :class:`~securefkm.algorithms.base.Algorithm`:
it samples clients, asks the (possibly malicious) server policy what to broadcast to whom,
runs the ``update`` stage and the aggregator's stages through a :class:`Transport`, applies
the server-side layers, updates the algorithm state and records everything in the
:class:`~securefkm.transcript.Transcript`.

The transport is pluggable (:mod:`securefkm.federation.transport`): :class:`LocalTransport`
(default) keeps every client in this process and injects simulated dropouts; worker
processes and Ray actors (:mod:`securefkm.federation.workers`) and the Flower app
(``securefkm.flower``) implement the same :class:`Transport`.

Aborted rounds (docs/aborted-rounds.md) are handled here, whatever the transport: an aborted
attempt leaves the state as it was, is logged in the transcript with its cause, and the same
round index is tried again (fresh sample, fresh protocol keys and round id) up to
``max_aborted_rounds`` aborted attempts per run. The round index, not the attempt, keys the
streams the model depends on (client randomness, seeded DP noise), and retries draw their
sample from a stream of their own, so the run's other rounds draw exactly what they would
have drawn had the aborted attempts never happened.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import time
import warnings
from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np
from tqdm.auto import tqdm

from ..datasets.population import ClientPopulation
from ..validation import check_fraction_or_count, check_int
from ..exceptions import (
    InputError,
    NoParticipantsError,
    PrivacyBudgetExceededError,
    RoundAbortedError,
    ServerMisbehaviourError,
    TooManyAbortedRoundsError,
)
from ..layers import Layer, RoundContext, RunInfo, validate_stack
from ..messages import AggregatedUpdate, Broadcast
from ..transcript import RECORD_LEVELS, AbortedRound, Exclusion, RoundRecord, StageRecord, Transcript
from ..transcript_file import file_transcript
from .client import ENCODER_REFUSAL, UPDATE_STAGE, ClientRuntime, UpdateRequest
from .client_policy import ClientPolicy
from .sampling import Dropouts, resolve_sample, sample_clients
from .transport import LocalTransport, SimulatedTransport, StreamedRuntimes, Transport  # noqa: F401  (re-exported)

log = logging.getLogger("securefkm")

#: ``crypto=`` choices: the aggregators' real protocol, or their ideal functionality
CRYPTO = ("real", "ideal")

#: default ``max_aborted_rounds``: aborted attempts tolerated per run. Production secure
#: aggregation sees 5-10% of clients drop per round (Bonawitz et al. 2017), which aborts a
#: round only rarely at the usual thresholds; 10 rides out bursts while a federation that
#: keeps failing (a threshold it can never meet) stops after a few seconds of retries.
MAX_ABORTED_ROUNDS = 10

#: default ``max_client_faults``: strikes after which a client is excluded from the rest of
#: the fit. A strike is a message of the client's that a check attributes to it alone
#: (malformed, replayed, a wrong share; docs/trust-model.md), never a dropout or an honest
#: refusal. 2, not 1: a deployed client can fail once without malice (a message corrupted on
#: a bad link, a client restarted mid-round with stale state), and the protocol already
#: leaves a faulty client out of that round, so a second chance costs nothing but that one
#: client's contribution; a client that keeps misbehaving is out after its second fault,
#: having cost the fit no aborted round where the protocol recovers.
MAX_CLIENT_FAULTS = 2

#: aborts the runtime never retries: the next attempt would fail the same way
_FINAL_ABORTS = (NoParticipantsError, PrivacyBudgetExceededError, TooManyAbortedRoundsError)


class ServerPolicy:
    """Whom the server asks and what it sends them. The honest policy sends every sampled
    client the algorithm's broadcast. Active attacks (``attacks``) subclass this to choose
    participants or send crafted, per-client broadcasts; the clients cannot tell."""

    def plan(
        self, state, round: int, broadcast: Broadcast, sampled: tuple[int, ...], n_clients: int
    ) -> tuple[tuple[int, ...], dict[int, Broadcast]]:
        return sampled, {c: broadcast for c in sampled}

    def observe(self, record: RoundRecord) -> None:
        """Called with each completed round record (adaptive attacks learn from it)."""

    def on_abort(self, record: RoundRecord, error: Exception) -> None:
        """Called when a round aborted (e.g. a consistency check caught this policy)."""


def _generator_states(state) -> list:
    """(generator, position) of every numpy Generator the algorithm keeps in its state (a
    deep copy of the state would do too, at ~10x the cost of a plain round's bookkeeping)."""
    return [(g, g.bit_generator.state) for g in state.generators()]


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Pause Python's cyclic garbage collector for one round. A round allocates a few objects
    per client (requests, replies, sessions, transcript entries: ~10^5 at 10,000 clients),
    which triggers several collections, and each full one traverses everything alive -- the
    growing transcript included: profiled at 10,000 clients, one in two rounds spent 70 ms
    (half the scikit-learn Lloyd iteration) in a collection. The round's garbage is freed
    by reference counting as usual; cycles, if any, are collected after the round."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _update_requests(run, round, sampled, per_client, first, fused, attempt) -> dict:
    """Each sampled client's :class:`UpdateRequest`. Clients sent the same broadcast object
    without a fused stage message get the same (immutable) request: every field of it is
    the same for them, and 10,000 clients need one object instead of 10,000."""
    shared: dict[int, UpdateRequest] = {}
    requests = {}
    for c in sampled:
        broadcast = per_client[c]
        if c in fused:
            requests[c] = UpdateRequest(run, round, broadcast, sampled, (first, fused[c]), attempt=attempt)
            continue
        request = shared.get(id(broadcast))
        if request is None:
            request = shared[id(broadcast)] = UpdateRequest(run, round, broadcast, sampled, None, attempt=attempt)
        requests[c] = request
    return requests


def _attempts_text(aborts) -> str:
    """``round 1 attempts 0-10, round 2 attempt 0``: the attempts ``aborts`` covered."""
    by_round: dict[int, list[int]] = {}
    for a in aborts:
        by_round.setdefault(a.round, []).append(a.attempt)
    parts = []
    for rnd, attempts in by_round.items():
        attempts = sorted(attempts)
        runs, start = [], attempts[0]
        for prev, cur in zip(attempts, attempts[1:] + [None]):
            if cur != prev + 1 if cur is not None else True:
                runs.append(str(start) if start == prev else f"{start}-{prev}")
                start = cur
        word = "attempt" if len(attempts) == 1 else "attempts"
        parts.append(f"round {rnd} {word} {', '.join(runs)}")
    return ", ".join(parts)


def describe_aborts(aborts, excerpt: int = 160) -> str:
    """Aborted attempts grouped by (cause, stage), each group once: where, the cause, how many,
    and the first message of the group cut to ``excerpt`` characters, e.g.
    ``round 1 attempts 0-10: 11 x too_few_survivors at stage 'masked_input' (pairwise ...)``."""
    groups: dict[tuple, list] = {}
    for a in aborts:
        groups.setdefault((a.cause, a.stage), []).append(a)
    out = []
    for (cause, stage), members in groups.items():
        message = members[0].message
        message = message if len(message) <= excerpt else message[: excerpt - 3].rstrip() + "..."
        count = f"{len(members)} x " if len(members) > 1 else ""
        out.append(f"{_attempts_text(members)}: {count}{cause} at stage {stage!r} ({message})")
    return "; ".join(out)


#: what to change, per abort cause (TooManyAbortedRoundsError's message)
_FIXES = {
    "too_few_survivors": "lower the aggregator's threshold / min_clients or sample more clients per round",
    "unattributed_check_failure": (
        "a contributor's input or the server failed a check that cannot tell which: run the masking with "
        "signed keys (PairwiseMasking(sign_keys=True)) so such faults are attributed to the client, which "
        "is then excluded"),
    "refused_before_round": "see the layer's refusal above (e.g. GaussianDP's minimum of participants)",
    "server_misbehaviour": "the server failed a protocol check: audit it before running again",
}


def _abort_fixes(aborts) -> str:
    causes = list(dict.fromkeys(a.cause for a in aborts))
    fixes = [_FIXES[c] for c in causes if c in _FIXES]
    return "To fix: " + "; ".join(fixes + ["or raise max_aborted_rounds"]) + "."


def _copy_payload(x):
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: _copy_payload(v) for k, v in x.items()}
    return x


class Federation:
    """Rounds of one fit: the server runtime over a transport.

    ``clients``: one record array per client, or a
    :class:`~securefkm.datasets.ClientPopulation`, whose clients are made when a round samples
    them and dropped when the next begins (:class:`~securefkm.federation.transport.StreamedRuntimes`;
    the same results). Parameters mirror the estimators': ``clients_per_round`` (count or fraction),
    ``dropout_rate`` (probability or schedule, simulation only), ``max_rounds``,
    ``random_state``, ``verbose`` and the ``protection`` stack. ``n_runs`` is the number of
    runs the fit will make (``n_init``); DP layers size their budget for all of them.
    ``crypto="ideal"`` swaps the stack's secure aggregator for its ideal functionality
    (:meth:`~securefkm.layers.Aggregator.ideal`): same release, same aborts, no cryptography.
    ``backend`` says where the simulated clients run: ``"local"`` (this process),
    ``"processes"`` (a pool of ``n_workers`` worker processes) or ``"ray"`` (a pool of Ray
    actors); each worker holds a shard of clients for the whole fit and the results are
    identical (:mod:`securefkm.federation.workers`). ``"auto"`` (default) picks worker
    processes when the clients' public-key cryptography would otherwise keep the fit on one
    core (:func:`~securefkm.federation.workers.auto_backend`: real masking or Paillier, at
    least ``AUTO_MIN_CLIENTS`` clients a round, two CPUs or more) and this process otherwise;
    ``self.backend`` is the choice made. Call :meth:`close` (or use the Federation as a
    context manager) to release the workers.

    ``max_aborted_rounds`` (default :data:`MAX_ABORTED_ROUNDS`): aborted round attempts
    tolerated per run (too few survivors, a layer refusing to start the round); each is
    retried and the run raises :class:`~securefkm.exceptions.TooManyAbortedRoundsError`,
    naming the rounds and causes, at one more. An abort where a protocol check caught the
    server misbehaving (:class:`~securefkm.exceptions.ServerMisbehaviourError`) ends the fit
    unless ``retry_server_misbehaviour=True`` (then it counts like any other abort).

    ``transcript_path``: write the transcript to this new file as the rounds happen instead of
    holding it in memory (:mod:`securefkm.transcript_file`; ``record`` still sets what a round
    keeps); :meth:`close` completes the file, :func:`~securefkm.transcript_file.open_transcript`
    reads it back.
    """

    def __init__(
        self,
        algorithm,
        clients: Sequence[np.ndarray] | None = None,
        *,
        protection: Sequence[Layer] | None = None,
        clients_per_round=1.0,
        dropout_rate=None,
        max_rounds: int = 100,
        n_runs: int = 1,
        random_state=None,
        verbose: int = 0,
        record: str = "full",
        server_policy: ServerPolicy | None = None,
        transport: Transport | None = None,
        n_features: int | None = None,
        crypto: str = "real",
        backend: str = "auto",
        n_workers: int | None = None,
        max_aborted_rounds: int = MAX_ABORTED_ROUNDS,
        retry_server_misbehaviour: bool = False,
        client_policies: Mapping[int, ClientPolicy] | None = None,
        max_client_faults: int | None = MAX_CLIENT_FAULTS,
        transcript_path=None,
    ):
        from .workers import check_backend

        self.backend, n_workers = check_backend(backend, n_workers)
        if self.backend not in ("auto", "local") and transport is not None:
            raise InputError(f"backend={backend!r} runs simulated clients; it cannot be combined with a transport.")
        self.algorithm = algorithm
        self.max_aborted_rounds = check_int(max_aborted_rounds, "max_aborted_rounds", minimum=0)
        self.max_client_faults = (None if max_client_faults is None
                                  else check_int(max_client_faults, "max_client_faults", minimum=1))
        self.retry_server_misbehaviour = bool(retry_server_misbehaviour)
        self.layers, self.aggregator = validate_stack(protection, algorithm)
        if crypto not in CRYPTO:
            raise InputError(
                f"crypto must be 'real' (run the secure aggregators' protocol) or 'ideal' (their ideal "
                f"functionality: the same release without the cryptography, for studies); got {crypto!r}."
            )
        self.crypto = crypto
        if crypto == "ideal":  # the one seam: the stack keeps its order, the aggregator is swapped
            ideal = self.aggregator.ideal()
            self.layers = [ideal if layer is self.aggregator else layer for layer in self.layers]
            self.aggregator = ideal
        self.max_rounds = check_int(max_rounds, "max_rounds", minimum=1)
        self.n_runs = check_int(n_runs, "n_runs", minimum=1)
        if record not in RECORD_LEVELS:
            raise InputError(f"record must be one of {RECORD_LEVELS}, got {record!r}; \"full\" keeps every "
                             "client message (what the attacks read), \"aggregates\" only each round's aggregate.")
        if random_state is not None and not isinstance(random_state, (int, np.integer)):
            raise InputError("Federation random_state must be an int or None (estimators convert Generators).")
        self.random_state = None if random_state is None else int(random_state)
        seq = np.random.SeedSequence(self.random_state)
        server_seq, drop_seq, self._algo_seq = seq.spawn(3)
        self.rng = np.random.default_rng(server_seq)
        # retries sample from their own stream, so that an aborted attempt does not shift the
        # samples of the run's other rounds (spawned after the three above: they are unchanged)
        self._retry_rng = np.random.default_rng(seq.spawn(1)[0])
        self.verbose = verbose
        self.policy = server_policy or ServerPolicy()
        streamed = isinstance(clients, ClientPopulation)
        if transport is None or clients is not None:
            if clients is None:
                raise InputError("Federation needs client arrays or a transport.")
            n_clients = len(clients)
            if streamed:  # declared: nobody is loaded to learn them
                n_features, sizes = clients.n_features, tuple(clients.sizes.tolist())
            else:
                n_features = clients[0].shape[1]
                sizes = tuple(len(x) for x in clients)
        if transport is not None:
            n_clients = len(transport.client_ids())
            sizes = None
            if n_features is None:
                raise InputError("Federation over a remote transport needs n_features.")
        self.n_clients = n_clients
        self.client_policies = self._check_client_policies(client_policies, n_clients, transport, clients)
        replying = sorted(c for c, p in self.client_policies.items() if type(p).reply is not ClientPolicy.reply)
        if replying and not getattr(self.aggregator, "simulates_client_replies", True):
            raise InputError(
                f"client_policies {replying[:5]} rewrite the clients' protocol messages, which the ideal "
                f"functionality of {self.aggregator.name} does not simulate (it runs honest clients only): use "
                "crypto='real' to run the protocol's checks against them.")
        self.clients_per_round = check_fraction_or_count(clients_per_round, "clients_per_round", n_clients)
        self.info = RunInfo(
            algorithm=algorithm,
            n_clients=n_clients,
            n_features=n_features,
            clients_per_round=self.clients_per_round,
            max_rounds=self.max_rounds,
            planned_rounds=self.n_runs * algorithm.planned_rounds(self.max_rounds),
            random_state=self.random_state,
            client_sizes=sizes,
        )
        for layer in self.layers:
            layer.setup(self.info)
        if self.backend == "auto":
            self.backend, n_workers = self._auto_backend(transport, n_workers)
        if transport is None and self.backend != "local":
            from .workers import WorkerTransport

            transport = WorkerTransport(
                self.backend, n_workers, clients, algorithm, self.layers, self.aggregator, self.info,
                Dropouts(dropout_rate), np.random.default_rng(drop_seq), policies=self.client_policies,
            )
        elif transport is None:
            if streamed:
                runtimes = StreamedRuntimes.of_population(clients, range(n_clients), algorithm, self.layers,
                                                          self.aggregator, self.info, self.client_policies)
            else:
                runtimes = [
                    ClientRuntime(i, X, algorithm, self.layers, self.aggregator, self.info,
                                  policy=self.client_policies.get(i))
                    for i, X in enumerate(clients)
                ]
            transport = LocalTransport(runtimes, Dropouts(dropout_rate), np.random.default_rng(drop_seq))
        elif dropout_rate:
            raise InputError("dropout_rate is a simulation parameter; a remote transport has real dropouts.")
        self.transport = transport
        make_transcript = Transcript if transcript_path is None else partial(file_transcript, transcript_path)
        self.transcript = make_transcript(
            meta={
                "algorithm": algorithm.name,
                "n_clients": n_clients,
                "n_features": n_features,
                "protection": tuple(repr(layer) for layer in self.layers),
                "client_messages_exact": not any(layer.perturbs_client_messages() for layer in self.layers),
                "aggregator": self.aggregator.name,
                "clients_per_round": self.clients_per_round,
                "crypto": crypto,
            },
            level=record,
        )
        self._round_counter = 0  # global across runs: dropout schedules count from 0
        self.elapsed = 0.0
        #: aborted attempts over all runs (also in ``transcript.aborts``)
        self.n_aborted_rounds = 0
        #: strikes per client over the fit (faults attributed to it; ``RoundRecord.faults``)
        self.strikes: dict[int, int] = {}
        #: clients excluded from the rest of the fit, client -> its last fault's reason
        #: (``transcript.exclusions``); never sampled again
        self.excluded: dict[int, str] = {}

    @staticmethod
    def _check_client_policies(policies, n_clients: int, transport, clients) -> dict[int, ClientPolicy]:
        """``client_policies`` as ``{client id: ClientPolicy}``, each a copy (a policy keeps state
        over the fit; the caller's object is left as it was)."""
        if not policies:
            return {}
        if transport is not None:
            raise InputError("client_policies are a simulation feature: they rewrite what simulated clients "
                             "send, and a transport's clients are real processes; drop client_policies or transport.")
        if not isinstance(policies, Mapping):
            raise InputError(f"client_policies must be a dict {{client id: ClientPolicy}}, got {type(policies).__name__}.")
        out = {}
        for c, policy in policies.items():
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= int(c) < n_clients:
                raise InputError(f"client_policies key {c!r} is not a client id (0 to {n_clients - 1}).")
            if not isinstance(policy, ClientPolicy):
                raise InputError(f"client_policies[{c}] is {policy!r}, not a ClientPolicy "
                                 "(subclass securefkm.federation.ClientPolicy).")
            out[int(c)] = copy.deepcopy(policy)
        return out

    def _auto_backend(self, transport, n_workers):
        """``backend="auto"`` resolved for this fit: (backend, n_workers)
        (:func:`.workers.auto_backend`)."""
        from .workers import auto_backend

        if transport is not None:  # a deployment: the clients are where they are
            return "local", None
        backend, n_workers = auto_backend(self.aggregator, self.clients_per_round,
                                          (self.algorithm, self.layers, self.aggregator, self.info,
                                           self.client_policies), n_workers)
        if backend != "local":
            log.info("backend='auto': the %d clients run in worker processes (%s: its clients' public-key "
                     "cryptography holds the GIL); pass backend='local' to keep them in this process",
                     self.n_clients, self.aggregator.name)
        return backend, n_workers

    # ------------------------------------------------------------------ rounds
    def run(self, run: int = 0, *, resume=None, on_round=None):
        """One complete run of the algorithm from a fresh init; returns the final state.

        ``max_rounds`` bounds the algorithm's own round counter (``state.round``: training
        rounds); seeding and score rounds do not use it up. When it is reached the
        algorithm's ``close`` runs its closing phases (e.g. the federated score request).

        ``resume``: ``(state, t, closing, aborts)`` to go on from instead of a fresh init
        (a checkpoint's); ``on_round(state, t, closing, aborts)`` is called after every
        completed round (the crash-safe ServerApp writes its checkpoint there).
        """
        if resume is None:
            algo_rng = np.random.default_rng(self._algo_seq.spawn(1)[0])
            state = self.algorithm.init(self.n_clients, self.info.n_features, algo_rng)
            t, closing, aborts = 0, False, []  # aborts: this run's aborted attempts
        else:
            state, t, closing, aborts = resume
            aborts = list(aborts)
        start = time.perf_counter()
        # guards against an algorithm that never advances (secure modes run many sub-rounds)
        hard_cap = 10 * max(self.max_rounds, self.algorithm.round_limit(self.max_rounds)) + 1000
        with tqdm(
            total=self.max_rounds,
            desc=f"{self.algorithm.name} run {run}",
            disable=self.verbose <= 0,
            delay=2.0,
            leave=False,
            unit="round",
        ) as bar:
            while not self.algorithm.converged(state):
                if not closing and state.round >= self.max_rounds:
                    closed = self.algorithm.close(state)
                    if closed is None:  # no closing phase
                        break
                    state, closing = closed, True  # the closing phases (score request ...)
                    continue
                if t >= hard_cap:
                    raise RuntimeError(f"{self.algorithm.name} made {t} rounds without finishing")
                before = state.round
                try:
                    state, t = self._complete_round(state, run, t, aborts, bar)
                except NoParticipantsError as exc:
                    if closing:
                        raise
                    # Clients refuse (participation caps): the run ends with the last
                    # completed round's state; nothing of the refused round is used.
                    if state.centres is None or np.ndim(state.centres) != 2 or state.phase in ("init", "seed"):
                        raise NoParticipantsError(
                            f"{exc}; the run had not produced centres yet ({self.algorithm.name} was in "
                            f"phase {state.phase!r} after {t} rounds). Raise the participation cap or "
                            "lower max_rounds / use an algorithm mode that needs fewer rounds.",
                            round=t,
                            stage=exc.stage,
                        ) from exc
                    warnings.warn(f"run {run} stopped after {state.round} rounds: {exc}", stacklevel=2)
                    break
                bar.update(state.round - before)
                if on_round is not None:
                    on_round(state, t, closing, aborts)
        self.elapsed += time.perf_counter() - start
        return state

    def _complete_round(self, state, run: int, t: int, aborts: list, bar=None):
        """Run round index ``t`` until an attempt completes; returns (new state, next index).

        An aborted attempt leaves ``state`` as it was (algorithms return new states; the one
        thing ``configure`` mutates is a generator kept in the state, e.g. for the seeding
        draw, whose position is restored), is logged, and the same index is retried with
        ``attempt + 1``. Only if the aborted attempt let
        the server learn something (``released``: the layers charged it) is the index given
        up for the next one, so that no protocol round id that produced a release is reused.
        """
        attempt = 0
        first_abort = len(aborts)
        while True:
            generators = _generator_states(state)
            try:
                new_state = self.run_round(state, run=run, round=t, attempt=attempt)
                if len(aborts) > first_abort:  # one line per distinct cause of this round's aborts
                    log.info("run %d round %d completed after %s", run, t, describe_aborts(aborts[first_abort:]))
                return new_state, t + 1
            except _FINAL_ABORTS:
                raise
            except RoundAbortedError as exc:
                for gen, position in generators:
                    gen.bit_generator.state = position
                entry = AbortedRound(run, t, attempt, exc.cause or "too_few_survivors", exc.stage, str(exc),
                                     exc.released)
                aborts.append(entry)
                self.transcript.log_abort(entry)
                self.n_aborted_rounds += 1
                if bar is not None:
                    bar.set_postfix_str(f"aborted={len(aborts)}", refresh=False)
                if isinstance(exc, ServerMisbehaviourError) and not self.retry_server_misbehaviour:
                    raise
                if len(aborts) > self.max_aborted_rounds:
                    raise TooManyAbortedRoundsError(
                        f"run {run}: {len(aborts)} round attempts aborted, more than max_aborted_rounds="
                        f"{self.max_aborted_rounds}: {describe_aborts(aborts)}. {_abort_fixes(aborts)}",
                        aborts=aborts, round=t, stage=exc.stage,
                    ) from exc
                # one INFO line the first time a cause is seen in the run, DEBUG for its repeats
                # (nothing reaches stderr by default; the summary says how many when it ends)
                key = (entry.cause, entry.stage)
                seen = sum(1 for a in aborts if (a.cause, a.stage) == key)
                log.log(logging.INFO if seen == 1 else logging.DEBUG, "%s; retrying (%d of max_aborted_rounds=%d)",
                        entry.describe(), len(aborts), self.max_aborted_rounds)
                if exc.released:
                    t, attempt = t + 1, 0
                else:
                    attempt += 1

    def run_round(self, state, *, run: int = 0, round: int = 0, attempt: int = 0):
        """One round attempt; raises RoundAbortedError on failure (the caller restores the
        generators ``configure`` may have drawn from). ``attempt`` > 0 retries
        round index ``round`` after aborted attempts: a fresh sample from the retry stream and
        fresh protocol round ids (``RoundContext.attempt``)."""
        with _cyclic_gc_paused():
            return self._run_round(state, run=run, round=round, attempt=attempt)

    def _run_round(self, state, *, run: int, round: int, attempt: int):
        algorithm = self.algorithm
        broadcast = algorithm.configure(state, round)
        count = resolve_sample(broadcast.sample, self.clients_per_round, self.n_clients)
        if self.excluded and len(self.excluded) >= self.n_clients:
            raise NoParticipantsError(
                f"every client is excluded for repeated faults ({self._excluded_text()}); no client is left to "
                "sample", round=round, stage="before_round")
        specs = algorithm.sum_fields(broadcast)
        if self.excluded and specs:
            self._check_floor(count, round)
        sampled = sample_clients(self.rng if attempt == 0 else self._retry_rng, self.n_clients, count,
                                 excluded=self.excluded)
        sampled, per_client = self.policy.plan(state, round, broadcast, sampled, self.n_clients)
        sampled = tuple(sampled)
        ctx = RoundContext(
            run=run,
            round=round,
            action=broadcast.action,
            sampled=sampled,
            specs=specs,
            info=self.info,
            broadcast_digest=broadcast.digest(),
            broadcast=broadcast,
            attempt=attempt,
        )
        record = RoundRecord(
            run=run,
            round=round,
            action=broadcast.action,
            sampled=sampled,
            broadcasts=dict(per_client),
            specs=specs,
            protection=tuple(layer.name for layer in self.layers),
            attempt=attempt,
        )
        decoded = None  # (sums, contributors) once the aggregator released the aggregate
        replies: dict = {}
        server = None
        global_round = self._round_counter
        self._round_counter += 1
        try:
            for layer in self.layers:
                layer.before_round(ctx)
            stages = (UPDATE_STAGE,) + (self.aggregator.stages if specs else ())
            self.transport.begin_round(
                RoundContext(run, global_round, ctx.action, sampled, specs, self.info, ctx.broadcast_digest,
                             attempt=attempt),
                stages,
            )
            server, fused = None, {}
            if specs and self.transport.fuse_first_stage:
                server = self.aggregator.server_session(ctx)
                fused = server.messages(self.aggregator.stages[0], sampled)
            first = self.aggregator.stages[0] if fused else None
            requests = _update_requests(run, round, sampled, per_client, first, fused, attempt)
            replies, refused = self.transport.exchange(UPDATE_STAGE, requests)
            record.stages.append(
                StageRecord(
                    UPDATE_STAGE,
                    sent=dict(requests),
                    received={c: _copy_payload(r.items) if r.items else {} for c, r in replies.items()},
                    dropped=tuple(c for c in sampled if c not in replies and c not in refused),
                    refused=refused,
                )
            )
            if refused:  # clients whose own encoder refused their update: the fit goes on without them
                self._warn_refusals(run, round, attempt, sampled, refused)
            alive = tuple(c for c in sampled if c in replies and replies[c].declined is None)
            if not alive:
                declined = sum(1 for r in replies.values() if r.declined)
                error = NoParticipantsError if declined and declined == len(replies) else RoundAbortedError
                raise error(
                    f"no sampled client answered round {round} (sampled {len(sampled)}, "
                    f"declined {sum(1 for r in replies.values() if r.declined)})",
                    round=round,
                    stage=UPDATE_STAGE,
                )
            if specs:
                if server is None:
                    server = self.aggregator.server_session(ctx)
                sums, contributors = self._aggregate(ctx, alive, record, server, fused, replies)
                decoded = (sums, contributors)
            else:
                sums, contributors = {}, alive
            items = {c: replies[c].items for c in contributors if replies[c].items}
            agg = AggregatedUpdate(sums=sums, items=items, contributors=tuple(contributors), specs=specs)
            for layer in self.layers:
                agg = layer.server_aggregate(agg, ctx)
            new_state = algorithm.aggregate(state, agg)
        except RoundAbortedError as exc:
            exc = self._classify_abort(exc)
            exc.released = self._account_abort(ctx, specs, decoded, replies, exc)
            note = self.transport.abort_note()
            if note:  # e.g. a worker holding clients died: say whom the round lost
                exc.args = (f"{exc}; {note}",) + exc.args[1:]
            record.aborted = str(exc)
            record.abort_cause = exc.cause
            self._strike(record, server)
            self.policy.on_abort(record, exc)  # what the server saw, before the transcript keeps less of it
            self.transcript.append(record)
            raise exc
        for layer in self.layers:
            layer.after_round(ctx, agg)
        record.items = {c: _copy_payload(v) for c, v in items.items()}
        record.aggregate = {k: np.array(v, copy=True) for k, v in agg.sums.items()}
        record.contributors = agg.contributors
        if new_state.centres is not None:
            record.centres_after = np.array(new_state.centres, copy=True)
        self._strike(record, server)
        self.policy.observe(record)  # the whole round, whatever `record` level the transcript keeps
        self.transcript.append(record)
        return new_state

    @staticmethod
    def _warn_refusals(run, round, attempt, sampled, refused) -> None:
        """One warning line for the clients whose own encoder refused their update (the user
        must fix their data or the codec's bound), an INFO line for other refusals of the
        update stage (e.g. a round below the run's floor); an InputError when every sampled
        client's encoder refused (a configuration to fix, not a round to retry)."""
        encoder = {c: why for c, why in refused.items() if why.startswith(ENCODER_REFUSAL)}
        others = {c: why for c, why in refused.items() if c not in encoder}
        for group, kind in ((encoder, "warn"), (others, "info")):
            if not group:
                continue
            listed = "; ".join(f"client {c}: {why.rstrip('.')}" for c, why in list(group.items())[:3])
            more = f"; and {len(group) - 3} more" if len(group) > 3 else ""
            if kind == "warn" and set(group) >= set(sampled):
                raise InputError(f"run {run} round {round}: every sampled client refused its update "
                                 f"({listed}{more}).")
            line = (f"run {run} round {round} attempt {attempt}: {len(group)} client(s) refused their update "
                    f"and the round goes on without them ({listed}{more})")
            if kind == "warn":
                warnings.warn(line, stacklevel=4)
            else:
                log.info("%s", line)

    def _strike(self, record: RoundRecord, server) -> None:
        """Read the round attempt's faults (the server session's, attributed by protocol
        checks, and the transport's, undecodable messages), record them in ``record.faults``,
        give each faulty client a strike and exclude a client from the rest of the fit at
        ``max_client_faults`` strikes (``transcript.exclusions``)."""
        unattributed = getattr(server, "unattributed", None) or {}
        if unattributed:
            record.unattributed = {int(c): str(why) for c, why in sorted(unattributed.items())}
        faults = dict(getattr(self.transport, "faults", None) or {})
        for c, why in (getattr(server, "faults", None) or {}).items():
            faults.setdefault(c, why)
        if not faults:
            return
        record.faults = {int(c): str(why) for c, why in sorted(faults.items())}
        for c, why in record.faults.items():
            self.strikes[c] = self.strikes.get(c, 0) + 1
            if (self.max_client_faults is None or c in self.excluded
                    or self.strikes[c] < self.max_client_faults):
                continue
            self.excluded[c] = why
            entry = Exclusion(record.run, record.round, record.attempt, c, self.strikes[c], why)
            self.transcript.log_exclusion(entry)
            log.warning("%s; it is not sampled again", entry.describe())

    def _check_floor(self, count: int, round: int) -> None:
        """With clients excluded, a round may no longer reach the fewest clients the secure
        aggregator lets honest clients accept (``Aggregator.sampled_floor``, from the run's
        declared facts): then every client would refuse it, so the run stops here instead."""
        floor_of = getattr(self.aggregator, "sampled_floor", None)
        floor = floor_of(self.info) if floor_of is not None else 0
        remaining = self.n_clients - len(self.excluded)
        if min(count, remaining) < floor:
            raise NoParticipantsError(
                f"{len(self.excluded)} client(s) are excluded for repeated faults ({self._excluded_text()}), "
                f"leaving {remaining} to sample, fewer than the {floor} a round must sample for the clients "
                f"to accept it under {self.aggregator.name}; lower clients_per_round or raise max_client_faults",
                round=round, stage="before_round")

    def _excluded_text(self) -> str:
        return ", ".join(f"client {c}" for c in sorted(self.excluded))

    @staticmethod
    def _classify_abort(exc: RoundAbortedError) -> RoundAbortedError:
        """Set ``exc.cause`` from the error itself: protocol checks that catch the server
        (the masking binding check) raise ServerMisbehaviourError; an abort before any client
        was contacted is a layer's refusal; every other abort is a shortage of survivors
        (dropouts, declines, refusals of honest clients that saw too few neighbours)."""
        if isinstance(exc, ServerMisbehaviourError):
            exc.cause = "server_misbehaviour"
        elif exc.cause is None:
            exc.cause = "refused_before_round" if exc.stage == "before_round" else "too_few_survivors"
        return exc

    def _account_abort(self, ctx, specs, decoded, replies, exc) -> bool:
        """What an aborted round let the server learn, handed to the layers to charge.

        Derived from how far the round got: the decoded aggregate if the aggregator released
        it (e.g. GaussianDP's decode-then-abort when fewer than ``min_clients`` survived), and
        the set-fields received in plain at the update stage. Nothing -> no hook, no charge.
        """
        items = {c: r.items for c, r in replies.items() if getattr(r, "declined", None) is None and r.items}
        if decoded is None and not items:
            return False
        sums, contributors = decoded if decoded is not None else ({}, tuple(sorted(items)))
        leaked = AggregatedUpdate(sums=dict(sums), items=items, contributors=tuple(contributors), specs=specs)
        for layer in self.layers:
            layer.after_aborted_round(ctx, leaked, exc)
        return True

    def _aggregate(self, ctx: RoundContext, alive: tuple[int, ...], record: RoundRecord,
                   server=None, fused=None, update_replies=None):
        if server is None:
            server = self.aggregator.server_session(ctx)
        for i, stage in enumerate(self.aggregator.stages):
            if i == 0 and fused:
                # answered inside the update exchange: same messages, same replies
                messages = {c: fused[c] for c in alive if c in fused}
                replies = {c: update_replies[c].then for c in messages if update_replies[c].then is not None}
                refused = {c: update_replies[c].then_refused for c in messages if update_replies[c].then_refused}
            else:
                messages = server.messages(stage, alive)
                replies, refused = self.transport.exchange(stage, messages)
            record.stages.append(
                StageRecord(
                    stage,
                    sent=messages,
                    received=replies,
                    dropped=tuple(c for c in messages if c not in replies and c not in refused),
                    refused=refused,
                )
            )
            server.receive(stage, replies)
            alive = tuple(c for c in alive if c in replies)
        return server.result()

    def close(self, keep_workers: bool = False) -> None:
        """Shut the transport's workers down (a no-op in process) and complete a file-backed
        transcript; safe to call twice.
        ``keep_workers``: the fit ended normally, so worker processes may be kept idle for
        the next fit (:data:`~securefkm.federation.workers.KEEP_IDLE_S`) instead."""
        self.transcript.close()
        if keep_workers and getattr(self.transport, "can_keep_workers", False):
            self.transport.close(keep_workers=True)
        else:
            self.transport.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def privacy_spent(self) -> tuple[float, float] | None:
        for layer in self.layers:
            spent = layer.report().get("privacy_spent")
            if spent is not None:
                return spent
        return None


def clone_layers(protection):
    """Fresh copies of a protection list, so that a fit never mutates the user's objects.

    Text and dict specs (``"masking"``, ``["dp:epsilon=1,delta=1e-5,clip=2", "masking"]``) are
    built into layers first (:func:`securefkm.registry.make_protection`)."""
    if protection is None:
        return []
    if isinstance(protection, (str, dict)) or (
        isinstance(protection, (list, tuple)) and any(isinstance(x, (str, dict)) for x in protection)
    ):
        from ..registry import make_protection

        return make_protection(protection)  # freshly built: nothing of the user's to copy
    if isinstance(protection, Layer):
        protection = [protection]
    return [copy.deepcopy(layer) for layer in protection]
