"""Rounding: clients coarsen what they send (weight rounding; cf. Garst & Reinders,
"Federated K-Means Clustering", sec. 2, on cluster sizes revealing client data).

What it does, on each client before the values leave it:

* ``count_multiple=m``: every ``count`` sum-field (per-cluster counts, fuzzy weights) and
  the set-field ``sizes`` are rounded to the nearest multiple of m (halves to even, as
  ``numpy.rint``); a count below m/2 becomes 0.
* ``decimals=r``: ``value`` sum-fields (a client's local centres) and every set-field other
  than ``sizes`` (local ``centres``) are rounded to r decimals (``numpy.round``). ``sum``
  and ``score`` fields are left alone: rounding a sum of many records hides nothing.

Trust model: applied by each client to its own message; nobody must be trusted. The server
learns the rounded values instead of the exact ones.

What it does not protect against: it is not differential privacy. Exact small counts are
hidden only up to m (a server still learns "about 10 records here"), differencing two rounds
or two aggregates can still isolate a record, and an active server can pick centres so that
rounding thresholds reveal information. Under :class:`~protocols.dp.GaussianDP` place it
*after* the DP layer in distributed or local mode (rounding noised values is
post-processing); GaussianDP refuses other placements because rounding before the noise
changes the sensitivity.
"""

from __future__ import annotations

import numbers

import numpy as np

from securefkm.validation import check_int
from securefkm.exceptions import InputError
from securefkm.layers import Layer
from securefkm.messages import Update


class Rounding(Layer):
    """Round counts to a multiple and centres/values to decimals on each client."""

    side = "client"

    def __init__(self, count_multiple=None, decimals=None):
        if count_multiple is None and decimals is None:
            raise InputError("Rounding needs count_multiple= (e.g. 5) and/or decimals= (e.g. 2).")
        if count_multiple is not None:
            if (
                not isinstance(count_multiple, numbers.Real)
                or isinstance(count_multiple, bool)
                or not np.isfinite(count_multiple)
                or count_multiple <= 0
            ):
                raise InputError(f"count_multiple must be a positive number (e.g. 5), got {count_multiple!r}.")
        self.count_multiple = count_multiple
        self.decimals = None if decimals is None else check_int(decimals, "decimals", minimum=0)
        self._repr_params = {"count_multiple": count_multiple, "decimals": decimals}

    def server_view(self, algorithm, aggregator):
        what = []
        if self.count_multiple is not None:
            what.append(f"counts rounded to multiples of {self.count_multiple}")
        if self.decimals is not None:
            what.append(f"values rounded to {self.decimals} decimals")
        return (", ".join(what) + " (a coarsening of each client's message, not a formal privacy guarantee)",
                "no trust assumption; offers no bound on what the rounded values reveal")

    def perturbs_client_messages(self) -> bool:
        return True

    def _round_count(self, arr):
        m = self.count_multiple
        return np.rint(np.asarray(arr, dtype=np.float64) / m) * m

    def client_update(self, update, client, ctx):
        sums = dict(update.sums)
        for spec in ctx.specs:
            if spec.name not in sums:
                continue
            if spec.kind == "count" and self.count_multiple is not None:
                sums[spec.name] = self._round_count(sums[spec.name])
            elif spec.kind in ("value", "mean") and self.decimals is not None:
                sums[spec.name] = np.round(np.asarray(sums[spec.name], dtype=np.float64), self.decimals)
        items = dict(update.items)
        for name, arr in items.items():
            if name == "sizes":
                if self.count_multiple is not None:
                    items[name] = self._round_count(arr)
            elif self.decimals is not None:
                items[name] = np.round(np.asarray(arr, dtype=np.float64), self.decimals)
        return Update(sums=sums, items=items)
