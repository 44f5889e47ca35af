"""The benchmark's summary (mean and standard error over seeds) and its one-page HTML report.

``report.html`` is self-contained (plots embedded as base64 PNG, no script, no external
file): the command line and versions that produced it; per algorithm a privacy-utility plot
(stacks ordered by strength, DP stacks by epsilon; utility on the y axis with standard-error
bars, one line per dataset, the most records any attack recovered written at each point) and a
stack x attack leakage heat-map; the DP audit's lower bounds beside the accounted epsilon; and
the table of every configured cell (``<tr data-cell="dataset|algorithm|stack|attack">``).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

GROUP = ("dataset", "algorithm", "stack", "attack")
NUMERIC = ("records_recovered", "fraction_recovered", "clients_exposed", "precision", "membership_auc",
           "membership_advantage", "poison_displacement", "poison_utility", "poison_ari", "poison_detected",
           "audit_epsilon", "claimed_epsilon", "utility", "ari", "epsilon")
AUDIT = "dp-audit"


def _num(v) -> float:
    if v is None or v == "":
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def mean_se(values) -> tuple[float, float, int]:
    """(mean, standard error of the mean, n) of the finite values; se = s / sqrt(n), 0 for n=1."""
    v = np.asarray([x for x in (_num(x) for x in values) if np.isfinite(x)])
    if len(v) == 0:
        return math.nan, math.nan, 0
    se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
    return float(v.mean()), se, len(v)


def summarise(rows) -> list[dict]:
    """One dict per (dataset, algorithm, stack, attack), in first-seen order: ``seeds``,
    ``status`` (ok / the not-applicable reason / the first error), ``<col>_mean`` and
    ``<col>_se`` for the numeric columns."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(str(r[k]) for k in GROUP), []).append(r)
    out = []
    for key, rs in groups.items():
        status = [str(r.get("status", "")) for r in rs]
        bad = [s for s in status if s != "ok"]
        s = {**dict(zip(GROUP, key)), "seeds": len(rs), "status": bad[0] if bad else "ok",
             "status_count": f"{len(bad)}/{len(rs)}" if bad else ""}
        for c in NUMERIC:
            m, se, _ = mean_se(r.get(c) for r in rs if str(r.get("status", "")) == "ok")
            s[f"{c}_mean"], s[f"{c}_se"] = m, se
        out.append(s)
    return out


def write_summary_csv(path, summary) -> None:
    cols = list(GROUP) + ["seeds", "status"] + [f"{c}_{x}" for c in NUMERIC for x in ("mean", "se")]
    with Path(path).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for s in summary:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) and np.isfinite(v) else ("" if isinstance(v, float)
                                                                                          else v))
                        for k, v in s.items()})


# ------------------------------------------------------------------ ordering
def stack_order(stacks: dict) -> list[str]:
    """Stacks without DP in configuration order (none first), then DP stacks from the
    largest epsilon (weakest) to the smallest; ties keep configuration order."""
    def eps(specs):
        from securefkm.specs import layer_specs

        e = [float(s["epsilon"]) for s in layer_specs(specs) if s.name == "dp"]
        return min(e) if e else None

    plain = [k for k, v in stacks.items() if eps(v) is None]
    dp = sorted((k for k, v in stacks.items() if eps(v) is not None), key=lambda k: -eps(stacks[k]))
    return plain + dp


# ------------------------------------------------------------------ plots
def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_privacy_utility(summary, algorithm: str, stacks: list[str], datasets: list[str]) -> str:
    """Utility (mean +- s.e.) per stack, one line per dataset; at each point the most records
    any attack recovered (mean over seeds); 'n/a' where the stack refuses the algorithm."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(stacks) + 2), 3.6))
    by = {(s["dataset"], s["stack"]): [] for s in summary if s["algorithm"] == algorithm}
    for s in summary:
        if s["algorithm"] == algorithm:
            by[(s["dataset"], s["stack"])].append(s)
    for i, ds in enumerate(datasets):
        xs, ys, es, labels = [], [], [], []
        for j, st in enumerate(stacks):
            ss = by.get((ds, st), [])
            u = [s for s in ss if np.isfinite(s["utility_mean"])]
            if not u:
                if ss:
                    ax.annotate("n/a", (j, 0.02), ha="center", fontsize=7, color="grey")
                continue
            rec = [s["records_recovered_mean"] for s in ss if np.isfinite(s["records_recovered_mean"])]
            xs.append(j + 0.06 * (i - (len(datasets) - 1) / 2))
            ys.append(u[0]["utility_mean"])
            es.append(u[0]["utility_se"])
            labels.append(f"{max(rec):.3g}" if rec else "")
        if not xs:
            continue
        line = ax.errorbar(xs, ys, yerr=es, marker="o", ms=4, lw=1, capsize=2, label=ds)
        for x, y, t in zip(xs, ys, labels):
            if t:
                ax.annotate(t, (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7,
                            color=line[0].get_color())
    ax.set_xticks(range(len(stacks)), [s.replace("+", "+\n") for s in stacks], fontsize=7)
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("utility (central / federated inertia)", fontsize=8)
    ax.set_title(f"{algorithm}: utility per stack (labels: most records recovered by any attack)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=6, loc="lower left", ncol=2)
    fig.tight_layout()
    return _png(fig)


def plot_heatmap(summary, algorithm: str, stacks: list[str], attacks: list[str]) -> str:
    """Stack x attack: colour = mean fraction of records recovered (membership: advantage),
    averaged over datasets; text = mean records recovered (membership: AUC); grey 'n/a'."""
    plt = _plt()
    M = np.full((len(stacks), len(attacks)), np.nan)
    T = [["n/a"] * len(attacks) for _ in stacks]
    for i, st in enumerate(stacks):
        for j, at in enumerate(attacks):
            ss = [s for s in summary if s["algorithm"] == algorithm and s["stack"] == st and s["attack"] == at]
            if at == "membership":
                v = [s["membership_advantage_mean"] for s in ss if np.isfinite(s["membership_advantage_mean"])]
                t = [s["membership_auc_mean"] for s in ss if np.isfinite(s["membership_auc_mean"])]
                fmt = "AUC {:.2f}"
            else:
                v = [s["fraction_recovered_mean"] for s in ss if np.isfinite(s["fraction_recovered_mean"])]
                t = [s["records_recovered_mean"] for s in ss if np.isfinite(s["records_recovered_mean"])]
                fmt = "{:.3g}"
            if v:
                M[i, j] = float(np.mean(v))
                T[i][j] = fmt.format(float(np.mean(t)))
            elif any(s["status"].startswith("error") for s in ss):
                T[i][j] = "error"
    fig, ax = plt.subplots(figsize=(1.0 * len(attacks) + 2.5, 0.38 * len(stacks) + 1.6))
    cmap = plt.get_cmap("Reds").with_extremes(bad="#dddddd")
    vmax = max(0.05, float(np.nanmax(M)) if np.isfinite(M).any() else 0.05)
    im = ax.imshow(np.ma.masked_invalid(M), cmap=cmap, vmin=0, vmax=vmax, aspect="auto")
    for i in range(len(stacks)):
        for j in range(len(attacks)):
            dark = np.isfinite(M[i, j]) and M[i, j] > 0.6 * vmax
            ax.text(j, i, T[i][j], ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(len(attacks)), [a.replace("-", "-\n", 1) for a in attacks], fontsize=7)
    ax.set_yticks(range(len(stacks)), stacks, fontsize=7)
    ax.set_title(f"{algorithm}: records recovered (colour: fraction; membership: advantage)", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    return _png(fig)


# ------------------------------------------------------------------ page
def versions() -> dict:
    import numpy
    import sklearn

    out = {"python": platform.python_version(), "numpy": numpy.__version__, "scikit-learn": sklearn.__version__,
           "platform": platform.platform()}
    try:
        from importlib.metadata import version

        out["securefkm"] = version("securefkm")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        out["securefkm"] = "?"
    try:
        here = Path(__file__).resolve().parent
        out["git commit"] = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True, timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        out["git commit"] = "?"
    return out


def _f(m, se=None, digits=3) -> str:
    if not isinstance(m, float) or not np.isfinite(m):
        return "-"
    if se is None or not np.isfinite(se):
        return f"{m:.{digits}g}"
    return f"{m:.{digits}g} &plusmn; {se:.2g}"


_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}td.l,th.l{text-align:left}
tr.na td{color:#888}tr.err td{color:#b00}h2{border-bottom:1px solid #999}.fig{display:inline-block;margin:4px}
code{background:#f4f4f4}"""


def write_report(path, rows, summary, cfg: dict, wall_seconds: float = math.nan) -> None:
    """The one self-contained page (see the module docstring)."""
    e = html.escape
    stacks = stack_order(cfg["stacks"])
    algorithms = list(cfg["algorithms"])
    datasets = list(dict.fromkeys(s["dataset"] for s in summary if s["attack"] != AUDIT))
    attacks = [a for a in cfg["attacks"]]
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>securefkm attack benchmark</title>"
             f"<style>{_CSS}</style></head><body>",
             "<h1>securefkm attack/defence benchmark</h1>",
             f"<p>Command: <code>{e(cfg.get('command') or 'run_benchmark(config)')}</code><br>"
             f"Written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; wall time of this call "
             f"{wall_seconds:.0f} s; seeds {e(str(cfg['seeds']))}; crypto={e(cfg['crypto'])}; "
             f"jobs={cfg['jobs']} ({e(cfg['backend'])}); {len(rows)} rows.</p>",
             "<p>Versions: " + ", ".join(f"{e(k)} {e(v)}" for k, v in versions().items()) + "</p>",
             "<p>Utility = best central k-means inertia / federated inertia (1 = as good as central); ARI against "
             "the labels. Leakage = records recovered exactly (within 1e-6 of the data range). Mean &plusmn; standard "
             "error over seeds. A cell is a number or <i>not applicable: reason</i>.</p>",
             "<h2>Configuration</h2><table><tr><th class='l'>stack</th><th class='l'>layers</th></tr>"]
    for st in stacks:
        parts.append(f"<tr><td class='l'>{e(st)}</td><td class='l'><code>{e(str(cfg['stacks'][st]))}</code></td></tr>")
    parts.append("</table><p>Datasets: " + ", ".join(e(d) for d in datasets) + "<br>Algorithms: "
                 + ", ".join(e(a) for a in algorithms) + "</p>")
    parts.append("<h2>DP audit: empirical lower bound beside the accounted epsilon</h2>")
    parts.append(audit_table(rows, summary, stacks))
    parts.append("<h2>Per algorithm: privacy-utility and leakage</h2>")
    for alg in algorithms:
        parts.append(f"<h3 id='alg-{e(alg)}'>{e(alg)}</h3>")
        parts.append(f"<div class='fig'><img alt='privacy-utility {e(alg)}' src='data:image/png;base64,"
                     f"{plot_privacy_utility(summary, alg, stacks, datasets)}'></div>")
        parts.append(f"<div class='fig'><img alt='heat-map {e(alg)}' src='data:image/png;base64,"
                     f"{plot_heatmap(summary, alg, stacks, attacks)}'></div>")
    parts.append("<h2>Every cell</h2>")
    parts.append(cell_table(summary))
    parts.append("</body></html>")
    Path(path).write_text("\n".join(parts))


def audit_table(rows, summary, stacks) -> str:
    e = html.escape
    out = ["<table id='audit'><tr><th class='l'>stack</th><th>target epsilon</th><th>spent in fits (mean)</th>"
           "<th>audit lower bound</th><th>bound / target</th><th class='l'>status</th></tr>"]
    for st in stacks:
        aud = [s for s in summary if s["stack"] == st and s["attack"] == AUDIT]
        if not aud:
            continue
        a = aud[0]
        spent = [s["epsilon_mean"] for s in summary if s["stack"] == st and s["attack"] != AUDIT
                 and np.isfinite(s["epsilon_mean"])]
        target = a["epsilon_mean"]
        ratio = a["audit_epsilon_mean"] / target if target else math.nan
        out.append(f"<tr data-cell='-|gaussian-dp-round|{e(st)}|{AUDIT}'><td class='l'>{e(st)}</td><td>{_f(target)}</td>"
                   f"<td>{_f(float(np.mean(spent)) if spent else math.nan)}</td>"
                   f"<td>{_f(a['audit_epsilon_mean'], a['audit_epsilon_se'])}</td><td>{_f(ratio)}</td>"
                   f"<td class='l'>{e(a['status'])}</td></tr>")
    if len(out) == 1:
        return "<p>No DP stack in this configuration: nothing to audit.</p>"
    out.append("</table>")
    return "\n".join(out)


def cell_table(summary) -> str:
    e = html.escape
    head = ["dataset", "algorithm", "stack", "attack", "seeds", "records recovered", "fraction", "clients exposed",
            "membership AUC", "utility", "ARI", "epsilon spent", "status"]
    out = ["<table id='cells'><tr>" + "".join(f"<th class='l'>{h}</th>" if i < 4 or h == "status" else f"<th>{h}</th>"
                                              for i, h in enumerate(head)) + "</tr>"]
    for s in summary:
        if s["attack"] == AUDIT:
            continue
        cls = "na" if s["status"].startswith("not applicable") else "err" if s["status"].startswith("error") else ""
        key = "|".join(s[k] for k in GROUP)
        out.append(
            f"<tr class='{cls}' data-cell='{e(key)}'>" + "".join(f"<td class='l'>{e(s[k])}</td>" for k in GROUP)
            + f"<td>{s['seeds']}</td><td>{_f(s['records_recovered_mean'], s['records_recovered_se'])}</td>"
            f"<td>{_f(s['fraction_recovered_mean'])}</td><td>{_f(s['clients_exposed_mean'])}</td>"
            f"<td>{_f(s['membership_auc_mean'], s['membership_auc_se'])}</td>"
            f"<td>{_f(s['utility_mean'], s['utility_se'])}</td><td>{_f(s['ari_mean'], s['ari_se'])}</td>"
            f"<td>{_f(s['epsilon_mean'])}</td><td class='l'>{e(s['status'])}"
            + (f" ({s['status_count']} seeds)" if s["status_count"] else "") + "</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def summary_markdown(summary, attacks, stacks=None) -> str:
    """A markdown table for docs: one line per (dataset, algorithm, stack), utility / ARI /
    epsilon spent (means over seeds), then per attack the mean records recovered
    (membership: AUC), 'n/a' where the attack does not apply, 'refused' lines collapsed."""
    fits: dict = {}
    for s in summary:
        if s["attack"] != AUDIT:
            fits.setdefault((s["dataset"], s["algorithm"], s["stack"]), {})[s["attack"]] = s
    order = {st: i for i, st in enumerate(stacks or [])}
    keys = sorted(fits, key=lambda k: (k[0], k[1], order.get(k[2], len(order))))
    lines = ["| dataset | algorithm | stack | utility | ARI | eps spent | " + " | ".join(attacks) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(attacks)]
    for key in keys:
        g = fits[key]
        ok = [s for s in g.values() if np.isfinite(s["utility_mean"])]
        if not ok:
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | refused | | | " + " | ".join("n/a" for _ in attacks) + " |")
            continue
        u = ok[0]
        cells = []
        for at in attacks:
            s = g.get(at)
            if s is None or s["status"] != "ok":
                cells.append("n/a" if s is None or s["status"].startswith("not applicable") else "error")
            elif at == "membership":
                cells.append(f"AUC {s['membership_auc_mean']:.2f}")
            elif at == "poisoning":  # how far the malicious clients moved a centre, and the utility left
                cells.append(f"move {s['poison_displacement_mean']:.3g}, utility {s['poison_utility_mean']:.2f}")
            else:
                cells.append(f"{s['records_recovered_mean']:.3g}")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {_f(u['utility_mean'])} | {_f(u['ari_mean'], digits=2)} | "
                     f"{_f(u['epsilon_mean'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
