"""The differential run of the two layers: each write of a policy test file, as its case sends it
(method, target, headers, body), sent straight to the real apiserver with the gatekeeper's own
token (``dryRun=All``: admitted, never stored) over the case's ``existing`` objects (made by an
admin); the apiserver's verdict set beside the gatekeeper's (the case's expectation, which
``dra-gatekeeper test`` holds the gatekeeper to).

A case the tier cannot express (a version it does not serve, a kind it cannot seed) is listed
with its reason, never counted.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from gatekeeper.policytest import TestCase
from tests.realcluster.cluster import Api, ApiError, RealCluster
from tests.recorded import all_recordings

__all__ = ["Layers", "Verdict", "realize", "recorded_creates", "send_both"]

_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The kinds the tier seeds as a case's existing objects: their collections.
_SEEDED = {
    "ResourceSlice": ("resource.k8s.io", "resourceslices", False),
    "DevicePool": ("devmgmtproto.k8s.io", "devicepools", False),
    "ResourceClaim": ("resource.k8s.io", "resourceclaims", True),
}
_SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation")


@dataclass(frozen=True)
class Verdict:
    """One case's write, as the apiserver answered the gatekeeper's token."""

    case: str
    gatekeeper_allows: bool
    code: int
    message: str
    denied: str
    """The admission policy's refusal message prefix (the policy and binding names)."""

    @property
    def admission_refuses(self) -> bool:
        return self.code == 403 and self.denied in self.message


def _collection(obj: dict[str, Any]) -> str | None:
    seeded = _SEEDED.get(str(obj.get("kind")))
    if seeded is None:
        return None
    group, resource, namespaced = seeded
    version = str(obj.get("apiVersion", "")).rpartition("/")[2]
    namespace = obj.get("metadata", {}).get("namespace", "default")
    where = f"/namespaces/{namespace}" if namespaced else ""
    return f"/apis/{group}/{version}{where}/{resource}"


def _requests(body: dict[str, Any]) -> None:
    """A claim's requests as a real apiserver validates them (the test files name only the
    request, which the gatekeeper never reads): a device class each, in the version's form."""
    version = str(body.get("apiVersion", "")).rpartition("/")[2]
    for request in body.get("spec", {}).get("devices", {}).get("requests", []):
        if "exactly" in request or "firstAvailable" in request or "deviceClassName" in request:
            continue
        if version == "v1beta1":
            request["deviceClassName"] = "example.com"
        else:
            request["exactly"] = {"deviceClassName": "example.com"}


def _seed(admin: Api, obj: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Create ``obj`` as an admin (its status too); its path and the stored object. ApiError
    when the tier cannot."""
    collection = _collection(obj)
    if collection is None:
        raise ApiError(0, f"the tier does not seed a {obj.get('kind')}")
    body = copy.deepcopy(obj)
    for key in _SERVER_SET:
        body.get("metadata", {}).pop(key, None)
    if body.get("kind") == "ResourceClaim":
        _requests(body)
    path = f"{collection}/{body['metadata']['name']}"
    try:
        admin.delete(path)
    except ApiError as error:
        if error.code != 404:
            raise
    stored = admin.create(collection, body)
    if body.get("status"):
        stored["status"] = body["status"]
        stored = admin.call("PUT", f"{path}/status", stored)
    return path, stored


def _as_stored(raw: bytes | None, stored: dict[str, dict[str, Any]]) -> bytes | None:
    """A JSON body naming a seeded object with that object's uid and resourceVersion (the
    test file's are the embedded server's): the real apiserver checks them before admission."""
    if not raw:
        return raw
    try:
        body = json.loads(raw)
    except ValueError:
        return raw
    metadata = body.get("metadata") if isinstance(body, dict) else None
    seeded = stored.get(str((metadata or {}).get("name")))
    if not isinstance(metadata, dict) or seeded is None:
        return raw
    for key in ("uid", "resourceVersion"):
        if key in metadata:
            metadata[key] = seeded["metadata"][key]
    if isinstance(body.get("spec"), dict) and body.get("kind") == "ResourceClaim":
        body["spec"] = seeded["spec"]  # the claim's spec is immutable; the file's is a stub
    return json.dumps(body).encode()


def realize(cluster: RealCluster, direct: Api, case: TestCase, denied: str) -> Verdict | str:
    """The apiserver's verdict on ``case``'s write by ``direct`` (the gatekeeper's token), or
    why the tier cannot express it."""
    request = case.request
    if request.method not in _WRITES:
        return "not a write"
    made: list[str] = []
    stored: dict[str, dict[str, Any]] = {}
    try:
        for obj, _ in case.existing:
            path, seeded = _seed(cluster.admin, obj)
            made.append(path)
            stored[seeded["metadata"]["name"]] = seeded
    except ApiError as error:
        _remove(cluster.admin, made)
        return f"its existing objects cannot be made here ({error})"
    target = request.target + ("&" if "?" in request.target else "?") + "dryRun=All"
    headers = dict(request.headers)
    content_type = headers.pop("Content-Type", headers.pop("content-type", "application/json"))
    try:
        direct.call(request.method, target, raw=_as_stored(request.body, stored),
                    content_type=content_type, headers=headers)  # fmt: skip
        code, message = 200, ""
    except ApiError as error:
        body = error.body if isinstance(error.body, dict) else {}
        code, message = error.code, str(body.get("message", error.body))
    finally:
        _remove(cluster.admin, made)
    return Verdict(case.name, case.expect.allowed, code, message, denied)


def _remove(admin: Api, paths: list[str]) -> None:
    for path in paths:
        try:
            admin.delete(path)
        except ApiError as error:
            if error.code != 404:
                raise


# --- the recorded creates ---------------------------------------------------------------------


def recorded_creates() -> list[tuple[str, dict[str, Any]]]:
    """The recorded JSON creates of ResourceSlices (tests/recordings), by their file name: every
    recorded slice write the tier can send without the stored state of the recorded session
    (updates, patches and deletes name objects of that session; claim status writes need its
    allocations)."""
    found = []
    for recorded in all_recordings():
        path = str(recorded["path"]).split("?", 1)[0]
        body = recorded.get("request_body")
        if (
            recorded["method"] == "POST"
            and path == "/apis/resource.k8s.io/v1/resourceslices"
            and isinstance(body, dict)
        ):
            found.append((str(recorded["_file"]), body))
    return found


@dataclass(frozen=True)
class Layers:
    """One write sent through the gatekeeper (as a driver) and straight to the apiserver with the
    gatekeeper's token, both as dry runs: the two answers."""

    name: str
    through: tuple[int, str]
    direct: tuple[int, str]
    denied: str

    @property
    def gatekeeper_refuses(self) -> bool:
        """Refused by the gatekeeper itself (a 403 that is not the admission policy's)."""
        code, message = self.through
        return code == 403 and self.denied not in message

    @property
    def admission_refuses(self) -> bool:
        code, message = self.direct
        return code == 403 and self.denied in message


def _answer(api: Api, path: str, body: dict[str, Any]) -> tuple[int, str]:
    try:
        api.create(f"{path}?dryRun=All", body)
    except ApiError as error:
        status = error.body if isinstance(error.body, dict) else {}
        return error.code, str(status.get("message", error.body))
    return 201, ""


def send_both(name: str, body: dict[str, Any], gatekeeper: Api, direct: Api, denied: str) -> Layers:
    """``body`` created (dry run) through ``gatekeeper`` and by ``direct``."""
    path = "/apis/resource.k8s.io/v1/resourceslices"
    return Layers(name, _answer(gatekeeper, path, body), _answer(direct, path, body), denied)
