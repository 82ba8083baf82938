"""Test doubles that ship with the gatekeeper: the embedded API server and its kinds."""

from gatekeeper.testing._dra import (
    DEVICE_CLASSES,
    DEVICE_POOLS,
    DRA_KINDS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from gatekeeper.testing._factories import resource_slice
from gatekeeper.testing._kinds import ServedKind
from gatekeeper.testing._policy import served_kinds
from gatekeeper.testing._tokens import ISSUER, PODS, SERVICE_ACCOUNTS, TOKEN_KINDS
from gatekeeper.testing.apiserver import APIServer, JournalEntry, running_api_server
from gatekeeper.testing.store import Store, StoreEvent

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
    "served_kinds",
]
