"""The README's commands and every python code block of the README and of
docs/semantics.md and docs/streaming.md run. The bash blocks are the two
commands that .ci/run executes verbatim. Blocks that need flax are skipped
without it."""

import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCS = ("README.md", "docs/semantics.md", "docs/streaming.md")


def _blocks(lang, doc="README.md"):
    text = open(os.path.join(ROOT, doc), encoding="utf-8").read()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _ci_lines():
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        return [ln.strip() for ln in f if not ln.lstrip().startswith("#")]


def test_readme_has_the_two_commands():
    bash = [b.strip() for b in _blocks("bash")]
    main_cmd = [b for b in bash if b.endswith("python -m jax_causal_conv")]
    test_cmd = [b for b in bash if b.endswith("pytest tests")]
    assert main_cmd and test_cmd, "README.md lost one of its two commands"
    ci = _ci_lines()
    # CI runs both exactly as written (the main job with --quick appended)
    assert any(ln == test_cmd[0] or ln.startswith(test_cmd[0] + " ") for ln in ci)
    assert any(ln == main_cmd[0] or ln.startswith(main_cmd[0] + " --quick") for ln in ci)


CASES = [(doc, i) for doc in DOCS for i in range(len(_blocks("python", doc)))]


@pytest.mark.parametrize("doc,i", CASES, ids=[f"{d}[{i}]" for d, i in CASES])
def test_doc_python_block_runs(doc, i):
    code = _blocks("python", doc)[i]
    if "flax" in code:
        pytest.importorskip("flax")
    exec(compile(code, f"{doc}[python block {i}]", "exec"), {})
