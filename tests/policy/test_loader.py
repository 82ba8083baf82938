"""Policy validation: every fault refused at load, naming the file, the key and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.policy import KindRule, load_policy
from gatekeeper.policy.model import AllocationPaths, UnboundTokens

SLICES = """\
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    versions:
      v1: {driver: spec.driver, node: spec.nodeName, pool: spec.pool.name}
"""
CLAIMS = """\
  - group: resource.k8s.io
    resource: resourceclaims
    kind: ResourceClaim
    scope: Namespaced
    rule: AllocatedToDriver
    subresources: [status]
    versions:
      v1:
        results: status.allocation.devices.results
        resultDriver: driver
        nodeSelector: status.allocation.nodeSelector
        devices: status.devices
        deviceDriver: driver
"""
HEAD = "apiVersion: gatekeeper.dra.k8s.io/v1alpha1\nkind: Policy\ndrivers: [gpu.example.com]\n"
GOOD = HEAD + "kinds:\n" + SLICES + CLAIMS


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


def test_a_good_policy_loads(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, GOOD))
    claims = policy.kind_for("resource.k8s.io", "resourceclaims")
    assert claims is not None and claims.rule is KindRule.ALLOCATED_TO_DRIVER
    assert claims.verbs == {"get", "list", "watch", "update", "patch"}  # the rule's default
    assert claims.versions["v1"].allocation == AllocationPaths(
        results=("status", "allocation", "devices", "results"),
        result_driver=("driver",),
        node_selector=("status", "allocation", "nodeSelector"),
        devices=("status", "devices"),
        device_driver=("driver",),
    )


def test_service_accounts_map_token_users_to_drivers(tmp_path: Path) -> None:
    text = GOOD + "serviceAccounts:\n  gpu.example.com: [gpu-system/plugin, gpu-system/legacy]\n"
    policy = load_policy(write(tmp_path, text))
    assert policy.service_accounts == {
        "system:serviceaccount:gpu-system:plugin": "gpu.example.com",
        "system:serviceaccount:gpu-system:legacy": "gpu.example.com",
    }
    assert policy.unbound_tokens is UnboundTokens.REFUSE  # the default
    assert policy.with_drivers(frozenset({"x.example.com"})).service_accounts == (
        policy.service_accounts
    )


def test_the_packaged_default_policy_loads() -> None:
    policy = load_policy(None)
    assert {spec.resource for spec in policy.kinds.values()} == {
        "resourceslices",
        "resourceclaims",
        "devicepools",
        "nodes",
    }
    claims = policy.kind_for("resource.k8s.io", "resourceclaims")
    assert claims is not None and set(claims.versions) == {"v1", "v1beta2", "v1beta1", "v1alpha3"}


def replaced(old: str, new: str, text: str = GOOD) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


INVALID = [
    (
        "unknown-top-key",
        replaced("kind: Policy\n", "kind: Policy\nrules: []\n"),
        "rules: unknown key",
    ),
    (
        "unknown-kind-key",
        replaced("    scope: Cluster\n", "    scope: Cluster\n    owner: x\n"),
        "kinds[0].owner: unknown key",
    ),
    (
        "unknown-version-key",
        replaced("pool: spec.pool.name}", "pool: spec.pool.name, nodes: x}"),
        "kinds[0].versions.v1.nodes: unknown key",
    ),
    (
        "unknown-claim-version-key",
        replaced(
            "        deviceDriver: driver\n", "        deviceDriver: driver\n        pool: x\n"
        ),
        "kinds[1].versions.v1.pool: unknown key",
    ),
    (
        "bad-path-empty-segment",
        replaced("driver: spec.driver", "driver: spec..driver"),
        "kinds[0].versions.v1.driver: bad field path 'spec..driver'",
    ),
    (
        "bad-path-index",
        replaced("pool: spec.pool.name", "pool: 'spec.pools[0].name'"),
        "kinds[0].versions.v1.pool: bad field path",
    ),
    (
        "bad-path-jsonpath-syntax",
        replaced("devices: status.devices", "devices: $.status.devices"),
        "kinds[1].versions.v1.devices: bad field path",
    ),
    (
        "bad-path-not-a-string",
        replaced("node: spec.nodeName", "node: [spec, nodeName]"),
        "kinds[0].versions.v1.node: a field path must be a non-empty string",
    ),
    (
        "kind-twice",
        HEAD + "kinds:\n" + SLICES + SLICES,
        "kinds[1]: resourceslices.resource.k8s.io is listed twice",
    ),
    (
        "scope-neither",
        replaced("scope: Cluster", "scope: Node"),
        "kinds[0].scope: 'Node' is not one of Cluster, Namespaced",
    ),
    (
        "scope-lowercase",
        replaced("scope: Namespaced", "scope: namespaced"),
        "kinds[1].scope: 'namespaced' is not one of Cluster, Namespaced",
    ),
    (
        "unknown-rule",
        replaced("rule: NodeLocal", "rule: Anything"),
        "kinds[0].rule: 'Anything' is not one of NodeLocal, AllocatedToDriver",
    ),
    (
        "unknown-verb",
        replaced("    rule: NodeLocal\n", "    rule: NodeLocal\n    verbs: [get, proxy]\n"),
        'kinds[0].verbs: unknown verb "proxy" (allowed: get, list, watch, create, update, '
        "patch, delete, deletecollection)",
    ),
    (
        "missing-driver-path",
        replaced("{driver: spec.driver, ", "{"),
        "kinds[0].versions.v1.driver: is required",
    ),
    (
        "missing-claim-path",
        replaced("        nodeSelector: status.allocation.nodeSelector\n", ""),
        "kinds[1].versions.v1.nodeSelector: is required (a JSON path) by rule AllocatedToDriver",
    ),
    ("missing-scope", replaced("    scope: Cluster\n", ""), "kinds[0].scope: is required"),
    (
        "bad-version-name",
        replaced("      v1: {", "      version1: {"),
        "kinds[0].versions.version1: 'version1' is not a valid value",
    ),
    (
        "bad-fill-field",
        replaced("    rule: NodeLocal\n", "    rule: NodeLocal\n    fill: [name]\n"),
        "kinds[0].fill: 'name' is not one of driver, node, pool",
    ),
    (
        "claims-create",
        replaced(
            "    subresources: [status]\n", "    subresources: [status]\n    verbs: [get, create]\n"
        ),
        "kinds[1].verbs: rule AllocatedToDriver allows only get, list, patch, update, watch, "
        "not create",
    ),
    (
        "claims-writes-without-status",
        replaced("    subresources: [status]\n", ""),
        "kinds[1].subresources: rule AllocatedToDriver writes only through the status subresource",
    ),
    (
        "claims-other-subresource",
        replaced("subresources: [status]", "subresources: [status, binding]"),
        "kinds[1].subresources: rule AllocatedToDriver allows only [status]",
    ),
    (
        "claims-list-selector",
        replaced(
            "    rule: AllocatedToDriver\n",
            "    rule: AllocatedToDriver\n    listSelector: Inject\n",
        ),
        "kinds[1].listSelector: is not used by rule AllocatedToDriver",
    ),
    (
        "claims-fill",
        replaced(
            "    rule: AllocatedToDriver\n", "    rule: AllocatedToDriver\n    fill: [driver]\n"
        ),
        "kinds[1].fill: is not used by rule AllocatedToDriver",
    ),
    (
        "duplicate-yaml-key",
        replaced("    scope: Cluster\n", "    scope: Cluster\n    scope: Cluster\n"),
        "duplicate key 'scope'",
    ),
    ("empty-kinds", HEAD + "kinds: []\n", "kinds: must be a non-empty list"),
    (
        "wrong-api-version",
        replaced("gatekeeper.dra.k8s.io/v1alpha1", "v1"),
        "apiVersion: must be gatekeeper.dra.k8s.io/v1alpha1",
    ),
    (
        "bad-driver-name",
        replaced("drivers: [gpu.example.com]", "drivers: [GPU_driver]"),
        "drivers[0]: 'GPU_driver' is not a DNS subdomain driver name",
    ),
    ("not-yaml", "kinds: [\n", "not valid YAML"),
    (
        "service-account-twice",
        GOOD + "serviceAccounts:\n  gpu.example.com: [gpu/sa]\n  nic.example.com: [gpu/sa]\n",
        "serviceAccounts.nic.example.com[0]: gpu/sa is mapped to gpu.example.com already",
    ),
    (
        "service-account-not-namespaced",
        GOOD + "serviceAccounts: {gpu.example.com: [gpu-sa]}\n",
        "serviceAccounts.gpu.example.com[0]: 'gpu-sa' is not namespace/name",
    ),
    (
        "service-account-bad-driver",
        GOOD + "serviceAccounts: {GPU: [gpu/sa]}\n",
        "serviceAccounts.GPU: 'GPU' is not a DNS subdomain driver name",
    ),
    (
        "service-accounts-a-list",
        GOOD + "serviceAccounts: [gpu/sa]\n",
        "serviceAccounts: must be a mapping",
    ),
    (
        "unbound-tokens-unknown",
        GOOD + "unboundTokens: Sometimes\n",
        "unboundTokens: 'Sometimes' is not one of Refuse, Allow",
    ),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_policies_are_refused_at_load(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    error = str(caught.value)
    assert error.startswith(f"{path}: "), error  # the file first
    assert message in error, error
    assert "\n" not in error  # one line (DESIGN §4.1)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"{missing}: cannot read policy"):
        load_policy(str(missing))


def test_yaml_errors_name_the_file_and_unknown_verbs_list_the_allowed(tmp_path: Path) -> None:
    path = write(tmp_path, "kinds: [\n")
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    assert f'in "{path}", line' in str(caught.value)
    assert "<unicode string>" not in str(caught.value)
    text = replaced("    rule: NodeLocal\n", "    rule: NodeLocal\n    verbs: [lists, gets]\n")
    with pytest.raises(ConfigError, match=r'unknown verbs "gets", "lists" \(allowed: get, list,'):
        load_policy(write(tmp_path, text))
