"""The embedded API server: a small kube-apiserver for the DRA kinds, run by ``demo`` and
``dra-gatekeeper test`` and used as the upstream in tests.

It is the oracle the gatekeeper is checked against, so it imports nothing of the gatekeeper:
where both need the same small piece (Status bodies, JSON paths, the object alias), it keeps
its own copy (``_status.py``, ``_jsonpath.py``). That little duplication is the price of an
independent oracle: a bug in the gatekeeper's parser cannot hide in both.
"""

from gatekeeper.apiserver._dra import (
    DEVICE_CLASSES,
    DEVICE_POOLS,
    DRA_KINDS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from gatekeeper.apiserver._factories import resource_slice
from gatekeeper.apiserver._kinds import ServedKind, sort_versions
from gatekeeper.apiserver._tokens import ISSUER, PODS, SERVICE_ACCOUNTS, TOKEN_KINDS
from gatekeeper.apiserver.server import APIServer, JournalEntry, running_api_server
from gatekeeper.apiserver.store import Store, StoreEvent

__all__ = [
    "DEVICE_CLASSES",
    "DEVICE_POOLS",
    "DRA_KINDS",
    "ISSUER",
    "PODS",
    "RESOURCE_CLAIMS",
    "RESOURCE_SLICES",
    "SERVICE_ACCOUNTS",
    "TOKEN_KINDS",
    "APIServer",
    "JournalEntry",
    "ServedKind",
    "Store",
    "StoreEvent",
    "resource_slice",
    "running_api_server",
    "sort_versions",
]
