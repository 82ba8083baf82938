"""``apiserverImmutable`` is a security assertion: the apiserver itself refuses changes to these
fields, so an apply that creates may be forwarded as an apply. Kubernetes' own validation says so
for the built-in groups; for any other group only the cluster's CRD can, so the policy confirms
it for that kind by name, and a block copied to another kind does not carry it over."""

from __future__ import annotations

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.policy.model import BUILT_IN_GROUPS, Field
from gatekeeper.policyfile import parse_policy

HEAD = "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\n"
KIND = """\
kinds:
  - group: {group}
    resource: widgets
    kind: Widget
    scope: Cluster
    rule: NodeLocal
    verbs: [get, create]
{extra}    versions:
      - names: [v1]
        driver: spec.driver
        node: spec.nodeName
{immutable}"""
ASSERTS = "        apiserverImmutable: [driver, node]\n"


def policy(group: str, *, extra: str = "", immutable: str = ASSERTS, head: str = HEAD) -> str:
    return head + KIND.format(group=group, extra=extra, immutable=immutable)


def test_a_built_in_group_asserts_it_on_kubernetes_validation() -> None:
    assert "resource.k8s.io" in BUILT_IN_GROUPS and "devmgmtproto.k8s.io" not in BUILT_IN_GROUPS
    kind = parse_policy(policy("resource.k8s.io")).kinds["resource.k8s.io", "widgets"]
    assert kind.versions["v1"].owner_fields_immutable
    assert not kind.apiserver_immutable_confirmed


def test_a_custom_resource_asserts_it_once_confirmed_for_itself() -> None:
    text = policy("example.com", extra="    apiserverImmutableConfirmed: widgets.example.com\n")
    kind = parse_policy(text).kinds["example.com", "widgets"]
    assert kind.apiserver_immutable_confirmed
    assert kind.versions["v1"].apiserver_immutable == {Field.DRIVER, Field.NODE}
    assert kind.versions["v1"].owner_fields_immutable


UNCONFIRMED = (
    "asserts that the apiserver refuses changes to these fields of widgets.{group} v1, a kind "
    "outside the built-in Kubernetes API groups: only its CRD's validation (a rule "
    "self == oldSelf on each field) makes that true. Confirm it with "
    "`apiserverImmutableConfirmed: widgets.{group}` on the kind, or drop {key} "
    "(docs/policy.md#apiserverimmutable-a-security-assertion)"
)
REFUSED = [
    (
        "custom-unconfirmed",
        policy("example.com"),
        "kinds[0].versions[0].apiserverImmutable: "
        + UNCONFIRMED.format(group="example.com", key="apiserverImmutable"),
    ),
    (
        # A k8s.io suffix is not a built-in group: the DevicePool prototype is a CRD.
        "k8s-io-suffix-is-not-built-in",
        policy("devmgmtproto.k8s.io"),
        "kinds[0].versions[0].apiserverImmutable: "
        + UNCONFIRMED.format(group="devmgmtproto.k8s.io", key="apiserverImmutable"),
    ),
    (
        "confirmation-of-a-copied-kind",
        policy("example.com", extra="    apiserverImmutableConfirmed: gadgets.example.com\n"),
        "kinds[0].apiserverImmutableConfirmed: 'gadgets.example.com' is not this kind: it must "
        "name widgets.example.com (a confirmation is for one kind's CRD, not for a copy of it)",
    ),
    (
        "confirmation-of-nothing",
        policy(
            "example.com",
            extra="    apiserverImmutableConfirmed: widgets.example.com\n",
            immutable="",
        ),
        "kinds[0].apiserverImmutableConfirmed: confirms nothing: no version of "
        "widgets.example.com lists apiserverImmutable",
    ),
    (
        "confirmation-in-a-built-in-group",
        policy(
            "resource.k8s.io", extra="    apiserverImmutableConfirmed: widgets.resource.k8s.io\n"
        ),
        "kinds[0].apiserverImmutableConfirmed: is only for kinds outside the built-in Kubernetes "
        "API groups: the validation of resource.k8s.io is the apiserver's own",
    ),
    (
        # Overriding an included kind cannot add the assertion without the confirmation either.
        "override-adds-it-to-a-custom-kind",
        HEAD
        + "include: [packaged:default]\noverrides:\n"
        + "  - group: devmgmtproto.k8s.io\n    resource: devicepools\n    versions:\n"
        + "      - {names: [v1alpha1], driver: spec.driver, node: spec.nodeName,\n"
        + "         pool: metadata.name, apiserverImmutable: [driver, node, pool]}\n",
        "overrides[0].versions[0].apiserverImmutable: asserts that the apiserver refuses changes "
        "to these fields of devicepools.devmgmtproto.k8s.io v1alpha1",
    ),
]


@pytest.mark.parametrize(("text", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_an_unconfirmed_or_misplaced_assertion_is_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_policy(text, "p.yaml")
    line, _, rest = str(caught.value).removeprefix("p.yaml:").partition(": ")
    assert rest.startswith(message), str(caught.value)
    key = message.split(":")[0].rsplit(".", 1)[-1]  # the line names the key at fault
    assert key in text.splitlines()[int(line) - 1]


def test_an_override_confirms_for_the_included_kind() -> None:
    text = HEAD + (
        "include: [packaged:default]\noverrides:\n"
        "  - group: devmgmtproto.k8s.io\n    resource: devicepools\n"
        "    apiserverImmutableConfirmed: devicepools.devmgmtproto.k8s.io\n    versions:\n"
        "      - {names: [v1alpha1], driver: spec.driver, node: spec.nodeName,\n"
        "         pool: metadata.name, apiserverImmutable: [driver, node, pool]}\n"
    )
    pools = parse_policy(text).kinds["devmgmtproto.k8s.io", "devicepools"]
    assert pools.apiserver_immutable_confirmed
    assert pools.versions["v1alpha1"].owner_fields_immutable
