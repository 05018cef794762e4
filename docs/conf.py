"""Sphinx configuration of the fastadam documentation.

Build: ``python -m sphinx -W --keep-going -b html docs build/docs`` (the ``docs`` extra).
The API reference is generated from the docstrings (numpydoc style, read by napoleon); the
guide and performance pages are Markdown (MyST).  fastadam is imported from the checkout this
file sits in, so build the extensions first (``pip install -e .`` or ``setup.py build_ext
--inplace``).
"""
import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import fastadam  # noqa: E402

project = "fastadam"
author = "The fastadam developers"
copyright = "The fastadam developers"
release = fastadam.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# numpydoc-style docstrings through napoleon
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"


def _importable(name):
    try:
        importlib.import_module(name)
    except ImportError:  # not installed, or installed without what it needs (mpi4py's MPI)
        return False
    return True


# optional libraries the front-ends import: mocked only where they do not import.  torch is not
# mocked: the fastadam.torch classes subclass torch.optim.Optimizer, and against a mock every
# signature on that page reads (*args, **kwargs); without torch the build warns (fails with -W).
HAVE_TORCH = _importable("torch")
autodoc_mock_imports = [name for name in ("torch", "mpi4py", "cupy") if not _importable(name)]

myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"fastadam {release}"
html_theme_options = {
    "description": "Fused, exact, multi-threaded optimizer steps for NumPy on the CPU",
    "fixed_sidebar": True,
    "page_width": "1100px",
    "sidebar_width": "240px",
}
html_static_path = []
html_show_sourcelink = False


def _skip_member(app, what, name, obj, skip, options):
    # scikit-learn attaches set_{fit,score,...}_request methods to every estimator; their
    # docstrings cite labels of scikit-learn's own docs, and they are scikit-learn's API
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return skip


def _draw_speedups(app):
    """performance/speedups.png from performance/speedups.csv (matplotlib, no display)."""
    import csv
    import math

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    here = os.path.join(app.srcdir, "performance")
    with open(os.path.join(here, "speedups.csv"), newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    labels = [r[0] for r in rows]
    low = [float(r[1]) for r in rows]
    high = [float(r[2]) for r in rows]
    mid = [math.sqrt(a * b) for a, b in zip(low, high)]
    fig, ax = plt.subplots(figsize=(8, 0.36 * len(rows) + 1.0), dpi=100)
    y = range(len(rows))[::-1]
    ax.barh(list(y), mid, color="#3b7dd8",
            xerr=[[m - a for m, a in zip(mid, low)], [b - m for m, b in zip(mid, high)]],
            error_kw={"ecolor": "#333333", "capsize": 2})
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="#aa3333", linewidth=1)
    ax.set_xlabel("speed-up over the baseline (x, log scale; bars: measured range)")
    fig.tight_layout()
    fig.savefig(os.path.join(here, "speedups.png"))
    plt.close(fig)


def _need_torch(app):
    if not HAVE_TORCH:
        from sphinx.util import logging
        logging.getLogger(__name__).warning(
            "torch is not installed: the fastadam.torch API page would show (*args, **kwargs) "
            "for every class; install torch (its CPU build: see docs/install.md) to build the docs")


def setup(app):
    app.connect("builder-inited", _need_torch)
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("builder-inited", _draw_speedups)
