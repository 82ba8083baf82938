"""``tests/recordings/import_new.py``: new recordings are copied with their index lines; one
that is already here must be identical, or nothing is copied."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.recorded import RECORDINGS

SCRIPT = RECORDINGS / "import_new.py"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_new", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


IMPORT = _module()


def _repo_copy(tmp_path: Path, numbers: range) -> Path:
    """A directory like tests/recordings holding the given recordings and their index lines."""
    target = tmp_path / "recordings"
    target.mkdir(parents=True)
    lines = (RECORDINGS / "INDEX.txt").read_text().splitlines()
    kept = [line for line in lines if int(line.split("-", 1)[0]) in numbers]
    for line in kept:
        shutil.copyfile(RECORDINGS / line.split("\t")[0], target / line.split("\t")[0])
    (target / "INDEX.txt").write_text("\n".join(kept) + "\n")
    return target


def test_new_recordings_are_copied_with_their_index_lines(tmp_path: Path) -> None:
    target = _repo_copy(tmp_path, range(1, 4))
    source = _repo_copy(tmp_path / "arrivals", range(1, 13))
    copied = IMPORT.import_recordings(source, target)
    assert [name.split("-")[0] for name in copied] == [f"{n:02d}" for n in range(4, 13)]
    assert (target / "INDEX.txt").read_text() == (source / "INDEX.txt").read_text()
    assert sorted(p.name for p in target.glob("*.json")) == sorted(
        p.name for p in source.glob("*.json")
    )
    assert IMPORT.import_recordings(source, target) == []  # a second run: nothing new


@pytest.mark.parametrize("trouble", ["changed", "unindexed", "renumbered"])
def test_a_conflict_copies_nothing(tmp_path: Path, trouble: str) -> None:
    target = _repo_copy(tmp_path, range(1, 4))
    source = _repo_copy(tmp_path / "arrivals", range(1, 6))
    index_before = (target / "INDEX.txt").read_text()
    if trouble == "changed":
        first = next(source.glob("01-*.json"))
        first.write_text(first.read_text().replace("1.36", "1.37"))
    elif trouble == "unindexed":
        index = (source / "INDEX.txt").read_text().splitlines()
        (source / "INDEX.txt").write_text("\n".join(index[:-1]) + "\n")
    else:
        shutil.copyfile(next(source.glob("05-*.json")), source / "02-other-name.json")
    with pytest.raises(IMPORT.RecordingConflict):
        IMPORT.import_recordings(source, target)
    assert len(list(target.glob("*.json"))) == 3
    assert (target / "INDEX.txt").read_text() == index_before


def test_the_script_runs_and_finds_nothing_new_in_a_copy_of_the_repositorys(
    tmp_path: Path,
) -> None:
    source = tmp_path / "shared"
    shutil.copytree(RECORDINGS, source, ignore=shutil.ignore_patterns("*.py", "*.md"))
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(source)], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout) == (0, f"nothing new in {source}\n"), result.stderr
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "absent")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "no such directory; nothing copied" in result.stderr
