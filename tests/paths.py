"""Where the repository is, for tests at any depth of ``tests/``."""

from pathlib import Path

__all__ = ["REPO"]

REPO = Path(__file__).resolve().parent.parent
"""The repository's root (``README.md``, ``policies/``, ``gatekeeper/``)."""
