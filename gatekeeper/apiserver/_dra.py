"""Ready-made :class:`ServedKind` definitions for the DRA kinds, as a 1.36 apiserver serves them."""

from __future__ import annotations

from gatekeeper.apiserver._kinds import ServedKind

__all__ = ["DEVICE_CLASSES", "DEVICE_POOLS", "DRA_KINDS", "RESOURCE_CLAIMS", "RESOURCE_SLICES"]

_SLICE_VERSIONS = ("v1", "v1beta2", "v1beta1")
_SLICE_FIELDS = {"spec.nodeName": "spec.nodeName", "spec.driver": "spec.driver"}

RESOURCE_SLICES = ServedKind(
    group="resource.k8s.io",
    resource="resourceslices",
    kind="ResourceSlice",
    namespaced=False,
    versions=_SLICE_VERSIONS,
    selectable_fields={v: _SLICE_FIELDS for v in _SLICE_VERSIONS},
    immutable_fields={
        v: ("spec.driver", "spec.nodeName", "spec.pool.name") for v in _SLICE_VERSIONS
    },
)
"""ResourceSlices: selectable ``spec.nodeName``/``spec.driver``; driver, node, pool immutable."""

RESOURCE_CLAIMS = ServedKind(
    group="resource.k8s.io",
    resource="resourceclaims",
    kind="ResourceClaim",
    namespaced=True,
    versions=_SLICE_VERSIONS,
    subresources=("status",),
)
"""ResourceClaims: namespaced, with a ``status`` subresource; only metadata field selectors."""

DEVICE_CLASSES = ServedKind(
    group="resource.k8s.io",
    resource="deviceclasses",
    kind="DeviceClass",
    namespaced=False,
    versions=_SLICE_VERSIONS,
)
"""DeviceClasses (cluster-scoped)."""

DEVICE_POOLS = ServedKind(
    group="devmgmtproto.k8s.io",
    resource="devicepools",
    kind="DevicePool",
    namespaced=False,
    versions=("v1alpha1",),
    selectable_fields={
        "v1alpha1": {"spec.driver": "spec.driver", "spec.nodeName": "spec.nodeName"}
    },
    immutable_fields={"v1alpha1": ("spec.driver", "spec.nodeName")},
    subresources=("status",),
)
"""The wg-device-management prototype DevicePool (cluster-scoped; pool name = metadata.name)."""

DRA_KINDS: tuple[ServedKind, ...] = (RESOURCE_SLICES, RESOURCE_CLAIMS, DEVICE_CLASSES, DEVICE_POOLS)
"""Every kind above: what ``dra-gatekeeper test`` and ``demo`` serve by default."""
