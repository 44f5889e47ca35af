"""Argument checks shared by every public entry point (a public module: ``protocols`` and
``attacks`` use it too).

Each check raises :class:`~securefkm.exceptions.InputError` with a message that names the
argument and says how to fix it.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Iterable

import numpy as np

from .exceptions import InputError


class InputTypeError(InputError, TypeError):
    """Bad input whose underlying failure is a TypeError (an object that is no number):
    still an :class:`InputError`, and a ``TypeError`` for callers (and scikit-learn's checks)
    that expect one."""


def _refuse_sparse_and_complex(X, name: str) -> None:
    """Sparse matrices and complex values have no meaning to the federated algorithms (sums of
    squared Euclidean distances over dense real records); refuse them before numpy would
    densify or drop the imaginary part silently."""
    if hasattr(X, "tocsr"):  # scipy.sparse matrices and arrays
        raise InputError(
            f"{name} is a sparse matrix; sparse input is not supported (the clients' updates are dense "
            f"sums). Pass {name}.toarray() if it fits in memory."
        )
    kinds = [getattr(X, "dtype", None)] + list(getattr(X, "dtypes", ()))  # arrays; DataFrame columns
    if any(getattr(k, "kind", None) == "c" for k in kinds):
        raise InputError(_complex_message(name))


def _complex_message(name: str) -> str:
    return (f"Complex data not supported: {name} has complex values; pass the real part "
            f"(np.real({name})) or split real and imaginary parts into separate features.")


def check_random_state(random_state) -> np.random.Generator:
    """Return a ``np.random.Generator`` from ``None``, an int, a SeedSequence or a Generator."""
    if random_state is None:
        return np.random.default_rng()
    if isinstance(random_state, np.random.Generator):
        return random_state
    if isinstance(random_state, np.random.SeedSequence):
        return np.random.default_rng(random_state)
    if isinstance(random_state, np.random.RandomState):
        return np.random.default_rng(random_state.randint(0, 2**31 - 1))
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise InputError(f"random_state must be a non-negative int, got {random_state}.")
        return np.random.default_rng(int(random_state))
    raise InputError(
        f"random_state must be None, an int or a numpy Generator, got {type(random_state).__name__}."
    )


def check_array(X, name: str = "X", *, allow_empty: bool = False) -> np.ndarray:
    """Return ``X`` as a finite 2-D float64 array or raise an error naming ``name``.

    Accepts numpy arrays, nested lists and pandas DataFrames (their values; column names are
    the estimators' business); refuses sparse matrices and complex values with the fix.
    """
    _refuse_sparse_and_complex(X, name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", np.exceptions.ComplexWarning)
            arr = np.asarray(X, dtype=np.float64)
    except np.exceptions.ComplexWarning:
        raise InputError(_complex_message(name)) from None
    except (TypeError, ValueError) as exc:
        if "complex" in str(exc):
            raise InputError(_complex_message(name)) from None
        raise (InputTypeError if isinstance(exc, TypeError) else InputError)(
            f"{name} must be a 2-D numeric array (rows are records); it could not be converted "
            f"to float ({exc}). Ragged lists of rows are not accepted: give every row the same length."
        ) from None
    if arr.ndim != 2:
        raise InputError(
            f"{name} must be 2-D (n_records, n_features), got shape {arr.shape}; "
            f"Reshape your data: {name}.reshape(-1, 1) for a single feature, {name}.reshape(1, -1) for a single record."
        )
    if not allow_empty and arr.shape[0] == 0:
        raise InputError(f"{name} has no rows; drop empty clients or give them data.")
    if arr.shape[1] == 0:
        raise InputError(
            f"{name} has 0 feature(s) (shape={arr.shape}) while a minimum of 1 is required; "
            "give every record at least one feature."
        )
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise InputError(
            f"{name} contains NaN or infinity (first at row {bad[0]}, column {bad[1]}); "
            "impute or drop those records before clustering."
        )
    return arr


def check_int(value, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise InputError(f"{name} must be an int, got {value!r}.")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InputError(f"{name} must be >= {minimum}, got {value}.")
    if maximum is not None and value > maximum:
        raise InputError(f"{name} must be <= {maximum}, got {value}.")
    return value


def check_float(
    value,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not np.isfinite(value):
        raise InputError(f"{name} must be a finite number, got {value!r}.")
    value = float(value)
    if minimum is not None and (value < minimum or (not min_inclusive and value == minimum)):
        op = ">=" if min_inclusive else ">"
        raise InputError(f"{name} must be {op} {minimum}, got {value}.")
    if maximum is not None and (value > maximum or (not max_inclusive and value == maximum)):
        op = "<=" if max_inclusive else "<"
        raise InputError(f"{name} must be {op} {maximum}, got {value}.")
    return value


def check_choice(value, name: str, choices: Iterable):
    choices = tuple(choices)
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}.")
    return value


def check_fraction_or_count(value, name: str, n_total: int) -> int:
    """Resolve a client count (int >= 1) or fraction (float in (0, 1]) to a count."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if not 1 <= value <= n_total:
            raise InputError(
                f"{name}={value} must be between 1 and the number of clients ({n_total}); "
                "pass a fraction in (0, 1] to sample a share of the clients."
            )
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not 0.0 < value <= 1.0:
            raise InputError(
                f"{name}={value} as a fraction must be in (0, 1]; pass an int for a client count."
            )
        return max(1, int(round(value * n_total)))
    raise InputError(f"{name} must be an int count or a float fraction, got {value!r}.")


def check_centres(init, n_clusters: int, n_features: int, name: str = "init") -> np.ndarray:
    arr = check_array(init, name)
    if arr.shape != (n_clusters, n_features):
        raise InputError(
            f"{name} array has shape {arr.shape}, expected (n_clusters, n_features) = "
            f"({n_clusters}, {n_features})."
        )
    return arr


def check_bounds(bounds, name: str = "init_bounds", n_features: int | None = None):
    """``None`` or ``(low, high)`` as two float arrays (scalars broadcast to ``n_features``).

    Refuses anything that is not a pair, non-finite values, and empty or reversed intervals
    (``low >= high`` in some feature): a box with no volume declares no data range at all.
    """
    if bounds is None:
        return None
    try:
        low, high = bounds
        low = np.asarray(low, dtype=np.float64)
        high = np.asarray(high, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a pair (low, high) of numbers or 1-D arrays, got {bounds!r}.") from None
    if low.ndim > 1 or high.ndim > 1 or not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise InputError(f"{name}=(low, high) must be finite numbers or 1-D arrays of length n_features, got {bounds!r}.")
    if n_features is not None:
        for part, v in (("low", low), ("high", high)):
            if v.ndim == 1 and v.shape[0] != n_features:
                raise InputError(f"{name}: {part} has {v.shape[0]} entries but the data has {n_features} features.")
    if np.any(low >= high):
        raise InputError(
            f"{name}=(low, high) must have low < high in every feature, got low={low}, high={high}; "
            "an empty or reversed range declares no data domain (swap the two if reversed)."
        )
    return low, high
