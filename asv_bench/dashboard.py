"""The asv dashboard: publish the stored results, serve them, and look at them in a browser.

    python asv_bench/dashboard.py publish            # HTML site in asv_bench/.asv/html
    python asv_bench/dashboard.py preview            # publish, then serve on http://127.0.0.1:8080
    python asv_bench/dashboard.py check --screenshot-dir DIR
                                                     # publish, serve, open in headless Chromium

`asv publish` writes a single-page site whose JavaScript libraries (jQuery, flot, bootstrap,
stupidtable, md5) come from public CDNs.  A browser with internet access needs nothing more.
For a machine without one (this project's CI reaches PyPI and Debian's mirror only), `--offline`
takes the same library versions from the asv 0.5.1 source distribution on PyPI, which shipped
them in `asv/www/vendor/`, and points the site's tags at those local copies.

`publish` also writes `instructions.html` beside asv's page (linked from it): one small SVG chart
per case of the instruction-count gate (asv_bench/instructions.py), its stored counts per
commit (asv_bench/instructions/*.json) in the order of main's history, with the gate's x1.25
line above the latest point, so a slow creep shows before it trips the gate.

`check` is what tests/test_asv_dashboard.py runs: it loads the site in headless Chromium with a
small probe script added to a copy of index.html.  The probe waits for asv to draw the summary
grid, then opens the graph page of every `track_*` benchmark in turn and reads flot's own data
(`$(div).data("plot").getData()`), so "the graph has data points" is read from what was plotted,
not guessed from pixels.  Chromium prints the DOM at the end (`--dump-dom`), and the probe's
report is a JSON block in it.  Screenshots of the summary grid and of one ratio graph are saved.

Only the standard library is used here (asv and Chromium are external programs).
"""

import argparse
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# CDN file of asv 0.6's index.html -> the same library in asv 0.5.1's www/vendor/.
VENDOR_FILES = {
    "jquery-3.3.1.min.js": "jquery-3.3.1.min.js",
    "flot/0.8.3/jquery.flot.min.js": "jquery.flot-0.8.3.min.js",
    "flot/0.8.3/jquery.flot.time.min.js": "jquery.flot-0.8.3.time.min.js",
    "flot/0.8.3/jquery.flot.selection.min.js": "jquery.flot-0.8.3.selection.min.js",
    "flot/0.8.3/jquery.flot.categories.min.js": "jquery.flot-0.8.3.categories.min.js",
    "jquery.flot.orderBars.js": "jquery.flot.orderBars.js",
    "stupidtable.min.js": "stupidtable.js",
    "md5.min.js": "md5.js",
    "bootstrap.min.js": "bootstrap-3.1.0.min.js",
    "bootstrap.min.css": "bootstrap-3.1.0.min.css",
}
VENDOR_SDIST = "asv==0.5.1"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def asv_config(results_dir=None, html_dir=None, workdir=None):
    """Path of an asv config: the repository's, or a copy with other results/html folders.

    asv.conf.json has // comments; asv accepts them, json does not, so they are dropped
    (whole-line comments only, which is all the file has).
    """
    path = os.path.join(HERE, "asv.conf.json")
    if results_dir is None and html_dir is None:
        return path
    with open(path) as f:
        text = re.sub(r"^\s*//.*$", "", f.read(), flags=re.M)
    conf = json.loads(text)
    conf["repo"] = REPO
    conf["benchmark_dir"] = os.path.join(HERE, conf["benchmark_dir"])
    conf["env_dir"] = os.path.join(HERE, conf["env_dir"])
    conf["results_dir"] = os.path.abspath(results_dir or os.path.join(HERE, conf["results_dir"]))
    conf["html_dir"] = os.path.abspath(html_dir or os.path.join(HERE, conf["html_dir"]))
    out = os.path.join(workdir or tempfile.mkdtemp(prefix="fastadam-asv-"), "asv.conf.json")
    with open(out, "w") as f:
        json.dump(conf, f, indent=1)
    return out


def fetch_vendor(dest):
    """Put asv 0.5.1's vendored JavaScript/CSS into `dest` (downloaded from PyPI, cached)."""
    if all(os.path.exists(os.path.join(dest, name)) for name in VENDOR_FILES.values()):
        return dest
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", "-d", tmp, VENDOR_SDIST],
                       check=True, stdout=subprocess.DEVNULL)
        (sdist,) = [os.path.join(tmp, n) for n in os.listdir(tmp) if n.endswith(".tar.gz")]
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                name = os.path.basename(member.name)
                if "/www/vendor/" in member.name and name in VENDOR_FILES.values():
                    with tar.extractfile(member) as src, \
                            open(os.path.join(dest, name), "wb") as out:
                        shutil.copyfileobj(src, out)
    missing = [n for n in VENDOR_FILES.values() if not os.path.exists(os.path.join(dest, n))]
    if missing:
        raise RuntimeError(f"{VENDOR_SDIST} did not contain {missing}")
    return dest


def use_local_libraries(html_dir, vendor_dir):
    """Point index.html's CDN <script>/<link> tags at copies in html_dir/vendor/."""
    target = os.path.join(html_dir, "vendor")
    os.makedirs(target, exist_ok=True)
    for name in VENDOR_FILES.values():
        shutil.copy(os.path.join(vendor_dir, name), target)
    index = os.path.join(html_dir, "index.html")
    with open(index) as f:
        html = f.read()

    def local(match):
        url = match.group(2)
        for suffix, name in VENDOR_FILES.items():
            if url.endswith("/" + suffix):
                # integrity hashes belong to the CDN's bytes; a local copy is trusted as is.
                rest = re.sub(r'\s(integrity|crossorigin|referrerpolicy)="[^"]*"', "",
                              match.group(3))
                return f'{match.group(1)}"vendor/{name}"{rest}'
        return match.group(0)

    html, count = re.subn(r'(<(?:script|link)\b[^>]*?\b(?:src|href)=)"(https://[^"]+)"([^>]*>)',
                          local, html)
    left = re.findall(r'<(?:script|link)\b[^>]*"https://(?:code\.jquery|cdnjs|cdn\.jsdelivr)[^"]*"',
                      html)
    if left:
        raise RuntimeError(f"index.html still loads from a CDN: {left}")
    with open(index, "w") as f:
        f.write(html)
    return count


class HistoryUnavailable(RuntimeError):
    """The checkout lacks the commits the stored results belong to (a shallow clone)."""


def _git(*args):
    return subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)


def ensure_history():
    """asv places each stored result by its commit on main, so a shallow clone (CI systems
    often make one) shows nothing: fetch the rest of the history when the remote allows."""
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() != "true":
        return
    out = _git("fetch", "--quiet", "--unshallow")
    if out.returncode != 0:
        raise HistoryUnavailable(
            "this is a shallow clone and `git fetch --unshallow` failed "
            f"({out.stderr.strip()[:200]}): the dashboard needs main's history")


INSTRUCTIONS_DIR = os.path.join(HERE, "instructions")


def instruction_history(store=INSTRUCTIONS_DIR):
    """[(commit, {case: count})] of the stored instruction counts, oldest first: in the order of
    HEAD's history, records of commits outside it last (by name)."""
    records = []
    for name in sorted(os.listdir(store)) if os.path.isdir(store) else []:
        if name.endswith(".json"):
            with open(os.path.join(store, name)) as fh:
                rec = json.load(fh)
            records.append((rec.get("commit", name[:-5]), rec.get("counts", {})))
    order = _git("rev-list", "--topo-order", "--reverse", "HEAD").stdout.split()
    rank = {c: i for i, c in enumerate(order)}
    return sorted(records, key=lambda r: (r[0] not in rank, rank.get(r[0], 0), r[0]))


def _chart(case, points, threshold=1.25, width=360, height=120):
    """An SVG line chart of (commit, count) points, with the gate's line over the last one."""
    import html

    counts = [c for _, c in points]
    top = max(max(counts), counts[-1] * threshold) * 1.05
    bottom = min(counts) * 0.9
    pad, span = 30, max(len(points) - 1, 1)

    def xy(i, c):
        return (pad + (width - 2 * pad) * i / span,
                height - pad - (height - 2 * pad) * (c - bottom) / (top - bottom))
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, c) for i, (_, c) in enumerate(points)))
    _, gate_y = xy(0, counts[-1] * threshold)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3"><title>{html.escape(commit[:10])}: '
                   f'{c:,d} instructions</title></circle>'
                   for (commit, c), (x, y) in ((p, xy(i, p[1])) for i, p in enumerate(points)))
    return (f'<figure><figcaption>{html.escape(case)}: {counts[-1]:,d}</figcaption>'
            f'<svg class="case" data-case="{html.escape(case)}" data-points="{len(points)}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
            f'<line class="gate" x1="{pad}" x2="{width - pad}" y1="{gate_y:.1f}" '
            f'y2="{gate_y:.1f}" stroke="#c33" stroke-dasharray="4 3"/>'
            f'<polyline fill="none" stroke="#246" stroke-width="1.5" points="{line}"/>'
            f'{dots}</svg></figure>')


def write_instructions_page(html_dir, store=INSTRUCTIONS_DIR):
    """instructions.html in html_dir (see the module docstring); returns its path."""
    history = instruction_history(store)
    cases = sorted({case for _, counts in history for case in counts})
    charts = []
    for case in cases:
        points = [(commit, counts[case]) for commit, counts in history if case in counts]
        charts.append(_chart(case, points))
    page = ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>fastadam instruction "
            "counts</title><style>body{font-family:sans-serif;margin:1em}figure{display:inline-"
            "block;margin:.5em}figcaption{font-size:12px}</style></head><body>"
            "<h1>Instructions per call, per stored commit</h1><p>Counted under callgrind by "
            "<code>python asv_bench/instructions.py</code> (one point per commit with stored "
            f"counts, {len(history)} commits, oldest left); the dashed line is the gate: x1.25 "
            "the newest count. <a href=\"index.html\">asv dashboard</a></p>"
            + "".join(charts) + "</body></html>")
    path = os.path.join(html_dir, "instructions.html")
    with open(path, "w") as fh:
        fh.write(page)
    index = os.path.join(html_dir, "index.html")
    if os.path.exists(index):  # a link from asv's page, once
        with open(index) as fh:
            text = fh.read()
        link = ('<a id="fastadam-instructions" href="instructions.html" style="position:fixed;'
                'right:1em;bottom:1em;z-index:9999">instruction counts</a>')
        if "fastadam-instructions" not in text:
            text = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + link, text, count=1)
            with open(index, "w") as fh:
                fh.write(text)
    return path


def publish(results_dir=None, html_dir=None, offline=False, vendor_dir=None, quiet=True):
    """Run `asv publish` over the stored results; return the HTML folder."""
    ensure_history()
    html_dir = os.path.abspath(html_dir or os.path.join(HERE, ".asv", "html"))
    with tempfile.TemporaryDirectory() as work:
        conf = asv_config(results_dir, html_dir, workdir=work)
        out = subprocess.run([sys.executable, "-m", "asv", "--config", conf, "publish"],
                             cwd=HERE, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"asv publish failed:\n{out.stdout}\n{out.stderr}")
    if not quiet:
        print(out.stdout)
    if offline:
        vendor_dir = vendor_dir or os.path.join(HERE, ".asv", "vendor")
        use_local_libraries(html_dir, fetch_vendor(vendor_dir))
    write_instructions_page(html_dir)
    return html_dir


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(html_dir, port=0):
    """Serve html_dir on 127.0.0.1 in a daemon thread; return (server, base URL)."""
    handler = functools.partial(_QuietHandler, directory=html_dir)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def find_chromium():
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _chromium(args, timeout=120):
    browser = find_chromium()
    if browser is None:
        raise RuntimeError("no Chromium found (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"chromium failed ({out.returncode}): {out.stderr[-2000:]}")
    return out.stdout


# Runs inside the page: wait for the summary grid's thumbnails, then visit each track_ graph.
PROBE = r"""
<script>
(function () {
  var report = {thumbnails: {}, graphs: {}, errors: []};
  function done() {
    var pre = document.createElement("pre");
    pre.id = "fastadam-probe";
    pre.textContent = JSON.stringify(report);
    document.body.appendChild(pre);
  }
  function points(div) {
    var plot = $(div).data("plot");
    if (!plot) return null;
    var n = 0;
    $.each(plot.getData(), function (i, s) {
      $.each(s.data, function (j, p) { if (p && p[1] !== null && isFinite(p[1])) n += 1; });
    });
    return n;
  }
  function when(test, then, tries) {
    if (test()) { then(); return; }
    if (tries <= 0) { then(); return; }
    setTimeout(function () { when(test, then, tries - 1); }, 100);
  }
  window.addEventListener("load", function () {
    when(function () { return $.asv && $.asv.main_json && $(".benchmark-container").length; },
      function () {
        var names = Object.keys(($.asv.main_json || {}).benchmarks || {}).filter(
          function (n) { return /\.track_/.test(n); });
        report.benchmarks = names;
        when(function () {
          return $(".benchmark-plot").toArray().some(function (d) { return $(d).data("plot"); });
        }, function () {
          // thumbnails are drawn when scrolled into view: record those that were drawn
          $(".benchmark-container").each(function () {
            var n = points($(this).find(".benchmark-plot"));
            if (n !== null) report.thumbnails[$(this).attr("href").slice(1)] = n;
          });
          (function next(i) {
            if (i >= names.length) { done(); return; }
            var before = $("#main-graph").data("plot");
            window.location.hash = "#" + names[i];
            when(function () {
              var p = $("#main-graph").data("plot");
              return p && p !== before && points("#main-graph") !== null;
            }, function () {
              report.graphs[names[i]] = points("#main-graph");
              next(i + 1);
            }, 100);
          })(0);
        }, 100);
      }, 150);
  });
  window.addEventListener("error", function (e) { report.errors.push(String(e.message)); });
})();
</script>
"""


def probe_site(html_dir, budget_ms=60000):
    """Load the published site with PROBE in headless Chromium; return the probe's report."""
    probe_dir = tempfile.mkdtemp(prefix="fastadam-dash-")
    try:
        shutil.copytree(html_dir, probe_dir, dirs_exist_ok=True)
        index = os.path.join(probe_dir, "index.html")
        with open(index) as f:
            html = f.read()
        with open(index, "w") as f:
            f.write(html.replace("</body>", PROBE + "</body>"))
        server, url = serve(probe_dir)
        try:
            # a tall window: the grid draws only the thumbnails that are in view
            dom = _chromium([f"--virtual-time-budget={budget_ms}", "--window-size=1400,8000",
                             "--dump-dom",
                             url + "index.html"])
        finally:
            server.shutdown()
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)
    match = re.search(r'<pre id="fastadam-probe">(.*?)</pre>', dom, flags=re.S)
    if match is None:
        raise RuntimeError("the probe did not finish: the page never drew the summary grid")
    import html as html_module
    return json.loads(html_module.unescape(match.group(1)))


def screenshot(url, path, size=(1400, 1000), budget_ms=20000):
    _chromium([f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}",
               "--hide-scrollbars", f"--screenshot={os.path.abspath(path)}", url])
    return path


def check(html_dir, screenshot_dir=None):
    """Probe the site; save screenshots; return (report, list of screenshot paths)."""
    report = probe_site(html_dir)
    shots = []
    if screenshot_dir:
        os.makedirs(screenshot_dir, exist_ok=True)
        server, url = serve(html_dir)
        try:
            shots.append(screenshot(url + "index.html",
                                    os.path.join(screenshot_dir, "asv-summary.png")))
            first = next(iter(sorted(report.get("graphs", {}))), None)
            if first:
                shots.append(screenshot(f"{url}index.html#{first}",
                                        os.path.join(screenshot_dir, "asv-graph.png")))
            shots.append(screenshot(url + "instructions.html",
                                    os.path.join(screenshot_dir, "instructions.png")))
        finally:
            server.shutdown()
    return report, shots


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["publish", "preview", "check"])
    parser.add_argument("--results-dir", help="asv results folder (default: the stored ones)")
    parser.add_argument("--html-dir", help="where the site goes (default asv_bench/.asv/html)")
    parser.add_argument("--offline", action="store_true",
                        help="serve the JavaScript libraries locally (fetched once from PyPI)")
    parser.add_argument("--vendor-dir", help="where the local copies of the libraries are kept "
                        "(default asv_bench/.asv/vendor)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--screenshot-dir", default=None)
    args = parser.parse_args(argv)
    html = publish(args.results_dir, args.html_dir, offline=args.offline or args.command == "check",
                   vendor_dir=args.vendor_dir, quiet=False)
    print(f"site: {html}")
    if args.command == "preview":
        server, url = serve(html, args.port)
        print(f"serving {url} (Ctrl-C stops)")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            server.shutdown()
    elif args.command == "check":
        report, shots = check(html, args.screenshot_dir)
        graphs = report.get("graphs", {})
        for name in sorted(graphs):
            print(f"{graphs[name]!s:>6} points  {name}")
        for path in shots:
            print(f"screenshot: {path}")
        # A benchmark with no stored value (a GPU one, or one newer than every stored commit)
        # has an empty graph; the site is broken only if no graph has points or a script failed.
        if not any(graphs.values()) or report.get("errors"):
            print(f"FAIL: no graph has points; page errors: {report.get('errors')}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
