"""The admission-policy export, offline: its CEL compiles with the gatekeeper's own runtime; every
write the gatekeeper forwards in the test files of the repository passes it (no surprise
refusals); and the takeovers a stolen gatekeeper token would try are refused by it alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gatekeeper.cli.main import main
from gatekeeper.errors import Refusal
from gatekeeper.policy.admissioncheck import ExportedPolicy, Write
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.policytest import Harness, load_test_file
from gatekeeper.request.requestinfo import parse_request

REPO = Path(__file__).resolve().parents[2]
TEST_FILES = [
    REPO / "policies" / "default_test.yaml",
    REPO / "policies" / "node-dash_test.yaml",
    REPO / "policies" / "new-kind-example_test.yaml",
    REPO / "tests" / "policy" / "rules" / "rules_test.yaml",
]
_WRITES = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _writes(harness: Harness, method: str, path: str, before: dict[str, Any]) -> list[Write]:
    """The write as admission saw it, one per object it changed (a collection delete: each one
    deleted): the stored object after it and before it (``before``: name → object)."""
    info = parse_request(method, path)
    api = harness.apiserver
    after = {o["metadata"]["name"]: o for o in api.objects(info.api_group, info.resource)}
    if method == "DELETE" and not info.name:
        gone = [name for name in before if name not in after]
        return [_write("delete", info, name, None, before[name]) for name in gone]
    if method == "POST":
        made = [name for name in after if name not in before]
        return [_write("create", info, name, after[name], None) for name in made]
    verb = _WRITES[method]
    return [_write(verb, info, info.name, after.get(info.name), before.get(info.name))]


def _write(verb: str, info: Any, name: str, new: Any, old: Any) -> Write:
    return Write(verb, info.api_group, info.api_version, info.resource, info.subresource,
                 info.namespace, name, None if verb == "delete" else new, old)  # fmt: skip


@pytest.mark.parametrize("path", TEST_FILES, ids=[p.name for p in TEST_FILES])
async def test_what_the_gatekeeper_forwards_the_admission_policy_allows(path: Path) -> None:
    test_file = load_test_file(str(path))
    exported = ExportedPolicy(test_file.policy)
    checked = 0
    async with Harness(test_file) as harness:
        for case in test_file.cases:
            if case.request.method not in _WRITES:
                continue
            try:
                info = parse_request(case.request.method, urlsplit(case.request.target).path)
            except Refusal:
                continue  # refused before any policy: nothing reaches admission
            before: dict[str, Any] = {}

            def snapshot(info: Any = info, before: dict[str, Any] = before) -> None:
                if harness.apiserver.store.serves((info.api_group, info.resource)):
                    objects = harness.apiserver.objects(info.api_group, info.resource)
                    before.update({o["metadata"]["name"]: o for o in objects})

            outcome = await harness.run(case, snapshot)
            forwarded = outcome.forwarded
            if forwarded is None or forwarded.method not in _WRITES or outcome.code >= 300:
                continue
            if forwarded.query.get("dryRun") == "All":
                continue
            for write in _writes(harness, forwarded.method, urlsplit(forwarded.path).path, before):
                refusal = exported.refusal(write, test_file.node, "gatekeeper")
                assert refusal is None, (case.name, refusal)
                checked += exported.matches(write)
    assert checked > 0


POLICY = load_policy(str(REPO / "tests" / "policy" / "rules" / "rules.yaml"))
EXPORT = ExportedPolicy(POLICY)
NODE = "node-a"


def slice_v1(driver: str = "gpu.example.com", node: str = NODE, pool: str = "node-a/gpus") -> Any:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
            "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool}}}  # fmt: skip


def claim(driver: str = "gpu.example.com", node: str = NODE, entries: Any = ()) -> Any:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "status": {"allocation": {"devices": {"results": [{"driver": driver, "device": "d0"}]},
                                  "nodeSelector": {"nodeSelectorTerms": [term]}},
                   "devices": list(entries)},
    }  # fmt: skip


def node_object(labels: Any) -> Any:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels},
            "spec": {}}  # fmt: skip


SLICE = ("resource.k8s.io", "v1", "resourceslices")
TAKEOVERS = [
    ("another node's slice", Write("create", *SLICE, object=slice_v1(node="node-b"))),
    ("another driver's slice", Write("create", *SLICE, object=slice_v1(driver="evil.example.com"))),
    ("a pool outside the prefix", Write("create", *SLICE, object=slice_v1(pool="node-b/gpus"))),
    ("a pool of a longer node name", Write("create", *SLICE, object=slice_v1(pool="node-ab"))),
    ("deleting another node's slice",
     Write("delete", *SLICE, name="s", old_object=slice_v1(node="node-b"))),
    ("moving a slice to another node",
     Write("update", *SLICE, name="s", object=slice_v1(node="node-b"), old_object=slice_v1())),
    ("another driver's claim status entry",
     Write("update", "resource.k8s.io", "v1", "resourceclaims", "status", "default", "c",
           claim(entries=[{"driver": "nic.example.com", "device": "d0"}]), claim())),
    ("a claim allocated on another node",
     Write("update", "resource.k8s.io", "v1", "resourceclaims", "status", "default", "c",
           claim(node="node-b", entries=[{"driver": "gpu.example.com", "device": "d0"}]),
           claim(node="node-b"))),
    ("another node's labels",
     Write("update", "", "v1", "nodes", name="node-b",
           object={**node_object({"gpu.example.com/x": "1"}), "metadata": {"name": "node-b"}},
           old_object={**node_object({}), "metadata": {"name": "node-b"}})),
    ("a label outside mayChange",
     Write("update", "", "v1", "nodes", name=NODE,
           object=node_object({"kubernetes.io/hostname": "x"}), old_object=node_object({}))),
    ("a taint rule for every device",
     Write("create", "resource.k8s.io", "v1beta2", "devicetaintrules", name="all",
           object={"spec": {"deviceSelector": {}, "taint": {"effect": "NoExecute"}}})),
    ("an event in another namespace",
     Write("create", "", "v1", "events", namespace="kube-system",
           object={"reportingComponent": "gpu.example.com"})),
]  # fmt: skip


@pytest.mark.parametrize(("what", "write"), TAKEOVERS, ids=[t[0] for t in TAKEOVERS])
def test_the_admission_policy_refuses_a_takeover_by_itself(what: str, write: Write) -> None:
    assert EXPORT.refusal(write, NODE) is not None


def managed(*entries: tuple[str, str, Any]) -> list[dict[str, Any]]:
    """managedFields entries: (manager, time, fieldsV1)."""
    return [
        {"manager": manager, "operation": "Update", "apiVersion": "v1", "time": time,
         "fieldsType": "FieldsV1", "fieldsV1": fields}
        for manager, time, fields in entries
    ]  # fmt: skip


def labelled(labels: Any, entries: list[dict[str, Any]]) -> Any:
    obj = node_object(labels)
    obj["metadata"]["managedFields"] = entries
    return obj


def owns(*keys: str) -> dict[str, Any]:
    return {"f:metadata": {"f:labels": {f"f:{key}": {} for key in keys}}}


T0, T1 = "2026-12-01T10:00:00Z", "2026-12-02T10:00:00Z"
KUBELET = ("kubelet", T0, owns("kubernetes.io/hostname", "gpu.example.com/x"))
HOSTNAME = owns("kubernetes.io/hostname")
WRITER = ("driver", T1, owns("gpu.example.com/x"))
STORED_NODE = labelled({"kubernetes.io/hostname": NODE, "gpu.example.com/x": "1"}, managed(KUBELET))
# (id, managedFields after the write, refused): the write changes gpu.example.com/x (allowed).
BOOKKEEPING = [
    ("the-writers-new-entry-taking-a-field", managed(("kubelet", T0, HOSTNAME), WRITER), False),
    ("forged-another-entry",
     managed(KUBELET, WRITER, ("controller", T1, {"f:spec": {"f:taints": {}}})), True),
    ("forged-growth-of-an-entry",
     managed(("kubelet", T0, {**HOSTNAME, "f:spec": {"f:taints": {}}}), WRITER), True),
    ("forged-manager-renamed", managed(("kube-controller-manager", T0, HOSTNAME), WRITER), True),
    ("cleared", [], False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("after", "refused"), [c[1:] for c in BOOKKEEPING], ids=[c[0] for c in BOOKKEEPING]
)
def test_managed_fields_change_only_as_the_apiserver_records_the_write(
    after: list[dict[str, Any]], refused: bool
) -> None:
    """What the apiserver's bookkeeping of one write does (the writer's entry, the fields it took
    over), the admission policy allows; an entry a write brought, changed or grew, it refuses."""
    new = labelled({"kubernetes.io/hostname": NODE, "gpu.example.com/x": "2"}, after)
    write = Write("update", "", "v1", "nodes", name=NODE, object=new, old_object=STORED_NODE)
    refusal = EXPORT.refusal(write, NODE)
    assert (refusal is not None) is refused, refusal
    if refused:
        assert refusal is not None and "managedFields" in refusal.validation.message


def test_a_create_brings_no_managed_fields_entry_of_its_own() -> None:
    created = {**slice_v1(), "metadata": {"name": "s", "managedFields": managed(KUBELET)}}
    assert EXPORT.refusal(Write("create", *SLICE, object=created), NODE) is None
    created["metadata"]["managedFields"] = managed(KUBELET, ("driver", T1, {}))
    assert EXPORT.refusal(Write("create", *SLICE, object=created), NODE) is not None


def test_a_token_without_a_node_is_refused() -> None:
    refusal = EXPORT.refusal(Write("create", *SLICE, object=slice_v1()), node="")
    assert refusal is not None and "names no node" in refusal.validation.message


def test_the_allowed_forms_pass() -> None:
    own = claim(entries=[{"driver": "gpu.example.com", "device": "d0", "data": {"x": 1}}])
    for write in (
        Write("create", *SLICE, object=slice_v1()),
        Write("update", "resource.k8s.io", "v1", "resourceclaims", "status", "default", "c",
              own, claim()),
        Write("update", "", "v1", "nodes", name=NODE,
              object=node_object({"gpu.example.com/x": "1", "a": "b"}),
              old_object=node_object({"a": "b"})),
    ):  # fmt: skip
        assert EXPORT.refusal(write, NODE) is None, write


def test_expressions_reading_what_the_apiserver_cannot_see_are_listed_not_exported() -> None:
    text = (
        (REPO / "tests" / "policy" / "rules" / "rules.yaml")
        .read_text()
        .replace(
            "expression: object.?reportingComponent.orValue('') == variables.driver",
            "expression: object.?reportingComponent.orValue('') == variables.pod",
        )
    )
    policy = parse_policy(text, "p.yaml", directory=str(REPO / "tests" / "policy" / "rules"))
    (left,) = ExportedPolicy(policy).export.not_exported
    assert left.where == "events v1 reports-itself" and "variables.pod" in left.source


def test_the_command_prints_a_policy_and_its_binding(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "vap", "--driver", "gpu.example.com"]) == 0
    vap, binding = yaml.safe_load_all(capsys.readouterr().out)
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"] == {"policyName": "dra-gatekeeper", "validationActions": ["Deny"]}
    assert vap["spec"]["matchConditions"][0]["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:kube-system:dra-gatekeeper'"
    )


SHIPPED = [
    None,
    *sorted(str(p) for p in (REPO / "policies").glob("*.yaml") if "_test" not in p.name),
]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: Path(p).name if p else "default")
def test_the_export_avoids_what_the_apiservers_cel_does_not_compile(path: str | None) -> None:
    """The gatekeeper's CEL runtime is more lenient than the apiserver's admission CEL in two
    ways the real tier found (tests/realcluster/test_admission.py installs the export, which
    is the proof): a list literal mixing types ("expected type 'null' but found 'bool'") and
    ``cel.bind`` ("undeclared reference to 'bind'"). Neither is printed, for any shipped policy."""
    export = ExportedPolicy(load_policy(path)).export
    sources = [e for _, e in export.variables] + [v.expression for v in export.validations]
    assert sources
    for source in sources:
        assert "cel.bind" not in source
        assert "[null, false]" not in source and "in [null" not in source
