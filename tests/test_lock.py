"""The dependency locks (requirements/*.txt, written by .ci/lock) and pyproject.toml agree: every
requirement of pyproject is pinned, at a version its specifier admits, and every pin the lock
says pyproject asked for, pyproject still asks for. The base lock pins what the test lock pins.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

_PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)")
_FROM_PYPROJECT = "dra-gatekeeper (pyproject.toml)"
_FROM_BUILD = "-r requirements/build.in"


@dataclass
class Pin:
    versions: set[Version] = field(default_factory=set)
    via: set[str] = field(default_factory=set)
    hashed: bool = True


def _read_lock(path: Path) -> dict[str, Pin]:
    """The pins of a uv-written lock, with what each is there for (its ``# via`` lines)."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    in_via = False
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines):
        if match := _PIN.match(line):
            current = pins.setdefault(canonicalize_name(match.group(1)), Pin())
            current.versions.add(Version(match.group(2)))
            following = lines[number + 1] if number + 1 < len(lines) else ""
            current.hashed = current.hashed and "--hash=sha256:" in following
            in_via = False
        elif current is not None and (comment := line.strip()).startswith("# via"):
            rest = comment.removeprefix("# via").strip()
            if rest:
                current.via.add(rest)
            in_via = not rest
        elif in_via and current is not None and line.strip().startswith("#   "):
            current.via.add(line.strip().removeprefix("#").strip())
        elif not line.startswith("    --hash"):
            in_via = False
    return pins


def _wanted(extras: tuple[str, ...]) -> list[Requirement]:
    requirements = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    for extra in extras:
        requirements += [
            Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"][extra]
        ]
    return requirements


def _build() -> list[Requirement]:
    return [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]


LOCK_EXTRAS = {"base.txt": (), "test.txt": ("test",)}


@pytest.mark.parametrize("lock", sorted(LOCK_EXTRAS))
def test_every_requirement_of_pyproject_is_pinned_within_its_specifier(lock: str) -> None:
    pins = _read_lock(LOCKS / lock)
    for requirement in [*_wanted(LOCK_EXTRAS[lock]), *_build()]:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is in pyproject.toml but not in {lock}: .ci/lock"
        for version in pins[name].versions:
            assert requirement.specifier.contains(version, prereleases=True), (
                f"{lock} pins {name}=={version}, outside pyproject's {requirement}: .ci/lock"
            )


@pytest.mark.parametrize("lock", sorted(LOCK_EXTRAS))
def test_every_pin_pyproject_asked_for_it_still_asks_for(lock: str) -> None:
    pins = _read_lock(LOCKS / lock)
    asked = {name for name, pin in pins.items() if _FROM_PYPROJECT in pin.via}
    wanted = {canonicalize_name(r.name) for r in _wanted(LOCK_EXTRAS[lock])}
    assert asked == wanted, f"{lock} and pyproject.toml differ: run .ci/lock"
    built = {name for name, pin in pins.items() if _FROM_BUILD in pin.via}
    assert built == {canonicalize_name(r.name) for r in _build()}


@pytest.mark.parametrize("lock", sorted(LOCK_EXTRAS))
def test_every_pin_is_needed_and_hashed(lock: str) -> None:
    pins = _read_lock(LOCKS / lock)
    for name, pin in pins.items():
        assert pin.hashed, f"{lock}: {name} has no hash"
        needed_by = {canonicalize_name(v.split(" ")[0]) for v in pin.via if not v.startswith("-")}
        assert pin.via and (
            _FROM_PYPROJECT in pin.via
            or _FROM_BUILD in pin.via
            or needed_by & set(pins)
            or any(v.startswith("-c ") for v in pin.via)
        ), f"{lock}: nothing needs {name}"


def test_the_base_lock_pins_the_versions_the_tests_ran_on() -> None:
    base, test = _read_lock(LOCKS / "base.txt"), _read_lock(LOCKS / "test.txt")
    for name, pin in base.items():
        assert name in test and pin.versions <= test[name].versions, name


def test_the_build_requirements_file_is_pyprojects() -> None:
    lines = (LOCKS / "build.in").read_text().splitlines()
    assert [line for line in lines if not line.startswith("#")] == list(
        PYPROJECT["build-system"]["requires"]
    ), "requirements/build.in is written by .ci/lock from pyproject.toml: run it"


def test_the_readme_ci_and_image_install_from_the_locks() -> None:
    readme = (ROOT / "README.md").read_text()
    for lock in ("requirements/base.txt", "requirements/test.txt"):
        assert f"pip install -q --require-hashes -r {lock}" in readme, lock
    assert "--require-hashes -r requirements/test.txt" in (ROOT / ".ci" / "run").read_text()
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "--require-hashes -r requirements/base.txt" in dockerfile
    assert "--no-deps --no-build-isolation" in dockerfile
