"""Composition: ``include`` loads other policy files first; this file then adds drivers, service
accounts and kinds, and overrides keys or versions of included kinds. Every refusal names the
file at fault, and the files that include it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.policy.model import Field, UnboundTokens
from gatekeeper.policyfile import load_policy, parse_policy

HEAD = "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\n"
SLICES = """\
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    verbs: [get, list, watch]
    versions:
      - {names: [v1beta2, v1], driver: spec.driver, node: spec.nodeName, pool: spec.pool.name}
"""
CLAIMS = """\
  - group: resource.k8s.io
    resource: resourceclaims
    kind: ResourceClaim
    scope: Namespaced
    rule: AllocatedToDriver
    verbs: [get, list, watch]
    versions:
      - names: [v1]
        results: status.allocation.devices.results
        resultDriver: driver
        nodeSelector: status.allocation.nodeSelector
        devices: status.devices
        deviceDriver: driver
"""
BASE = HEAD + "drivers: [a.example.com]\nkinds:\n" + SLICES + CLAIMS


def files(tmp_path: Path, **texts: str) -> str:
    """Write ``name_yaml=text`` files; the path of ``root.yaml``."""
    for name, text in texts.items():
        path = tmp_path / name.replace("_yaml", ".yaml").replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / "root.yaml")


def test_an_included_file_is_loaded_first_and_this_file_adds_to_it(tmp_path: Path) -> None:
    root = files(
        tmp_path,
        base_yaml=BASE + "serviceAccounts: {a.example.com: [ns/a]}\n",
        root_yaml=HEAD
        + "include: [base.yaml]\ndrivers: [b.example.com]\n"
        + "serviceAccounts: {b.example.com: [ns/b], a.example.com: [ns/a]}\n"
        + "unboundTokens: Allow\nkinds:\n"
        + SLICES.replace("resourceslices", "widgets").replace("resource.k8s.io", "example.com"),
    )
    policy = load_policy(root)
    assert policy.drivers == {"a.example.com", "b.example.com"}
    assert policy.service_accounts == {
        "system:serviceaccount:ns:a": "a.example.com",
        "system:serviceaccount:ns:b": "b.example.com",
    }
    assert policy.unbound_tokens is UnboundTokens.ALLOW
    assert set(policy.kinds) == {
        ("resource.k8s.io", "resourceslices"),
        ("resource.k8s.io", "resourceclaims"),
        ("example.com", "widgets"),
    }
    assert policy.source == root
    assert policy.files == (root, str(tmp_path / "base.yaml"))


def test_overrides_replace_keys_whole_and_versions_by_name(tmp_path: Path) -> None:
    root = files(
        tmp_path,
        base_yaml=BASE,
        root_yaml=HEAD
        + "include: [base.yaml]\noverrides:\n"
        + "  - group: resource.k8s.io\n    resource: resourceslices\n"
        + "    verbs: [get]\n    poolSeparators: [/, '-']\n    versions:\n"
        + "      - {names: [v1], driver: spec.d, node: spec.n}\n"
        + "      - {names: [v2], driver: spec.owner.driver, node: spec.owner.node}\n",
    )
    slices = load_policy(root).kinds[("resource.k8s.io", "resourceslices")]
    assert slices.verbs == {"get"}  # replaced, not merged with [get, list, watch]
    assert slices.pool_separators == ("/", "-")
    assert list(slices.versions) == ["v1beta2", "v1", "v2"]
    assert slices.versions["v1"].paths == {Field.DRIVER: ("spec", "d"), Field.NODE: ("spec", "n")}
    # v1beta2 keeps the included rules; the kind's separators reach every version.
    assert slices.versions["v1beta2"].paths[Field.POOL] == ("spec", "pool", "name")
    assert slices.versions["v1beta2"].pool_separators == ("/", "-")
    assert slices.kind == "ResourceSlice" and slices.rule.value == "NodeLocal"


def test_the_packaged_default_is_included_by_name(tmp_path: Path) -> None:
    root = files(tmp_path, root_yaml=HEAD + "include: [packaged:default]\ndrivers: [x.example]\n")
    policy = load_policy(root)
    assert policy.kinds == load_policy(None).kinds
    assert policy.drivers == {"x.example"}
    assert policy.files == (root,)  # the packaged file changes only with the gatekeeper
    text = HEAD + "include: [packaged:default]\n"
    assert parse_policy(text, "inline").kinds == policy.kinds


def test_nested_includes_resolve_relative_to_each_file(tmp_path: Path) -> None:
    root = files(
        tmp_path,
        shared__base_yaml=BASE,
        shared__mid_yaml=HEAD + "include: [base.yaml]\ndrivers: [m.example.com]\n",
        root_yaml=HEAD + "include: [shared/mid.yaml]\n",
    )
    policy = load_policy(root)
    assert policy.drivers == {"a.example.com", "m.example.com"}
    assert policy.files == (
        root,
        str(tmp_path / "shared" / "mid.yaml"),
        str(tmp_path / "shared" / "base.yaml"),
    )


OVERRIDE = "  - group: resource.k8s.io\n    resource: resourceslices\n"
# (id, files, the file and line named first, the rest of the message)
REFUSED: list[tuple[str, dict[str, str], str, str]] = [
    (
        "missing",
        {"root_yaml": HEAD + "include: [nope.yaml]\n"},
        "nope.yaml",
        "cannot read policy: No such file or directory (included by {root})",
    ),
    (
        "unknown-packaged",
        {"root_yaml": HEAD + "include: [packaged:strict]\n"},
        "packaged:strict",
        "no such packaged policy (packaged: packaged:default) (included by {root})",
    ),
    (
        "absolute",
        {"root_yaml": HEAD + "include: [/etc/policy.yaml]\n"},
        "root.yaml:3",
        "include[0]: '/etc/policy.yaml' is not a path relative to this file, or packaged:<name>",
    ),
    (
        "not-a-list",
        {"root_yaml": HEAD + "include: base.yaml\n", "base_yaml": BASE},
        "root.yaml:3",
        "include: must be a list of strings",
    ),
    (
        "itself",
        {"root_yaml": HEAD + "include: [root.yaml]\n"},
        "root.yaml:3",
        "include[0]: {root} includes itself: {root} -> {root}",
    ),
    (
        "cycle",
        {"root_yaml": HEAD + "include: [a.yaml]\n", "a_yaml": HEAD + "include: [root.yaml]\n"},
        "a.yaml:3",
        "include[0]: {root} includes itself: {root} -> {dir}/a.yaml -> {root} (included by {root})",
    ),
    (
        "twice",
        {
            "root_yaml": HEAD + "include: [a.yaml, b.yaml]\n",
            "a_yaml": HEAD + "include: [base.yaml]\n",
            "b_yaml": HEAD + "include: [base.yaml]\n",
            "base_yaml": BASE,
        },
        "b.yaml:3",
        "include[0]: {dir}/base.yaml is included twice (also by {dir}/a.yaml): a file is included "
        "once (included by {root})",
    ),
    (
        "fault-in-an-included-file",
        {
            "root_yaml": HEAD + "include: [mid.yaml]\n",
            "mid_yaml": HEAD + "include: [base.yaml]\n",
            "base_yaml": BASE.replace("scope: Cluster", "scope: Node"),
        },
        "base.yaml:8",
        "kinds[0].scope: 'Node' is not one of Cluster, Namespaced "
        "(included by {dir}/mid.yaml <- {root})",
    ),
    (
        "kind-defined-again",
        {"root_yaml": HEAD + "include: [base.yaml]\nkinds:\n" + SLICES, "base_yaml": BASE},
        "root.yaml:5",
        "kinds[0]: resourceslices.resource.k8s.io (rule NodeLocal) is defined by {dir}/base.yaml: "
        "kinds[0] "
        "already: change it under `overrides` (a kind is defined once per rule)",
    ),
    (
        "kind-in-two-includes",
        {
            "root_yaml": HEAD + "include: [base.yaml, other.yaml]\n",
            "base_yaml": BASE,
            "other_yaml": HEAD + "kinds:\n" + SLICES,
        },
        "other.yaml:4",
        "kinds[0]: resourceslices.resource.k8s.io is defined by {dir}/base.yaml: kinds[0] too: "
        "include one of them (included by {root})",
    ),
    (
        "override-without-include",
        {"root_yaml": HEAD + "kinds:\n" + SLICES + "overrides:\n" + OVERRIDE + "    verbs: []\n"},
        "root.yaml:13",
        "overrides[0]: overrides resourceslices.resource.k8s.io, which no included file defines "
        "(this file does: edit it there)",
    ),
    (
        "override-of-an-unknown-kind",
        {
            "root_yaml": HEAD + "include: [base.yaml]\noverrides:\n"
            "  - {group: example.com, resource: widgets, verbs: []}\n",
            "base_yaml": BASE,
        },
        "root.yaml:5",
        "overrides[0]: overrides widgets.example.com, which no included file defines",
    ),
    (
        "override-twice",
        {
            "root_yaml": HEAD
            + "include: [base.yaml]\noverrides:\n"
            + OVERRIDE
            + "    verbs: []\n"
            + OVERRIDE
            + "    verbs: [get]\n",
            "base_yaml": BASE,
        },
        "root.yaml:8",
        "overrides[1]: resourceslices.resource.k8s.io is overridden twice",
    ),
    (
        "override-changes-the-rule",
        {
            "root_yaml": HEAD
            + "include: [base.yaml]\noverrides:\n"
            + OVERRIDE
            + "    rule: AllocatedToDriver\n",
            "base_yaml": BASE,
        },
        "root.yaml:7",
        "overrides[0].rule: resourceslices.resource.k8s.io is listed under rule NodeLocal, not "
        "AllocatedToDriver: an override names the rule of the entry it changes, it cannot change "
        "a rule",
    ),
    (
        "override-of-nothing",
        {"root_yaml": HEAD + "include: [base.yaml]\noverrides:\n" + OVERRIDE, "base_yaml": BASE},
        "root.yaml:5",
        "overrides[0]: overrides nothing: give the keys or versions to replace",
    ),
    (
        "override-breaks-the-rule",
        {
            "root_yaml": HEAD + "include: [base.yaml]\noverrides:\n"
            "  - {group: resource.k8s.io, resource: resourceclaims, verbs: [get, delete]}\n",
            "base_yaml": BASE,
        },
        "root.yaml:5",
        "overrides[0].verbs[1]: 'delete' is not one of get, list, watch, update, patch "
        "(rule AllocatedToDriver)",
    ),
    (
        "override-version-at-fault",
        {
            "root_yaml": HEAD
            + "include: [base.yaml]\noverrides:\n"
            + OVERRIDE
            + "    versions: [{names: [v2], driver: spec.d}]\n",
            "base_yaml": BASE,
        },
        "root.yaml:7",
        "overrides[0].versions[0].node: is required",
    ),
    (
        # The kind an override changed is checked whole, by the schema of its rule: the fault
        # is named where the value at fault was written.
        "override-adds-a-key-its-rule-refuses",
        {
            "root_yaml": HEAD + "include: [base.yaml]\noverrides:\n"
            "  - {group: resource.k8s.io, resource: resourceclaims, fill: [driver]}\n",
            "base_yaml": BASE,
        },
        "root.yaml:5",
        "overrides[0].fill: is not allowed (rule AllocatedToDriver)",
    ),
    (
        "override-version-of-another-rules-shape",
        {
            "root_yaml": HEAD
            + "include: [base.yaml]\noverrides:\n"
            + OVERRIDE
            + "    versions: [{names: [v2]}]\n",
            "base_yaml": BASE,
        },
        "root.yaml:7",
        "overrides[0].versions[0].driver: is required (rule NodeLocal)",
    ),
    (
        "service-account-of-two-drivers",
        {
            "root_yaml": HEAD + "include: [base.yaml]\nserviceAccounts: {b.example.com: [ns/a]}\n",
            "base_yaml": BASE + "serviceAccounts: {a.example.com: [ns/a]}\n",
        },
        "root.yaml:4",
        "serviceAccounts.b.example.com[0]: ns/a is mapped to a.example.com already by "
        "{dir}/base.yaml: serviceAccounts.a.example.com[0]: a service account identifies one "
        "driver",
    ),
    (
        "includes-disagree-on-unbound-tokens",
        {
            "root_yaml": HEAD + "include: [base.yaml, other.yaml]\n",
            "base_yaml": BASE + "unboundTokens: Refuse\n",
            "other_yaml": HEAD + "unboundTokens: Allow\n",
        },
        "root.yaml:1",
        "unboundTokens: the included files disagree ({dir}/base.yaml: unboundTokens: Refuse, "
        "{dir}/other.yaml: unboundTokens: Allow): set it here",
    ),
]


@pytest.mark.parametrize(
    ("texts", "named", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_composition_faults_name_the_file_and_its_includers(
    tmp_path: Path, texts: dict[str, str], named: str, message: str
) -> None:
    root = files(tmp_path, **texts)
    with pytest.raises(ConfigError) as caught:
        load_policy(root)
    shown = named if named.startswith("packaged:") else f"{tmp_path}/{named}"
    expected = f"{shown}: " + message.format(root=root, dir=tmp_path)
    assert str(caught.value) == expected


def test_two_includes_that_agree_need_no_decision_and_this_file_decides(tmp_path: Path) -> None:
    texts = {
        "base_yaml": BASE + "unboundTokens: Refuse\n",
        "other_yaml": HEAD + "unboundTokens: Refuse\n",
        "root_yaml": HEAD + "include: [base.yaml, other.yaml]\n",
    }
    assert load_policy(files(tmp_path, **texts)).unbound_tokens is UnboundTokens.REFUSE
    texts["other_yaml"] = HEAD + "unboundTokens: Allow\n"
    texts["root_yaml"] += "unboundTokens: Allow\n"
    assert load_policy(files(tmp_path, **texts)).unbound_tokens is UnboundTokens.ALLOW


def test_a_relative_include_needs_a_file() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(HEAD + "include: [base.yaml]\n", "inline")
    assert str(caught.value) == (
        "inline:3: include[0]: 'base.yaml': a relative include needs the policy to be a file"
    )


def test_files_read_lists_what_a_failed_load_tried(tmp_path: Path) -> None:
    root = files(tmp_path, root_yaml=HEAD + "include: [later.yaml]\n")
    tried: list[str] = []
    with pytest.raises(ConfigError):
        load_policy(root, files_read=tried)
    assert tried == [root, str(tmp_path / "later.yaml")]
