"""MinClusterSize: clients never send a cluster built from fewer than ``p`` records
(Garst & Reinders, "Federated K-Means Clustering", sec. 2: a local cluster of one record
*is* that record).

What it does, on each client:

* set-fields: when the update has a ``sizes`` item (shape (k_i,)), every local cluster with
  size < p is dropped from every set-field whose first dimension is k_i (conventionally
  ``centres`` (k_i, d) and ``sizes`` (k_i,)).
* sum-fields: for each field of kind ``count`` (a per-cluster count vector of length k),
  every cluster j with count_j < p is zeroed in every sum-field whose first dimension is k
  -- the *per-cluster fields* (counts, coordinate sums, per-cluster scores, local
  centres). Fuzzy counts (sums of memberships) are compared with p as they are. A
  count field of shape (1,) (a whole-client count, as in a score round) suppresses the
  client's whole message when it holds fewer than p records. Clusters with count 0 are
  already zero.

Trust model: applied by each client; nobody must be trusted. The server never receives a
per-cluster value computed from fewer than p of a client's records.

What it does not protect against: it is not differential privacy -- clusters of p or more
records still reveal their exact sums; differencing (the server compares rounds, or
aggregates with and without a client, and isolates a record); active attacks (a server that
places centres so that a cluster holds exactly p records, p - 1 of them known to it, or
that asks for many slightly moved centres); under secure aggregation it is the *client's*
contribution that is suppressed, not the aggregate. Under
:class:`~protocols.dp.GaussianDP` the suppression depends on the data, so one record can
switch a whole cluster of p records on or off; GaussianDP therefore multiplies its
sensitivities by p when this layer runs before the noise (always in central mode), and not
when it runs after distributed/local noise (then it acts on noised counts, post-processing).
"""

from __future__ import annotations

import numbers

import numpy as np

from securefkm.exceptions import InputError
from securefkm.layers import Layer
from securefkm.messages import Update


class MinClusterSize(Layer):
    """Suppress any cluster of fewer than ``p`` records in a client's message."""

    side = "client"

    def __init__(self, p=2):
        if not isinstance(p, numbers.Real) or isinstance(p, bool) or not np.isfinite(p) or p < 1:
            raise InputError(f"MinClusterSize p must be a number >= 1 (e.g. p=2), got {p!r}.")
        self.p = p
        self._repr_params = {"p": p}

    def server_view(self, algorithm, aggregator):
        return (f"no client cluster of fewer than {self.p} records (such clusters are suppressed on the client "
                "before sending)",
                "no trust assumption; not a formal privacy guarantee (larger clusters are sent as before)")

    def client_update(self, update, client, ctx):
        p = self.p
        items = dict(update.items)
        sizes = items.get("sizes")
        if sizes is not None:
            sizes = np.asarray(sizes)
            keep = sizes >= p
            k = len(sizes)
            for name, arr in items.items():
                arr = np.asarray(arr)
                if arr.ndim >= 1 and arr.shape[0] == k:
                    items[name] = arr[keep]
        sums = dict(update.sums)
        for spec in ctx.specs:
            if spec.kind != "count" or spec.name not in sums:
                continue
            counts = np.asarray(update.sums[spec.name], dtype=np.float64).reshape(-1)
            small = counts < p
            if not np.any(small):
                continue
            k = counts.shape[0]
            for other in ctx.specs:
                if other.name in sums and len(other.shape) >= 1 and other.shape[0] == k:
                    arr = np.array(sums[other.name], dtype=np.float64, copy=True)
                    arr[small] = 0.0
                    sums[other.name] = arr
        return Update(sums=sums, items=items)
