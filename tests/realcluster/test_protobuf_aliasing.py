"""The protobuf field-number aliasing attack (issue 29) on the real apiserver: a hidden second
ObjectMeta under field 1 + 2**32 holding resourceVersion "" makes a pinned update unconditional
at the apiserver (Go reads the tag's low 32 bits and merges the copy last). Through the
gatekeeper such a body is refused with 400 before anything goes upstream, while the plain
update, pinned, still fails with 409 on a concurrent change."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from gatekeeper.codec.kubeproto import MAGIC, with_resource_version
from gatekeeper.codec.protowire import bytes_of, replace_field, unique_fields
from tests.codec.test_kubeproto import ALIAS, field
from tests.realcluster.cluster import Api, ApiError, RealCluster, poll
from tests.realcluster.interposer import Interposer
from tests.realcluster.processes import GatekeeperProcess
from tests.realcluster.test_protobuf import GATEKEEPER_USER, GPU, PROTOBUF, SLICES, slice_object

NAME = "aliased"
PATH = f"{SLICES}/{NAME}"
REFUSAL = "object: field number 4294967297 is above the protobuf maximum 536870911"


def get_protobuf(api: Api, path: str) -> bytes:
    """The object at ``path`` as the apiserver encodes it in protobuf (what client-go reads)."""
    request = urllib.request.Request(api.url + path, headers={"Accept": PROTOBUF})
    with urllib.request.urlopen(request, context=api.context, timeout=30) as answer:
        assert answer.headers["Content-Type"] == PROTOBUF
        data: bytes = answer.read()
    return data


def with_hidden_meta(body: bytes) -> bytes:
    """``body`` with ObjectMeta{resourceVersion: ""} appended to its object under the aliased
    tag of field 1."""
    unknown = body[len(MAGIC) :]
    raw = bytes_of(unknown, unique_fields(unknown, "envelope", frozenset({2}))[2], "raw")
    hidden = field(1 + ALIAS, field(6, ""))
    return MAGIC + replace_field(unknown, "envelope", 2, raw + hidden)


def someone_else_writes(admin: Api) -> None:
    current = admin.get(PATH)
    current["metadata"].setdefault("annotations", {})["written-by"] = "someone-else"
    admin.call("PUT", PATH, current)


def annotations(admin: Api) -> dict[str, Any]:
    annotated: dict[str, Any] = admin.get(PATH)["metadata"].get("annotations", {})
    return annotated


def put(api: Api, body: bytes) -> Any:
    return api.call("PUT", PATH, raw=body, content_type=PROTOBUF)


def test_the_hidden_objectmeta_unpins_an_update_at_the_apiserver(
    real_cluster: RealCluster, clean: None
) -> None:
    """The premise, straight to the apiserver: the stale body pinned to its resourceVersion is
    409; the same body with the hidden ObjectMeta is written over the concurrent change."""
    admin = real_cluster.admin
    admin.create(SLICES, slice_object(NAME))
    stale = get_protobuf(admin, PATH)
    someone_else_writes(admin)
    with pytest.raises(ApiError) as conflict:
        put(admin, stale)
    assert conflict.value.code == 409
    put(admin, with_hidden_meta(stale))  # 200: a lost update
    assert "written-by" not in annotations(admin)


def _requests_for_the_object(cluster: RealCluster) -> list[str]:
    return [
        f"{e['verb']} {e['requestURI']}"
        for e in cluster.audit_events()
        if e["user"]["username"] == GATEKEEPER_USER and f"/{NAME}" in e["requestURI"]
    ]


def test_the_aliased_update_is_refused_and_never_reaches_the_apiserver(
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    journal: None,
    clean: None,
) -> None:
    admin = real_cluster.admin
    admin.create(SLICES, slice_object(NAME))
    attack = with_hidden_meta(with_resource_version(get_protobuf(admin, PATH), ""))
    before = _requests_for_the_object(real_cluster)
    driver = real_gatekeeper.driver_api(GPU)
    with pytest.raises(ApiError) as refused:
        put(driver, attack)
    assert refused.value.code == 400
    assert refused.value.body["kind"] == "Status"
    assert REFUSAL in refused.value.body["message"]
    # A read forwarded after the refusal: once the apiserver logged it, it would have logged
    # anything the refused request had sent (the fetch, the dry run, the write) before it.
    driver.get(PATH)
    after = poll(
        "the apiserver's audit log to hold the read sent after the refusal",
        lambda: (seen := _requests_for_the_object(real_cluster)) != before and seen,
        timeout=10,
    )
    assert after[len(before) :] == [f"get {PATH}"]


def test_the_plain_update_is_still_pinned_while_the_aliased_one_is_refused(
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    clean: None,
) -> None:
    """Someone else writes between the gatekeeper's check (its dry run) and its write: the
    unconditional update is pinned and fails with 409; the aliased one never got as far as a
    dry run."""
    admin = real_cluster.admin
    admin.create(SLICES, slice_object(NAME))
    unconditional = with_resource_version(get_protobuf(admin, PATH), "")

    def is_the_dry_run(method: str, path_qs: str) -> bool:
        return method == "PUT" and "dryRun=All" in path_qs and f"/{NAME}" in path_qs

    with Interposer(real_cluster, is_the_dry_run, lambda: someone_else_writes(admin)) as interposer:
        gatekeeper = GatekeeperProcess(
            real_cluster,
            real_gatekeeper.policy,
            real_gatekeeper.drivers,
            real_gatekeeper.token_file,
            extra_args=("--upstream", interposer.url),
        ).start()
        try:
            driver = gatekeeper.driver_api(GPU)
            with pytest.raises(ApiError) as refused:
                put(driver, with_hidden_meta(unconditional))
            assert (refused.value.code, interposer.fired.is_set()) == (400, False)
            with pytest.raises(ApiError) as conflict:
                put(driver, unconditional)
        finally:
            gatekeeper.stop()
    assert interposer.fired.is_set()
    assert conflict.value.code == 409
    assert annotations(admin)["written-by"] == "someone-else"
