"""kubectl (1.32, on PATH) as the real tier runs it: one kubeconfig, a discovery cache of its own
(so every test makes kubectl's discovery and openapi requests afresh), and ``get -w`` read line
by line with a deadline."""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Kubectl", "Watch", "kubectl_binary"]


def kubectl_binary() -> str:
    """kubectl on PATH; without it the test is skipped (under CI it fails)."""
    found = shutil.which("kubectl")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl not found on PATH; under CI the real tier must run")
        pytest.skip("this real-tier test needs kubectl on PATH")
    return found


class Kubectl:
    """``kubectl --kubeconfig FILE --cache-dir DIR ...`` with a bounded run time."""

    def __init__(self, binary: str, kubeconfig: Path, cache_dir: Path) -> None:
        self.base = [
            binary,
            f"--kubeconfig={kubeconfig}",
            f"--cache-dir={cache_dir}",
            "--request-timeout=30s",
        ]

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*self.base, *args], input=stdin, capture_output=True, text=True, timeout=90
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
            # A refused discovery or openapi request, or a server warning, shows here.
            assert done.stderr == "", f"kubectl {' '.join(args)}: {done.stderr}"
        return done

    def json(self, *args: str, stdin: str | None = None) -> dict[str, Any]:
        return dict(json.loads(self.run(*args, "-o", "json", stdin=stdin).stdout))

    @contextmanager
    def watch(self, *args: str) -> Iterator[Watch]:
        process = subprocess.Popen(
            [*self.base, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        watch = Watch(process)
        try:
            yield watch
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class Watch:
    """The lines a running ``kubectl get -w`` prints, read as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, what: str, match: Callable[[str], bool], timeout: float = 30) -> str:
        """The first line from now on that ``match``es; fails after ``timeout`` seconds, or when
        kubectl exits, with the lines seen and kubectl's stderr."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                assert self.process.stderr is not None
                raise AssertionError(
                    f"kubectl exited waiting for {what}: {self.lines} {self.process.stderr.read()}"
                )
            self.lines.append(line)
            if match(line):
                return line
        raise AssertionError(f"no line for {what} within {timeout:g} s: {self.lines}")
