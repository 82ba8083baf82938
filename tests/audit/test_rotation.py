"""Size-based rotation: the configured number of backups, whole lines only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gatekeeper.audit import JsonLinesWriter
from gatekeeper.audit.rotation import MEGABYTE, RotatingFile, backup_files


def line(index: int, size: int = 100) -> bytes:
    text = json.dumps({"auditID": f"id-{index}", "pad": "x" * size})
    return text.encode() + b"\n"


def all_lines(path: Path) -> list[list[str]]:
    """Lines of every kept file, oldest first, each file's lines parsed."""
    files = [*backup_files(path), path]
    return [[json.loads(text)["auditID"] for text in f.read_text().splitlines()] for f in files]


@pytest.mark.parametrize("backups", [1, 3])
async def test_writer_rotates_and_keeps_the_configured_backups(
    tmp_path: Path, backups: int
) -> None:
    path = tmp_path / "audit.log"
    max_mb = 0.01  # 10 KiB files: about 30 events of ~330 bytes each
    writer = JsonLinesWriter(str(path), max_size_mb=max_mb, max_backups=backups)
    for index in range(2000):
        await writer.emit({"auditID": f"id-{index}", "pad": "x" * 300})
    writer.close()
    assert writer.stats.rotations > backups
    kept = backup_files(path)
    assert len(kept) == backups
    assert all(name.name.startswith("audit-") and name.suffix == ".log" for name in kept)
    files = all_lines(path)  # every line of every file parses: none is split
    flat = [audit_id for lines in files for audit_id in lines]
    # The newest events are all there, in order, ending with the last one.
    assert flat == [f"id-{i}" for i in range(2000 - len(flat), 2000)]
    for kept_file in [*kept, path]:
        assert kept_file.stat().st_size <= max_mb * MEGABYTE


def test_zero_backups_keeps_every_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.json"
    rotating = RotatingFile(str(path), max_bytes=1000, max_backups=0)
    for index in range(100):
        rotating.add([line(index)])
        rotating.flush()
    rotating.close()
    files = all_lines(path)
    assert len(files) >= 10
    assert [i for lines in files for i in lines] == [f"id-{i}" for i in range(100)]


def test_a_line_larger_than_the_limit_is_never_split(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    rotating = RotatingFile(str(path), max_bytes=500, max_backups=5)
    rotating.add([line(0), line(1, 2000), line(2)])
    rotating.flush()
    rotating.close()
    assert all_lines(path) == [["id-0"], ["id-1"], ["id-2"]]


def test_existing_file_size_counts(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(line(0, 900))
    rotating = RotatingFile(str(path), max_bytes=1000, max_backups=1)
    rotating.add([line(1)])
    rotating.flush()
    rotating.close()
    assert all_lines(path) == [["id-0"], ["id-1"]]
