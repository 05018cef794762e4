"""Every ```python block of the documentation (docs/**/*.md) runs as written.

The same runner as the README's blocks (tests/code_blocks.py): one fresh interpreter per block,
in an empty temporary folder, which must still be empty afterwards (an example that writes files
writes them in a temporary folder of its own, or removes them).  A block marked ``<!-- skip-test: REASON -->`` right above its fence is
skipped with that reason (pytest counts it); ``test_skipped_blocks_are_few`` keeps them rare.
The docs are not in the sdist or the wheel: outside a checkout these tests skip.
"""

import pytest

import fastadam
from code_blocks import ROOT, check_block, count_python_fences, python_blocks

DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) if DOCS.is_dir() else []
MAX_SKIPPED = 3


def docs_params():
    params = []
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for line, code, reason in python_blocks(page):
            params.append(pytest.param(code, reason, id=f"{name}:{line}"))
    return params


def _need_docs():
    if not PAGES:
        pytest.skip("docs/ is not beside this test (installed wheel)")


def test_every_python_fence_is_seen():
    _need_docs()
    for page in PAGES:
        assert len(python_blocks(page)) == count_python_fences(page), (
            f"{page.name}: a ```python fence that is indented or unterminated is never run")


def test_docs_have_examples_and_skipped_blocks_are_few():
    _need_docs()
    blocks = [b for page in PAGES for b in python_blocks(page)]
    assert len(blocks) >= 10
    skipped = [b for b in blocks if b[2]]
    assert len(skipped) <= MAX_SKIPPED, [(line, reason) for line, _, reason in skipped]


def test_skip_marker_is_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- skip-test: needs 4 MPI ranks -->\n```python\nraise SystemExit(1)\n"
                    "```\n\n```python\nx = 1\n```\n")
    assert [(b[0], b[2]) for b in python_blocks(page)] == [(4, "needs 4 MPI ranks"), (8, None)]


@pytest.mark.parametrize("code, skip_reason", docs_params())
def test_docs_block_runs(code, skip_reason, tmp_path):
    check_block(code, skip_reason, tmp_path, "docs")
    # a reader pastes the block in a folder of their own: it must leave nothing behind there
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [], f"the block left {left} in its working folder"


def test_api_reference_lists_every_public_name():
    """The API pages that list names by hand (fastadam, optim, sparse) miss none of __all__;
    the other pages document their module's ``__all__`` through ``automodule :members:``."""
    _need_docs()
    import types

    import fastadam.optim
    import fastadam.sparse
    api = DOCS / "api"
    top = (api / "fastadam.rst").read_text()
    missing = [n for n in fastadam.__all__ if not isinstance(getattr(fastadam, n), types.ModuleType)
               and f"fastadam.{n}\n" not in top]
    assert missing == [], f"docs/api/fastadam.rst lacks {missing}"
    for module, page in ((fastadam.optim, "optim.rst"), (fastadam.sparse, "sparse.rst")):
        text = (api / page).read_text()
        members = " ".join(line.split(":members:", 1)[1] for line in text.splitlines()
                           if ":members:" in line).replace(",", " ").split()
        missing = [n for n in module.__all__ if n not in fastadam.__all__ and n not in members
                   and not isinstance(getattr(module, n), types.ModuleType)]
        assert missing == [], f"docs/api/{page} lacks {missing}"
    for page in ("autodiff", "torch", "onnx", "sklearn", "distributed", "gpu", "io"):
        text = (api / f"{page}.rst").read_text()
        assert f".. automodule:: fastadam.{page}\n   :members:\n" in text, page


def test_speedup_plot_data_comes_from_the_performance_tables():
    """Every range drawn by docs/conf.py (performance/speedups.csv) is printed on the page."""
    _need_docs()
    import csv
    page = (DOCS / "performance" / "index.md").read_text()
    with open(DOCS / "performance" / "speedups.csv", newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    assert len(rows) >= 10
    for label, low, high, script in rows:
        assert float(low) <= float(high), label
        for figure in {low, high}:
            assert figure in page, f"{label}: {figure} is not on the performance page"
        assert (ROOT / script).is_file(), f"{label}: {script} does not exist"
        assert f"python {script}" in page, f"{label}: the page does not name {script}"


def test_api_coverage_check_reads_the_inventory_and_finds_what_is_missing(tmp_path):
    """docs/check_api_coverage.py, which CI runs on the built site: an entry documents its own
    name and the same object under another module's name; anything else is missing."""
    _need_docs()
    import importlib.util
    import types
    import zlib

    import fastadam.optim
    spec = importlib.util.spec_from_file_location("check_api_coverage",
                                                  DOCS / "check_api_coverage.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    body = ("fastadam.Adam py:class 1 api/fastadam.html#$ -\n"
            "fastadam.optim.prepare_step py:function 1 api/optim.html#$ -\n"
            "installing std:label -1 install.html#installing Installing\n"
            "fastadam.optim.SGD std:doc -1 nowhere.html -\n")
    (tmp_path / "objects.inv").write_bytes(
        b"# Sphinx inventory version 2\n# Project: fastadam\n# Version: 0\n"
        b"# The remainder of this file is compressed using zlib.\n" + zlib.compress(body.encode()))
    inventory = check.read_inventory(tmp_path / "objects.inv")
    assert inventory == {"fastadam.Adam": "class", "fastadam.optim.prepare_step": "function"}
    missing = check.undocumented([fastadam.optim], inventory)
    assert ("fastadam.optim", "Adam") not in missing            # as fastadam.Adam, same object
    assert ("fastadam.optim", "prepare_step") not in missing
    assert ("fastadam.optim", "AdamW") in missing and ("fastadam.optim", "SGD") in missing
    assert len(missing) == len(fastadam.optim.__all__) - 2
    assert check.undocumented([types.ModuleType("fastadam.nameless")], inventory) == [
        ("fastadam.nameless", None)]
