"""The federated dataset: one array of records per client, optional labels, client ids.

A :class:`FederatedDataset` is the input type of every estimator (``fit`` also accepts a
plain list of per-client arrays through :func:`as_federated`). It holds the clients'
arrays as float64 without copying arrays that already are float64 and C-contiguous, and
offers the pooled view (client order) that central baselines and metrics use.

CSV layout (:meth:`FederatedDataset.from_csv_dir` / :meth:`FederatedDataset.to_csv_dir`):
one file per client, the client id is the file stem, files are read in natural name order
(``client-2`` before ``client-10``), an optional header row (detected: a first row that is
not entirely numeric is a header), numeric columns only, and an optional label column.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..validation import check_array
from ..exceptions import InputError

__all__ = ["FederatedDataset", "as_federated", "from_groups"]


def _check_labels(labels, sizes: list[int]) -> list[np.ndarray] | None:
    if labels is None:
        return None
    if isinstance(labels, np.ndarray) or not isinstance(labels, (list, tuple)):
        raise InputError(
            "labels must be a list with one 1-D array per client (or None); "
            f"got {type(labels).__name__}. Use FederatedDataset.from_pooled(X, y) for pooled labels."
        )
    if len(labels) != len(sizes):
        raise InputError(
            f"labels has {len(labels)} entries but there are {len(sizes)} clients; give one per client."
        )
    out = []
    for i, (lab, n) in enumerate(zip(labels, sizes)):
        arr = np.asarray(lab)
        if arr.ndim != 1:
            raise InputError(f"labels[{i}] must be 1-D, got shape {arr.shape}.")
        if len(arr) != n:
            raise InputError(
                f"labels[{i}] has {len(arr)} entries but clients[{i}] has {n} rows; they must match."
            )
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise InputError(f"labels[{i}] contains NaN or infinity.")
        out.append(arr)
    return out


def _check_client_ids(client_ids, n_clients: int) -> list[str]:
    if client_ids is None:
        return [f"client-{i}" for i in range(n_clients)]
    ids = list(client_ids)
    if len(ids) != n_clients:
        raise InputError(f"client_ids has {len(ids)} entries but there are {n_clients} clients.")
    for i, cid in enumerate(ids):
        if not isinstance(cid, str) or not cid:
            raise InputError(f"client_ids[{i}] must be a non-empty string, got {cid!r}.")
    if len(set(ids)) != len(ids):
        dup = sorted({c for c in ids if ids.count(c) > 1})
        raise InputError(f"client_ids must be unique; duplicated: {dup}.")
    return ids


def _natural_key(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _labels_from_strings(col: np.ndarray) -> np.ndarray:
    """Integers if every value is an integer, else floats if numeric, else strings."""
    try:
        return col.astype(np.int64)
    except ValueError:
        pass
    try:
        return col.astype(np.float64)
    except ValueError:
        return col.astype(str)


#: header names that are almost surely labels, not features: clustering one would leak the
#: answer into the clustering and make any score meaningless
LABEL_LIKE_NAMES = ("label", "labels", "class", "target", "y", "species", "category", "group", "cluster",
                    "outcome", "diagnosis")
#: an unnamed column is taken for an integer-coded label when it alone holds integers with at
#: most this many distinct values in a file of at least LABEL_LIKE_MIN_ROWS records
LABEL_LIKE_MAX_CODES = 20
LABEL_LIKE_MIN_ROWS = 50


def _column_index(file: Path, header, width: int, column, arg: str) -> int:
    """Index of a column given by header name or integer index (negative allowed)."""
    if isinstance(column, str) and not column.lstrip("-").isdigit():
        if header is None or column not in header:
            raise InputError(
                f"{file}: {arg}={column!r} not found "
                f"({'no header row' if header is None else 'columns: ' + ', '.join(header)}); "
                "pass the column's name or integer index."
            )
        return header.index(column)
    j = int(column)
    if not -width <= j < width:
        raise InputError(f"{file}: {arg}={column} is out of range for {width} columns.")
    return j % width


def _integer_coded(column: np.ndarray) -> int | None:
    """Number of distinct values of a column written as integers (``"3"``, not ``"3.0"``), else None."""
    values = np.char.strip(column)
    if not all(v.lstrip("+-").isdigit() for v in values):
        return None
    return len(set(values.tolist()))


def _label_like_column(header, table: np.ndarray) -> tuple[str, str] | None:
    """(column, reason) of a column that looks like a label, or None.

    By name (:data:`LABEL_LIKE_NAMES`), or by content: in a file of at least
    :data:`LABEL_LIKE_MIN_ROWS` records and two or more columns, the one column that holds
    integers with at most :data:`LABEL_LIKE_MAX_CODES` distinct values (integer-coded classes
    stand out among measured features; data that are integers throughout are not flagged).
    """
    names = header if header is not None else [str(j) for j in range(table.shape[1])]
    for h in header or ():
        if h.strip().lower() in LABEL_LIKE_NAMES:
            return h, "it is named like one"
    n, width = table.shape
    if n < LABEL_LIKE_MIN_ROWS or width < 2:
        return None
    coded = [(j, c) for j in range(width) if (c := _integer_coded(table[:, j])) is not None]
    if len(coded) == 1 and coded[0][1] <= LABEL_LIKE_MAX_CODES:
        j, c = coded[0]
        return names[j], f"it holds only {c} distinct integer values in {n} records, like class codes"
    return None


def _refuse_label_like(file: Path, header, table: np.ndarray) -> None:
    found = _label_like_column(header, table)
    if found is None:
        return
    col, reason = found
    why = (f"{file}: column {col!r} looks like a label ({reason}); clustering it as a feature would leak "
           "the answer into the clustering. ")
    raise InputError(
        why + f"Pass label_column={col!r} to score against it (labels never leave the client), or "
        "feature_columns=[...] to name the columns to cluster (include it there to cluster it anyway).",
        cli=why + f"Pass --label-column {col} to score against it (labels never leave the client), or "
        "--feature-columns a,b,... to name the columns to cluster (include it there to cluster it anyway).",
    )


def _read_client_csv(file: Path, label_column, feature_columns=None):
    with open(file, newline="") as fh:
        rows = [r for r in csv.reader(fh) if r]
    if not rows:
        raise InputError(f"{file}: the file is empty; every client needs at least one record.")
    header = None
    if not all(_is_number(v) for v in rows[0]):
        header, rows = [h.strip() for h in rows[0]], rows[1:]
    if not rows:
        raise InputError(
            f"{file}: only a header row, no records; every client needs at least one record."
        )
    width = len(header) if header is not None else len(rows[0])
    for r, row in enumerate(rows):
        if len(row) != width:
            line = r + 1 + (header is not None)
            raise InputError(
                f"{file}: line {line} has {len(row)} fields, expected {width}; fix the ragged row."
            )
    table = np.array(rows, dtype=str)
    names = header if header is not None else [str(j) for j in range(width)]
    labels = None
    if label_column is None and feature_columns is None:
        _refuse_label_like(file, header, table)
    if label_column is not None:
        j = _column_index(file, header, width, label_column, "label_column")
        labels = _labels_from_strings(np.char.strip(table[:, j]))
    if feature_columns is not None:
        keep = [_column_index(file, header, width, c, "feature_columns") for c in feature_columns]
        if label_column is not None and j in keep:
            raise InputError(f"{file}: column {names[j]!r} is both label_column and in feature_columns; "
                             "a label must not be clustered.")
    else:
        keep = [k for k in range(width) if label_column is None or k != j]
    table = table[:, keep]
    names = [names[k] for k in keep]
    if table.shape[1] == 0:
        raise InputError(f"{file}: no feature columns left after removing the label column.")
    X = np.empty(table.shape, dtype=np.float64)
    first_line = 1 + (header is not None)  # file line of record 0
    for j in range(table.shape[1]):  # loop over columns, not records
        try:
            X[:, j] = table[:, j].astype(np.float64)
        except ValueError:
            bad = next(r for r, v in enumerate(table[:, j]) if not _is_number(v))
            where = f"line {bad + first_line} (record {bad}), column {names[j]!r}"
            if not table[bad, j].strip():
                raise InputError(
                    f"{file}: missing value at {where}; fill it in or drop the record (the clustering "
                    "needs every feature of every record)."
                ) from None
            raise InputError(
                f"{file}: column {names[j]!r} is not numeric (value {table[bad, j]!r} at line "
                f"{bad + first_line}, record {bad}); encode categorical columns as numbers or pass it as "
                "label_column."
            ) from None
        if not np.all(np.isfinite(X[:, j])):
            bad = int(np.flatnonzero(~np.isfinite(X[:, j]))[0])
            raise InputError(
                f"{file}: {table[bad, j].strip()!r} at line {bad + first_line} (record {bad}), column "
                f"{names[j]!r}; every value must be a finite number: fill in the missing value or drop "
                "the record."
            )
    return X, labels


class FederatedDataset:
    """Records held by several clients.

    Parameters
    ----------
    clients : list of array-like (n_i, n_features)
        One 2-D array per client; finite, non-empty, all with the same number of features.
    labels : list of 1-D array-like, optional
        Ground-truth labels per client (for evaluation only; never sent anywhere).
    client_ids : list of str, optional
        Unique ids; default ``"client-0"``, ``"client-1"``, ...
    name : str, optional
        A label for reports.
    """

    def __init__(self, clients, labels=None, client_ids=None, name=None):
        if isinstance(clients, np.ndarray) or not isinstance(clients, (list, tuple)):
            raise InputError(
                "clients must be a list of per-client 2-D arrays; to split one pooled array use "
                "FederatedDataset.from_pooled(X, y, split='iid', n_clients=...)."
            )
        if len(clients) == 0:
            raise InputError("clients is empty; a federation needs at least one client.")
        arrays = [check_array(c, name=f"clients[{i}]") for i, c in enumerate(clients)]
        d = arrays[0].shape[1]
        for i, a in enumerate(arrays):
            if a.shape[1] != d:
                raise InputError(
                    f"clients[{i}] has {a.shape[1]} features but clients[0] has {d}; "
                    "every client must hold the same features in the same order."
                )
        self._clients = arrays
        self._labels = _check_labels(labels, [len(a) for a in arrays])
        self._client_ids = _check_client_ids(client_ids, len(arrays))
        self._name = None if name is None else str(name)

    # ----------------------------------------------------------------- properties
    @property
    def clients(self) -> list[np.ndarray]:
        return list(self._clients)

    @property
    def labels(self) -> list[np.ndarray] | None:
        return None if self._labels is None else list(self._labels)

    @property
    def client_ids(self) -> list[str]:
        return list(self._client_ids)

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def n_clients(self) -> int:
        return len(self._clients)

    @property
    def n_features(self) -> int:
        return self._clients[0].shape[1]

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(a) for a in self._clients], dtype=np.int64)

    @property
    def n_samples(self) -> int:
        return int(self.sizes.sum())

    # ----------------------------------------------------------------- views
    def pooled(self) -> np.ndarray:
        """All records stacked in client order (a copy; central baselines only)."""
        return np.concatenate(self._clients, axis=0)

    def pooled_labels(self) -> np.ndarray | None:
        return None if self._labels is None else np.concatenate(self._labels)

    def client_of_record(self) -> np.ndarray:
        """Client index of each row of :meth:`pooled`."""
        return np.repeat(np.arange(self.n_clients), self.sizes)

    def __len__(self) -> int:
        return self.n_clients

    def __getitem__(self, i) -> np.ndarray:
        return self._clients[i]

    def __iter__(self):
        return iter(self._clients)

    def __repr__(self) -> str:
        sizes = self.sizes
        nm = f"{self._name!r}, " if self._name else ""
        return (
            f"FederatedDataset({nm}n_clients={self.n_clients}, n_features={self.n_features}, "
            f"n_samples={self.n_samples}, sizes={sizes.min()}..{sizes.max()}, "
            f"labels={'yes' if self._labels is not None else 'no'})"
        )

    # ----------------------------------------------------------------- constructors
    @classmethod
    def from_arrays(cls, clients, labels=None, client_ids=None, name=None) -> FederatedDataset:
        return cls(clients, labels=labels, client_ids=client_ids, name=name)

    @classmethod
    def from_pooled(
        cls,
        X,
        y=None,
        *,
        split: str = "iid",
        n_clients: int | None = 10,
        random_state=None,
        name=None,
        **split_kwargs,
    ) -> FederatedDataset:
        """Split one pooled array into clients with a splitter of :mod:`securefkm.datasets.splitters`.

        With ``split="column"`` the splitting column is removed from the features unless
        ``drop=False`` is passed.
        """
        from .splitters import split_indices

        X = check_array(X, "X")
        if y is not None:
            y = np.asarray(y)
            if y.ndim != 1 or len(y) != len(X):
                raise InputError(
                    f"y must be 1-D with one label per row of X ({len(X)}), got shape {y.shape}."
                )
        parts = split_indices(
            split, X, y, n_clients=n_clients, random_state=random_state, **split_kwargs
        )
        if split == "column" and split_kwargs.get("drop", True):
            X = np.delete(X, split_kwargs.get("column", 0), axis=1)
            if X.shape[1] == 0:
                raise InputError(
                    "split='column' with drop=True leaves no features; pass drop=False."
                )
        clients = [X[idx] for idx in parts]
        labels = None if y is None else [y[idx] for idx in parts]
        return cls(clients, labels=labels, name=name if name is not None else split)

    @classmethod
    def from_csv_dir(
        cls, path, label_column=None, pattern: str = "*.csv", name=None, feature_columns=None
    ) -> FederatedDataset:
        """One CSV per client in ``path`` (client id = file stem, natural name order).

        ``label_column`` (a header name or an integer index, negative allowed) is split off
        as the labels; files written by :meth:`to_csv_dir` read back with ``label_column="label"``
        (or ``-1`` without header). ``feature_columns`` (names or indices) selects the columns
        to cluster; by default every column but the label. A header column named like a
        label (``label``, ``class``, ``target``, ``y``, ``species``, ``category``, ``group``,
        ``cluster``, ``outcome``, ``diagnosis``), or the one integer-coded column with at most 20
        distinct values in a file of 50 records or more, is refused unless one of the two says
        what it is: clustering a label as a feature silently leaks the answer.
        """
        folder = Path(path)
        if not folder.is_dir():
            raise InputError(f"path={str(path)!r} is not a directory of per-client CSV files.")
        files = sorted(
            (f for f in folder.glob(pattern) if f.is_file()), key=lambda f: _natural_key(f.name)
        )
        if not files:
            raise InputError(
                f"no files match pattern={pattern!r} in {str(path)!r}; one CSV per client is expected."
            )
        clients, labels = [], []
        for f in files:
            X, lab = _read_client_csv(f, label_column, feature_columns)
            clients.append(X)
            labels.append(lab)
        widths = {c.shape[1] for c in clients}
        if len(widths) > 1:
            first = next(f for f, c in zip(files, clients) if c.shape[1] != clients[0].shape[1])
            raise InputError(
                f"{first} has a different number of feature columns than {files[0]}; "
                "every client file must have the same columns."
            )
        return cls(
            clients,
            labels=labels if label_column is not None else None,
            client_ids=[f.stem for f in files],
            name=name if name is not None else folder.name,
        )

    def to_csv_dir(self, path, header: bool = True) -> list[Path]:
        """Write ``<client_id>.csv`` per client (floats with 17 significant digits, exact on
        read-back; labels, if any, as the last column ``label``). Returns the written paths."""
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        cols = [f"x{j}" for j in range(self.n_features)]
        written = []
        for i, (cid, X) in enumerate(zip(self._client_ids, self._clients)):
            table = np.char.mod("%.17g", X)
            if self._labels is not None:
                lab = self._labels[i]
                lab_s = np.char.mod("%.17g", lab) if lab.dtype.kind == "f" else lab.astype(str)
                table = np.column_stack([table, lab_s])
            file = folder / f"{cid}.csv"
            with open(file, "w", newline="") as fh:
                w = csv.writer(fh)
                if header:
                    w.writerow(cols + (["label"] if self._labels is not None else []))
                w.writerows(table.tolist())
            written.append(file)
        return written


def _ndim(c) -> int:
    """Dimensions of one client's data: arrays, DataFrames and sparse matrices by their shape,
    nested sequences by their first level (rows of numbers = 2, numbers = 1)."""
    shape = getattr(c, "shape", None)
    if shape is not None:
        return len(shape)
    if isinstance(c, Sequence) and not isinstance(c, str):
        rows_ok = len(c) > 0 and all(
            isinstance(r, (Sequence, np.ndarray)) and not isinstance(r, str) for r in c
        )
        return 2 if rows_ok else 1
    return 0


def from_groups(X, groups, name: str = "X") -> tuple[FederatedDataset, np.ndarray]:
    """Split a pooled array by per-record client labels (scikit-learn's ``groups``).

    Clients are the distinct values of ``groups`` in sorted order (client ids are their
    strings). Returns the dataset and the pooled array in the caller's record order.
    """
    X = check_array(X, name)
    groups = np.asarray(groups)
    if groups.ndim != 1 or len(groups) != len(X):
        raise InputError(
            f"groups must be 1-D with one client label per row of {name} ({len(X)}), got shape {groups.shape}."
        )
    if groups.dtype.kind == "f" and not np.all(np.isfinite(groups)):
        raise InputError("groups contains NaN or infinity; every record needs a client label.")
    ids, inverse = np.unique(groups, return_inverse=True)
    clients = [X[inverse == i] for i in range(len(ids))]
    return FederatedDataset(clients, client_ids=[str(g) for g in ids]), X


def as_federated(data, name: str = "X", *, groups=None, allow_pooled: bool = False) -> FederatedDataset:
    """Accept a :class:`FederatedDataset` (returned as is) or a list/tuple of per-client 2-D
    arrays (numpy arrays, nested lists or pandas DataFrames).

    With ``groups`` (one client label per record), a pooled 2-D ``data`` is split into those
    clients. With ``allow_pooled=True`` (the estimators' ``fit``), a pooled 2-D array without
    ``groups`` is ONE client: a single data holder (see docs/getting-started.md, "Pooled
    arrays"); by default it is refused, since silently inventing a split would invent a federation.
    """
    advice = (
        "pass a list of per-client 2-D arrays, a FederatedDataset, a pooled array with "
        "groups=<client label per record>, or split a pooled array with "
        "FederatedDataset.from_pooled(X, y, split='iid', n_clients=...)"
    )
    if isinstance(data, FederatedDataset):
        if groups is not None:
            raise InputError(f"groups is given but {name} is already a FederatedDataset; drop groups.")
        return data
    if isinstance(data, (list, tuple)) and groups is None:
        if len(data) == 0:
            raise InputError(f"{name} is an empty list; {advice}.")
        for i, c in enumerate(data):
            if _ndim(c) != 2:
                raise InputError(
                    f"{name}[{i}] is not a 2-D array (it looks like a single record or value); {advice}."
                )
        return FederatedDataset([c for c in data], client_ids=None)
    if groups is not None:
        return from_groups(data, groups, name)[0]
    if allow_pooled:
        return FederatedDataset([check_array(data, name)])
    if isinstance(data, np.ndarray):
        raise InputError(f"{name} is a single array of shape {data.shape}; {advice}.")
    raise InputError(f"{name} of type {type(data).__name__} is not federated data; {advice}.")
