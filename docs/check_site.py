"""Check the built documentation site the way a reader meets it, in headless Chromium.

    python docs/check_site.py build/docs --screenshot build/docs-screenshot.png

Three checks, each of which fails the run with a message naming what is wrong:

1. Links: every ``href`` and ``src`` of every page that points inside the site resolves to a
   file, and every ``#anchor`` exists in its target page (an element ``id`` or an ``<a name>``).
   Links with a scheme (``https:``, ``mailto:``) are not followed: the site is checked offline.
2. Search: ``search.html?q=<name>`` for each known API name is loaded over a local HTTP server
   with ``--virtual-time-budget`` (so the search index loads and the script runs) and
   ``--dump-dom``; the results list must hold a link to a page of the site that exists.
3. Screenshot: the landing page is rendered to a PNG (printed path), which must be a real image.

Chromium is Debian's ``chromium`` (or ``chromium-browser``, ``google-chrome``); without one,
checks 2 and 3 fail unless ``--links-only`` is given.  Exit status 0 only when every check passed.
"""
import argparse
import functools
import html.parser
import http.server
import importlib.util
import os
import posixpath
import sys
import threading
import urllib.parse


def _load_dashboard():
    """asv_bench/dashboard.py, whose headless-Chromium runner (``find_chromium``, ``_chromium``)
    this check shares; it imports only the standard library."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "asv_bench", "dashboard.py")
    spec = importlib.util.spec_from_file_location("fastadam_asv_dashboard", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_dashboard = _load_dashboard()
find_chromium, _chromium = _dashboard.find_chromium, _dashboard._chromium

LINK_ATTRS = {"a": "href", "link": "href", "area": "href", "img": "src", "script": "src",
              "iframe": "src", "source": "src"}
DEFAULT_QUERIES = ("step_inplace", "TrainingSession")


class _PageParser(html.parser.HTMLParser):
    """The ids (anchors) a page defines and the local references it makes."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids = set()
        self.refs = []  # (tag, attribute, value, line)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.ids.add(attrs["name"])
        attr = LINK_ATTRS.get(tag)
        if attr and attrs.get(attr) is not None:
            self.refs.append((tag, attr, attrs[attr], self.getpos()[0]))

    handle_startendtag = handle_starttag


def _parse(path):
    parser = _PageParser()
    with open(path, encoding="utf-8", errors="replace") as f:
        parser.feed(f.read())
    parser.close()
    return parser


def _is_external(value):
    parts = urllib.parse.urlsplit(value)
    return bool(parts.scheme) or value.startswith("//")


def check_links(site_dir):
    """(broken local references as strings, pages read, local references checked)."""
    site_dir = os.path.abspath(site_dir)
    pages = {}
    for folder, _, files in os.walk(site_dir):
        for name in files:
            if name.endswith(".html"):
                path = os.path.join(folder, name)
                pages[path] = _parse(path)
    problems, checked = [], 0
    for path, page in sorted(pages.items()):
        where = os.path.relpath(path, site_dir)
        for tag, attr, value, line in page.refs:
            if _is_external(value) or value.strip() == "":
                continue
            checked += 1
            parts = urllib.parse.urlsplit(value)
            if parts.path:
                target = os.path.normpath(os.path.join(os.path.dirname(path),
                                                       urllib.parse.unquote(parts.path)))
                if os.path.isdir(target):
                    target = os.path.join(target, "index.html")
            else:
                target = path
            if not target.startswith(site_dir + os.sep):
                problems.append(f"{where}:{line}: <{tag} {attr}={value!r}> leaves the site")
                continue
            if not os.path.isfile(target):
                problems.append(f"{where}:{line}: <{tag} {attr}={value!r}> -> missing file "
                                f"{os.path.relpath(target, site_dir)}")
                continue
            fragment = urllib.parse.unquote(parts.fragment)
            if fragment and target.endswith(".html"):
                target_page = pages.get(target) or _parse(target)
                if fragment not in target_page.ids:
                    problems.append(f"{where}:{line}: <{tag} {attr}={value!r}> -> no anchor "
                                    f"#{fragment} in {os.path.relpath(target, site_dir)}")
    return problems, len(pages), checked


def _serve(site_dir):
    handler = functools.partial(_QuietHandler, directory=site_dir)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class _ResultParser(html.parser.HTMLParser):
    """The hrefs of the links inside the search page's results list (``ul.search``)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth = 0  # > 0 inside <ul class="search">
        self.links = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "ul":
            if self.depth:
                self.depth += 1
            elif "search" in (attrs.get("class") or "").split():
                self.depth = 1
        elif tag == "a" and self.depth and attrs.get("href"):
            self.links.append(attrs["href"])

    def handle_endtag(self, tag):
        if tag == "ul" and self.depth:
            self.depth -= 1


def search_results(dom):
    """The result links of a dumped search page's DOM."""
    parser = _ResultParser()
    parser.feed(dom)
    parser.close()
    return parser.links


def check_search(site_dir, queries=DEFAULT_QUERIES, budget_ms=15000):
    """Problems (strings) and {query: result hrefs} of the site's search page in Chromium."""
    site_dir = os.path.abspath(site_dir)
    if not os.path.isfile(os.path.join(site_dir, "search.html")):
        return ["search.html is missing"], {}
    problems, found = [], {}
    server, url = _serve(site_dir)
    try:
        for query in queries:
            dom = _chromium([f"--virtual-time-budget={budget_ms}", "--dump-dom",
                             f"{url}search.html?q={urllib.parse.quote(query)}"])
            links = search_results(dom)
            found[query] = links
            if not links:
                problems.append(f"search for {query!r}: no result link in the page")
                continue
            for href in links:
                path = urllib.parse.urlsplit(href).path
                if _is_external(href) or not path:
                    continue
                target = os.path.normpath(os.path.join(site_dir, urllib.parse.unquote(
                    posixpath.normpath(path.lstrip("/")))))
                if not os.path.isfile(target):
                    problems.append(f"search for {query!r}: result {href!r} is not a page")
    finally:
        server.shutdown()
    return problems, found


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def screenshot(site_dir, path, size=(1280, 900), budget_ms=5000):
    """Render the landing page to path (PNG); problems as strings."""
    site_dir = os.path.abspath(site_dir)
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    if os.path.exists(path):
        os.remove(path)
    server, url = _serve(site_dir)
    try:
        _chromium([f"--virtual-time-budget={budget_ms}", f"--window-size={size[0]},{size[1]}",
                   "--hide-scrollbars", f"--screenshot={os.path.abspath(path)}",
                   url + "index.html"])
    finally:
        server.shutdown()
    if not os.path.isfile(path):
        return [f"no screenshot written to {path}"]
    if png_size(path) != size:
        return [f"{path}: not a {size[0]}x{size[1]} PNG (got {png_size(path)})"]
    if os.path.getsize(path) < 10_000:
        return [f"{path}: {os.path.getsize(path)} bytes, too small to hold a rendered page"]
    return []


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site_dir", help="the built HTML site (sphinx -b html output)")
    parser.add_argument("--screenshot", default=None, metavar="PNG",
                        help="write the landing page's screenshot here")
    parser.add_argument("--query", action="append", default=None,
                        help=f"a name the search must find (default: {DEFAULT_QUERIES})")
    parser.add_argument("--links-only", action="store_true",
                        help="check the links only (no Chromium)")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.site_dir, "index.html")):
        print(f"FAIL: {args.site_dir} has no index.html (build the site first)", file=sys.stderr)
        return 1
    problems, npages, nrefs = check_links(args.site_dir)
    print(f"links: {nrefs} local references in {npages} pages, {len(problems)} broken")
    if nrefs == 0:
        problems.append("no local link at all: is this the built site?")
    if not args.links_only:
        search_problems, found = check_search(args.site_dir, tuple(args.query or DEFAULT_QUERIES))
        for query, links in found.items():
            print(f"search {query!r}: {len(links)} results, first {links[:1]}")
        problems += search_problems
        if args.screenshot:
            shot_problems = screenshot(args.site_dir, args.screenshot)
            problems += shot_problems
            if not shot_problems:
                print(f"screenshot: {os.path.abspath(args.screenshot)}")
    if problems:
        print(f"FAIL: {len(problems)} problems in the documentation site:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print("documentation site OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
