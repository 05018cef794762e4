"""The asv dashboard renders the stored history of the ratio benchmarks (issue 15).

`asv publish` builds the site from asv_bench/results/, a local HTTP server on 127.0.0.1 serves
it, and headless Chromium (Debian's `chromium`) opens it.  A probe script in the page reads
flot's plotted data for every `track_*` benchmark's graph (asv_bench/dashboard.py says how).
The expected number of points is counted here, independently, from the results JSON files.

It needs asv, Chromium and (once, cached) PyPI for the JavaScript libraries the site would
otherwise take from CDNs.  Without them it skips, except under FASTADAM_REQUIRE_DASHBOARD=1
(set by .ci/run), where a missing piece is a failure: CI must not skip it silently.
"""

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "asv_bench")
RESULTS = os.path.join(BENCH, "results")
VENDOR = os.path.join(os.path.expanduser("~"), ".cache", "fastadam", "asv-vendor")
REQUIRED = os.environ.get("FASTADAM_REQUIRE_DASHBOARD") == "1"

if not os.path.exists(os.path.join(BENCH, "dashboard.py")) or not os.path.isdir(
        os.path.join(REPO, ".git")):
    pytest.skip("not a source checkout (the wheel's test run has no asv_bench/ or git history)",
                allow_module_level=True)


def _missing(what):
    if REQUIRED:
        pytest.fail(f"FASTADAM_REQUIRE_DASHBOARD=1 but {what}")
    pytest.skip(what)


def _load_dashboard():
    spec = importlib.util.spec_from_file_location("fastadam_asv_dashboard",
                                                  os.path.join(BENCH, "dashboard.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stored_points():
    """{benchmark: number of finite stored values}, over every machine and commit stored."""
    counts = {}
    for machine in sorted(os.listdir(RESULTS)):
        folder = os.path.join(RESULTS, machine)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".json") or name == "machine.json":
                continue
            with open(os.path.join(folder, name)) as f:
                data = json.load(f)
            column = data["result_columns"].index("result")
            for bench, row in data["results"].items():
                values = row[column] if row[column] is not None else []
                finite = sum(1 for v in values
                             if isinstance(v, (int, float)) and math.isfinite(v))
                counts[bench] = counts.get(bench, 0) + finite
    return counts


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if importlib.util.find_spec("asv") is None:
        _missing("asv is not installed (pip install -e '.[test]')")
    dashboard = _load_dashboard()
    if dashboard.find_chromium() is None:
        _missing("Chromium is not installed (Debian: apt-get install chromium)")
    vendor = VENDOR
    try:
        dashboard.fetch_vendor(vendor)
    except (subprocess.CalledProcessError, OSError) as exc:
        _missing(f"could not fetch asv's JavaScript libraries from PyPI: {exc}")
    html = str(tmp_path_factory.mktemp("asv-html"))
    try:
        dashboard.publish(results_dir=RESULTS, html_dir=html, offline=True, vendor_dir=vendor)
    except dashboard.HistoryUnavailable as exc:
        # not an install problem that CI could fix: the clone itself has no history to show
        pytest.skip(str(exc))
    shots = str(tmp_path_factory.mktemp("asv-shots"))
    report, paths = dashboard.check(html, screenshot_dir=shots)
    keep = os.environ.get("FASTADAM_DASHBOARD_SCREENSHOTS")
    if keep:
        os.makedirs(keep, exist_ok=True)
        for path in paths:
            shutil.copy(path, keep)
    return html, report, paths


def test_results_are_stored_for_the_ratio_benchmarks():
    counts = stored_points()
    tracked = {b: n for b, n in counts.items() if ".track_" in b}
    assert tracked, f"no track_* results stored under {RESULTS}"
    assert any(n >= 2 for n in tracked.values()), "no ratio benchmark has a history (>= 2 points)"


def test_every_ratio_graph_has_its_stored_points(site):
    _, report, _ = site
    assert report["errors"] == [], report["errors"]
    counts = stored_points()
    expected = {b: n for b, n in counts.items() if ".track_" in b and n > 0}
    assert expected
    for bench, n in sorted(expected.items()):
        assert bench in report["graphs"], f"{bench}: the dashboard has no graph for it"
        assert report["graphs"][bench] == n, (
            f"{bench}: {report['graphs'][bench]} points drawn, {n} stored")


def test_summary_grid_draws_thumbnails(site):
    _, report, _ = site
    drawn = {b: n for b, n in report["thumbnails"].items() if n}
    assert drawn, "no thumbnail on the summary grid has a plotted line"


def test_the_site_loads_no_library_from_the_internet(site):
    html, _, _ = site
    with open(os.path.join(html, "index.html")) as f:
        text = f.read()
    assert "cdnjs.cloudflare.com" not in text and "code.jquery.com" not in text
    assert 'src="vendor/jquery-3.3.1.min.js"' in text


def test_screenshots_are_real_images(site):
    _, _, paths = site
    assert len(paths) == 3
    for path in paths:
        with open(path, "rb") as f:
            head = f.read(24)
        assert head[:8] == b"\x89PNG\r\n\x1a\n", path
        width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        assert (width, height) == (1400, 1000), (path, width, height)
        assert os.path.getsize(path) > 20_000, f"{path}: too small to hold a drawn graph"


def test_dashboard_cli_check_exits_zero(tmp_path, site):
    # the command the README gives, on the same stored results
    out = subprocess.run([sys.executable, os.path.join(BENCH, "dashboard.py"), "check",
                          "--results-dir", RESULTS, "--html-dir", str(tmp_path / "html"),
                          "--vendor-dir", VENDOR],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "points" in out.stdout


def test_the_instruction_counts_page_charts_every_stored_case(tmp_path):
    dashboard = _load_dashboard()
    store = tmp_path / "store"
    store.mkdir()
    records = {"c1": {"a": 100, "b": 10}, "c2": {"a": 110}, "c3": {"a": 120, "b": 30}}
    for commit, counts in records.items():
        (store / f"{commit}.json").write_text(json.dumps({"commit": commit, "counts": counts}))
    html = tmp_path / "html"
    html.mkdir()
    (html / "index.html").write_text("<html><body class='x'><p>asv</p></body></html>")
    page = open(dashboard.write_instructions_page(str(html), str(store))).read()
    assert page.count('<svg class="case"') == 2
    assert 'data-case="a" data-points="3"' in page and 'data-case="b" data-points="2"' in page
    chart_b = page.split('data-case="b"')[1]
    assert "c1: 10 instructions" in chart_b and "c3: 30 instructions" in chart_b
    assert "c2:" not in chart_b  # c2 stored no count for b
    assert page.index("c1: 100 ") < page.index("c2: 110 ") < page.index("c3: 120 ")
    index = (html / "index.html").read_text()
    assert index.count('href="instructions.html"') == 1
    dashboard.write_instructions_page(str(html), str(store))  # the link is added once only
    assert (html / "index.html").read_text().count('href="instructions.html"') == 1


def test_the_published_site_links_the_instruction_counts(site):
    html, _, _ = site
    with open(os.path.join(html, "index.html")) as fh:
        assert 'href="instructions.html"' in fh.read()
    with open(os.path.join(html, "instructions.html")) as fh:
        page = fh.read()
    stored = set()
    for name in os.listdir(os.path.join(BENCH, "instructions")):
        with open(os.path.join(BENCH, "instructions", name)) as fh:
            stored |= set(json.load(fh)["counts"])
    assert page.count('<svg class="case"') == len(stored) > 20
