"""ONNX's own backend node tests, run on fastadam.onnx (issue 22).

The onnx wheel carries the generators of its node tests (``onnx.backend.test.case.node``);
``collect_testcases()`` builds every case in-process (model, inputs, expected outputs,
tolerances).  A case is *claimed* when every node of its model is an operator that
``fastadam.onnx.supported_operators()`` lists at the case's opset: each claimed case is one
parametrised test, compared as ONNX's backend runner compares (``Runner.assert_similar_outputs``:
output count, shapes, dtypes, then ``assert_allclose`` with the case's rtol/atol, 1e-3 and 1e-7
by default).  A claimed case passes, or raises ``UnsupportedOperatorError`` for a form that the
ONNX guide's "Not supported" line lists (``DOCUMENTED``).  Every other case, and a node of every
``ai.onnx`` schema not listed, must raise ``UnsupportedOperatorError`` naming its operator:
nothing outside the list runs silently.  Operators registered later are picked up by the same
code.  The counts are printed in the terminal summary.
"""
import pathlib
import re
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnx.backend.test.case.node")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402

import fastadam.onnx as fo  # noqa: E402
from fastadam.onnx._graph import Graph  # noqa: E402

# error message of an unsupported form -> the phrase of the "Not supported" line of the
# ONNX guide (docs/guide/onnx.md)
DOCUMENTED = [
    (r"only 1-D and 2-D .*(inputs|convolutions) are supported", "3-D convolution and pooling"),
    (r"ceil_mode=1 with count_include_pad=1 is not supported",
     "`ceil_mode=1` AveragePool with `count_include_pad=1`"),
    (r"the Indices output is not supported", "MaxPool's `Indices` output"),
    (r"BatchNormalization: only the inference form|only the first output of BatchNormalization",
     "BatchNormalization in training mode"),
    (r"string tensors are not supported", "string tensors"),
    (r"only tensor types are supported", "sequence, map and optional types"),
    (r"ai.onnx opset \d+ is not supported", "opsets below 7"),
    (r"draws a random mask", "Dropout in training mode with a ratio above 0"),
]
ONNX_GUIDE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "guide" / "onnx.md"


def _opset(model, domain):
    for o in model.opset_import:
        if (o.domain or "") in ((domain,) if domain else ("", "ai.onnx")):
            return o.version
    return None


def _claimed(model, supported):
    """Whether every node of ``model`` is an operator ``supported`` lists at its opset."""
    for node in model.graph.node:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        since = supported.get((domain, node.op_type))
        opset = _opset(model, domain)
        if since is None or opset is None or opset < since:
            return False
    return True


def _collect():
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # the generators' own overflow warnings
        cases = [c for c in collect_testcases() if c.model is not None and c.data_sets]
    supported = fo.supported_operators()
    claimed = {c.name: c for c in cases if _claimed(c.model, supported)}
    others = [c for c in cases if c.name not in claimed]
    return claimed, others


CLAIMED, OTHERS = _collect()
RESULTS = {}  # case name -> "passed" or the guide's phrase of its unsupported form


def _array(value):
    """A case's input or expected output as the backend runner normalises it."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_array(v) for v in value]
    return value


def _feeds(case, inputs):
    return {vi.name: _array(a) for vi, a in zip(case.model.graph.input, inputs)}


def _documented(message):
    for pattern, phrase in DOCUMENTED:
        if re.search(pattern, message):
            return phrase
    return None


@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_node_case(name):
    case = CLAIMED[name]
    model = case.model
    for inputs, expected in case.data_sets:
        try:
            out = fo.run(model, _feeds(case, inputs))
        except fo.UnsupportedOperatorError as e:
            phrase = _documented(str(e))
            assert phrase is not None, f"an unsupported form the ONNX guide does not list: {e}"
            RESULTS[name] = phrase
            return
        got = [out[o.name] for o in model.graph.output]
        Runner.assert_similar_outputs([_array(e) for e in expected], got, rtol=case.rtol,
                                      atol=case.atol)
    RESULTS[name] = "passed"


def test_documented_forms_are_in_the_onnx_guide():
    if not ONNX_GUIDE.exists():
        pytest.skip("docs/ is not beside this test (the installed wheel's test run)")
    section = ONNX_GUIDE.read_text()
    start = section.index("- **Not supported**")
    end = section.find("\n- ", start + 1)
    bullet = " ".join(section[start:end].split())
    for _, phrase in DOCUMENTED:
        assert phrase in bullet, f"the ONNX guide's 'Not supported' list lacks {phrase!r}"


def test_cases_of_unlisted_operators_raise_unsupported():
    """Every case with a node that supported_operators() does not list (at its opset) raises
    UnsupportedOperatorError naming such an operator, before anything runs."""
    supported = fo.supported_operators()
    assert OTHERS, "no case outside the list: the collection found nothing"
    wrong = []
    for case in OTHERS:
        model = case.model
        unlisted = {n.op_type for n in model.graph.node
                    if supported.get(("" if n.domain in ("", "ai.onnx") else n.domain,
                                      n.op_type), 10 ** 9) >
                    (_opset(model, "" if n.domain in ("", "ai.onnx") else n.domain) or 0)}
        try:
            fo.run(model, _feeds(case, case.data_sets[0][0]))
        except fo.UnsupportedOperatorError as e:
            message = str(e)
            if not (any(re.search(rf"operator {op}\b", message) for op in unlisted) or
                    _documented(message)):
                wrong.append((case.name, message))
        else:
            wrong.append((case.name, "ran"))
    assert not wrong, wrong[:20]


def test_every_unlisted_schema_raises_unsupported():
    """A node of every ai.onnx operator schema that the list leaves out (test case or not)."""
    supported = fo.supported_operators()
    top = onnx.defs.onnx_opset_version()
    schemas = {s.name for s in onnx.defs.get_all_schemas_with_history()
               if s.domain in ("", "ai.onnx") and s.since_version <= top}
    unlisted = sorted(op for op in schemas if ("", op) not in supported)
    assert len(unlisted) > 50
    for op in unlisted:
        node = helper.make_node(op, ["a"], ["b"], name="n")
        with pytest.raises(fo.UnsupportedOperatorError, match=rf"node 'n' \({op}\): operator "
                                                              rf"{op} of domain ai.onnx"):
            Graph([node], {"": top}, known={"a"})


def test_claimed_cases_cover_every_listed_operator():
    """Each listed operator has at least one claimed ONNX node test (Gradient's are model
    tests, run by tests/test_onnx_gradient.py), or only tests at an opset below the oldest
    fastadam runs (Not's are at opset 1: they raise the documented "opsets below 7" error)."""
    def ops(case):
        return {(n.domain if n.domain not in ("", "ai.onnx") else "", n.op_type)
                for n in case.model.graph.node}
    covered = {k for c in CLAIMED.values() for k in ops(c)}
    covered |= {k for c in OTHERS if (_opset(c.model, "") or 7) < 7 for k in ops(c)}
    covered.add((fo.TRAINING_DOMAIN, "Gradient"))
    missing = sorted(k for k in fo.supported_operators() if k not in covered)
    assert not missing, f"listed operators without an ONNX node test: {missing}"


class _Summary:
    """Prints the counts at the end of the session (visible without -rA)."""

    @staticmethod
    def pytest_terminal_summary(terminalreporter):
        if not RESULTS:
            return
        passed = sum(v == "passed" for v in RESULTS.values())
        forms = {}
        for v in RESULTS.values():
            if v != "passed":
                forms[v] = forms.get(v, 0) + 1
        terminalreporter.write_sep("-", "ONNX node tests (onnx " + onnx.__version__ + ")")
        terminalreporter.write_line(
            f"{len(CLAIMED)} claimed, {len(RESULTS)} run: {passed} passed, "
            f"{len(RESULTS) - passed} documented-unsupported, "
            f"{len(CLAIMED) - len(RESULTS)} failed or not run; "
            f"{len(OTHERS)} cases of unlisted operators")
        for phrase, n in sorted(forms.items()):
            terminalreporter.write_line(f"  unsupported: {phrase}: {n}")


@pytest.fixture(scope="module", autouse=True)
def _print_summary(request):
    manager = request.config.pluginmanager
    if not manager.has_plugin("fastadam-onnx-node-summary"):
        manager.register(_Summary(), "fastadam-onnx-node-summary")
    yield
