"""The benchmark's summary (mean and standard error over seeds) and its one-page HTML report.

``report.html`` is one self-contained offline file: figures embedded as base64 PNG, one
small inline script (sorting and filtering of the cell table), nothing fetched. It holds:

* the command line, versions and configuration;
* a table of the threat model each attack assumes;
* **one panel per data set** (``<section class="panel" data-dataset="...">``) with three
  figures, each with a caption stating what it shows and the threat models involved:

  - *records recovered*: one stack x attack grid per algorithm, each cell written as
    ``recovered/attacked`` records (summed over the seeds that ran) and coloured by that
    fraction on one fixed 0-1 scale shared by every panel; cells whose fit the stack refused
    are hatched and written ``refused``, attacks that do not apply ``n/a``;
  - *membership inference*: stack x algorithm, coloured by the membership advantage on its
    own fixed 0-1 scale, written with the AUC; the caption gives the AUC interval and the
    advantage an attack without any signal reaches with this many candidates, and cells
    beyond it are starred;
  - *privacy-utility*: utility against the stack's target epsilon (log axis), one line per
    DP family (local, central, distributed + masking, ...), the unprotected fit as a dashed
    line, refused fits as crosses in a separate "refused" strip (never drawn at utility 0),
    error bars (standard error) only where several seeds ran;

* the DP audit: audit lower bound against the claimed epsilon and their ratio, per DP stack,
  with the table of the audit rows;
* every configured cell in one table (``<tr data-cell="dataset|algorithm|stack|attack">``)
  that sorts on a click on a header and filters by the inputs under the headers. The page
  URL's fragment sets the initial state: ``#sort=utility&order=desc&q=dwf&f.stack=dp``.

A value is printed ``mean &plusmn; s.e.`` only when several seeds ran; with one seed there is
no standard error and none is printed.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import platform
import re
import subprocess
import time
from pathlib import Path

import numpy as np

GROUP = ("dataset", "algorithm", "stack", "attack")
NUMERIC = ("records_recovered", "n_records", "fraction_recovered", "clients_exposed", "precision", "membership_auc",
           "membership_advantage", "poison_displacement", "poison_utility", "poison_ari", "poison_detected",
           "audit_epsilon", "claimed_epsilon", "utility", "ari", "epsilon")
AUDIT = "dp-audit"
MEMBERSHIP = "membership"
POISONING = "poisoning"
POISONING_RANGE = "poisoning-out-of-range"
#: attacks that are not record recovery: drawn in their own figure (membership) or only tabled (poisoning)
NOT_RECOVERY = (MEMBERSHIP, POISONING, POISONING_RANGE, AUDIT)

#: what each attack assumes of the adversary (the captions and the threat-model table)
THREAT = {
    "small-cluster": "passive honest-but-curious server: reads every message in the transcript; a client's "
                     "cluster of one record is that record",
    "differencing": "passive server: subtracts one client's plaintext messages of successive rounds to peel off "
                    "records that changed cells",
    "aggregate-differencing": "passive server: subtracts secure aggregates whose contributor sets differ by one "
                              "client",
    "fuzzy-equations": "passive server: solves the equations a fuzzy c-means client's memberships and sums form in "
                       "its records (exact solutions only)",
    "crafted-centroids": "malicious server: broadcasts crafted centres (slabs by binary search) until each of the "
                         "target client's cells holds one record; reads per-client sums",
    "model-inconsistency": "malicious server: sends the target client different centres from the others "
                           "(Pasquini et al. 2022) to single it out inside a secure sum",
    "active-aggregate-differencing": "malicious server: samples contributor sets S and S minus the target in one "
                                     "broadcast and subtracts the two secure sums",
    "sybil": "malicious server with sybil clients of known inputs that fill a secure round beside the target",
    MEMBERSHIP: "sees only the released centres and holds candidate records: held-out non-members and as many "
                "training members; score = minus the distance to the nearest centre",
    POISONING: "10% of the clients malicious (adaptive: every lie inside the range checks); an integrity attack, "
               "tabled as centre displacement, utility left and the fraction detected",
    POISONING_RANGE: "10% of the clients malicious, coordinate sums scaled 10,000 times beyond the box; what "
                     "validated aggregation detects and excludes (tabled like the adaptive attack)",
    AUDIT: "distinguishing game on one DWF round through the stack's real GaussianDP layer: a canary at full "
           "sensitivity alone in its cell, the auditor sees the noised aggregate (a distributed layer is audited "
           "as its central equivalent); Clopper-Pearson lower bound at 95% confidence",
}

#: who adds the noise in each DP family of the benchmark's stacks (the privacy-utility captions)
FAMILY = {
    "dp-local": "every client noises its own message; no party is trusted",
    "dp-central": "the server noises the decoded sum, so it still sees the clients' plaintext messages",
    "dp+masking": "every client adds a noise share, summed under pairwise masking: the server sees only the noised sum",
    "dp+paillier": "the same noise shares summed under Paillier encryption",
    "recommended": "distributed DP + MinClusterSize(2) + ParticipationCap(20) + masking",
}

#: stack family of a DP stack label: "dp-local(eps=0.5)" -> "dp-local", "dp(eps=1)+masking" -> "dp+masking"
_EPS_RE = re.compile(r"\(eps=[^)]*\)")


def _num(v) -> float:
    if v is None or v == "":
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def mean_se(values) -> tuple[float, float, int]:
    """(mean, standard error of the mean, n) of the finite values; se = s / sqrt(n), NaN for
    n = 1 (one seed has no standard error)."""
    v = np.asarray([x for x in (_num(x) for x in values) if np.isfinite(x)])
    if len(v) == 0:
        return math.nan, math.nan, 0
    se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else math.nan
    return float(v.mean()), se, len(v)


def summarise(rows) -> list[dict]:
    """One dict per (dataset, algorithm, stack, attack), in first-seen order: ``seeds``,
    ``ok_seeds`` (seeds with status ok), ``status`` (ok / the not-applicable reason / the
    first error), ``<col>_mean`` and ``<col>_se`` for the numeric columns (se NaN with one
    seed), ``records_recovered_sum`` / ``n_records_sum`` over the ok seeds."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(str(r[k]) for k in GROUP), []).append(r)
    out = []
    for key, rs in groups.items():
        status = [str(r.get("status", "")) for r in rs]
        bad = [s for s in status if s != "ok"]
        ok = [r for r in rs if str(r.get("status", "")) == "ok"]
        s = {**dict(zip(GROUP, key)), "seeds": len(rs), "ok_seeds": len(ok), "status": bad[0] if bad else "ok",
             "status_count": f"{len(bad)}/{len(rs)}" if bad else ""}
        for c in NUMERIC:
            m, se, _ = mean_se(r.get(c) for r in ok)
            s[f"{c}_mean"], s[f"{c}_se"] = m, se
        rec = [(_num(r.get("records_recovered")), _num(r.get("n_records"))) for r in ok]
        rec = [(a, b) for a, b in rec if np.isfinite(a) and np.isfinite(b)]
        s["records_recovered_sum"] = float(sum(a for a, _ in rec)) if rec else math.nan
        s["n_records_sum"] = float(sum(b for _, b in rec)) if rec else math.nan
        out.append(s)
    return out


def write_summary_csv(path, summary) -> None:
    cols = (list(GROUP) + ["seeds", "ok_seeds", "status"] + [f"{c}_{x}" for c in NUMERIC for x in ("mean", "se")]
            + ["records_recovered_sum", "n_records_sum"])
    with Path(path).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for s in summary:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) and np.isfinite(v) else ("" if isinstance(v, float)
                                                                                          else v))
                        for k, v in s.items()})


# ------------------------------------------------------------------ ordering and classification
def stack_epsilon(specs) -> float | None:
    """The smallest target epsilon of a stack's DP layers, None without DP."""
    from securefkm.specs import layer_specs

    e = [float(s["epsilon"]) for s in layer_specs(specs) if s.name == "dp"]
    return min(e) if e else None


def stack_order(stacks: dict) -> list[str]:
    """Stacks without DP in configuration order (none first), then DP stacks from the
    largest epsilon (weakest) to the smallest; ties keep configuration order."""
    plain = [k for k, v in stacks.items() if stack_epsilon(v) is None]
    dp = sorted((k for k, v in stacks.items() if stack_epsilon(v) is not None), key=lambda k: -stack_epsilon(stacks[k]))
    return plain + dp


def stack_family(label: str) -> str:
    """The DP family a stack label belongs to: its label without the ``(eps=...)`` part."""
    return _EPS_RE.sub("", label)


def cell_state(s: dict) -> str:
    """"ok" (numbers from at least one seed), "refused" (the stack refused the algorithm, or
    its participation cap ended the fit before it had centres), "n/a" (the attack does not
    apply) or "error"."""
    if s["ok_seeds"] > 0:
        return "ok"
    st = s["status"]
    if st.startswith("not applicable: the stack"):
        return "refused"
    if st.startswith("not applicable"):
        return "n/a"
    return "error"


# ------------------------------------------------------------------ plots
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


#: fixed colour scales: (colour map, vmin, vmax); the same in every panel and every run
SCALES = {"fraction_recovered": ("Reds", 0.0, 1.0), "membership_advantage": ("Blues", 0.0, 1.0)}
_NA, _REFUSED = "#e6e6e6", "#c8c8c8"


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(max_cols, max(1, n))
    return int(math.ceil(n / cols)), cols


def _fraction_text(s: dict) -> str:
    a, b = s["records_recovered_sum"], s["n_records_sum"]
    if not (np.isfinite(a) and np.isfinite(b)):
        return "-"
    return f"{a:.0f}/{b:.0f}"


def leakage_figure(summary, dataset: str, algorithms: list[str], stacks: list[str], attacks: list[str]):
    """The matplotlib figure of one data set's records-recovered grids (one per algorithm):
    cells ``recovered/attacked`` over the seeds, colour = that fraction on the fixed 0-1
    scale, refused fits hatched, attacks that do not apply grey."""
    plt = _plt()
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    cmap_name, vmin, vmax = SCALES["fraction_recovered"]
    cmap, norm = plt.get_cmap(cmap_name), Normalize(vmin, vmax)
    by = {(s["algorithm"], s["stack"], s["attack"]): s for s in summary if s["dataset"] == dataset}
    nr, nc = _grid(len(algorithms))
    w = 0.66 * max(1, len(attacks)) + 0.4
    fig, axes = plt.subplots(nr, nc, figsize=(w * nc + 2.2, (0.24 * len(stacks) + 1.2) * nr + 0.5), squeeze=False,
                             layout="constrained")
    for k, alg in enumerate(algorithms):
        ax = axes[k // nc][k % nc]
        M = np.full((len(stacks), len(attacks)), np.nan)
        for i, st in enumerate(stacks):
            for j, at in enumerate(attacks):
                s = by.get((alg, st, at))
                state = "missing" if s is None else cell_state(s)
                if state == "ok" and np.isfinite(s["n_records_sum"]) and s["n_records_sum"] > 0:
                    M[i, j] = s["records_recovered_sum"] / s["n_records_sum"]
                    txt = _fraction_text(s)
                    ax.text(j, i, txt, ha="center", va="center", fontsize=6,
                            color="white" if M[i, j] > 0.55 else "black")
                    continue
                face = _REFUSED if state == "refused" else _NA
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=face, edgecolor="white",
                                       hatch="///" if state == "refused" else None, lw=0.5))
                ax.text(j, i, {"refused": "refused", "error": "error", "missing": "-"}.get(state, "n/a"),
                        ha="center", va="center", fontsize=5.5, color="#b00000" if state == "error" else "#555555")
        ax.imshow(np.ma.masked_invalid(M), cmap=cmap, norm=norm, aspect="auto")
        ax.set_xlim(-0.5, len(attacks) - 0.5)
        ax.set_ylim(len(stacks) - 0.5, -0.5)
        ax.set_xticks(range(len(attacks)), [a.replace("-", "-\n") for a in attacks], fontsize=6, rotation=0)
        ax.set_yticks(range(len(stacks)), stacks if k % nc == 0 else [""] * len(stacks), fontsize=6)
        ax.set_title(alg, fontsize=8)
    for k in range(len(algorithms), nr * nc):
        axes[k // nc][k % nc].set_visible(False)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    cb = fig.colorbar(sm, ax=axes.ravel().tolist(), fraction=0.03, pad=0.01, aspect=40)
    cb.set_label("fraction of the attacked records recovered exactly (fixed scale 0-1)", fontsize=7)
    cb.ax.tick_params(labelsize=6)
    fig.suptitle(f"{dataset}: records recovered / records attacked", fontsize=9)
    return fig


def membership_figure(summary, dataset: str, algorithms: list[str], stacks: list[str], chance: dict | None = None):
    """Stack x algorithm for one data set: colour = membership advantage on its own fixed
    0-1 scale, text = AUC (and the advantage); a star where the AUC lies outside the
    no-signal interval of ``chance`` (:func:`attacks.membership.chance_levels`)."""
    plt = _plt()
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    cmap_name, vmin, vmax = SCALES["membership_advantage"]
    cmap, norm = plt.get_cmap(cmap_name), Normalize(vmin, vmax)
    by = {(s["algorithm"], s["stack"]): s for s in summary if s["dataset"] == dataset and s["attack"] == MEMBERSHIP}
    M = np.full((len(stacks), len(algorithms)), np.nan)
    fig, ax = plt.subplots(figsize=(0.95 * len(algorithms) + 2.6, 0.3 * len(stacks) + 1.4), layout="constrained")
    for i, st in enumerate(stacks):
        for j, alg in enumerate(algorithms):
            s = by.get((alg, st))
            state = "missing" if s is None else cell_state(s)
            if state == "ok":
                M[i, j] = s["membership_advantage_mean"]
                auc = s["membership_auc_mean"]
                c = (chance or {}).get(s["ok_seeds"])
                star = "*" if c and not (c["auc_low"] <= auc <= c["auc_high"]) else ""
                ax.text(j, i, f"AUC {auc:.2f}{star}\nadv {M[i, j]:.2f}", ha="center", va="center", fontsize=5.5,
                        color="white" if M[i, j] > 0.55 else "black")
                continue
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=_REFUSED if state == "refused" else _NA,
                                   edgecolor="white", hatch="///" if state == "refused" else None, lw=0.5))
            ax.text(j, i, {"refused": "refused", "error": "error", "missing": "-"}.get(state, "n/a"), ha="center",
                    va="center", fontsize=5.5, color="#b00000" if state == "error" else "#555555")
    im = ax.imshow(np.ma.masked_invalid(M), cmap=cmap, norm=norm, aspect="auto")
    ax.set_xlim(-0.5, len(algorithms) - 0.5)
    ax.set_ylim(len(stacks) - 0.5, -0.5)
    ax.set_xticks(range(len(algorithms)), algorithms, fontsize=6, rotation=30, ha="right")
    ax.set_yticks(range(len(stacks)), stacks, fontsize=6)
    cb = fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    cb.set_label("membership advantage (fixed scale 0-1)", fontsize=7)
    cb.ax.tick_params(labelsize=6)
    ax.set_title(f"{dataset}: membership inference on the released centres", fontsize=9)
    return fig


def _eps_axis(ax, eps_values):
    ax.set_xscale("log")
    if eps_values:
        lo, hi = min(eps_values), max(eps_values)
        ax.set_xlim(lo / 1.6, hi * 1.6)
        ax.set_xticks(sorted(set(eps_values)), [f"{e:g}" for e in sorted(set(eps_values))], fontsize=6)
        ax.minorticks_off()


def privacy_utility_figure(summary, dataset: str, algorithms: list[str], stacks: dict):
    """Utility against the target epsilon, one subplot per algorithm, one line per DP family;
    the unprotected fit as a dashed line; refused fits as crosses in a "refused" strip under
    the axis (no utility is drawn for them); error bars only for points with several seeds."""
    plt = _plt()

    dp = [(st, stack_epsilon(v)) for st, v in stacks.items() if stack_epsilon(v) is not None]
    families = list(dict.fromkeys(stack_family(st) for st, _ in dp))
    eps_values = [e for _, e in dp]
    util, states = {}, {}
    for s in summary:
        if s["dataset"] == dataset and s["attack"] != AUDIT:
            states.setdefault((s["algorithm"], s["stack"]), []).append(cell_state(s))
            if np.isfinite(s["utility_mean"]):
                util.setdefault((s["algorithm"], s["stack"]), s)
    nr, nc = _grid(len(algorithms), 4)
    fig = plt.figure(figsize=(3.3 * nc + 0.4, 3.1 * nr + 0.8), layout="constrained")
    gs = fig.add_gridspec(2 * nr, nc, height_ratios=[4, 1] * nr)
    colours = plt.get_cmap("tab10")
    handles = {}
    for k, alg in enumerate(algorithms):
        r, c = 2 * (k // nc), k % nc
        ax = fig.add_subplot(gs[r, c])
        strip = fig.add_subplot(gs[r + 1, c], sharex=ax)
        ax.set_title(alg, fontsize=8)
        base = util.get((alg, "none"))
        if base is not None:
            h = ax.axhline(base["utility_mean"], ls="--", lw=1, color="grey")
            handles.setdefault("none (no protection)", h)
        refused_any = False
        for f_i, fam in enumerate(families):
            pts = sorted((e, st) for st, e in dp if stack_family(st) == fam)
            xs, ys, es, ref = [], [], [], []
            for e, st in pts:
                s = util.get((alg, st))
                if s is not None:
                    xs.append(e)
                    ys.append(s["utility_mean"])
                    many = s["ok_seeds"] > 1 and np.isfinite(s["utility_se"])
                    es.append(s["utility_se"] if many else 0.0)
                elif "refused" in states.get((alg, st), ()):
                    ref.append(e)
            colour = colours(f_i % 10)
            if xs:
                if any(es):
                    h = ax.errorbar(xs, ys, yerr=es, marker="o", ms=3.5, lw=1, capsize=2, color=colour)
                else:
                    (h,) = ax.plot(xs, ys, marker="o", ms=3.5, lw=1, color=colour)
                handles.setdefault(fam, h)
            if ref:
                refused_any = True
                h = strip.scatter(ref, [f_i] * len(ref), marker="x", s=22, color=colour)
                handles.setdefault(fam, h)
        _eps_axis(ax, eps_values)
        ax.set_ylim(0, 1.08)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=6, labelbottom=False)
        if c == 0:
            ax.set_ylabel("utility", fontsize=7)
        strip.set_ylim(-0.7, max(len(families), 1) - 0.3)
        strip.set_yticks([])
        strip.set_ylabel("refused", fontsize=6, rotation=0, ha="right", va="center")
        strip.tick_params(labelsize=6)
        strip.set_xlabel("target epsilon (log scale)", fontsize=6)
        if not refused_any:
            strip.text(0.5, 0.5, "none refused", transform=strip.transAxes, ha="center", va="center", fontsize=6,
                       color="#777777")
        if not dp:
            ax.text(0.5, 0.5, "no DP stack in this configuration", transform=ax.transAxes, ha="center",
                    fontsize=7, color="#777777")
    fig.suptitle(f"{dataset}: utility against epsilon", fontsize=9)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=min(6, len(handles)),
                   fontsize=7, frameon=False)
    return fig


def audit_figure(rows, stacks: dict):
    """Audit lower bound against the claimed epsilon (left, with the line bound = claim) and
    their ratio against the target epsilon (right), one marker series per DP family; mean
    over seeds, error bars only with several seeds."""
    plt = _plt()
    by: dict = {}
    for r in rows:
        if r.get("attack") == AUDIT and str(r.get("status")) == "ok":
            by.setdefault(str(r["stack"]), []).append(r)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.0, 3.3), layout="constrained")
    colours = plt.get_cmap("tab10")
    fams = list(dict.fromkeys(stack_family(st) for st in by))
    eps_all, hi = [], 0.0
    for st, rs in by.items():
        e = stack_epsilon(stacks[st]) if st in stacks else _num(rs[0].get("epsilon"))
        claim = mean_se(r.get("claimed_epsilon") for r in rs)
        bound = mean_se(r.get("audit_epsilon") for r in rs)
        ratio = mean_se(_num(r.get("audit_epsilon")) / _num(r.get("claimed_epsilon")) for r in rs
                        if _num(r.get("claimed_epsilon")) > 0)
        col = colours(fams.index(stack_family(st)) % 10)
        lab = stack_family(st)
        se = (lambda t: t[1] if t[2] > 1 and np.isfinite(t[1]) else 0.0)
        a1.errorbar([claim[0]], [bound[0]], yerr=[se(bound)], marker="o", ms=4, color=col, capsize=2, ls="none",
                    label=lab if lab not in a1.get_legend_handles_labels()[1] else None)
        jitter = 1 + 0.05 * (fams.index(stack_family(st)) - (len(fams) - 1) / 2)  # families side by side
        a2.errorbar([e * jitter], [ratio[0]], yerr=[se(ratio)], marker="o", ms=4, color=col, capsize=2, ls="none")
        eps_all.append(e)
        hi = max(hi, claim[0], bound[0])
    if by:
        grid = np.array([0, hi * 1.1 + 1e-9])
        a1.plot(grid, grid, ls="--", color="grey", lw=1, label="bound = claim (tight)")
        a1.legend(fontsize=6, loc="upper left")
        _eps_axis(a2, eps_all)
    a1.set_xlabel("claimed epsilon of the audited round (layer's accountant)", fontsize=7)
    a1.set_ylabel("audit lower bound on epsilon", fontsize=7)
    a2.axhline(1.0, ls="--", color="grey", lw=1)
    a2.set_ylim(0, 1.1)
    a2.set_xlabel("target epsilon of the stack (log scale)", fontsize=7)
    a2.set_ylabel("audit bound / claimed epsilon", fontsize=7)
    for a in (a1, a2):
        a.tick_params(labelsize=6)
        a.grid(alpha=0.3)
    fig.suptitle("DP audit: a ratio above 1 would refute the accountant", fontsize=9)
    return fig


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


def _f(m, se=None, digits=3, n: int = 1) -> str:
    """``m`` to ``digits`` significant digits; `` &plusmn; se`` only when ``n`` > 1 seeds."""
    if not isinstance(m, float) or not np.isfinite(m):
        return "-"
    if se is None or n < 2 or not np.isfinite(se):
        return f"{m:.{digits}g}"
    return f"{m:.{digits}g} &plusmn; {se:.2g}"


_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:1500px}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}th{background:#eee}td.l,th.l{text-align:left}
tr.na td{color:#888}tr.refused td{color:#777;background:#f3f3f3}tr.err td{color:#b00}h2{border-bottom:1px solid #999}
figure{margin:10px 0 18px 0}figure img{max-width:100%}figcaption{font-size:13px;max-width:1100px;color:#222}
figcaption dl{margin:4px 0}figcaption dt{font-weight:bold;float:left;clear:left;margin-right:.4em}
section.panel{border:1px solid #bbb;border-radius:4px;padding:4px 14px;margin:16px 0}
code{background:#f4f4f4}.scroll{overflow-x:auto}th.sortable{cursor:pointer}th[aria-sort=ascending]::after{content:" \\25B2"}
th[aria-sort=descending]::after{content:" \\25BC"}tr.filters th{background:#f8f8f8}
tr.filters input,tr.filters select{width:100%;box-sizing:border-box;font-size:11px}
#cells td{white-space:nowrap}#cells td:last-child{white-space:normal;min-width:30em}"""

#: the sorting and filtering of the cell table (no library, no network)
_SCRIPT = r"""
(function () {
  var root = document.documentElement, errors = [];
  window.addEventListener('error', function (e) {
    errors.push(String(e.message)); root.setAttribute('data-script-errors', errors.join(' | '));
  });
  function init() {
    var t = document.getElementById('cells');
    if (!t) { return; }
    var head = t.tHead.rows[0], filt = t.tHead.rows[1], body = t.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var inputs = Array.prototype.slice.call(filt.querySelectorAll('input,select'));
    var q = document.getElementById('cells-q'), count = document.getElementById('cells-count');
    function num(tr, i) {
      var v = tr.cells[i].getAttribute('data-v');
      if (v === null || v === '') { return null; }
      var x = parseFloat(v); return isNaN(x) ? null : x;
    }
    function text(tr, i) { return tr.cells[i].textContent.toLowerCase(); }
    function sortBy(i, dir) {
      rows.sort(function (a, b) {
        var x = num(a, i), y = num(b, i);
        if (x === null && y === null) { var s = text(a, i), u = text(b, i); return dir * (s < u ? -1 : s > u ? 1 : 0); }
        if (x === null) { return 1; }
        if (y === null) { return -1; }
        return dir * (x - y);
      });
      rows.forEach(function (r) { body.appendChild(r); });
      for (var j = 0; j < head.cells.length; j++) {
        head.cells[j].setAttribute('aria-sort', j === i ? (dir > 0 ? 'ascending' : 'descending') : 'none');
      }
    }
    function match(tr, i, f) {
      if (!f) { return true; }
      var m = /^(<=|>=|<|>|=)\s*(-?[0-9.eE+-]+)$/.exec(f);
      if (m) {
        var x = num(tr, i), y = parseFloat(m[2]);
        if (x === null) { return false; }
        return m[1] === '<' ? x < y : m[1] === '>' ? x > y : m[1] === '<=' ? x <= y : m[1] === '>=' ? x >= y : x === y;
      }
      if (tr.cells[i].getAttribute('data-exact') !== null && inputs[i].tagName === 'SELECT') {
        return tr.cells[i].getAttribute('data-exact') === f;
      }
      return text(tr, i).indexOf(f.toLowerCase()) >= 0;
    }
    function apply() {
      var g = q.value.toLowerCase(), shown = 0;
      rows.forEach(function (r) {
        var ok = !g || r.textContent.toLowerCase().indexOf(g) >= 0;
        for (var i = 0; ok && i < inputs.length; i++) { ok = match(r, i, inputs[i].value.trim()); }
        r.hidden = !ok; if (ok) { shown++; }
      });
      count.textContent = shown + ' of ' + rows.length + ' rows shown';
    }
    for (var i = 0; i < head.cells.length; i++) {
      (function (i) {
        head.cells[i].classList.add('sortable');
        head.cells[i].setAttribute('aria-sort', 'none');
        head.cells[i].title = 'click to sort';
        head.cells[i].addEventListener('click', function () {
          sortBy(i, head.cells[i].getAttribute('aria-sort') === 'ascending' ? -1 : 1);
        });
      })(i);
    }
    inputs.forEach(function (el) { el.addEventListener('input', apply); el.addEventListener('change', apply); });
    q.addEventListener('input', apply);
    var h = {};
    (location.hash || '').replace(/^#/, '').split('&').forEach(function (kv) {
      var p = kv.split('='); if (p[0]) { h[decodeURIComponent(p[0])] = decodeURIComponent(p.slice(1).join('=')); }
    });
    if (h.q) { q.value = h.q; }
    inputs.forEach(function (el, i) {
      var key = 'f.' + head.cells[i].getAttribute('data-key'); if (h[key] !== undefined) { el.value = h[key]; }
    });
    if (h.sort) {
      for (var j = 0; j < head.cells.length; j++) {
        if (head.cells[j].getAttribute('data-key') === h.sort) { sortBy(j, h.order === 'desc' ? -1 : 1); }
      }
    }
    apply();
    root.setAttribute('data-table-ready', String(rows.length));
  }
  if (document.readyState === 'loading') { document.addEventListener('DOMContentLoaded', init); } else { init(); }
})();
"""


def _figure(kind: str, png: str, alt: str, caption: str, **attrs) -> str:
    e = html.escape
    extra = "".join(f" data-{k.replace('_', '-')}='{e(str(v))}'" for k, v in attrs.items())
    return (f"<figure class='fig' data-kind='{kind}'{extra}><img alt='{e(alt)}' src='data:image/png;base64,{png}'>"
            f"<figcaption>{caption}</figcaption></figure>")


def _threat_dl(attacks) -> str:
    e = html.escape
    return "<dl>" + "".join(f"<dt>{e(a)}</dt><dd>{e(THREAT.get(a, 'see the attack module'))}</dd>"
                            for a in attacks) + "</dl>"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-")


def membership_chance(candidates: dict | None, dataset: str, seeds_counts) -> dict:
    """{ok seeds -> :func:`attacks.membership.chance_levels`} for a data set whose
    membership attack had ``candidates[dataset]`` candidates per side (per seed: a list,
    whose mean is used)."""
    if not candidates or dataset not in candidates:
        return {}
    from .membership import chance_levels

    n = candidates[dataset]
    n = int(round(float(np.mean(n)))) if isinstance(n, (list, tuple)) else int(n)
    if n < 1:
        return {}
    return {s: chance_levels(n, n, n_runs=s, n_sim=2000, random_state=0) for s in sorted(set(seeds_counts)) if s > 0}


def write_report(path, rows, summary, cfg: dict, wall_seconds: float = math.nan,
                 membership_candidates: dict | None = None) -> None:
    """The one self-contained page (see the module docstring). ``membership_candidates``:
    {dataset label: candidates per side (or a list, one per seed)}; with it the membership
    captions give the no-signal interval of the AUC and the advantage."""
    e = html.escape
    stacks = stack_order(cfg["stacks"])
    algorithms = list(cfg["algorithms"])
    datasets = list(dict.fromkeys(s["dataset"] for s in summary if s["attack"] != AUDIT))
    attacks = [a for a in cfg["attacks"]]
    recovery = [a for a in attacks if a not in NOT_RECOVERY]
    n_seeds = len(cfg["seeds"])
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>securefkm attack benchmark</title>"
             f"<style>{_CSS}</style></head><body>",
             "<h1>securefkm attack/defence benchmark</h1>",
             f"<p>Command: <code>{e(cfg.get('command') or 'run_benchmark(config)')}</code><br>"
             f"Written {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; wall time of this call "
             f"{wall_seconds:.0f} s; seeds {e(str(cfg['seeds']))}; crypto={e(cfg['crypto'])}; "
             f"jobs={cfg['jobs']} ({e(cfg['backend'])}); {len(rows)} rows.</p>",
             "<p>Versions: " + ", ".join(f"{e(k)} {e(v)}" for k, v in versions().items()) + "</p>",
             "<p><b>How to read it.</b> Utility = best central k-means inertia / federated inertia on the training "
             "records (1 = as good as central k-means); ARI against the labels. A record counts as recovered when "
             "a claim lies within 1e-6 of the data range of it; recovered records are written "
             "<i>recovered/attacked</i> (attacked: every record for a passive attack, the target client's for an "
             "active one), summed over the seeds that ran. "
             + (f"{n_seeds} seeds: values in the table are mean &plusmn; standard error over seeds."
                if n_seeds > 1 else "One seed: no standard error exists and none is printed.")
             + " <i>refused</i>: the stack refused the algorithm (its own error text is in the table), so there is no "
             "fit, no utility and no attack; <i>n/a</i>: the attack does not apply. Panels: "
             + ", ".join(f"<a href='#ds-{_slug(d)}'>{e(d)}</a>" for d in datasets)
             + "; <a href='#audit'>DP audit</a>; <a href='#cells-section'>every cell</a>.</p>",
             "<h2>Threat models</h2><table id='threats'><tr><th class='l'>attack</th>"
             "<th class='l'>what the adversary sees and does</th></tr>"
             + "".join(f"<tr><td class='l'>{e(a)}</td><td class='l'>{e(THREAT.get(a, ''))}</td></tr>"
                       for a in [*attacks, AUDIT] if a in THREAT) + "</table>",
             "<h2>Configuration</h2><table id='stacks'><tr><th class='l'>stack</th><th>target epsilon</th>"
             "<th class='l'>layers</th></tr>"]
    for st in stacks:
        eps = stack_epsilon(cfg["stacks"][st])
        parts.append(f"<tr><td class='l'>{e(st)}</td><td>{'-' if eps is None else f'{eps:g}'}</td>"
                     f"<td class='l'><code>{e(str(cfg['stacks'][st]))}</code></td></tr>")
    parts.append("</table><p>Datasets: " + ", ".join(e(d) for d in datasets) + "<br>Algorithms: "
                 + ", ".join(e(a) for a in algorithms) + "</p>")
    stacks_cfg = {st: cfg["stacks"][st] for st in stacks}
    for ds in datasets:
        parts.append(f"<section class='panel' id='ds-{_slug(ds)}' data-dataset='{e(ds)}'><h2>{e(ds)}</h2>")
        if recovery:
            fig = leakage_figure(summary, ds, algorithms, stacks, recovery)
            cap = ("<b>Records recovered.</b> Per algorithm, stack x attack; each cell is <i>recovered/attacked</i> "
                   f"records summed over the seeds that ran, coloured by that fraction on one fixed 0-1 scale (the "
                   "same in every panel). Hatched <i>refused</i>: the stack refused the algorithm, no fit; grey "
                   "<i>n/a</i>: the attack does not apply. Threat models:" + _threat_dl(recovery))
            parts.append(_figure("leakage", _png(fig), f"records recovered, {ds}", cap, dataset=ds,
                                 scale="fraction_recovered:0-1"))
        if MEMBERSHIP in attacks:
            seeds_counts = [s["ok_seeds"] for s in summary if s["dataset"] == ds and s["attack"] == MEMBERSHIP]
            chance = membership_chance(membership_candidates, ds, seeds_counts)
            fig = membership_figure(summary, ds, algorithms, stacks, chance)
            parts.append(_figure("membership", _png(fig), f"membership inference, {ds}",
                                 _membership_caption(ds, chance, membership_candidates), dataset=ds,
                                 scale="membership_advantage:0-1"))
        fig = privacy_utility_figure(summary, ds, algorithms, stacks_cfg)
        fams = list(dict.fromkeys(stack_family(st) for st in stacks if stack_epsilon(cfg["stacks"][st]) is not None))
        fam_text = "; ".join(f"<code>{e(f)}</code>: {e(FAMILY.get(f, 'layers as in the configuration table'))}"
                             for f in fams)
        cap = ("<b>Privacy-utility.</b> Utility (mean over the seeds; error bars = standard error, drawn only where "
               "several seeds ran) against the stack's target epsilon on a log axis, one line per DP family"
               + (f" ({fam_text})" if fams else " (this configuration has no DP stack)")
               + ". The dashed line is the fit without protection. Crosses in the <i>refused</i> strip mark DP "
               "stacks that refused the algorithm: they have no utility and are not drawn as 0. DP is "
               "record-level: (epsilon, delta) bounds what any observer of the noised releases learns about one "
               "record; who that observer may be depends on the family.")
        parts.append(_figure("privacy-utility", _png(fig), f"privacy-utility, {ds}", cap, dataset=ds))
        parts.append("</section>")
    parts.append("<h2 id='audit'>DP audit: empirical lower bound beside the claimed epsilon</h2>")
    if any(r.get("attack") == AUDIT for r in rows):
        fig = audit_figure(rows, cfg["stacks"])
        cap = ("<b>DP audit.</b> Left: the audit's lower bound on epsilon against the epsilon the layer's "
               "accountant claims for the audited round; right: their ratio against the stack's target epsilon "
               "(mean over seeds, error bars only with several seeds). A bound is a statement that the "
               "mechanism spends <i>at least</i> that much with 95% confidence; a ratio above 1 would refute the "
               "accountant, a ratio below 1 refutes nothing (the audit is a lower bound, not a measurement). "
               f"Threat model: {e(THREAT[AUDIT])}. The one-run white-box audit of a whole fit "
               "(<code>attacks.audit_one_run</code>) is not among the benchmark rows; its figures are in the "
               "membership-and-audit documentation.")
        parts.append(_figure("audit", _png(fig), "DP audit", cap))
    parts.append(audit_table(rows, summary, stacks))
    parts.append("<h2 id='cells-section'>Every cell</h2>")
    parts.append("<div class='scroll'>" + cell_table(summary, cfg["stacks"]) + "</div>")
    parts.append(f"<script>{_SCRIPT}</script>")
    parts.append("</body></html>")
    Path(path).write_text("\n".join(parts))


def _membership_caption(ds: str, chance: dict, candidates: dict | None) -> str:
    e = html.escape
    txt = ("<b>Membership inference.</b> Per stack and algorithm, colour = membership advantage (max over "
           "thresholds of TPR - FPR) on its own fixed 0-1 scale, text = AUC and advantage (means over seeds). "
           f"Threat model: {e(THREAT[MEMBERSHIP])}. ")
    if chance:
        c1 = chance[min(chance)]
        n = c1["n_in"]
        bands = "; ".join(f"{k} seed{'s' if k > 1 else ''}: AUC in [{c['auc_low']:.2f}, {c['auc_high']:.2f}], "
                          f"advantage up to {c['advantage_high']:.2f} (mean {c['advantage_mean']:.2f})"
                          for k, c in sorted(chance.items()))
        txt += (f"<b>Chance level.</b> With {n} candidates per side an attack with no signal at all scores, "
                f"at 95%: {bands}. A star marks an AUC outside that interval; across many cells about one in 20 is "
                "starred by chance alone, so a lone star is not evidence of leakage. ")
    else:
        txt += "<b>Chance level.</b> The candidate counts were not given, so no no-signal interval is drawn. "
    txt += ("<b>Why the AUC sits at 0.5 without protection.</b> A member pulls its nearest centre towards itself "
            "by (x - c)/n<sub>cell</sub>; with a few centres over hundreds of records, n<sub>cell</sub> is large and "
            "the pull is far below the spread of distances between records, so members and held-out records "
            "(both drawn from the same clients) are equally close to the centres. The AUC then scatters around "
            "0.5 by sampling error alone (values below 0.5 included), and the advantage, a maximum over "
            "thresholds, is positive even without signal. This setting gives the distance attack no "
            "membership signal; it does leak when clusters are small (few records per centre). A stronger "
            "adversary, who knows the other training records and re-runs the algorithm (the likelihood-ratio "
            "attack, <code>MembershipInference(\"lira\")</code>), can separate members the distance attack "
            "cannot; the benchmark runs the distance attack only.")
    return txt


def audit_table(rows, summary, stacks) -> str:
    e = html.escape
    out = ["<table id='audit-table'><tr><th class='l'>stack</th><th>seeds</th><th>target epsilon</th>"
           "<th>spent in fits (mean)</th><th>claimed for the audited round</th><th>audit lower bound</th>"
           "<th>bound / claimed</th><th class='l'>status</th></tr>"]
    for st in stacks:
        aud = [s for s in summary if s["stack"] == st and s["attack"] == AUDIT]
        if not aud:
            continue
        a = aud[0]
        n = a["ok_seeds"]
        spent = [s["epsilon_mean"] for s in summary if s["stack"] == st and s["attack"] != AUDIT
                 and np.isfinite(s["epsilon_mean"])]
        claimed = a["claimed_epsilon_mean"]
        ratio = a["audit_epsilon_mean"] / claimed if claimed else math.nan
        out.append(f"<tr data-cell='-|gaussian-dp-round|{e(st)}|{AUDIT}'><td class='l'>{e(st)}</td><td>{n}</td>"
                   f"<td>{_f(a['epsilon_mean'])}</td><td>{_f(float(np.mean(spent)) if spent else math.nan)}</td>"
                   f"<td>{_f(claimed)}</td><td>{_f(a['audit_epsilon_mean'], a['audit_epsilon_se'], n=n)}</td>"
                   f"<td>{_f(ratio)}</td><td class='l'>{e(a['status'])}</td></tr>")
    if len(out) == 1:
        return "<p>No DP stack in this configuration: nothing to audit.</p>"
    out.append("</table>")
    return "\n".join(out)


#: the cell table's columns: (key, header, left-aligned text column)
CELL_COLUMNS = (
    ("dataset", "dataset", True), ("algorithm", "algorithm", True), ("stack", "stack", True),
    ("attack", "attack", True), ("state", "state", True), ("target_eps", "target epsilon", False),
    ("seeds", "seeds", False), ("recovered", "recovered / attacked", False), ("fraction", "fraction", False),
    ("clients", "clients exposed", False), ("precision", "precision", False), ("auc", "membership AUC", False),
    ("advantage", "membership advantage", False), ("poison_move", "poisoning: centre moved", False),
    ("poison_utility", "poisoning: utility left", False), ("poison_detected", "poisoning: detected", False),
    ("utility", "utility", False), ("ari", "ARI", False), ("eps_spent", "epsilon spent", False),
    ("status", "status", True),
)


def _td(value, text=None, left=False, exact=None) -> str:
    e = html.escape
    v = value if isinstance(value, float) and np.isfinite(value) else None
    attrs = "" if v is None else f" data-v='{v:.6g}'"
    if exact is not None:
        attrs += f" data-exact='{e(exact)}'"
    cls = " class='l'" if left else ""
    return f"<td{cls}{attrs}>{text if text is not None else e(str(value))}</td>"


def cell_table(summary, stacks: dict | None = None) -> str:
    """Every non-audit cell; a filter row under the headers (selects for the key columns,
    text boxes elsewhere: a substring, or ``>0.5`` / ``<=1`` / ``=0`` on numeric columns) and
    a global search box; the inline script sorts on a header click."""
    e = html.escape
    cells = [s for s in summary if s["attack"] != AUDIT]
    selects = ("dataset", "algorithm", "stack", "attack", "state")
    out = ["<p><label>Search every column: <input id='cells-q' type='search' size='40'></label> "
           f"<span id='cells-count'>{len(cells)} rows</span>. Click a header to sort; type <code>&gt;0</code>, "
           "<code>&lt;=0.5</code> or <code>=1</code> under a numeric header to filter by value, any text to "
           "filter by substring.</p>",
           "<table id='cells'><thead><tr>"
           + "".join(f"<th data-key='{k}' class='{'l' if left else ''}'>{e(h)}</th>" for k, h, left in CELL_COLUMNS)
           + "</tr><tr class='filters'>"]
    for k, _, _ in CELL_COLUMNS:
        if k in selects:
            vals = list(dict.fromkeys((cell_state(s) if k == "state" else s[k]) for s in cells))
            out.append(f"<th><select aria-label='filter {k}'><option value=''>all</option>"
                       + "".join(f"<option value='{e(v)}'>{e(v)}</option>" for v in vals) + "</select></th>")
        else:
            out.append(f"<th><input aria-label='filter {k}' size='6'></th>")
    out.append("</tr></thead><tbody>")
    for s in cells:
        state = cell_state(s)
        cls = {"n/a": "na", "refused": "refused", "error": "err"}.get(state, "ok")
        key = "|".join(s[k] for k in GROUP)
        n = s["ok_seeds"]
        eps = stack_epsilon(stacks[s["stack"]]) if stacks and s["stack"] in stacks else None
        frac = (s["records_recovered_sum"] / s["n_records_sum"] if np.isfinite(s["n_records_sum"])
                and s["n_records_sum"] > 0 else math.nan)
        status = e(s["status"]) + (f" ({s['status_count']} seeds)" if s["status_count"] else "")
        tds = [_td(s[k], left=True, exact=s[k]) for k in GROUP]
        tds += [_td(None, e(state), left=True, exact=state),
                _td(float(eps) if eps is not None else None, "-" if eps is None else f"{eps:g}"),
                _td(float(s["seeds"]), str(s["seeds"]) + (f" ({n} ok)" if state == "ok" and n != s["seeds"] else "")),
                _td(s["records_recovered_sum"], _fraction_text(s)),
                _td(frac, _f(frac)),
                _td(s["clients_exposed_mean"], _f(s["clients_exposed_mean"], s["clients_exposed_se"], n=n)),
                _td(s["precision_mean"], _f(s["precision_mean"])),
                _td(s["membership_auc_mean"], _f(s["membership_auc_mean"], s["membership_auc_se"], n=n)),
                _td(s["membership_advantage_mean"],
                    _f(s["membership_advantage_mean"], s["membership_advantage_se"], n=n)),
                _td(s["poison_displacement_mean"], _f(s["poison_displacement_mean"], s["poison_displacement_se"], n=n)),
                _td(s["poison_utility_mean"], _f(s["poison_utility_mean"], s["poison_utility_se"], n=n)),
                _td(s["poison_detected_mean"], _f(s["poison_detected_mean"])),
                _td(s["utility_mean"], _f(s["utility_mean"], s["utility_se"], n=n)),
                _td(s["ari_mean"], _f(s["ari_mean"], s["ari_se"], n=n)),
                _td(s["epsilon_mean"], _f(s["epsilon_mean"])),
                _td(None, status, left=True)]
        out.append(f"<tr class='{cls}' data-cell='{e(key)}'>" + "".join(tds) + "</tr>")
    out.append("</tbody></table>")
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
            elif at in (POISONING, POISONING_RANGE):  # how far the malicious clients moved a centre, utility left
                cells.append(f"move {s['poison_displacement_mean']:.3g}, utility {s['poison_utility_mean']:.2f}")
            else:
                cells.append(f"{s['records_recovered_mean']:.3g}")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {_f(u['utility_mean'])} | {_f(u['ari_mean'], digits=2)} | "
                     f"{_f(u['epsilon_mean'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
