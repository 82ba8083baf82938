"""The README and docs/ say what runs: the README's test command is `.ci/run`'s, verbatim; every
command the docs print runs as printed, in a fresh clone; every example file loads; every
section a comment or a doc cites exists. What the docs say is checked, not how they are laid out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from gatekeeper.policyfile import parse_policy
from gatekeeper.rule import Rule

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
README_MAX_LINES = 300


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


def test_the_readme_opens_with_two_set_up_commands_and_fits_a_screen() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = [b.strip() for b in re.findall(r"```sh\n(.*?)```", readme, re.S)]
    set_ups = [b for b in blocks if b.startswith("python3 -m venv")]
    assert blocks[:2] == set_ups and len(set_ups) == 2  # the first two, and no others
    assert all("\n" not in b for b in set_ups)
    assert set_ups[0].endswith("dra-gatekeeper demo") and set_ups[1].endswith("pytest")
    assert len(readme.splitlines()) <= README_MAX_LINES


def test_every_doc_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in DOCS[1:]:
        assert f"]({doc.relative_to(ROOT)})" in readme, doc


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
    for doc in DOCS:
        for command in _sh_commands(doc.read_text()):
            for part in re.split(r"&&|\|", command):
                words = part.split()
                if any(w.rsplit("/", 1)[-1] == "dra-gatekeeper" for w in words[:1]):
                    assert words[0] == ".venv/bin/dra-gatekeeper", (doc.name, command)
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
    docs = " ".join(" ".join(doc.read_text() for doc in DOCS).split())
    commands = [
        ".venv/bin/dra-gatekeeper test --junit-xml policy-tests.xml policies/",
        ".venv/bin/dra-gatekeeper certs ca --out ca/",
        ".venv/bin/dra-gatekeeper certs client --ca-dir ca/ --driver gpu.example.com --out certs/",
        ".venv/bin/dra-gatekeeper certs server --ca-dir ca/ --host 127.0.0.1 --out certs/",
        ".venv/bin/dra-gatekeeper policy rbac --policy deploy/policy.yaml",
    ]
    for command in commands:
        assert command in docs, command
        result = _run(clone, command)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
    assert result.stdout == (clone / "deploy" / "generated" / "rbac.yaml").read_text()
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


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    found: set[str] = set()
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)  # no headings in code blocks
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug, n = _slug(heading), 0
        while (slug if n == 0 else f"{slug}-{n}") in found:
            n += 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


_SOURCES = ("gatekeeper", "tests", "bench", "deploy", "policies")


def _citing_files() -> list[Path]:
    files = [path for name in _SOURCES for path in (ROOT / name).rglob("*") if path.is_file()]
    return [
        p
        for p in files
        if p.suffix in {".py", ".yaml", ".md", ".json"} and "recordings" not in p.parts
    ]


def test_every_cited_section_exists() -> None:
    """``docs/operating.md#limits`` in a comment, ``(policy.md#rules)`` or ``(#faults)`` in a
    doc: the file exists and has that heading; a doc's relative links name existing files."""
    broken = []
    for doc in DOCS:
        text = doc.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists() or (anchor and anchor not in _anchors(file)):
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    for path in _citing_files():
        if path == Path(__file__):
            continue  # its docstrings show the forms
        for cited, anchor in re.findall(
            r"(?<![\w/.-])((?:docs/)?[\w-]+\.md)#([\w-]+)", path.read_text()
        ):
            # From the root; a doc's relative to it; code's also as text rendered into docs/.
            files = [path.parent / cited, ROOT / cited] if path.suffix == ".md" else [ROOT / cited]
            if path.suffix != ".md" and not cited.startswith("docs/"):
                files.append(ROOT / "docs" / cited)
            if not any(f.is_file() and anchor in _anchors(f) for f in files):
                broken.append(f"{path.relative_to(ROOT)}: {cited}#{anchor}")
    assert not broken, "\n".join(broken)


def test_nothing_cites_a_readme_section() -> None:
    """Sections live in docs/ under stable anchors; the README is the front door only."""
    citing = re.compile(r'README(?:\.md)?[ ,(]+"[A-Z]|README, [A-Z][a-z]')
    found = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in _citing_files()
        for line in path.read_text().splitlines()
        if citing.search(line)
    ]
    assert not found, "\n".join(found)


def _yaml_blocks(doc: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", doc.read_text(), re.S)


def test_the_policy_examples_load() -> None:
    examples = [
        block
        for doc in DOCS
        for block in _yaml_blocks(doc)
        if re.search(r"^kind: Policy$", block, re.M)
    ]
    assert len(examples) >= 2
    for text in examples:
        assert parse_policy(text, "example").kinds, text


def test_the_policy_test_example_runs(tmp_path: Path) -> None:
    """docs/policy-tests.md's example file, against a policy that is the packaged default."""
    (example,) = [b for b in _yaml_blocks(ROOT / "docs" / "policy-tests.md") if "cases:" in b]
    (tmp_path / "my-policy.yaml").write_text(
        "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\ninclude: [packaged:default]\n"
    )
    (tmp_path / "example_test.yaml").write_text(example)
    result = _run(tmp_path, f"{sys.executable} -m gatekeeper test example_test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "1 passed, 0 failed"


_USAGE_ERRORS = ("usage:", "unrecognized arguments", "did you mean", "Traceback")


def test_every_documented_command_parses(tmp_path: Path) -> None:
    """Each ``.venv/bin/dra-gatekeeper`` line of the docs' shell blocks, run in a fresh clone
    after the block's variable assignments: it succeeds, or fails on its input (a file that
    only exists on a node), never on its flags. ``demo`` runs until stopped: test_demo.py."""
    clone = _fresh_clone(tmp_path)
    ran = 0
    for doc in DOCS:
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S):
            lines = block.replace("\\\n", " ").splitlines()
            assignments = [ln for ln in lines if re.match(r"^[A-Z_]+=\S+$", ln.strip())]
            for line in lines:
                line = line.split("  #")[0].strip()
                if not line.startswith(".venv/bin/dra-gatekeeper") or " demo" in line:
                    continue
                script = "\n".join([*assignments, f"NODE_NAME=node-a {line}"])
                result = _run(clone, script)
                assert not any(e in result.stderr for e in _USAGE_ERRORS), (
                    doc.name,
                    line,
                    result.stderr,
                )
                ran += 1
    assert ran >= 10


def test_the_metrics_table_lists_every_rule() -> None:
    """The ``reason`` label's values are the Rule enum's: the table says all of them."""
    text = (ROOT / "docs" / "operating.md").read_text()
    (row,) = [line for line in text.splitlines() if "dra_gatekeeper_refusals_total" in line]
    listed = re.findall(r"`([a-z-]+)`", row.split("gatekeeper/rule.py`):")[1].split(";")[0])
    assert listed == [rule.value for rule in Rule]


def test_every_file_the_docs_name_exists() -> None:
    named = {
        path
        for doc in DOCS
        for path in re.findall(
            r"`((?:gatekeeper|tests|bench|deploy|policies|schemas)/[\w./-]+\.[a-z]+)`",
            doc.read_text(),
        )
    }
    assert len(named) > 20
    assert [path for path in sorted(named) if not (ROOT / path).exists()] == []
