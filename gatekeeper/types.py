"""Type aliases shared across modules: Kubernetes objects stay plain JSON dicts."""

from typing import Any

__all__ = ["JSONValue", "KubeObject"]

KubeObject = dict[str, Any]
"""A Kubernetes object as decoded JSON. The gatekeeper never compiles in API types."""

JSONValue = Any
