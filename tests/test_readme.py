"""Every ```python block of README.md runs as written, pasted into a fresh interpreter.

Each block runs in its own subprocess (a fresh namespace, as when pasted) in a temporary folder
(checkpoints land there), against the fastadam this test imports (tests/code_blocks.py).  A
block that imports an optional library that is not installed is skipped with the library's
name.  API signatures and formulas are fenced as ``text``, not ``python``.
"""

import pytest

from code_blocks import ROOT, check_block, count_python_fences, python_blocks

README = ROOT / "README.md"
# the test command .ci/run runs verbatim, and the README opens with
TEST_COMMAND = "pip install -e '.[test]' && python -m pytest tests"


def readme_params():
    if not README.exists():  # an installed wheel tested outside the checkout
        return []
    return [pytest.param(code, reason, id=f"README.md:{line}")
            for line, code, reason in python_blocks(README)]


def test_readme_has_python_blocks():
    if not README.exists():
        pytest.skip("README.md is not beside this test (installed wheel)")
    blocks = python_blocks(README)
    assert len(blocks) >= 5  # NumPy, torch, scikit-learn, ONNX, embeddings
    assert len(blocks) == count_python_fences(README), "a ```python fence the test cannot see"


def test_readme_opens_with_the_commands_and_stays_one_page():
    if not README.exists():
        pytest.skip("README.md is not beside this test (installed wheel)")
    text = README.read_text()
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert "pip install -e . && python -m fastadam" in first_block
    assert TEST_COMMAND in first_block
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text()
    assert len(text.splitlines()) <= 200
    assert "--index-url https://download.pytorch.org/whl/cpu" in text


@pytest.mark.parametrize("code, skip_reason", readme_params())
def test_readme_block_runs(code, skip_reason, tmp_path):
    check_block(code, skip_reason, tmp_path, "README")
    # pasted in a reader's own folder, a block leaves nothing behind there
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [], f"the block left {left} in its working folder"
