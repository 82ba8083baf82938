"""Policy validation: every fault refused at load, naming the file, the key and the reason."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.policy import KindRule, load_policy, parse_policy
from gatekeeper.policy.model import AllocationPaths, Field, UnboundTokens

SLICES = """\
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    verbs: [get, list, watch, create, update, patch, delete, deletecollection]
    versions:
      - {names: [v1], driver: spec.driver, node: spec.nodeName, pool: spec.pool.name}
"""
CLAIMS = """\
  - group: resource.k8s.io
    resource: resourceclaims
    kind: ResourceClaim
    scope: Namespaced
    rule: AllocatedToDriver
    verbs: [get, list, watch, update, patch]
    subresources: [status]
    versions:
      - names: [v1]
        results: status.allocation.devices.results
        resultDriver: driver
        nodeSelector: status.allocation.nodeSelector
        devices: status.devices
        deviceDriver: driver
"""
NODES = """\
  - group: ""
    resource: nodes
    kind: Node
    scope: Cluster
    rule: OwnNode
    verbs: [get]
    versions:
      - names: [v1]
"""
HEAD = "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\ndrivers: [gpu.example.com]\n"
GOOD = HEAD + "kinds:\n" + SLICES + CLAIMS + NODES


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


def test_a_good_policy_loads(tmp_path: Path) -> None:
    policy = load_policy(write(tmp_path, GOOD))
    claims = policy.kind_for("resource.k8s.io", "resourceclaims")
    assert claims is not None and claims.rule is KindRule.ALLOCATED_TO_DRIVER
    assert claims.verbs == {"get", "list", "watch", "update", "patch"}
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
        "kinds[0].versions[0].nodes: unknown key",
    ),
    (
        "unknown-claim-version-key",
        replaced(
            "        deviceDriver: driver\n", "        deviceDriver: driver\n        pool: x\n"
        ),
        "kinds[1].versions[0].pool: unknown key",
    ),
    (
        "bad-path-empty-segment",
        replaced("driver: spec.driver", "driver: spec..driver"),
        "kinds[0].versions[0].driver: bad field path 'spec..driver'",
    ),
    (
        "bad-path-index",
        replaced("pool: spec.pool.name", "pool: 'spec.pools[0].name'"),
        "kinds[0].versions[0].pool: bad field path",
    ),
    (
        "bad-path-jsonpath-syntax",
        replaced("devices: status.devices", "devices: $.status.devices"),
        "kinds[1].versions[0].devices: bad field path",
    ),
    (
        "bad-path-not-a-string",
        replaced("node: spec.nodeName", "node: [spec, nodeName]"),
        "kinds[0].versions[0].node: a field path must be a non-empty string",
    ),
    (
        "kind-twice",
        HEAD + "kinds:\n" + SLICES + SLICES,
        "kinds[1]: resourceslices.resource.k8s.io is listed twice under rule NodeLocal",
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
        "kinds[0].rule: 'Anything' is not one of NodeLocal, AllocatedToDriver, OwnNode",
    ),
    (
        "unknown-verb",
        replaced(
            "[get, list, watch, create, update, patch, delete, deletecollection]", "[get, proxy]"
        ),
        'kinds[0].verbs: unknown verb "proxy" (allowed: get, list, watch, create, update, '
        "patch, delete, deletecollection)",
    ),
    (
        "missing-driver-path",
        replaced("driver: spec.driver, node", "node"),
        "kinds[0].versions[0].driver: is required",
    ),
    (
        "missing-claim-path",
        replaced("        nodeSelector: status.allocation.nodeSelector\n", ""),
        "kinds[1].versions[0].nodeSelector: is required (a JSON path) by rule AllocatedToDriver",
    ),
    ("missing-scope", replaced("    scope: Cluster\n", ""), "kinds[0].scope: is required"),
    (
        "bad-version-name",
        replaced("names: [v1], driver", "names: [version1], driver"),
        "kinds[0].versions[0].names[0]: 'version1' is not a valid value",
    ),
    (
        "bad-fill-field",
        replaced("    rule: NodeLocal\n", "    rule: NodeLocal\n    fill: [name]\n"),
        "kinds[0].fill: 'name' is not one of driver, node, pool",
    ),
    (
        "claims-create",
        replaced("verbs: [get, list, watch, update, patch]", "verbs: [get, create]"),
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
    ("no-kinds", HEAD, "kinds: no kind is defined (here or in an included file)"),
    (
        "wrong-api-version",
        replaced("dra-gatekeeper.io/v1alpha1", "v1"),
        "apiVersion: must be dra-gatekeeper.io/v1alpha1",
    ),
    (
        "kind-missing",
        replaced("kind: Policy\n", ""),
        "kind: must be Policy",
    ),
    # Versions: listed together where they share rules, each name once.
    (
        "versions-a-mapping",
        replaced(
            "      - {names: [v1], driver: spec.driver, node: spec.nodeName, pool: spec.pool.name}",
            "      v1: {driver: spec.driver, node: spec.nodeName, pool: spec.pool.name}",
        ),
        "kinds[0].versions: must be a non-empty list of {names: [<version>, …], <rules>}",
    ),
    (
        "versions-empty",
        replaced(
            "    verbs: [get]\n    versions:\n      - names: [v1]\n",
            "    verbs: [get]\n    versions: []\n",
        ),
        "kinds[2].versions: must be a non-empty list",
    ),
    (
        "version-named-twice-in-one-entry",
        replaced("names: [v1], driver", "names: [v1, v1], driver"),
        "kinds[0].versions[0].names[1]: v1 is named twice (also at kinds[0].versions[0])",
    ),
    (
        "version-named-twice-across-entries",
        replaced(
            "      - {names: [v1], driver",
            "      - {names: [v1beta2, v1], driver: driverName, node: nodeName}\n"
            "      - {names: [v1], driver",
        ),
        "kinds[0].versions[1].names[0]: v1 is named twice (also at kinds[0].versions[0])",
    ),
    (
        "version-without-names",
        replaced("{names: [v1], driver", "{driver"),
        "kinds[0].versions[0].names: is required (the versions these rules are for)",
    ),
    (
        "version-names-empty",
        replaced("names: [v1], driver", "names: [], driver"),
        "kinds[0].versions[0].names: must name at least one version",
    ),
    (
        "version-names-not-a-list",
        replaced("names: [v1], driver", "names: v1, driver"),
        "kinds[0].versions[0].names: must be a list of strings",
    ),
    (
        "version-entry-not-a-mapping",
        replaced(
            "    verbs: [get]\n    versions:\n      - names: [v1]\n",
            "    verbs: [get]\n    versions: [v1]\n",
        ),
        "kinds[2].versions[0]: must be a mapping with names and the rules they share",
    ),
    (
        "immutable-in-the-current-format",
        replaced("pool: spec.pool.name}", "pool: spec.pool.name, immutable: [driver]}"),
        "kinds[0].versions[0].immutable: unknown key",
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
    text = replaced(
        "[get, list, watch, create, update, patch, delete, deletecollection]", "[lists, gets]"
    )
    with pytest.raises(ConfigError, match=r'unknown verbs "gets", "lists" \(allowed: get, list,'):
        load_policy(write(tmp_path, text))


# Every kind names its verbs: none are implied (a NodeLocal kind once got every verb,
# deletecollection included, when it named none).
VERBS_MISSING = [
    ("node-local", "[get, list, watch, create, update, patch, delete, deletecollection]", 0),
    ("allocated-to-driver", "[get, list, watch, update, patch]", 1),
    ("own-node", "[get]", 2),
]


@pytest.mark.parametrize(
    ("verbs", "index"), [c[1:] for c in VERBS_MISSING], ids=[c[0] for c in VERBS_MISSING]
)
def test_a_kind_without_verbs_is_refused(tmp_path: Path, verbs: str, index: int) -> None:
    path = write(tmp_path, replaced(f"    verbs: {verbs}\n", ""))
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    assert str(caught.value) == (
        f"{path}: kinds[{index}].verbs: is required: the verbs drivers may use on this kind "
        "(e.g. [get, list, watch]); no verbs are implied"
    )


def test_an_empty_verb_list_allows_no_verb(tmp_path: Path) -> None:
    text = replaced("[get, list, watch, create, update, patch, delete, deletecollection]", "[]")
    slices = load_policy(write(tmp_path, text)).kind_for("resource.k8s.io", "resourceslices")
    assert slices is not None and slices.verbs == frozenset()


def test_versions_listed_together_share_one_rule_set(tmp_path: Path) -> None:
    text = replaced("names: [v1], driver", "names: [v1beta1, v1beta2, v1], driver")
    slices = load_policy(write(tmp_path, text)).kind_for("resource.k8s.io", "resourceslices")
    assert slices is not None and list(slices.versions) == ["v1beta1", "v1beta2", "v1"]
    assert slices.versions["v1beta1"] == slices.versions["v1"]
    assert slices.versions["v1"].paths[Field.POOL] == ("spec", "pool", "name")


# The first format (apiVersion gatekeeper.dra.k8s.io/v1alpha1, or none): versions as a mapping
# (shared through YAML anchors), `immutable`. Still read, with one notice per deprecation.
LEGACY = """\
apiVersion: gatekeeper.dra.k8s.io/v1alpha1
kind: Policy
drivers: [gpu.example.com]
kinds:
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    verbs: [get, list, watch, create, update, patch, delete, deletecollection]
    versions:
      v1beta2: &spec
        driver: spec.driver
        node: spec.nodeName
        pool: spec.pool.name
        immutable: [driver, node, pool]
      v1: *spec
"""
CURRENT = """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
drivers: [gpu.example.com]
kinds:
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    verbs: [get, list, watch, create, update, patch, delete, deletecollection]
    versions:
      - names: [v1beta2, v1]
        driver: spec.driver
        node: spec.nodeName
        pool: spec.pool.name
        apiserverImmutable: [driver, node, pool]
"""


def notices(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gatekeeper.policy"]


def test_a_deprecated_file_loads_as_its_current_form_with_one_notice_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "gatekeeper.policy")
    current = load_policy(write(tmp_path, CURRENT))
    assert notices(caplog) == []
    path = str(tmp_path / "old.yaml")
    Path(path).write_text(LEGACY)
    legacy = load_policy(path)
    assert legacy.kinds == current.kinds
    assert legacy.kinds[("resource.k8s.io", "resourceslices")].versions["v1"].owner_fields_immutable
    assert notices(caplog) == [
        f"{path}: apiVersion gatekeeper.dra.k8s.io/v1alpha1 is deprecated: read in the old "
        "format; write `apiVersion: dra-gatekeeper.io/v1alpha1` with versions listed as "
        "[{names: […], …}] (README, The policy file)",
        f"{path}: `immutable` is deprecated: rename it `apiserverImmutable` "
        "(kinds[0].versions.v1beta2, kinds[0].versions.v1)",
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_a_file_without_api_version_is_read_in_the_deprecated_format(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "gatekeeper.policy")
    path = write(tmp_path, LEGACY.replace("apiVersion: gatekeeper.dra.k8s.io/v1alpha1\n", ""))
    assert load_policy(path).kinds == parse_policy(CURRENT).kinds
    assert notices(caplog)[0].startswith(f"{path}: no apiVersion: read in the old format; write")


DEPRECATED_INVALID = [
    (
        "both-names",
        LEGACY.replace(
            "immutable: [driver, node, pool]",
            "immutable: [driver, node, pool]\n        apiserverImmutable: [driver]",
        ),
        "kinds[0].versions.v1beta2.immutable: is the deprecated name of apiserverImmutable: "
        "give one of them",
    ),
    (
        "list-form",
        LEGACY.replace("      v1beta2: &spec\n", "      - names: [v1beta2]\n").replace(
            "      v1: *spec\n", ""
        ),
        "kinds[0].versions: must be a non-empty mapping of version to field paths",
    ),
    (
        "verbs-still-required",
        LEGACY.replace(
            "    verbs: [get, list, watch, create, update, patch, delete, deletecollection]\n", ""
        ),
        "kinds[0].verbs: is required",
    ),
    (
        "bad-version-name",
        LEGACY.replace("      v1: *spec", "      one: *spec"),
        "kinds[0].versions.one: 'one' is not a valid value",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"),
    [c[1:] for c in DEPRECATED_INVALID],
    ids=[c[0] for c in DEPRECATED_INVALID],
)
def test_deprecated_files_are_checked_as_strictly(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(text, "old.yaml")
    assert str(caught.value).startswith(f"old.yaml: {message}"), str(caught.value)
