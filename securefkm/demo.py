"""``securefkm demo``: the library's promise on one screen.

The same DWF fit (Holzer et al. 2023) on the non-IID 5-blob set with 100 simulated clients,
twice: unprotected, and under the recommended secure stack -- distributed Gaussian DP
(epsilon=1, delta=1e-5, over the declared domain [-2, 2]^2) inside pairwise-masked secure
aggregation. For each: utility against central k-means on the pooled data, the records an
honest-but-curious server recovers from the transcript (:class:`attacks.Differencing`) and
the records a malicious server recovers by crafting the broadcast centres
(:class:`attacks.CraftedCentroids`, aimed at client 0), and the epsilon spent. One terminal
table and one PNG. No server to start: the rounds run in this process with the real
cryptography (the masked fits' clients in worker processes of the default backend on two CPUs
or more: docs/scaling.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from .datasets import load_dataset
from .estimators.dwf import WeightedFederatedKMeans
from .registry import make_protection

#: the public box every feature of the demo set lies in (declared once, on GaussianDP)
DOMAIN = (-2.0, 2.0)
#: the recommended stack: noise added by the clients, only its masked sum reaches the server
RECOMMENDED = ["dp:epsilon=1,delta=1e-5,bounds=[-2,2],mode=distributed", "masking"]
#: rounds a malicious server may run against the protected stack (the fit itself plans its
#: rounds for the budget: docs/protocols/dp-utility.md)
PROTECTED_ACTIVE_ROUNDS = 5


@dataclass
class DemoRow:
    name: str
    score: float  #: inertia / n on the pooled records
    ari: float
    rounds: int
    passive: tuple[int, int]  #: (records recovered, records attacked)
    active: tuple[int, int]
    epsilon: float | None
    seconds: float


def _attacks(estimator, fitted, data, *, active_rounds: int):
    from attacks import CraftedCentroids, Differencing

    passive = Differencing(data_bounds=DOMAIN).evaluate(fitted.transcript_, data)
    active = CraftedCentroids(target=0, max_rounds=active_rounds).evaluate(estimator, data)
    return passive, active


def _row(name, est, data, X, y, seconds, passive, active):
    spent = est.privacy_spent_
    return DemoRow(name, est.inertia_ / len(X), adjusted_rand_score(y, est.labels_), est.n_iter_,
                   (passive.records_recovered, passive.n_records), (active.records_recovered, active.n_records),
                   None if spent is None else float(spent[0]), seconds)


def data_box(layers):
    """The data domain the protected fit declares on the estimator: None when a
    :class:`~protocols.GaussianDP` of the stack declares its own ``bounds`` (that box then
    serves the start too), else the demo set's public box :data:`DOMAIN` as ``init_bounds``
    (a protected fit must not seed from raw records)."""
    from protocols.dp import GaussianDP

    if any(isinstance(layer, GaussianDP) and layer.bounds is not None for layer in layers):
        return None
    return DOMAIN


def run_demo(n_clients=100, random_state=0, plot_path="securefkm-demo.png", protection=None, verbose=1, out=print):
    """Run the side-by-side comparison; ``protection`` replaces the recommended stack
    (``None``: :data:`RECOMMENDED`; ``[]``: no protection, the unprotected fit only)."""
    data = load_dataset("dwf-blobs", split="non-iid", n_clients=n_clients, random_state=random_state)
    X, y = data.pooled(), data.pooled_labels()

    t = time.perf_counter()
    central = min(
        (KMeans(5, n_init=1, random_state=random_state + s).fit(X) for s in range(10)), key=lambda m: m.inertia_
    )
    central_row = DemoRow("central k-means (best of 10, pooled data)", central.inertia_ / len(X),
                          adjusted_rand_score(y, central.labels_), int(central.n_iter_), (0, 0), (0, 0), None,
                          time.perf_counter() - t)

    rows, fitted = [central_row], {}
    layers = make_protection(RECOMMENDED if protection is None else protection)
    settings = [("DWF federated, unprotected", dict(), 100)]
    if layers:
        stack = " + ".join(type(x).__name__ for x in layers)
        protected = dict(protection=layers)
        box = data_box(layers)
        if box is not None:
            protected["init_bounds"] = box
        settings.append((f"DWF federated + {stack}", protected, PROTECTED_ACTIVE_ROUNDS))
    for name, params, active_rounds in settings:
        if verbose:
            out(f"fitting: {name} ...")
        est = WeightedFederatedKMeans(5, random_state=random_state, **params)
        t = time.perf_counter()
        est.fit(data)
        seconds = time.perf_counter() - t
        passive, active = _attacks(WeightedFederatedKMeans(5, random_state=random_state, **params), est, data,
                                   active_rounds=active_rounds)
        rows.append(_row(name, est, data, X, y, seconds, passive, active))
        fitted[name] = est

    out(f"\nDWF k-means on the non-IID 5-blob set: {data.n_clients} clients, {data.n_samples} records, k=5")
    out("passive = Differencing on the transcript (honest-but-curious server); active = CraftedCentroids "
        "(malicious server, aimed at client 0)\n")
    for line in format_table(rows, central_row.score):
        out(line)
    ratios = f"{rows[1].score / central_row.score:.4f} (unprotected)"
    if len(rows) > 2:
        ratios += f", {rows[2].score / central_row.score:.4f} (protected)"
    out(f"\nfederated / central score: {ratios}")
    if plot_path:
        out(f"plot written to {plot_demo(data, central, fitted, rows, plot_path)}")
    return {"rows": rows, "estimators": fitted, "central": central, "ratio": rows[1].score / central_row.score}


def format_table(rows: list[DemoRow], central_score: float) -> list[str]:
    head = (f"| {'setting':<50} | {'score / central':>15} | {'ARI':>5} | {'rounds':>6} | "
            f"{'passive: records recovered':>26} | {'active: records recovered':>25} | {'epsilon':>7} | {'time (s)':>8} |")
    lines = [head, "|" + "|".join("-" * (len(c) + 0) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        central = r.passive[1] == 0
        passive = "-" if central else f"{r.passive[0]} / {r.passive[1]}"
        active = "-" if central else f"{r.active[0]} / {r.active[1]}"
        eps = "-" if central else ("none" if r.epsilon is None else f"{r.epsilon:.2f}")
        lines.append(f"| {r.name:<50} | {r.score / central_score:>15.4f} | {r.ari:>5.3f} | {r.rounds:>6d} | "
                     f"{passive:>26} | {active:>25} | {eps:>7} | {r.seconds:>8.2f} |")
    return lines


def plot_demo(data, central, fitted: dict, rows: list[DemoRow], path) -> str:
    """Left: the clients and the three sets of centres; right: records recovered per attack."""
    from .plotting import _pyplot

    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [1.1, 1]})
    cmap = plt.get_cmap("tab20")
    for i, Xc in enumerate(data.clients):
        ax.scatter(Xc[:, 0], Xc[:, 1], s=3, color=cmap(i % 20), alpha=0.4, linewidths=0)
    names = list(fitted)
    marks = [("central k-means", central.cluster_centers_, "o", "black"),
             ("unprotected DWF", fitted[names[0]].cluster_centers_, "X", "crimson")]
    if len(names) > 1:
        marks.append(("protected DWF", fitted[names[1]].cluster_centers_, "P", "royalblue"))
    for label, C, m, c in marks:
        if m == "o":  # hollow ring, so the federated centres on top stay visible
            ax.scatter(C[:, 0], C[:, 1], s=420, marker=m, facecolors="none", edgecolors=c, linewidths=2,
                       label=label, zorder=4)
        else:
            ax.scatter(C[:, 0], C[:, 1], s=150, marker=m, color=c, edgecolors="white", linewidths=1.2,
                       label=label, zorder=5)
    ax.legend(loc="lower left", fontsize=9)
    central_score = rows[0].score
    ratios = f"unprotected {rows[1].score / central_score:.3f}"
    if len(rows) > 2:
        ratios += f", protected {rows[2].score / central_score:.3f}"
    ax.set_title(f"Utility: {data.n_clients} clients (one colour each)\nscore / central: {ratios}", fontsize=10)

    labels = ["passive\n(Differencing)", "active, client 0\n(CraftedCentroids)"]
    xs = np.arange(2)
    for j, (r, colour, label) in enumerate(zip(rows[1:], ("crimson", "royalblue"), ("unprotected", "protected"))):
        pct = [100 * r.passive[0] / max(r.passive[1], 1), 100 * r.active[0] / max(r.active[1], 1)]
        counts = [r.passive, r.active]
        bars = bx.bar(xs + (j - 0.5) * 0.38, pct, width=0.38, color=colour, label=label)
        for b, (k, n) in zip(bars, counts):
            bx.annotate(f"{k} / {n}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                        fontsize=9, xytext=(0, 2), textcoords="offset points")
    bx.set_xticks(xs, labels)
    bx.set_ylim(0, 110)
    bx.set_ylabel("records recovered exactly (% of attacked records)")
    eps = rows[2].epsilon if len(rows) > 2 else None
    bx.set_title("Privacy: what the server recovers\n" + ("no protected fit" if len(rows) < 3 else "protected: "
                 + (f"epsilon = {eps:.2f}" if eps is not None else "no DP guarantee")), fontsize=10)
    bx.legend(loc="upper right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
