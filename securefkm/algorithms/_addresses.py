"""Remembered data addresses of the clients' record arrays, for the pooled k-means kernel
(:mod:`._kmeans`): a fit asks for the same arrays' addresses round after round, and reading
one costs more than checking a weak reference."""

from __future__ import annotations

import weakref

import numpy as np

_ADDRESSES: dict[int, tuple] = {}


def _data_address(X: np.ndarray) -> int:
    """``X``'s data pointer, remembered per live array object. Reading it
    (``__array_interface__``) costs ~1 us, and a 10,000-client round asks it for every client
    (:func:`_block_records`): ~12 ms of interpreter time per round, paid by the kernel's
    threads under the GIL. An array object's data pointer does not change while it lives
    (``ndarray.resize`` moves only an array that nothing else references, and the caller
    holds it); the entry goes when the array does (its weak reference's callback)."""
    key = id(X)
    entry = _ADDRESSES.get(key)
    if entry is not None and entry[0]() is X:
        return entry[1]
    address = X.__array_interface__["data"][0]
    try:
        ref = weakref.ref(X, lambda _, key=key: _ADDRESSES.pop(key, None))
    except TypeError:  # an array type without weak references: not remembered
        return address
    _ADDRESSES[key] = (ref, address)
    return address


#: the latest calls' clients (weak references) and their records' addresses, by the ids of
#: their arrays: a fit asks for the same clients' addresses round after round
_CALL_ADDRESSES: dict[tuple, tuple] = {}
_CALL_ADDRESSES_KEPT = 4


def _record_addresses(datas) -> tuple[list, np.ndarray]:
    """(arrays, addresses): each client's records as C-ordered float64 -- its own array, or
    a copy for this call, which the caller keeps alive while it reads them -- and the
    address of their data. When every client's own array is read in place, the addresses
    are remembered for the same array objects (:func:`_data_address`'s reasoning): checking
    that the weak references still give those objects costs a tenth of looking each up."""
    key = tuple(map(id, datas))
    entry = _CALL_ADDRESSES.get(key)
    if entry is not None and all(ref() is X for ref, X in zip(entry[0], datas)):
        return datas, entry[1]
    f64 = np.dtype(np.float64)
    kept = [X if X.dtype == f64 and X.flags.c_contiguous else np.ascontiguousarray(X, dtype=np.float64)
            for X in datas]  # read in place: the clients' own arrays, or one copy for this call
    bases = np.fromiter((_data_address(X) for X in kept), dtype=np.int64, count=len(kept))
    if all(K is X for K, X in zip(kept, datas)):
        try:
            refs = tuple(weakref.ref(X) for X in datas)
        except TypeError:  # an array type without weak references: not remembered
            return kept, bases
        bases.flags.writeable = False
        while len(_CALL_ADDRESSES) >= _CALL_ADDRESSES_KEPT:
            _CALL_ADDRESSES.pop(next(iter(_CALL_ADDRESSES)))
        _CALL_ADDRESSES[key] = (refs, bases)
        return datas, bases
    return kept, bases
