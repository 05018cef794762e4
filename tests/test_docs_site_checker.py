"""docs/check_site.py, the CI check of the built documentation, fails on what it must catch.

On a small generated HTML tree: a missing page, a missing anchor, a missing image and a link
out of the site are each reported with the page and line; external links and good links are
not.  The search-result parser reads the results list of a Sphinx search page's DOM.  With
Chromium installed, the search and screenshot checks run on a generated two-page site with a
hand-written search page (no Sphinx build: that is the CI step's job).
"""
import importlib.util
import os
import pathlib

import pytest

CHECKER = pathlib.Path(__file__).resolve().parent.parent / "docs" / "check_site.py"


@pytest.fixture(scope="module")
def check_site():
    if not CHECKER.exists():
        pytest.skip("docs/ is not beside this test (installed wheel)")
    spec = importlib.util.spec_from_file_location("check_site", CHECKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_site(root, index_body):
    (root / "guide").mkdir(parents=True)
    (root / "index.html").write_text(f"<html><body>\n{index_body}\n</body></html>\n")
    (root / "guide" / "page.html").write_text(
        '<html><body>\n<h1 id="top">Page</h1>\n<a name="old-anchor"></a>\n'
        '<a href="../index.html#intro">back</a>\n<img src="../_static/logo.png">\n'
        "</body></html>\n")
    (root / "guide" / "index.html").write_text("<html></html>")
    (root / "_static").mkdir()
    (root / "_static" / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")


GOOD = ('<p id="intro">fastadam</p>\n<a href="guide/page.html">page</a>\n'
        '<a href="guide/page.html#top">top</a>\n<a href="guide/page.html#old-anchor">old</a>\n'
        '<a href="guide/">folder</a>\n<a href="#intro">self</a>\n<a href="#">nothing</a>\n'
        '<a href="https://example.invalid/x.html#nowhere">external</a>\n'
        '<a href="mailto:dev@fastadam.invalid">mail</a>\n'
        '<link rel="stylesheet" href="_static/logo.png?v=3">')


def test_a_good_tree_passes(check_site, tmp_path):
    write_site(tmp_path, GOOD)
    problems, pages, refs = check_site.check_links(tmp_path)
    assert problems == []
    assert pages == 3 and refs == 9  # the two external links are not followed


def test_broken_links_and_anchors_are_reported(check_site, tmp_path):
    write_site(tmp_path, GOOD + "\n"
               '<a href="guide/gone.html">gone</a>\n'
               '<a href="guide/page.html#no-such-anchor">anchor</a>\n'
               '<img src="_static/missing.png">\n'
               '<a href="#not-here">self</a>\n'
               '<a href="../../outside.html">out</a>\n')
    problems, _, _ = check_site.check_links(tmp_path)
    assert len(problems) == 5, problems
    text = "\n".join(problems)
    assert "index.html:" in text
    assert "missing file guide/gone.html" in text
    assert "no anchor #no-such-anchor in guide/page.html" in text
    assert "missing file _static/missing.png" in text
    assert "no anchor #not-here in index.html" in text
    assert "leaves the site" in text


def test_main_fails_loudly_on_a_broken_link(check_site, tmp_path, capsys):
    write_site(tmp_path, GOOD + '\n<a href="api/missing.html">api</a>')
    assert check_site.main([str(tmp_path), "--links-only"]) == 1
    err = capsys.readouterr().err
    assert "FAIL: 1 problems" in err and "api/missing.html" in err
    assert check_site.main([str(tmp_path / "nothing-here"), "--links-only"]) == 1


def test_search_results_are_read_from_the_results_list(check_site):
    dom = ('<ul class="nav"><li><a href="index.html">home</a></li></ul>'
           '<div id="search-results"><h2>Search Results</h2>'
           '<ul class="search"><li class="kind-object"><a href="api/fastadam.html'
           '#fastadam.step_inplace">fastadam.step_inplace</a><ul><li><a href="x.html">nested'
           '</a></li></ul></li><li><a href="guide/dense.html?highlight=step">Dense</a></li></ul>'
           '<a href="after.html">after</a></div>')
    assert check_site.search_results(dom) == [
        "api/fastadam.html#fastadam.step_inplace", "x.html", "guide/dense.html?highlight=step"]
    assert check_site.search_results('<ul class="search"></ul>') == []


SEARCH_PAGE = """<html><body><ul class="search" id="results"></ul>
<script>
var q = new URLSearchParams(window.location.search).get("q");
setTimeout(function () {
  if (q === "step_inplace") {
    document.getElementById("results").innerHTML =
      '<li><a href="%s">fastadam.step_inplace</a></li>';
  }
}, 200);
</script></body></html>"""


def test_search_and_screenshot_in_chromium(check_site, tmp_path):
    if check_site.find_chromium() is None:
        if os.environ.get("FASTADAM_REQUIRE_DASHBOARD") == "1":
            pytest.fail("Chromium is not installed (Debian: apt-get install chromium)")
        pytest.skip("Chromium is not installed")
    write_site(tmp_path, GOOD + "\n<h2>" + "fastadam " * 400 + "</h2>")
    (tmp_path / "search.html").write_text(SEARCH_PAGE % "guide/page.html#top")
    problems, found = check_site.check_search(tmp_path, ("step_inplace", "nothing_found"),
                                              budget_ms=3000)
    assert found["step_inplace"] == ["guide/page.html#top"]
    assert problems == ["search for 'nothing_found': no result link in the page"]
    (tmp_path / "search.html").write_text(SEARCH_PAGE % "api/missing.html")
    problems, _ = check_site.check_search(tmp_path, ("step_inplace",), budget_ms=3000)
    assert problems == ["search for 'step_inplace': result 'api/missing.html' is not a page"]
    shot = tmp_path / "shots" / "landing.png"
    assert check_site.screenshot(tmp_path, shot, budget_ms=1000) == []
    assert check_site.png_size(shot) == (1280, 900)
