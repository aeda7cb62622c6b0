"""Every python code block in the README runs (the bash blocks are the two
commands .ci/run executes). Blocks that need flax are skipped without it."""

import os
import re

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def _blocks(lang):
    text = open(README, encoding="utf-8").read()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_has_the_two_commands():
    bash = _blocks("bash")
    assert any("python -m jax_causal_conv" in b for b in bash)
    ci = open(os.path.join(os.path.dirname(README), ".ci", "run"), encoding="utf-8").read()
    test_cmd = [b.strip() for b in bash if "pytest" in b]
    assert test_cmd and test_cmd[0] in ci  # CI runs exactly the README's test command


@pytest.mark.parametrize("i", range(len(_blocks("python"))))
def test_readme_python_block_runs(i):
    code = _blocks("python")[i]
    if "flax" in code:
        pytest.importorskip("flax")
    exec(compile(code, f"README.md[python block {i}]", "exec"), {})
