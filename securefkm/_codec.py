"""The ServerApp's saved state as tagged JSON plus raw arrays: a format that cannot run code.

:func:`dumps` turns a tree of plain values and a fixed set of the library's record classes
into the :func:`securefkm._frame.frame` layout (JSON header, numeric array buffers);
:func:`loads` rebuilds it. JSON carries ``None``, ``bool``, ``str``, finite ``float`` and
``int`` as themselves and lists as lists; everything else is an object with one tag key:

========================  ==============================================================
``{"$d": [[k, v], ...]}``  a dict (any encodable keys, insertion order kept)
``{"$t": [...]}``          a tuple; ``$set`` / ``$fset`` a set / frozenset (sorted if it can be)
``{"$T": i}``              the ``i``-th ``$t`` of the body again (tuples of scalars only)
``{"$ctr": [[k, n]...]}``  a :class:`collections.Counter`
``{"$i": "hex"}``          an int of 63 bits or more (Paillier ciphertexts, RNG states)
``{"$f": "nan"}``          a non-finite float (``nan``, ``inf``, ``-inf``)
``{"$b": "base64"}``       bytes
``{"$a": i}``              a numpy array (the ``i``-th buffer; the same array met again, the
                           same ``i``); ``{"$s": i}`` a numpy scalar
``{"$rng": [name, st]}``   a numpy ``Generator`` over the bit generator ``name`` in state ``st``
``{"$seq": {...}}``        a numpy ``SeedSequence`` (entropy, spawn key, pool size, children)
``{"$o": [name, fields]}`` an instance of the allow-listed class ``name`` with ``fields``
``{"$ref": i}``            a reference the caller resolves (the federation's ``i``-th layer)
========================  ==============================================================

Decoding never looks a class up by a name read from the file: ``name`` must be a key of
:data:`CLASSES` (written out below), and the instance is made with ``cls.__new__`` and its
fields set directly, so no constructor, ``__setstate__`` or ``__reduce__`` runs (a class that
must not save every field, such as an ideal functionality's sealed handle, names its fields
with ``_codec_state`` and checks them in its ``_codec_restore``). Arrays use
the wire's numeric dtypes only. A value of any other type is refused when saving, with the
path to it, so a new field of a saved object fails loudly in the tests instead of being
written in a form that cannot be read back.
"""

from __future__ import annotations

import base64
import binascii
import collections
import math

import numpy as np

from .exceptions import SecureFKMError
from ._frame import DTYPES, WireError, frame, unframe

_BIG = 1 << 63
_MAX_DEPTH = 200


class StateCodecError(SecureFKMError, ValueError):
    """A value cannot be saved in, or a file's body cannot be read as, the checkpoint format."""


def _classes() -> dict[str, type]:
    from protocols.dp.accounting import PrivacyAccountant
    from protocols.dp.budget import Budget
    from protocols.dp.geometry import DomainGeometry
    from protocols.dp.radius import RadiusBound
    from protocols.dp.scheduling import RoundSchedule
    from protocols.masking.ideal import Sealed
    from protocols.paillier.ideal import IdealPaillierTicket as PaillierTicket
    from protocols.validated.ideal import IdealValidationTicket as ValidatedTicket
    from protocols.paillier.authority import (DecryptedAggregate, EncryptedContribution, EncryptRequest,
                                              PublicBundle, RoundTicket)
    from protocols.validated.helper import (HelperBundle, NoiseField, NoisePlan, ValidatedReport, ValidationRequest,
                                            ValidationTicket)

    from .algorithms.base import AlgorithmState, SeededState
    from .algorithms.dwf import WeightedKMeansState
    from .algorithms.fuzzy import FuzzyState
    from .algorithms.minibatch import MiniBatchState
    from .algorithms.secure_centres import SecureCentresState, SecureKMeansRun, SecureServerKMeans
    from .federation.update_stage import UpdateRequest
    from .messages import Broadcast, FieldSpec
    from .protection_report import LayerView, ProtectionReport
    from .transcript import AbortedRound, Exclusion, RoundRecord, StageRecord, Transcript

    found = [AlgorithmState, SeededState, WeightedKMeansState, MiniBatchState, SecureCentresState, FuzzyState,
             SecureKMeansRun, SecureServerKMeans, Broadcast, FieldSpec, UpdateRequest, Transcript, RoundRecord, StageRecord,
             AbortedRound, Exclusion, PrivacyAccountant, Budget, RoundSchedule, RadiusBound, DomainGeometry, ProtectionReport, LayerView,
             PublicBundle, RoundTicket, EncryptRequest, EncryptedContribution, DecryptedAggregate,
             HelperBundle, NoiseField, NoisePlan, ValidationTicket, ValidationRequest, ValidatedReport,
             Sealed, PaillierTicket, ValidatedTicket]
    return {f"{c.__module__}.{c.__qualname__}": c for c in found}


_CLASS_CACHE: dict[str, type] = {}


def classes() -> dict[str, type]:
    """``qualified name -> class`` of every object a checkpoint may hold (the allow-list)."""
    if not _CLASS_CACHE:
        _CLASS_CACHE.update(_classes())
    return _CLASS_CACHE


#: numpy bit generators a saved ``Generator`` may use
_BIT_GENERATORS = {c.__name__: c for c in (np.random.PCG64, np.random.PCG64DXSM, np.random.Philox,
                                           np.random.SFC64, np.random.MT19937)}


# ---------------------------------------------------------------- encode
class _Encoder:
    def __init__(self, refs: dict[int, int]):
        self.refs = refs  # id(object) -> reference index
        self.arrays: list[np.ndarray] = []
        self.open: set[int] = set()
        self.names = {c: n for n, c in classes().items()}
        # an array or a tuple of scalars met again (one cohort tuple in every client's request,
        # one centres array in every broadcast) is written once and referred to after: a
        # round's body then grows with its clients, not with their square
        self.seen_arrays: dict[int, int] = {}
        self.seen_tuples: dict[int, int] = {}
        self.n_tuples = 0
        self.keep: list = []  # what the memos point at stays alive, so no id is reused

    def array(self, a: np.ndarray, path: str) -> int:
        if isinstance(a, np.ndarray) and id(a) in self.seen_arrays:
            return self.seen_arrays[id(a)]
        original = a
        a = np.asarray(a)
        if a.dtype.byteorder == ">" or a.dtype.newbyteorder("<").str not in DTYPES:
            raise StateCodecError(f"{path}: arrays of dtype {a.dtype} cannot be saved (numeric dtypes only)")
        self.arrays.append(np.asarray(a, dtype=a.dtype.newbyteorder("<"), order="C"))  # keeps 0-d shapes
        if isinstance(original, np.ndarray):
            self.seen_arrays[id(original)] = len(self.arrays) - 1
            self.keep.append(original)
        return len(self.arrays) - 1

    def __call__(self, v, path: str = "state"):
        if v is None or isinstance(v, (bool, str)):
            return v
        if id(v) in self.refs:
            return {"$ref": self.refs[id(v)]}
        t = type(v)
        if t is int:
            return v if -_BIG < v < _BIG else {"$i": hex(v)}
        if t is float:
            return v if math.isfinite(v) else {"$f": repr(v)}
        if t is bytes:
            return {"$b": base64.b64encode(v).decode()}
        if isinstance(v, np.ndarray):
            return {"$a": self.array(v, path)}
        if isinstance(v, np.generic):
            return {"$s": self.array(np.asarray(v), path)}
        if isinstance(v, np.random.Generator):
            name = type(v.bit_generator).__name__
            if name not in _BIT_GENERATORS:
                raise StateCodecError(f"{path}: a Generator over {name} cannot be saved")
            return {"$rng": [name, self(v.bit_generator.state, f"{path}.state")]}
        if isinstance(v, np.random.SeedSequence):
            return {"$seq": {"entropy": self(v.entropy, path), "spawn_key": self(tuple(v.spawn_key), path),
                             "pool_size": v.pool_size, "n_children_spawned": v.n_children_spawned}}
        if id(v) in self.open:
            raise StateCodecError(f"{path}: a reference cycle cannot be saved")
        self.open.add(id(v))
        try:
            return self._container(v, t, path)
        finally:
            self.open.discard(id(v))

    def _container(self, v, t, path):
        if t is list:
            return [self(x, f"{path}[{i}]") for i, x in enumerate(v)]
        if t is tuple:
            if id(v) in self.seen_tuples:
                return {"$T": self.seen_tuples[id(v)]}
            index, self.n_tuples = self.n_tuples, self.n_tuples + 1  # numbered as the decoder meets them
            if _scalars(v):
                self.seen_tuples[id(v)] = index
                self.keep.append(v)
            return {"$t": [self(x, f"{path}[{i}]") for i, x in enumerate(v)]}
        if t is collections.Counter:
            return {"$ctr": [[self(k, path), self(n, f"{path}[{k!r}]")] for k, n in v.items()]}
        if t is dict:
            return {"$d": [[self(k, f"{path}.<key>"), self(x, f"{path}[{k!r}]")] for k, x in v.items()]}
        if t in (set, frozenset):
            try:
                items = sorted(v)
            except TypeError:
                items = list(v)
            return {"$set" if t is set else "$fset": [self(x, f"{path}{{}}") for x in items]}
        name = self.names.get(t)
        if name is None:
            raise StateCodecError(
                f"{path}: a {t.__module__}.{t.__qualname__} cannot be saved in a checkpoint; "
                "add its class to securefkm._codec's allow-list if it is plain data"
            )
        # a class may say which fields it saves (e.g. a handle whose secret must not be written)
        fields = v._codec_state() if hasattr(t, "_codec_state") else dict(vars(v))
        return {"$o": [name, self(fields, f"{path}.__dict__")]}


def _scalars(t: tuple) -> bool:
    """Whether a tuple holds only scalars: the only tuples written once and referred to, so a
    reference never stands for a nested structure (a file cannot make a small body expand)."""
    return all(x is None or type(x) in (bool, int, float, str) for x in t)


def dumps(value, *, magic: bytes, refs: dict[int, int] | None = None) -> bytes:
    """The checkpoint body bytes of ``value``; ``refs`` maps ``id(obj)`` to a reference index
    written instead of ``obj`` (the caller resolves it on :func:`loads`)."""
    enc = _Encoder(refs or {})
    body = enc(value)
    return frame(body, enc.arrays, magic=magic)


# ---------------------------------------------------------------- decode
class _Decoder:
    def __init__(self, arrays, refs):
        self.arrays, self.refs = arrays, refs
        self.classes = classes()
        self.tuples: list = []  # every tuple in the order met; None while it is being read

    def fail(self, why):
        raise StateCodecError(why)

    def __call__(self, v, depth: int = 0):
        if depth > _MAX_DEPTH:
            self.fail("nested too deeply")
        if v is None or isinstance(v, (bool, str, int, float)):
            return v
        if isinstance(v, list):
            return [self(x, depth + 1) for x in v]
        if not (isinstance(v, dict) and len(v) == 1):
            self.fail(f"unexpected {type(v).__name__}")
        (tag, x), = v.items()
        d = depth + 1
        if tag == "$d":
            return {self._key(k, d): self(y, d) for k, y in self._pairs(x)}
        if tag == "$t":
            index = len(self.tuples)
            self.tuples.append(None)
            value = tuple(self(y, d) for y in self._list(x))
            self.tuples[index] = value
            return value
        if tag == "$T":
            if not (type(x) is int and 0 <= x < len(self.tuples)) or self.tuples[x] is None:
                self.fail(f"bad tuple reference {str(x)[:20]!r}")
            if not _scalars(self.tuples[x]):
                self.fail("a tuple reference may only stand for a tuple of scalars")
            return self.tuples[x]
        if tag in ("$set", "$fset"):
            items = [self._key(y, d) for y in self._list(x)]
            return set(items) if tag == "$set" else frozenset(items)
        if tag == "$ctr":
            return collections.Counter({self._key(k, d): self(n, d) for k, n in self._pairs(x)})
        if tag == "$i":
            return self._int(x)
        if tag == "$f":
            if x not in ("nan", "inf", "-inf"):
                self.fail(f"bad float {str(x)[:20]!r}")
            return float(x)
        if tag == "$b":
            try:
                return base64.b64decode(x, validate=True) if isinstance(x, str) else self.fail("bytes must be base64")
            except binascii.Error:
                self.fail("bytes are not base64")
        if tag in ("$a", "$s"):
            a = self._array(x)
            return a if tag == "$a" else a[()]
        if tag == "$rng":
            name, state = self._list(x, 2)
            bg = _BIT_GENERATORS.get(name) if isinstance(name, str) else None
            if bg is None:
                self.fail(f"unknown bit generator {str(name)[:40]!r}")
            gen = bg()
            try:
                gen.state = self(state, d)
            except (TypeError, ValueError, KeyError) as exc:
                self.fail(f"bad {name} state ({exc})")
            return np.random.Generator(gen)
        if tag == "$seq":
            if not isinstance(x, dict) or set(x) != {"entropy", "spawn_key", "pool_size", "n_children_spawned"}:
                self.fail("bad SeedSequence")
            try:
                return np.random.SeedSequence(self(x["entropy"], d), spawn_key=self(x["spawn_key"], d),
                                              pool_size=x["pool_size"], n_children_spawned=x["n_children_spawned"])
            except (TypeError, ValueError) as exc:
                self.fail(f"bad SeedSequence ({exc})")
        if tag == "$ref":
            if not (type(x) is int and 0 <= x < (len(self.refs) if self.refs is not None else 1 << 20)):
                self.fail(f"bad reference {str(x)[:20]!r}")
            return None if self.refs is None else self.refs[x]
        if tag == "$o":
            name, fields = self._list(x, 2)
            cls = self.classes.get(name) if isinstance(name, str) else None
            if cls is None:
                self.fail(f"class {str(name)[:80]!r} is not one a checkpoint may hold")
            fields = self(fields, d)
            if not isinstance(fields, dict) or not all(isinstance(k, str) for k in fields):
                self.fail(f"{name}: fields must be a dict with str keys")
            if hasattr(cls, "_codec_restore"):
                try:
                    return cls._codec_restore(fields)
                except (TypeError, ValueError, KeyError) as exc:
                    self.fail(f"{name}: bad fields ({exc})")
            obj = cls.__new__(cls)
            vars(obj).update(fields)
            return obj
        self.fail(f"unknown tag {str(tag)[:20]!r}")

    def _key(self, k, depth):
        k = self(k, depth)
        try:
            hash(k)
        except TypeError:
            self.fail(f"unhashable key {type(k).__name__}")
        return k

    def _list(self, x, n=None):
        if not isinstance(x, list) or (n is not None and len(x) != n):
            self.fail("malformed tagged value")
        return x

    def _pairs(self, x):
        for pair in self._list(x):
            yield self._list(pair, 2)

    def _int(self, x):
        if not (isinstance(x, str) and len(x) < 4096):
            self.fail("bad int")
        try:
            return int(x, 16)
        except ValueError:
            self.fail("bad int")

    def _array(self, i):
        if not (type(i) is int and 0 <= i < len(self.arrays)):
            self.fail(f"bad array index {str(i)[:20]!r}")
        return self.arrays[i]


def loads(data: bytes, *, magic: bytes, refs=None, max_bytes: int = 1 << 40):
    """Rebuild what :func:`dumps` wrote; ``refs[i]`` stands for the ``i``-th reference
    (``None``: every reference reads as ``None``, to check a body before its referents exist).
    :class:`StateCodecError` for anything that is not such a body."""
    try:
        body, arrays = unframe(data, magic=magic, max_bytes=max_bytes)
    except WireError as exc:
        raise StateCodecError(str(exc)) from None
    try:
        return _Decoder(arrays, None if refs is None else list(refs))(body)
    except RecursionError:
        raise StateCodecError("nested too deeply") from None
