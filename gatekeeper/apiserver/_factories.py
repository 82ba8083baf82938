"""Objects to seed the embedded API server with, for the demo, tests and benchmarks."""

from __future__ import annotations

from collections.abc import Sequence

from gatekeeper.apiserver._types import KubeObject

__all__ = ["resource_slice"]


def resource_slice(
    name: str | None,
    *,
    driver: str,
    node: str,
    pool: str | None = None,
    devices: Sequence[KubeObject] = ({"name": "gpu-0"},),
) -> KubeObject:
    """A ``resource.k8s.io/v1`` ResourceSlice of ``driver`` on ``node``.

    The pool defaults to the node name; a ``None`` name asks the server to generate one
    (``generateName: <node>-<driver>-``).
    """
    metadata = {"name": name} if name else {"generateName": f"{node}-{driver}-"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
            "devices": [dict(device) for device in devices],
        },
    }
