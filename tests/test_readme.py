"""The README's commands are the ones that run: its test command is `.ci/run`'s, verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _first_sh_block(text: str, heading: str) -> list[str]:
    section = text[text.index(f"\n## {heading}\n") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, heading
    return block.group(1).strip().splitlines()


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    (command,) = _first_sh_block(readme, "Run the tests")
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci_lines
    assert "pytest" in command and "pip install" in command


def test_the_readme_opens_with_two_set_up_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    first_sections = readme[: readme.index("\n## 1. ")]
    blocks = re.findall(r"```sh\n(.*?)```", first_sections, re.S)
    assert [b.strip().count("\n") for b in blocks] == [0, 0]
    assert "demo" in blocks[0] and "pytest" in blocks[1]
