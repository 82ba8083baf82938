"""The audit log file: whole lines appended, size-based rotation with kept backups.

Rotation follows the kube-apiserver (lumberjack): ``--audit-log-maxsize`` megabytes per file,
backups named ``<name>-<UTC time><ext>`` beside it, the newest ``--audit-log-maxbackup`` kept
(0: keep all). A line is never split across files, and a failed write resumes where it stopped.
"""

from __future__ import annotations

import itertools
import os
import re
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["MEGABYTE", "RotatingFile", "backup_files"]

MEGABYTE = 1024 * 1024
_STAMP = "%Y-%m-%dT%H-%M-%S.%f"
_STAMP_PATTERN = r"\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{6}"
_MAX_CHUNK = 1024 * 1024


def _split(path: Path) -> tuple[str, str]:
    ext = path.suffix
    return path.name[: len(path.name) - len(ext)] if ext else path.name, ext


def backup_files(path: str | Path) -> list[Path]:
    """The rotated backups of ``path``, oldest first."""
    target = Path(path)
    stem, ext = _split(target)
    pattern = re.compile(rf"^{re.escape(stem)}-{_STAMP_PATTERN}{re.escape(ext)}$")
    directory = target.parent
    try:
        names = sorted(name for name in os.listdir(directory) if pattern.match(name))
    except FileNotFoundError:
        return []
    return [directory / name for name in names]


class RotatingFile:
    """Appends whole lines to ``path`` (or to stdout for ``-``), rotating by size.

    Not thread-safe: one writer thread owns it. :meth:`add` queues lines, :meth:`flush` writes
    them; on ``OSError`` nothing is lost or duplicated — call :meth:`flush` again to resume.
    """

    def __init__(self, path: str, *, max_bytes: int = 0, max_backups: int = 0) -> None:
        self.path = path
        self.max_bytes = max_bytes if path != "-" else 0
        self.max_backups = max_backups
        self.rotations = 0
        self._lines: deque[bytes] = deque()
        self._chunk: bytes = b""
        self._chunk_lines = 0
        self._offset = 0
        self._fd: int | None = None
        self._size = 0
        self._torn = False
        self._open()

    @property
    def pending(self) -> int:
        """Lines accepted but not yet fully written."""
        return len(self._lines)

    def add(self, lines: list[bytes]) -> None:
        """Queue ``lines`` (each ending in ``\\n``) for the next :meth:`flush`."""
        self._lines.extend(lines)

    def flush(self) -> None:
        """Write every pending line; raises OSError with the remainder kept for a retry."""
        while self._lines or self._chunk:
            if not self._chunk:
                self._next_chunk()
                if self._torn:
                    self._chunk, self._torn = b"\n" + self._chunk, False
            self._open()
            view = memoryview(self._chunk)[self._offset :]
            while view:
                assert self._fd is not None
                written = os.write(self._fd, view)
                self._offset += written
                self._size += written
                view = view[written:]
            for _ in range(self._chunk_lines):
                self._lines.popleft()
            self._chunk, self._chunk_lines, self._offset = b"", 0, 0

    def discard(self) -> int:
        """Give up on every pending line (only when closing on a failing file); their count."""
        count = len(self._lines)
        if self._offset:
            # Half a line is on disk: end it, so that the next line starts clean.
            self._torn = True
        self._lines.clear()
        self._chunk, self._chunk_lines, self._offset = b"", 0, 0
        return count

    def close(self) -> None:
        """Sync and close the file (stdout is left open)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        if self.path == "-":
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _next_chunk(self) -> None:
        """Join the next lines that fit in the current file; rotate first when none does."""
        first = self._lines[0]
        if self._must_rotate(len(first)):
            self._rotate()
        parts = [first]
        size = len(first)
        room = self.max_bytes - self._size if self.max_bytes > 0 else _MAX_CHUNK
        for line in itertools.islice(self._lines, 1, None):
            if size + len(line) > min(room, _MAX_CHUNK):
                break
            parts.append(line)
            size += len(line)
        self._chunk, self._chunk_lines, self._offset = b"".join(parts), len(parts), 0

    def _must_rotate(self, incoming: int) -> bool:
        return self.max_bytes > 0 and self._size > 0 and self._size + incoming > self.max_bytes

    def _open(self) -> None:
        if self._fd is not None:
            return
        if self.path == "-":
            self._fd = 1
            return
        # The log holds request bodies: owner-only.
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fd).st_size

    def _rotate(self) -> None:
        self.close()
        target = Path(self.path)
        stem, ext = _split(target)
        moment = datetime.now(UTC)
        backup = target.with_name(f"{stem}-{moment.strftime(_STAMP)}{ext}")
        while backup.exists():
            moment = moment.replace(microsecond=(moment.microsecond + 1) % 1_000_000)
            backup = target.with_name(f"{stem}-{moment.strftime(_STAMP)}{ext}")
        os.replace(target, backup)
        self.rotations += 1
        self._size = 0
        self._open()
        self._prune()

    def _prune(self) -> None:
        if self.max_backups <= 0:
            return
        backups = backup_files(self.path)
        for old in backups[: max(0, len(backups) - self.max_backups)]:
            old.unlink(missing_ok=True)
