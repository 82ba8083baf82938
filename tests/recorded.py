"""The recordings of a real kube-apiserver kept in ``tests/recordings`` (its README says what
they are): one place that finds and parses them, so that every test reads the repository's copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gatekeeper.apiserver._json import deep

__all__ = ["RECORDINGS", "all_recordings", "number_of", "parse", "recording", "recording_path"]

RECORDINGS = Path(__file__).resolve().parent / "recordings"


def number_of(path: Path) -> int:
    """The recording number of ``NNN-description.json``."""
    return int(path.name.split("-", 1)[0])


def parse(text: str) -> Any:
    """JSON of any depth the apiserver writes (190-196 nest up to 10,007 levels)."""
    return deep(json.loads, text)


def recording_path(number: int) -> Path:
    """The file of recording ``number`` (exactly one must exist)."""
    (path,) = [p for p in RECORDINGS.glob("*.json") if number_of(p) == number]
    return path


def recording(number: int) -> dict[str, Any]:
    """Recording ``number``, parsed."""
    parsed: dict[str, Any] = parse(recording_path(number).read_text(encoding="utf-8"))
    return parsed


def all_recordings() -> list[dict[str, Any]]:
    """Every recording in order, with ``_n`` (its number) and ``_file`` (its name) added."""
    files = sorted(RECORDINGS.glob("*.json"), key=number_of)
    return [
        parse(p.read_text(encoding="utf-8")) | {"_n": number_of(p), "_file": p.name} for p in files
    ]
