"""Where the recordings are is an explicit setting (``DRA_GATEKEEPER_RECORDINGS``); under CI
missing recordings fail the replay instead of skipping it (issue 8)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run_replay(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "CI"}
    environ |= {"DRA_GATEKEEPER_RECORDINGS": str(tmp_path / "absent")} | env
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/testing/test_recordings.py",
            "-k",
            "most_recordings_are_replayed",
        ],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("ci", "outcome"), [("", "1 skipped"), ("true", "1 error")])
def test_missing_recordings_skip_locally_and_fail_under_ci(
    tmp_path: Path, ci: str, outcome: str
) -> None:
    result = _run_replay(tmp_path, **({"CI": ci} if ci else {}))
    assert outcome in result.stdout, result.stdout + result.stderr
    assert (result.returncode != 0) == bool(ci)
    if ci:
        assert f"recordings not found at {tmp_path / 'absent'}" in result.stdout


def test_the_setting_points_the_replay_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "absent").mkdir()  # a directory without recordings is missing recordings too
    result = _run_replay(tmp_path, CI="1")
    assert "1 error" in result.stdout and "DRA_GATEKEEPER_RECORDINGS" in result.stdout
