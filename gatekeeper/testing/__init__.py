"""Test doubles that ship with the gatekeeper: the embedded API server and its kinds."""

from gatekeeper.testing._dra import (
    DEVICE_CLASSES,
    DEVICE_POOLS,
    DRA_KINDS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from gatekeeper.testing._engine import decide_offline, planned_fetch
from gatekeeper.testing._factories import resource_slice
from gatekeeper.testing._fixtures import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    PINNED,
    PKI,
    SLICES,
    Audited,
    RecordingSink,
    Running,
    raw_request,
    running_gatekeeper,
    seed,
    slice_body,
)
from gatekeeper.testing._kinds import ServedKind
from gatekeeper.testing._kubectl import (
    KUBECTL,
    SELECTOR,
    Kubectl,
    slice_manifest,
    write_kubeconfig,
)
from gatekeeper.testing._policy import served_kinds
from gatekeeper.testing.apiserver import APIServer, JournalEntry, running_api_server
from gatekeeper.testing.store import Store, StoreEvent

__all__ = [
    "DEVICE_CLASSES",
    "DEVICE_POOLS",
    "DRA_KINDS",
    "GPU",
    "KUBECTL",
    "NIC",
    "NODE",
    "NODE_TOKEN",
    "PINNED",
    "PKI",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "SELECTOR",
    "SLICES",
    "APIServer",
    "Audited",
    "JournalEntry",
    "Kubectl",
    "RecordingSink",
    "Running",
    "ServedKind",
    "Store",
    "StoreEvent",
    "decide_offline",
    "planned_fetch",
    "raw_request",
    "resource_slice",
    "running_api_server",
    "running_gatekeeper",
    "seed",
    "served_kinds",
    "slice_body",
    "slice_manifest",
    "write_kubeconfig",
]
