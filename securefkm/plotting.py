"""Plots written by the CLI and the benchmarks (matplotlib, no screen needed)."""

from __future__ import annotations

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_clients_and_centres(dataset, centres: dict[str, np.ndarray], path, title: str = "") -> str:
    """Scatter every client's records (one colour per client) and each set of centres."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 6))
    cmap = plt.get_cmap("tab20")
    for i, X in enumerate(dataset.clients):
        ax.scatter(X[:, 0], X[:, 1], s=3, color=cmap(i % 20), alpha=0.5, linewidths=0)
    markers = ["X", "P", "o", "D", "^"]
    colours = ["crimson", "black", "navy", "darkgreen", "purple"]
    for j, (name, C) in enumerate(centres.items()):
        ax.scatter(C[:, 0], C[:, 1], s=140, marker=markers[j % 5], color=colours[j % 5],
                   edgecolors="white", linewidths=1.2, label=name, zorder=5)
    ax.legend(loc="best")
    ax.set_title(title or f"{dataset.n_clients} clients (one colour each) and learned centres")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
