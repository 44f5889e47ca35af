"""numpy's own ``dgemm``, for compiled loops that must compute distance products with the
very library ``np.matmul`` calls (:mod:`._cellsums_jit`'s pooled kernel).

A compiled loop that calls some other BLAS -- numba's ``np.dot`` and scikit-learn call
SciPy's, a different OpenBLAS build (0.3.30 against numpy's 0.3.31 on the machine of
docs/benchmarks.md) -- may round a distance differently and so label a near-tie record
differently from the numpy reference: the compiled and numpy paths must give the same
bits. So the kernel calls the ``dgemm`` of the BLAS library that numpy loaded, found
among the process's loaded libraries by threadpoolctl: the OpenBLAS that numpy's wheels
ship (``numpy.libs`` or ``numpy/.dylibs``), exported as ``scipy_dgemm_64_`` (64-bit
integers) or ``scipy_dgemm_`` / ``dgemm_`` (32-bit). Any other numpy build (MKL,
Accelerate, a system BLAS) gives None, and the pooled kernel keeps its thread-pool form,
whose products are ``np.matmul`` itself (:mod:`._cellsums`)."""

from __future__ import annotations

import ctypes
import os

import numpy as np

#: Fortran ``dgemm`` symbols by the width of their integer arguments, in preference order
SYMBOLS = (("scipy_dgemm_64_", np.int64), ("dgemm_64_", np.int64), ("scipy_dgemm_", np.int32), ("dgemm_", np.int32))

_FOUND: tuple | None | bool = False  # not looked for yet
_LIBRARY = None  # the CDLL handle, kept for the address's lifetime


def numpy_blas_dirs() -> tuple[str, ...]:
    """The directories numpy's wheels put their vendored libraries in."""
    package = os.path.dirname(os.path.abspath(np.__file__))
    return (package + ".libs", os.path.join(package, ".dylibs"), package)


_CONTROLLER = None  # threadpoolctl's controller of numpy's OpenBLAS alone


def _numpy_openblas_path() -> str | None:
    global _CONTROLLER
    from threadpoolctl import ThreadpoolController

    dirs = tuple(os.path.realpath(p) for p in numpy_blas_dirs())
    controller = ThreadpoolController()
    for lib in controller.lib_controllers:
        if lib.internal_api == "openblas" and os.path.dirname(os.path.realpath(lib.filepath)) in dirs:
            _CONTROLLER = controller.select(filepath=lib.filepath)
            return lib.filepath
    return None


class single_threaded:
    """A context in which numpy's OpenBLAS (the :func:`dgemm` found) runs on one thread:
    a compiled loop calls it from each of its own threads. It sets the library's thread
    count through threadpoolctl's controller of that one library, and back on exit
    (``ThreadpoolController.limit`` does the same for 8 us a call, which a round of small
    clients notices; this costs 1-2 us, timed ad hoc)."""

    def __enter__(self):
        lib = self._lib = _CONTROLLER.lib_controllers[0]
        self._before = lib.get_num_threads()
        if self._before != 1:
            lib.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        if self._before != 1:
            self._lib.set_num_threads(self._before)


def dgemm() -> tuple[int, type] | None:
    """``(address, integer dtype)`` of numpy's Fortran ``dgemm``, or None when numpy's BLAS
    is not an OpenBLAS it ships (looked up once per process)."""
    global _FOUND, _LIBRARY
    if _FOUND is False:
        _FOUND = None
        path = _numpy_openblas_path()
        if path is not None:
            library = ctypes.CDLL(path)  # already loaded by numpy: the same handle
            for name, int_type in SYMBOLS:
                fn = getattr(library, name, None)
                if fn is not None:
                    _LIBRARY = library
                    _FOUND = (ctypes.cast(fn, ctypes.c_void_p).value, int_type)
                    break
    return _FOUND
