"""Sphinx configuration of the fastadam documentation.

Build: ``python -m sphinx -W --keep-going -b html docs build/docs`` (the ``docs`` extra).
The API reference is generated from the docstrings (numpydoc style, read by napoleon); the
guide and performance pages are Markdown (MyST).  fastadam is imported from the checkout this
file sits in, so build the extensions first (``pip install -e .`` or ``setup.py build_ext
--inplace``).
"""
import importlib.util
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
autodoc_typehints = "description"
autodoc_class_signature = "separated"
# optional libraries the front-ends subclass or import: mocked only where not installed
autodoc_mock_imports = [name for name in ("torch", "mpi4py", "cupy")
                        if importlib.util.find_spec(name) is None]

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


def setup(app):
    app.connect("autodoc-skip-member", _skip_member)
