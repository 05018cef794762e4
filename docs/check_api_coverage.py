"""Fail unless the built API reference documents every public name of every public module.

Usage (after ``python -m sphinx -b html docs build/docs``)::

    python docs/check_api_coverage.py build/docs

A public module is a module of the fastadam package whose dotted name has no part starting with
``_``; its public names are its ``__all__``.  A name counts as documented when Sphinx's inventory
of the built site (``objects.inv``, what cross-references and the search page use) holds it
under the module's own name, or under another module's name with the same last part and the
very same object (``fastadam.optim.Adam`` is documented as ``fastadam.Adam``).  A public module
without ``__all__`` is an error too: its public names would be anyone's guess.  Exits 1 and lists
what is missing; prints a one-line summary otherwise.
"""
import importlib
import pkgutil
import sys
import zlib
from pathlib import Path

# the fastadam the site was built from: the checkout this file sits in, as docs/conf.py does
ROOT = Path(__file__).resolve().parent.parent


def read_inventory(path):
    """{full name: role} of the Python objects of a Sphinx ``objects.inv`` (format version 2)."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n", 4)
    if not lines[0].startswith(b"# Sphinx inventory version 2") or len(lines) < 5:
        raise ValueError(f"{path}: not a Sphinx inventory of version 2")
    names = {}
    for line in zlib.decompress(lines[4]).decode().splitlines():
        # name domain:role priority uri display-name; a name may contain spaces (labels)
        parts = line.rsplit(" ", 3)
        if len(parts) < 4:
            continue
        name, role = parts[0].rsplit(" ", 1)
        if role.startswith("py:"):
            names[name] = role[3:]
    return names


def public_modules(package="fastadam"):
    """The public modules of ``package`` (itself included), imported, in name order.  A module
    that needs an optional library that is missing is left out with a note on stderr."""
    root = importlib.import_module(package)
    names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".")
                         if not any(part.startswith("_") for part in m.name.split("."))]
    modules = []
    for name in sorted(names):
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            print(f"note: {name} not checked ({exc})", file=sys.stderr)
    return modules


def _resolve(name):
    """The object at a dotted name, or None."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def undocumented(modules, inventory):
    """[(module name, name)] of the public names no entry of ``inventory`` documents; a module
    without ``__all__`` appears as (module name, None)."""
    by_last = {}
    for full in inventory:
        by_last.setdefault(full.rsplit(".", 1)[-1], []).append(full)
    missing = []
    for module in modules:
        names = getattr(module, "__all__", None)
        if names is None:
            missing.append((module.__name__, None))
            continue
        for name in names:
            if f"{module.__name__}.{name}" in inventory:
                continue
            obj = getattr(module, name)
            if not any(_resolve(full) is obj for full in by_last.get(name, ())):
                missing.append((module.__name__, name))
    return missing


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    inventory = read_inventory(Path(args[0]) / "objects.inv")
    modules = public_modules()
    missing = undocumented(modules, inventory)
    for module, name in missing:
        if name is None:
            print(f"{module}: a public module without __all__")
        else:
            print(f"{module}.{name}: in __all__, not in the API reference (docs/api/)")
    total = sum(len(getattr(m, "__all__", ())) for m in modules)
    if missing:
        print(f"FAIL: {len(missing)} of {total} public names of {len(modules)} modules undocumented")
        return 1
    print(f"API reference: all {total} public names of {len(modules)} modules documented")
    return 0


if __name__ == "__main__":
    sys.exit(main())
