"""The object alias of the embedded API server: a Kubernetes object as decoded JSON.

Its own, like every piece of this package: the oracle imports nothing of the gatekeeper.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KubeObject"]

KubeObject = dict[str, Any]
"""A Kubernetes object as decoded JSON."""
