"""Bring new recordings into the repository: ``python tests/recordings/import_new.py [SOURCE]``.

SOURCE (default ``../shared/recordings`` beside the repository) is where new recordings of a
real kube-apiserver arrive. Files not here yet are copied, with their lines of SOURCE's
``INDEX.txt``; a recording already here must be byte-identical (recordings never change once
taken in, so a differing file is an error, and nothing is copied). Exit 0 when done, 1 on a
conflict or a file missing from SOURCE's index.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

__all__ = ["HERE", "import_recordings", "main"]

HERE = Path(__file__).resolve().parent
_DEFAULT_SOURCE = HERE.parents[1].parent / "shared" / "recordings"
_NAME = re.compile(r"^(\d+)-[A-Za-z0-9._-]+\.json$")


class RecordingConflict(Exception):
    """A conflict that leaves the repository's recordings untouched."""


def _index(path: Path) -> dict[str, str]:
    """INDEX.txt as file name -> its line."""
    if not path.exists():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    return {line.split("\t", 1)[0]: line for line in lines if line.strip()}


def import_recordings(source: Path, target: Path = HERE) -> list[str]:
    """Copy the recordings of ``source`` that ``target`` lacks; the names copied, in order."""
    if not source.is_dir():
        raise RecordingConflict(f"{source}: no such directory")
    source_index = _index(source / "INDEX.txt")
    target_index = _index(target / "INDEX.txt")
    numbers = {int(m.group(1)): p.name for p in target.glob("*.json") if (m := _NAME.match(p.name))}
    new: list[Path] = []
    for path in sorted(source.glob("*.json")):
        match = _NAME.match(path.name)
        if match is None:
            raise RecordingConflict(f"{path.name}: not named NUMBER-description.json")
        mine = target / path.name
        if mine.exists():
            if mine.read_bytes() != path.read_bytes():
                raise RecordingConflict(f"{path.name}: differs from the copy in {target}")
            continue
        taken = numbers.get(int(match.group(1)))
        if taken is not None:
            raise RecordingConflict(f"{path.name}: number {match.group(1)} is already {taken}")
        if path.name not in source_index:
            raise RecordingConflict(f"{path.name}: not listed in {source / 'INDEX.txt'}")
        new.append(path)
    for path in new:
        shutil.copyfile(path, target / path.name)
        target_index[path.name] = source_index[path.name]
    if new:
        ordered = sorted(target_index.values(), key=lambda line: int(line.split("-", 1)[0]))
        (target / "INDEX.txt").write_text("\n".join(ordered) + "\n", encoding="utf-8")
    return [p.name for p in new]


def main(argv: list[str]) -> int:
    source = Path(argv[0]) if argv else _DEFAULT_SOURCE
    try:
        copied = import_recordings(source)
    except RecordingConflict as exc:
        print(f"import_new.py: {exc}; nothing copied", file=sys.stderr)
        return 1
    if copied:
        print(f"imported {len(copied)} recordings: {copied[0]} … {copied[-1]}")
        print("now add them to the replay (tests/testing/test_recordings.py, README.md here)")
    else:
        print(f"nothing new in {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
