"""Policy validation: every fault refused at load, naming the file, the key and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.policy import KindRule
from gatekeeper.policy.model import AllocationPaths, Field, UnboundTokens
from gatekeeper.policyfile import load_policy

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


# (id, text, the message after "<file>:<line>: ", a text on the line it names)
INVALID = [
    (
        "unknown-top-key",
        replaced("kind: Policy\n", "kind: Policy\nrules: []\n"),
        "rules: unknown key (allowed: apiVersion, drivers, include, kind, kinds, overrides, "
        "serviceAccounts, unboundTokens)",
        "rules: []",
    ),
    (
        "unknown-kind-key",
        replaced("    scope: Cluster\n", "    scope: Cluster\n    owner: x\n"),
        "kinds[0].owner: unknown key (allowed: apiserverImmutableConfirmed, encodings, fill, "
        "group, kind, listSelector, poolSeparators, readAcrossNodes, resource, rule, scope, "
        "subresources, validations, variables, verbs, versions)",
        "owner: x",
    ),
    (
        "unknown-version-key",
        replaced("pool: spec.pool.name}", "pool: spec.pool.name, nodes: x}"),
        "kinds[0].versions[0].nodes: unknown key (allowed: apiserverImmutable, driver, "
        "fieldSelectors, forbidden, names, node, nodeSelector, pool, validations, variables) "
        "(rule NodeLocal)",
        "nodes: x",
    ),
    (
        "unknown-claim-version-key",
        replaced(
            "        deviceDriver: driver\n", "        deviceDriver: driver\n        pool: x\n"
        ),
        "kinds[1].versions[0].pool: unknown key (allowed: deviceDriver, devices, names, "
        "nodeSelector, opaque, resultDriver, results, times, validations, variables) "
        "(rule AllocatedToDriver)",
        "pool: x",
    ),
    (
        "bad-path-empty-segment",
        replaced("driver: spec.driver", "driver: spec..driver"),
        "kinds[0].versions[0].driver: 'spec..driver' is not a field path: dotted plain field "
        "names (spec.pool.name), no [0], no $ (rule NodeLocal)",
        "spec..driver",
    ),
    (
        "bad-path-index",
        replaced("pool: spec.pool.name", "pool: 'spec.pools[0].name'"),
        "kinds[0].versions[0].pool: 'spec.pools[0].name' is not a field path",
        "spec.pools[0]",
    ),
    (
        "bad-path-jsonpath-syntax",
        replaced("devices: status.devices", "devices: $.status.devices"),
        "kinds[1].versions[0].devices: '$.status.devices' is not a field path",
        "devices: $.status",
    ),
    (
        "bad-path-not-a-string",
        replaced("node: spec.nodeName", "node: [spec, nodeName]"),
        "kinds[0].versions[0].node: must be a field path (rule NodeLocal)",
        "[spec, nodeName]",
    ),
    (
        "kind-twice",
        HEAD + "kinds:\n" + SLICES + SLICES,
        "kinds[1]: resourceslices.resource.k8s.io is listed twice under rule NodeLocal",
        "- group: resource.k8s.io",
    ),
    (
        "scope-neither",
        replaced("scope: Cluster", "scope: Node"),
        "kinds[0].scope: 'Node' is not one of Cluster, Namespaced",
        "scope: Node",
    ),
    (
        "scope-lowercase",
        replaced("scope: Namespaced", "scope: namespaced"),
        "kinds[1].scope: 'namespaced' is not one of Cluster, Namespaced",
        "scope: namespaced",
    ),
    (
        "unknown-rule",
        replaced("rule: NodeLocal", "rule: Anything"),
        "kinds[0].rule: 'Anything' is not one of NodeLocal, AllocatedToDriver, OwnNode, OwnPod, "
        "OnNode, DriverNamespace, CEL, DriverCredentials",
        "rule: Anything",
    ),
    (
        "unknown-verb",
        replaced(
            "[get, list, watch, create, update, patch, delete, deletecollection]", "[get, proxy]"
        ),
        "kinds[0].verbs[1]: 'proxy' is not one of get, list, watch, create, update, patch, "
        "delete, deletecollection",
        "[get, proxy]",
    ),
    (
        "missing-driver-path",
        replaced("driver: spec.driver, node", "node"),
        "kinds[0].versions[0].driver: is required (rule NodeLocal)",
        "{names: [v1], node",
    ),
    (
        "missing-claim-path",
        replaced("        nodeSelector: status.allocation.nodeSelector\n", ""),
        "kinds[1].versions[0].nodeSelector: is required (rule AllocatedToDriver)",
        "- names: [v1]",
    ),
    (
        "missing-scope",
        replaced("    scope: Cluster\n", ""),
        "kinds[0].scope: is required",
        "- group: resource.k8s.io",
    ),
    (
        "bad-version-name",
        replaced("names: [v1], driver", "names: [version1], driver"),
        "kinds[0].versions[0].names[0]: 'version1' is not a version name (v1, v1beta2, "
        "v1alpha3, …)",
        "[version1]",
    ),
    (
        "bad-fill-field",
        replaced("    rule: NodeLocal\n", "    rule: NodeLocal\n    fill: [name]\n"),
        "kinds[0].fill[0]: 'name' is not one of driver, node, pool",
        "fill: [name]",
    ),
    (
        "claims-create",
        replaced("verbs: [get, list, watch, update, patch]", "verbs: [get, create]"),
        "kinds[1].verbs[1]: 'create' is not one of get, list, watch, update, patch "
        "(rule AllocatedToDriver)",
        "verbs: [get, create]",
    ),
    (
        "claims-writes-without-status",
        replaced("    subresources: [status]\n", ""),
        "kinds[1].subresources: is required: writes go only through the status subresource "
        "(list [status], or drop update and patch from verbs) (rule AllocatedToDriver)",
        "- group: resource.k8s.io",
    ),
    (
        "claims-other-subresource",
        replaced("subresources: [status]", "subresources: [status, binding]"),
        "kinds[1].subresources[1]: must be status (rule AllocatedToDriver)",
        "[status, binding]",
    ),
    (
        "claims-list-selector",
        replaced(
            "    rule: AllocatedToDriver\n",
            "    rule: AllocatedToDriver\n    listSelector: Inject\n",
        ),
        "kinds[1].listSelector: is not allowed (rule AllocatedToDriver)",
        "listSelector: Inject",
    ),
    (
        "claims-fill",
        replaced(
            "    rule: AllocatedToDriver\n", "    rule: AllocatedToDriver\n    fill: [driver]\n"
        ),
        "kinds[1].fill: is not allowed (rule AllocatedToDriver)",
        "fill: [driver]",
    ),
    (
        "duplicate-yaml-key",
        replaced("    scope: Cluster\n", "    scope: Cluster\n    scope: Cluster\n"),
        "not valid YAML: duplicate key 'scope'",
        "scope: Cluster",
    ),
    ("empty-kinds", HEAD + "kinds: []\n", "kinds: must be a non-empty list", "kinds: []"),
    (
        "no-kinds",
        HEAD,
        "kinds: no kind is defined (here or in an included file): an empty policy would allow "
        "nothing",
        "",  # the policy as a whole: no line
    ),
    (
        "wrong-api-version",
        replaced("dra-gatekeeper.io/v1alpha1", "v1"),
        "apiVersion: must be dra-gatekeeper.io/v1alpha1",
        "apiVersion: v1",
    ),
    ("kind-missing", replaced("kind: Policy\n", ""), "kind: must be Policy", "apiVersion:"),
    # Versions: listed together where they share rules, each name once.
    (
        "versions-a-mapping",
        replaced(
            "      - {names: [v1], driver: spec.driver, node: spec.nodeName, pool: spec.pool.name}",
            "      v1: {driver: spec.driver, node: spec.nodeName, pool: spec.pool.name}",
        ),
        "kinds[0].versions: must be a list of {names: [<version>, …], <rules>}",
        "versions:",
    ),
    (
        "versions-empty",
        replaced(
            "    verbs: [get]\n    versions:\n      - names: [v1]\n",
            "    verbs: [get]\n    versions: []\n",
        ),
        "kinds[2].versions: must be a non-empty list",
        "versions: []",
    ),
    (
        "version-named-twice-in-one-entry",
        replaced("names: [v1], driver", "names: [v1, v1], driver"),
        "kinds[0].versions[0].names[1]: 'v1' is listed twice",
        "[v1, v1]",
    ),
    (
        "version-named-twice-across-entries",
        replaced(
            "      - {names: [v1], driver",
            "      - {names: [v1beta2, v1], driver: driverName, node: nodeName}\n"
            "      - {names: [v1], driver",
        ),
        "kinds[0].versions[1].names[0]: v1 is named twice (also at kinds[0].versions[0])",
        "{names: [v1], driver",
    ),
    (
        "version-without-names",
        replaced("{names: [v1], driver", "{driver"),
        "kinds[0].versions[0].names: is required",
        "{driver: spec.driver",
    ),
    (
        "version-names-empty",
        replaced("names: [v1], driver", "names: [], driver"),
        "kinds[0].versions[0].names: must be a non-empty list",
        "names: []",
    ),
    (
        "version-names-not-a-list",
        replaced("names: [v1], driver", "names: v1, driver"),
        "kinds[0].versions[0].names: must be a list of version names",
        "names: v1",
    ),
    (
        "version-entry-not-a-mapping",
        replaced(
            "    verbs: [get]\n    versions:\n      - names: [v1]\n",
            "    verbs: [get]\n    versions: [v1]\n",
        ),
        "kinds[2].versions[0]: must be a mapping with names and the rules they share",
        "versions: [v1]",
    ),
    (
        # The first format's name of apiserverImmutable: that format is read no more.
        "immutable",
        replaced("pool: spec.pool.name}", "pool: spec.pool.name, immutable: [driver]}"),
        "kinds[0].versions[0].immutable: unknown key",
        "immutable: [driver]",
    ),
    (
        "bad-driver-name",
        replaced("drivers: [gpu.example.com]", "drivers: [GPU_driver]"),
        "drivers[0]: 'GPU_driver' is not a driver name (a DNS subdomain of at most 63 "
        'characters), or "*"',
        "[GPU_driver]",
    ),
    (
        "not-yaml",
        replaced("kind: Policy\n", "kind: Policy: x\n"),
        "not valid YAML: mapping values are not allowed here",
        "kind: Policy: x",
    ),
    (
        "service-account-twice",
        GOOD + "serviceAccounts:\n  gpu.example.com: [gpu/sa]\n  nic.example.com: [gpu/sa]\n",
        "serviceAccounts.nic.example.com[0]: gpu/sa is mapped to gpu.example.com already",
        "nic.example.com: [gpu/sa]",
    ),
    (
        "service-account-not-namespaced",
        GOOD + "serviceAccounts: {gpu.example.com: [gpu-sa]}\n",
        "serviceAccounts.gpu.example.com[0]: 'gpu-sa' is not namespace/name",
        "[gpu-sa]",
    ),
    (
        "service-account-namespace-too-long",
        GOOD + f"serviceAccounts: {{gpu.example.com: [{'n' * 64}/sa]}}\n",
        "serviceAccounts.gpu.example.com[0]: 'nnnn",
        "serviceAccounts:",
    ),
    (
        "service-account-bad-driver",
        GOOD + "serviceAccounts: {GPU: [gpu/sa]}\n",
        "serviceAccounts.GPU: 'GPU' is not a driver name (a DNS subdomain of at most 63 "
        "characters)",
        "{GPU: [gpu/sa]}",
    ),
    (
        "service-accounts-a-list",
        GOOD + "serviceAccounts: [gpu/sa]\n",
        "serviceAccounts: must be a mapping",
        "serviceAccounts: [gpu/sa]",
    ),
    (
        "unbound-tokens-unknown",
        GOOD + "unboundTokens: Sometimes\n",
        "unboundTokens: 'Sometimes' is not one of Refuse, Allow",
        "unboundTokens: Sometimes",
    ),
    (
        "a-test-file",
        "policy: packaged:default\nnode: node-a\ncases:\n  - name: x\n",
        "cases: this is a policy test file (it lists cases), not a policy: a policy says "
        "`kind: Policy`; run a test file with `dra-gatekeeper test`",
        "cases:",
    ),
]


def refusal(path: str, error: str, text: str) -> tuple[str, str]:
    """(the text of the line an error names, the rest of the message); the error starts with
    the file and the line (``path:12: …``), or the file alone for the policy as a whole."""
    assert error.startswith(f"{path}:"), error  # the file first
    if error.startswith(f"{path}: "):
        return "", error.removeprefix(f"{path}: ")
    line, _, rest = error.removeprefix(f"{path}:").partition(": ")
    return text.splitlines()[int(line) - 1], rest


@pytest.mark.parametrize(
    ("text", "message", "marker"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_policies_are_refused_at_load(
    tmp_path: Path, text: str, message: str, marker: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    error = str(caught.value)
    line, rest = refusal(path, error, text)
    assert rest.startswith(message), error
    assert marker in line, (error, line)
    assert "\n" not in error  # one line (DESIGN §4.1)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"{missing}: cannot read policy"):
        load_policy(str(missing))


def test_yaml_errors_name_the_file_and_line_and_unknown_verbs_each_their_place(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "kinds: [\n")
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    assert str(caught.value).startswith(f"{path}:2: not valid YAML: ")
    assert "<unicode string>" not in str(caught.value)
    text = replaced(
        "[get, list, watch, create, update, patch, delete, deletecollection]", "[lists, gets]"
    )
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_policy(path)
    assert str(caught.value) == (
        f"{path}:10: kinds[0].verbs[0]: 'lists' is not one of get, list, watch, create, update, "
        "patch, delete, deletecollection"
    )


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

    line = [i for i, t in enumerate(GOOD.splitlines(), 1) if t.startswith("  - group:")][index]
    assert str(caught.value) == (
        f"{path}:{line}: kinds[{index}].verbs: is required: the verbs drivers may use on this "
        "kind (e.g. [get, list, watch]); no verbs are implied"
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
