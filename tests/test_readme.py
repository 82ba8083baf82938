"""The README's commands are the ones that run: its test command is `.ci/run`'s, verbatim; the
commands it prints run as printed, in a fresh clone, whose own recording tests pass."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

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


def _sh_commands(text: str) -> list[str]:
    """Every command line of the ```sh blocks (continuations joined, comments dropped)."""
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(" ".join(line.split()))
    return commands


def test_every_printed_command_runs_as_printed_from_the_clone() -> None:
    """No bare ``dra-gatekeeper``: the README's install does not put it on the PATH."""
    for doc in ("README.md", "deploy/README.md"):
        for command in _sh_commands((ROOT / doc).read_text()):
            for part in re.split(r"&&|\|", command):
                words = part.split()
                if any(w.rsplit("/", 1)[-1] == "dra-gatekeeper" for w in words[:1]):
                    assert words[0] == ".venv/bin/dra-gatekeeper", (doc, command)
    readme = (ROOT / "README.md").read_text()
    assert "source .venv/bin/activate" in readme  # said once, for those who prefer it
    prose = re.findall(r"`(dra-gatekeeper (?:certs|audit|test|serve|policy) [^`]*)`", readme)
    assert all(" --" not in p or p.startswith("dra-gatekeeper certs show") for p in prose), prose


def _fresh_clone(tmp_path: Path) -> Path:
    """The repository's tracked files as they are in the work tree (what a clone has, with
    this change), and the work tree's .venv, as the README's install leaves one."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    clone = tmp_path / "clone"
    for name in filter(None, listed.split("\0")):
        if not (ROOT / name).is_file():
            continue  # deleted in the work tree, not yet committed
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, clone / name)
    (clone / ".venv").symlink_to(Path(sysconfig.get_path("scripts")).parent)
    return clone


def _run(clone: Path, command: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DRA_GATEKEEPER_RECORDINGS"}
    return subprocess.run(
        command, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=600
    )


def test_a_fresh_clone_runs_the_readmes_commands_and_its_recording_tests(tmp_path: Path) -> None:
    clone = _fresh_clone(tmp_path)
    assert not (tmp_path / "shared").exists()  # nothing beside the clone to fall back on
    readme = " ".join((ROOT / "README.md").read_text().split())
    commands = [
        ".venv/bin/dra-gatekeeper test --junit-xml policy-tests.xml policies/",
        ".venv/bin/dra-gatekeeper certs ca --out ca/",
        ".venv/bin/dra-gatekeeper certs client --ca-dir ca/ --driver gpu.example.com --out certs/",
        ".venv/bin/dra-gatekeeper certs server --ca-dir ca/ --host 127.0.0.1 --out certs/",
        ".venv/bin/dra-gatekeeper policy rbac --policy deploy/policy.yaml",
    ]
    for command in commands:
        assert command in readme, command
        result = _run(clone, command)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
    assert result.stdout == (clone / "deploy" / "clusterrole.yaml").read_text()
    shown = _run(clone, ".venv/bin/dra-gatekeeper certs show certs/server.crt")
    assert "SANs:       IP:127.0.0.1" in shown.stdout, shown.stderr
    tests = (
        "tests/apiserver/test_recordings.py tests/proxy/test_recorded_parity.py "
        "tests/policy/test_merge_patch.py tests/policy/test_claims_status.py "
        "tests/proxy/test_filtering_claims.py "
        "-k 'recording or recorded or apiserver or python_client'"
    )
    result = _run(clone, f"CI=1 .venv/bin/pytest -q -p no:cacheprovider {tests}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout.splitlines()[-1] and "skipped" not in result.stdout


@pytest.mark.kubectl
def test_the_readmes_offline_check_of_deploy_runs_in_a_fresh_clone(tmp_path: Path) -> None:
    assert "```sh\nkubectl kustomize deploy/\n```" in (ROOT / "README.md").read_text()
    clone = _fresh_clone(tmp_path)
    result = _run(clone, "kubectl kustomize deploy/")
    assert result.returncode == 0, result.stderr
    assert "kind: DaemonSet" in result.stdout
