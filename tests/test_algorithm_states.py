"""The algorithms' typed server states: fits on fixed seeds keep their exact results, every
state class round-trips through the code-free checkpoint format, and the runtime finds the
generators a state holds."""

import dataclasses
import hashlib
import warnings

import numpy as np
import pytest

from _algos import ALGOS
from protocols.dp import GaussianDP
from securefkm.algorithms.base import AlgorithmState, SeededState
from securefkm.algorithms.dwf import WeightedKMeansState
from securefkm.algorithms.fuzzy import FuzzyState
from securefkm.algorithms.minibatch import MiniBatchState
from securefkm.algorithms.secure_centres import SecureCentresState, SecureKMeansRun
from securefkm.flower import _state_codec as codec
from securefkm.registry import make_estimator

BOX = (-2.0, 2.0)
STACKS = {
    "plain": lambda: None,
    "masking": lambda: ["masking"],
    "masking-kpp": lambda: ["masking"],
    "dp": lambda: [GaussianDP(1.0, 1e-5, bounds=BOX, rng="seeded")],
    "dp+masking": lambda: [GaussianDP(1.0, 1e-5, bounds=BOX, mode="distributed", rng="seeded"), "masking"],
}
SUM_ONLY = {"dwf", "ewf", "minibatch", "fcm-fedavg", "aligning-secure", "kfed-secure", "child-parent-secure",
            "fcm-secure"}
#: configurations that keep the server's generator busy: restarts, sampled clients, shuffling
MORE = {
    "dwf-n_init2": ("dwf", {"n_init": 2, "clients_per_round": 0.5}),
    "minibatch-batches": ("minibatch", {"batch_size": 8, "clients_per_round": 0.5}),
    "fcm-fedavg-n_init2": ("fcm-fedavg", {"n_init": 2}),
    "kfed-secure-shuffle": ("kfed", {"secure_mode": True, "shuffle": True}),
    "aligning-secure-k": ("aligning", {"secure_mode": True, "init": "k-means++"}),
    "fcm-secure-n_init2": ("fcm", {"secure_mode": True, "n_init": 2}),
}
#: (sha256 of the centres' bytes, n_iter_, rounds in the transcript) of each fit below
FINGERPRINTS = {
    "aligning-secure-k/plain": ("bd47e167fcf619bf", 2, 9),
    "aligning-secure/dp": ("ef35b658c6456d80", 3, 4),
    "aligning-secure/dp+masking": ("8bc070efc2514878", 3, 4),
    "aligning-secure/masking": ("00cbefc4df95ee71", 2, 10),
    "aligning-secure/masking-kpp": ("f7b0ebecdb3f8d46", 2, 9),
    "aligning-secure/plain": ("bd47e167fcf619bf", 2, 9),
    "aligning/plain": ("97a20f00be098584", 2, 3),
    "child-parent-secure/dp": ("ef35b658c6456d80", 3, 4),
    "child-parent-secure/dp+masking": ("8bc070efc2514878", 3, 4),
    "child-parent-secure/masking": ("a6e36e79f7fa436e", 1, 4),
    "child-parent-secure/masking-kpp": ("0287d1bf7251277a", 1, 4),
    "child-parent-secure/plain": ("99d2e9eebd497f74", 1, 4),
    "child-parent/plain": ("4a140cc2f65da8bd", 1, 1),
    "dwf-n_init2/plain": ("0d7f179a92fc8dbf", 3, 10),
    "dwf/dp": ("ef35b658c6456d80", 3, 4),
    "dwf/dp+masking": ("8bc070efc2514878", 3, 4),
    "dwf/masking": ("648a29fb088fea76", 2, 3),
    "dwf/masking-kpp": ("62acb528a6b44619", 2, 3),
    "dwf/plain": ("70fa6d88bd9f7844", 2, 3),
    "ewf/dp": ("bfcf143d023a3615", 4, 5),
    "ewf/dp+masking": ("acac8ef709bc1bc3", 4, 5),
    "ewf/masking": ("19b7f16646843d28", 2, 3),
    "ewf/masking-kpp": ("2a750da27f05f9d4", 2, 3),
    "ewf/plain": ("12768da0d6946e76", 2, 3),
    "fcm-fedavg-n_init2/plain": ("21985cbe819f473c", 5, 14),
    "fcm-fedavg/dp": ("fac10f17840bbbc3", 3, 5),
    "fcm-fedavg/dp+masking": ("2e5d2c16ad944497", 3, 5),
    "fcm-fedavg/masking": ("8b986dca1e0641ae", 4, 6),
    "fcm-fedavg/masking-kpp": ("0ecfe14a44908171", 5, 7),
    "fcm-fedavg/plain": ("e7e59a71e39a60d5", 5, 7),
    "fcm-secure-n_init2/plain": ("0a97b752f3be770e", 2, 16),
    "fcm-secure/dp": ("fac10f17840bbbc3", 3, 5),
    "fcm-secure/dp+masking": ("2e5d2c16ad944497", 3, 5),
    "fcm-secure/masking": ("e463508ec93371e4", 2, 9),
    "fcm-secure/masking-kpp": ("b8c300169cd1f983", 2, 8),
    "fcm-secure/plain": ("7c9ca46d26b18fe0", 2, 8),
    "fcm/plain": ("2afae7a68aae080d", 2, 4),
    "kfed-secure-shuffle/plain": ("78a3edfacd36d22c", 1, 3),
    "kfed-secure/dp": ("ef35b658c6456d80", 3, 4),
    "kfed-secure/dp+masking": ("8bc070efc2514878", 3, 4),
    "kfed-secure/masking": ("fbf0d249f8eab71d", 1, 4),
    "kfed-secure/masking-kpp": ("7a6407c0d6bcbfc1", 1, 4),
    "kfed-secure/plain": ("c242f3f0bd326610", 1, 3),
    "kfed/plain": ("7f1da388f2531436", 1, 1),
    "minibatch-batches/plain": ("a59f3e4c985c7081", 16, 17),
    "minibatch/dp": ("e206701c59a3158f", 3, 4),
    "minibatch/dp+masking": ("f9e715390963bc4c", 3, 4),
    "minibatch/masking": ("648a29fb088fea76", 2, 3),
    "minibatch/masking-kpp": ("62acb528a6b44619", 2, 3),
    "minibatch/plain": ("6dab3843db32851b", 3, 4),
}


def _cases():
    for key, (name, params) in ALGOS.items():
        for stack in STACKS:
            if stack == "plain" or key in SUM_ONLY:
                extra = {} if stack == "plain" else {"init": "k-means++"} if stack == "masking-kpp" else {
                    "init_bounds": BOX}
                yield f"{key}/{stack}", name, dict(params, **extra), STACKS[stack], 0
    for key, (name, params) in MORE.items():
        yield f"{key}/plain", name, params, STACKS["plain"], 1


@pytest.fixture(scope="module")
def clients():
    rng = np.random.default_rng(0)
    centres = np.array([[-1.0, -1.0], [1.0, 1.0], [1.0, -1.0]])
    return [np.clip(centres[rng.integers(0, 3, 50)] + rng.normal(0, 0.3, (50, 2)), *BOX) for _ in range(4)]


def test_fits_keep_their_exact_results(clients):
    got = {}
    for key, name, params, stack, seed in _cases():
        kw = {"crypto": "ideal"} if seed == 0 else {}
        est = make_estimator(name, n_clusters=3, random_state=seed, protection=stack(), **kw, **params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(clients)
        digest = hashlib.sha256(np.ascontiguousarray(est.cluster_centers_).tobytes()).hexdigest()[:16]
        got[key] = (digest, int(est.n_iter_), len(est.transcript_))
    assert got == FINGERPRINTS


def _filled(cls):
    """An instance of cls whose every field differs from its default."""
    rng = np.random.default_rng(3)
    rng.random(2)
    run = SecureKMeansRun(np.arange(6.0).reshape(3, 2), iteration=4, stage="coarse", exact_means=True,
                          objective=1.5)
    values = {
        "centres": np.eye(3, 2), "phase": "secure", "round": 7, "movements": [0.5, 0.25], "score": 2.5,
        "extra": {"note": (1, "a")}, "rng": rng, "n_clients": 9, "seed_attempts": 2,
        "previous_centres": np.ones((3, 2)), "streak": np.array([0, 3, 1]), "reassigned": 4,
        "secure_run": run, "secure_total": 11, "secure_start": np.full((12, 2), 0.5), "secure_coarse": True,
        "validity_terms": {"n": np.array([150.0]), "spread": np.array([1.0, 2.0, 3.0])},
        "refined": 2, "population": np.full((9, 2), 0.25),
    }
    names = [f.name for f in dataclasses.fields(cls)]
    missing = sorted(set(names) - set(values))
    assert not missing, f"give the new field(s) {missing} a value here"
    return cls(**{n: values[n] for n in names})


def _same(a, b):
    if isinstance(a, np.random.Generator):
        return type(b) is np.random.Generator and a.bit_generator.state == b.bit_generator.state
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and np.array_equal(a, b)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("cls", [AlgorithmState, SeededState, WeightedKMeansState, MiniBatchState,
                                 SecureCentresState, FuzzyState])
def test_every_state_class_round_trips_through_a_checkpoint(cls):
    state = _filled(cls)
    back = codec.loads(codec.dumps({"state": state}, magic=b"T\n"), magic=b"T\n")["state"]
    assert _same(state, back)
    if isinstance(state, SeededState):  # the generator goes on where it was
        assert np.array_equal(back.rng.random(4), state.rng.random(4))


def test_the_runtime_finds_the_generators_of_fields_and_of_extra():
    a, b = np.random.default_rng(1), np.random.default_rng(2)
    state = SeededState(centres=None, rng=a, extra={"mine": b, "other": 3})
    assert state.generators() == [a, b]
    assert AlgorithmState(centres=None).generators() == []


def test_optional_hooks_have_declared_defaults():
    """The hooks protection layers consult are declared on the base class: an algorithm that
    knows no schedule says so with empty values, and one that does (DWF) fills both."""
    from securefkm.algorithms.base import Algorithm
    from securefkm.algorithms.dwf import WeightedFederatedKMeansAlgorithm

    abstract = {name for name in dir(Algorithm) if getattr(getattr(Algorithm, name), "__isabstractmethod__", False)}
    bare = type("Bare", (Algorithm,), dict.fromkeys(abstract, lambda *a, **k: None))()
    assert bare.planned_sequence(5) == () and bare.planned_actions(5) == {} and bare.nearest_centre_actions == ()
    dwf = WeightedFederatedKMeansAlgorithm(3, init="k-means++", score_round=True)
    assert list(dwf.planned_sequence(2)) == ["init.kmeans++", "train", "train", "score"]
    assert dwf.planned_actions(2) == {"init.kmeans++": 1, "train": 2, "score": 1} and dwf.nearest_centre_actions == ("train",)
