"""The benchmark's HTML report: what a reviewer reads.

Fast tests build the page from hand-made rows (no fit) and check its structure; the slow test
opens a real benchmark page in headless Chromium and checks that the script runs and the
figures and the sortable table are there."""

import base64
import html
import math
import os
import re
import subprocess

import pytest

from attacks import html_report as hr

STACKS = {
    "none": [],
    "masking": ["masking"],
    "dp-central(eps=1)": [{"name": "dp", "epsilon": 1.0, "delta": 1e-5, "mode": "central"}],
    "dp-central(eps=4)": [{"name": "dp", "epsilon": 4.0, "delta": 1e-5, "mode": "central"}],
    "dp-local(eps=1)": [{"name": "dp", "epsilon": 1.0, "delta": 1e-5, "mode": "local"}],
}
ATTACKS = ["small-cluster", "crafted-centroids", "membership", "poisoning"]
REFUSED = "not applicable: the stack refuses the algorithm: kfed sends set-fields"


def _rows(seeds=(0,)):
    """Two data sets of different sizes (blobs: 101 records, wine: 18), two algorithms;
    kfed is refused by every stack but none."""
    rows = []
    sizes = {"blobs/non-iid": 101, "wine/iid": 18}
    for ds, n in sizes.items():
        for alg in ("dwf", "kfed"):
            for st in STACKS:
                for seed in seeds:
                    base = {"dataset": ds, "algorithm": alg, "stack": st, "seed": seed}
                    refused = alg == "kfed" and st != "none"
                    eps = STACKS[st][0]["epsilon"] if st.startswith("dp") else None
                    utility = 0.9 if eps is None else 0.5 + 0.1 * eps + 0.01 * seed
                    for at in ATTACKS:
                        r = {**base, "attack": at}
                        if refused:
                            r["status"] = REFUSED
                        elif at == "crafted-centroids" and st == "masking":
                            r["status"] = "not applicable: reads per-client cell sums"
                        else:
                            r.update(status="ok", utility=utility, ari=0.8, epsilon=eps)
                            if at == "membership":
                                r.update(membership_auc=0.47 + 0.01 * seed, membership_advantage=0.2)
                            elif at == "poisoning":
                                r.update(poison_displacement=3.0, poison_utility=0.5, poison_detected=0.0)
                            else:
                                k = n if at == "crafted-centroids" else n // 10
                                r.update(records_recovered=k, n_records=n, fraction_recovered=k / n,
                                         clients_exposed=0.5)
                        rows.append(r)
    for st in ("dp-central(eps=1)", "dp-central(eps=4)", "dp-local(eps=1)"):
        for seed in seeds:
            eps = STACKS[st][0]["epsilon"]
            rows.append({"dataset": "-", "algorithm": "gaussian-dp-round", "stack": st, "attack": hr.AUDIT,
                         "seed": seed, "status": "ok", "epsilon": eps, "audit_epsilon": 0.3 * eps,
                         "claimed_epsilon": eps})
    return rows


def _cfg(seeds=(0,)):
    return {"stacks": STACKS, "algorithms": ["dwf", "kfed"], "attacks": ATTACKS, "seeds": list(seeds),
            "crypto": "ideal", "jobs": 1, "backend": "processes", "command": "test"}


def _page(tmp_path, seeds=(0,), candidates=None):
    rows = _rows(seeds)
    summary = hr.summarise(rows)
    path = tmp_path / "report.html"
    hr.write_report(path, rows, summary, _cfg(seeds), wall_seconds=1.0,
                    membership_candidates=candidates if candidates is not None else {"blobs/non-iid": 10,
                                                                                     "wine/iid": 2})
    return path.read_text(), rows, summary


def _sections(page):
    return dict(re.findall(r"<section class='panel' id='[^']*' data-dataset='([^']*)'>(.*?)</section>", page, re.S))


def test_one_panel_per_dataset_with_its_figures_and_captions(tmp_path):
    page, _, _ = _page(tmp_path)
    panels = _sections(page)
    assert set(panels) == {"blobs/non-iid", "wine/iid"}
    for ds, body in panels.items():
        kinds = re.findall(r"<figure class='fig' data-kind='([^']*)' data-dataset='([^']*)'", body)
        assert kinds == [("leakage", ds), ("membership", ds), ("privacy-utility", ds)]
        caps = re.findall(r"<figcaption>(.*?)</figcaption>", body, re.S)
        assert len(caps) == 3
        # the threat model of every attack drawn in the leakage figure is in its caption
        for at in ("small-cluster", "crafted-centroids"):
            assert f"<dt>{at}</dt><dd>{html.escape(hr.THREAT[at])}</dd>" in caps[0]
        assert "Threat model" in caps[1] and "released centres" in caps[1]
        assert "observer" in caps[2]
        imgs = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", body)
        assert len(imgs) == 3 and all(base64.b64decode(i)[:4] == b"\x89PNG" for i in imgs)
    # the audit figure has its caption and says what the audit assumes
    audit = re.search(r"<figure class='fig' data-kind='audit'.*?<figcaption>(.*?)</figcaption>", page, re.S)
    assert audit and html.escape(hr.THREAT[hr.AUDIT]) in audit.group(1)
    assert "src='http" not in page and "<link" not in page and "src=\"http" not in page


def test_fractions_with_denominators_per_dataset(tmp_path):
    page, _, _ = _page(tmp_path, seeds=(0, 1))
    # the table writes recovered/attacked summed over the seeds, each data set with its own size
    rows = {m[0]: m[1] for m in re.findall(r"<tr class='ok' data-cell='([^']*)'>(.*?)</tr>", page)}
    assert "<td data-v='20'>20/202</td>" in rows["blobs/non-iid|dwf|none|small-cluster"]
    assert "<td data-v='2'>2/36</td>" in rows["wine/iid|dwf|none|small-cluster"]
    assert "<td data-v='36'>36/36</td>" in rows["wine/iid|dwf|none|crafted-centroids"]
    # no average of counts over data sets of different sizes anywhere on the page
    assert "59.5" not in page
    summary = hr.summarise(_rows())
    fig = hr.leakage_figure(summary, "wine/iid", ["dwf", "kfed"], list(STACKS), ["small-cluster", "crafted-centroids"])
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "1/18" in texts and "18/18" in texts and "refused" in texts and "n/a" in texts
    assert not any(re.fullmatch(r"\d+/101", t) for t in texts)  # only this data set's records


def test_colour_scales_are_fixed_and_separate(tmp_path):
    summary = hr.summarise(_rows())
    stacks = list(STACKS)
    # a panel whose largest fraction is 0.1 uses the same 0-1 scale as one with a fraction of 1
    low = [s for s in summary if s["attack"] != "crafted-centroids"]
    for sm in (summary, low):
        fig = hr.leakage_figure(sm, "blobs/non-iid", ["dwf", "kfed"], stacks, ["small-cluster", "crafted-centroids"])
        ims = [im for ax in fig.axes for im in ax.get_images()]
        assert ims and all((im.norm.vmin, im.norm.vmax) == (0.0, 1.0) for im in ims)
        assert {im.get_cmap().name for im in ims} == {"Reds"}
    fig = hr.membership_figure(summary, "blobs/non-iid", ["dwf", "kfed"], stacks)
    (im,) = fig.axes[0].get_images()
    assert (im.norm.vmin, im.norm.vmax) == (0.0, 1.0) and im.get_cmap().name == "Blues"
    page, _, _ = _page(tmp_path)
    assert page.count("data-scale='fraction_recovered:0-1'") == 2
    assert page.count("data-scale='membership_advantage:0-1'") == 2


def test_refused_cells_are_marked_and_not_drawn_at_zero(tmp_path):
    page, _, summary = _page(tmp_path)
    refused = re.findall(r"<tr class='refused' data-cell='([^']*)'>", page)
    assert "blobs/non-iid|kfed|masking|small-cluster" in refused
    assert all("|kfed|" in c and "|none|" not in c for c in refused)
    assert "<td class='l' data-exact='refused'>refused</td>" in page
    fig = hr.privacy_utility_figure(summary, "blobs/non-iid", ["dwf", "kfed"], STACKS)
    titled = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    kfed = titled["kfed"]
    # kfed is refused by every DP stack: no utility point at all (none drawn at 0) ...
    ys = [y for line in kfed.get_lines() if line.get_linestyle() != "--" for y in line.get_ydata()]
    assert ys == []
    # ... but three crosses in the refused strip under it
    strip = fig.axes[fig.axes.index(kfed) + 1]
    xs = sorted(x for col in strip.collections for x, _ in col.get_offsets())
    assert xs == [1.0, 1.0, 4.0]
    # dwf: the utility at each epsilon, on a log epsilon axis
    dwf = titled["dwf"]
    assert dwf.get_xscale() == "log"
    pts = sorted((x, round(y, 6)) for line in dwf.get_lines() if line.get_linestyle() != "--"
                 for x, y in zip(line.get_xdata(), line.get_ydata()))
    assert pts == [(1.0, 0.6), (1.0, 0.6), (4.0, 0.9)]


def test_no_plus_minus_with_one_seed_and_error_bars_only_with_several(tmp_path):
    page, _, summary = _page(tmp_path, seeds=(0,))
    assert "&plusmn;" not in page.split("<h2>Threat models</h2>")[1]
    assert all(math.isnan(s["utility_se"]) for s in summary)
    fig = hr.privacy_utility_figure(summary, "blobs/non-iid", ["dwf"], STACKS)
    from matplotlib.container import ErrorbarContainer

    assert not any(isinstance(c, ErrorbarContainer) for ax in fig.axes for c in ax.containers)
    page2, _, summary2 = _page(tmp_path, seeds=(0, 1))
    assert "&plusmn;" in page2
    row = re.search(r"data-cell='blobs/non-iid\|dwf\|dp-central\(eps=1\)\|membership'>(.*?)</tr>", page2).group(1)
    assert "0.475 &plusmn; 0.005" in row
    fig = hr.privacy_utility_figure(summary2, "blobs/non-iid", ["dwf"], STACKS)
    assert any(isinstance(c, ErrorbarContainer) for ax in fig.axes for c in ax.containers)


def test_membership_caption_gives_the_chance_level(tmp_path):
    page, _, _ = _page(tmp_path)
    body = _sections(page)["blobs/non-iid"]
    cap = re.findall(r"<figcaption>(.*?)</figcaption>", body, re.S)[1]
    assert "With 10 candidates per side" in cap and "Why the AUC sits at 0.5" in cap
    from attacks.membership import chance_levels

    c = chance_levels(10, 10, n_sim=2000, random_state=0)
    assert f"AUC in [{c['auc_low']:.2f}, {c['auc_high']:.2f}]" in cap
    page, _, _ = _page(tmp_path, candidates={})
    assert "candidate counts were not given" in page


def test_table_is_sortable_and_filterable_markup(tmp_path):
    page, rows, summary = _page(tmp_path)
    assert page.count("<script>") == 1 and "data-table-ready" in page
    table = re.search(r"<table id='cells'>(.*?)</table>", page, re.S).group(1)
    keys = re.findall(r"<th data-key='([^']*)'", table)
    assert keys == [k for k, _, _ in hr.CELL_COLUMNS]
    filters = re.search(r"<tr class='filters'>(.*?)</tr>", table, re.S).group(1)
    assert filters.count("<select") == 5 and filters.count("<input") == len(keys) - 5
    body = re.findall(r"<tr class='[^']*' data-cell='[^']*'>(.*?)</tr>", table)
    assert len(body) == len([s for s in summary if s["attack"] != hr.AUDIT])
    assert all(b.count("<td") == len(keys) for b in body)
    assert "id='cells-q'" in page and "id='cells-count'" in page


def test_stack_family_and_epsilon():
    assert hr.stack_family("dp-local(eps=0.5)") == "dp-local"
    assert hr.stack_family("dp(eps=1)+masking") == "dp+masking"
    assert hr.stack_epsilon(STACKS["dp-central(eps=4)"]) == 4.0 and hr.stack_epsilon([]) is None
    assert hr.stack_order(STACKS) == ["none", "masking", "dp-central(eps=4)", "dp-central(eps=1)", "dp-local(eps=1)"]


# ------------------------------------------------------------------ in a real browser
CHROMIUM = "/usr/bin/chromium"


def _chromium(url, *extra):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--enable-logging=stderr", "--v=0", *extra, "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian Chromium at /usr/bin/chromium "
                    "(apt-get install -y chromium chromium-driver)")
def test_quick_report_loads_in_headless_chromium(tmp_path):
    from attacks.bench import quick_config, run_benchmark

    cfg = quick_config(str(tmp_path / "bench"))
    cfg.progress = False
    run_benchmark(cfg)
    page = tmp_path / "bench" / "report.html"
    url = page.resolve().as_uri()
    res = _chromium(url)
    dom, log = res.stdout, res.stderr
    assert res.returncode == 0, log[-2000:]
    console = [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not [line for line in console if "rror" in line or "Uncaught" in line], console
    html_tag = re.search(r"<html[^>]*>", dom).group(0)
    assert "data-script-errors" not in html_tag, html_tag
    n_cells = len(re.findall(r"<tr class='[^']*' data-cell='", page.read_text().split("<table id='cells'>")[1]))
    assert f'data-table-ready="{n_cells}"' in html_tag
    # the script made every header sortable and counted the rows
    head = re.search(r"<table id=\"cells\">\s*<thead>\s*<tr>(.*?)</tr>", dom, re.S).group(1)
    assert len(re.findall(r'<th [^>]*class="[^"]*\bsortable\b', head)) == len(hr.CELL_COLUMNS)
    assert f"{n_cells} of {n_cells} rows shown" in dom
    # figures: one panel per data set (three figures each) and the audit figure, all decoded PNGs
    assert dom.count('<section class="panel"') == len(cfg.datasets)
    assert len(re.findall(r'<figure class="fig" data-kind="(leakage|membership|privacy-utility|audit)"', dom)) == 4
    # a sort and a filter from the URL fragment: utility descending, only dwf, only ok rows
    res = _chromium(url + "#sort=utility&order=desc&f.algorithm=dwf&f.state=ok")
    dom = res.stdout
    assert "data-script-errors" not in re.search(r"<html[^>]*>", dom).group(0)
    body = dom.split('<table id="cells">')[1].split("</table>")[0]
    visible = [r for r in re.findall(r"<tr (class=\"[^\"]*\" data-cell=\"[^\"]*\"[^>]*)>(.*?)</tr>", body, re.S)
               if "hidden" not in r[0]]
    assert visible and all("|dwf|" in r[0] for r in visible)
    col = [k for k, _, _ in hr.CELL_COLUMNS].index("utility")
    utils = [float(re.findall(r"<td([^>]*)>", row)[col].split('data-v="')[1].split('"')[0]) for _, row in visible]
    assert utils == sorted(utils, reverse=True) and len(utils) == len(visible)
    assert re.search(r'<th data-key="utility"[^>]*aria-sort="descending"', dom)
