"""A test skips only when a tool it drives is absent, with a one-line reason; under CI (the
environment variable ``CI`` set, as ``.ci/run`` does) a skip fails the run instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KUBECTL_TEST = "tests/proxy/test_clients.py::test_kubectl_get_with_field_selector"
# One process (-n 0): the run under test is small, and its report is read whole.
_PYTEST = (sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-n", "0")


def _pytest(target: str, tmp_path: Path, *extra: str, ci: bool) -> subprocess.CompletedProcess[str]:
    # PATH holds only an empty directory: no kubectl (the interpreter is named by its path).
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PATH")}
    env["PATH"] = str(tmp_path / "empty-path")
    if ci:
        env["CI"] = "1"
    return subprocess.run(
        [*_PYTEST, *extra, target],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_kubectl_test_without_kubectl_skips_saying_so(tmp_path: Path) -> None:
    result = _pytest(KUBECTL_TEST, tmp_path, ci=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("SKIPPED")]
    assert line.endswith("kubectl is not installed (not on the PATH)"), line


def test_under_ci_a_kubectl_test_without_kubectl_fails(tmp_path: Path) -> None:
    result = _pytest(KUBECTL_TEST, tmp_path, ci=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("1 error in ")  # failed in its setup
    assert (
        "skipped, and no skip is allowed under CI (CI is set): kubectl is not installed"
        in result.stdout
    )


def test_under_ci_any_skip_fails(tmp_path: Path) -> None:
    """Any skip, at run time or for a whole module, with this repository's conftest loaded."""
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_skips.py").write_text(
        "import pytest\n\n"
        "def test_skip():\n    pytest.skip('no reason')\n\n"
        "@pytest.mark.skipif(True, reason='marked')\ndef test_marked():\n    pass\n\n"
        "def test_runs():\n    pass\n"
    )
    (tests / "test_module.py").write_text(
        "import pytest\npytest.skip('whole module', allow_module_level=True)\n"
    )
    extra = ("-c", os.devnull, "--rootdir", str(tests), "-p", "tests.conftest")
    local = _pytest(str(tests), tmp_path, *extra, ci=False)
    assert local.returncode == 0 and "1 passed, 3 skipped" in local.stdout, local.stdout
    ci = _pytest(str(tests / "test_skips.py"), tmp_path, *extra, ci=True)
    assert ci.returncode == 1, ci.stdout + ci.stderr
    assert "1 failed, 1 passed, 1 error" in ci.stdout, ci.stdout  # run time; marked (setup)
    assert "no skip is allowed under CI (CI is set): no reason" in ci.stdout
    module = _pytest(str(tests / "test_module.py"), tmp_path, *extra, ci=True)
    assert module.returncode != 0 and "1 error" in module.stdout, module.stdout
    assert "no skip is allowed under CI (CI is set): whole module" in module.stdout
