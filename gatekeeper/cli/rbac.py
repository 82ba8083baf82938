"""``dra-gatekeeper policy rbac``: the RBAC a policy needs outside the gatekeeper.

Exactly what the policy can forward, and no more:

- the gatekeeper's ClusterRole: each kind's verbs (plus ``get`` where a write fetches the stored
  object first, ``list`` where a filtered watch is primed by a list), its subresources,
  discovery, and for status writes of allocated claims the RBAC-only ``resourceclaims/driver``
  check of Kubernetes 1.36 (``associated-node:update``/``:patch`` with the drivers as resource
  names), and ``tokenreviews create`` when the policy maps service accounts to drivers; and its
  ClusterRoleBinding to the gatekeeper's ServiceAccount. ``deploy/generated/rbac.yaml`` is this
  for ``deploy/policy.yaml``;
- for kinds of rule DriverNamespace, a ClusterRole of their rights, bound to the gatekeeper by a
  RoleBinding in each namespace the policy maps a driver's ServiceAccount to (not a
  cluster-wide grant). A namespace may not exist yet when the gatekeeper is installed: the
  deployment leaves the RoleBindings to ``publish-ca --bind-role``, which makes each as its
  namespace appears (:func:`render_rbac` ``namespace_bindings=False``);
- for kinds of rule DriverCredentials, what each driver's own ServiceAccount needs: the
  gatekeeper forwards those requests with the driver's token, so the apiserver checks the
  driver's RBAC, never the gatekeeper's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from gatekeeper.cli.admission import VAP_NAME, render_admission_policy
from gatekeeper.cli.deploy import add_deploy_arguments, read_served_policy, run_deploy
from gatekeeper.errors import ConfigError
from gatekeeper.policy import Policy
from gatekeeper.policy.model import ANY_DRIVER, KindRule, KindSpec
from gatekeeper.policyfile import load_policy
from gatekeeper.usage import UsageParser

__all__ = [
    "ROLE_NAME",
    "cluster_role",
    "driver_namespace_role",
    "driver_roles",
    "namespace_bindings",
    "namespace_role_name",
    "render_cluster_role",
    "render_rbac",
    "run_policy_command",
]

ROLE_NAME = "dra-gatekeeper"
_PROG = "dra-gatekeeper policy"
_FETCHING_VERBS = frozenset({"get", "update", "patch", "delete"})
_SELF = "kube-system/dra-gatekeeper"
"""The gatekeeper's own ServiceAccount in deploy/ (namespace/name)."""
# Rules whose requests carry the gatekeeper's credentials cluster-wide (its ClusterRole).
_CLUSTER_WIDE = frozenset(
    {
        KindRule.NODE_LOCAL,
        KindRule.ALLOCATED_TO_DRIVER,
        KindRule.OWN_NODE,
        KindRule.OWN_POD,
        KindRule.ON_NODE,
        KindRule.CEL,
    }
)
_SUBRESOURCE_VERBS = ("get", "patch", "update")
# "/version/" too: the official Python client asks for it (the others end in "*", which covers
# "/api/" and "/apis/<group>/"), as the apiserver's own system:public-info-viewer lists it.
_DISCOVERY = ["/api", "/api/*", "/apis", "/apis/*", "/openapi/*", "/version", "/version/"]
_VERB_ORDER = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


def _sorted_verbs(verbs: set[str]) -> list[str]:
    return [verb for verb in _VERB_ORDER if verb in verbs]


def _kind_rules(spec: KindSpec, drivers: frozenset[str]) -> list[dict[str, Any]]:
    if not spec.verbs:
        return []  # a kind the policy names but allows nothing of (a rule with no verbs is invalid)
    verbs = set(spec.verbs)
    if verbs & _FETCHING_VERBS:
        verbs.add("get")  # SECURITY: DESIGN §4.4 — a write is decided on the fetched object
    if spec.rule is KindRule.ALLOCATED_TO_DRIVER:
        writes = verbs & {"update", "patch"}
        verbs -= {"update", "patch"}  # claim writes go to the status subresource only
    else:
        writes = set()
    if spec.rule in (KindRule.ALLOCATED_TO_DRIVER, KindRule.CEL) and "watch" in verbs:
        verbs.add("list")  # a filtered watch is primed by a list at its resourceVersion
    group = spec.group
    rules: list[dict[str, Any]] = [
        {"apiGroups": [group], "resources": [spec.resource], "verbs": _sorted_verbs(verbs)}
    ]
    for sub in sorted(spec.subresources):
        sub_verbs = set(spec.verbs) & set(_SUBRESOURCE_VERBS)
        rules.append(
            {
                "apiGroups": [group],
                "resources": [f"{spec.resource}/{sub}"],
                "verbs": _sorted_verbs(sub_verbs),
            }
        )
    if writes and "status" in spec.subresources:
        # Kubernetes 1.36 authorizes claim status writes also against resourceclaims/driver,
        # name = the driver (RBAC only, not an endpoint); without it the apiserver answers 422.
        rule: dict[str, Any] = {
            "apiGroups": [group],
            "resources": [f"{spec.resource}/driver"],
            "verbs": [f"associated-node:{verb}" for verb in sorted(writes)],
        }
        if ANY_DRIVER not in drivers:
            rule["resourceNames"] = sorted(drivers)
        rules.append(rule)
    return rules


def cluster_role(policy: Policy, name: str = ROLE_NAME) -> dict[str, Any]:
    """The ClusterRole (a plain dict) that lets the gatekeeper forward what ``policy`` allows."""
    rules: list[dict[str, Any]] = []
    for key in sorted(policy.kinds):
        for entry in policy.kinds[key].entries:
            if entry.rule in _CLUSTER_WIDE:
                rules.extend(_kind_rules(entry, policy.drivers))
    if policy.service_accounts:
        # Drivers identified by their own service-account token: the gatekeeper asks the
        # apiserver who holds it (as system:auth-delegator allows, without the SAR half).
        rules.append(
            {
                "apiGroups": ["authentication.k8s.io"],
                "resources": ["tokenreviews"],
                "verbs": ["create"],
            }
        )
    rules.append({"nonResourceURLs": list(_DISCOVERY), "verbs": ["get"]})
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dra-gatekeeper"}},
        "rules": rules,
    }


def _entries(policy: Policy, rule: KindRule) -> list[KindSpec]:
    return [
        entry
        for key in sorted(policy.kinds)
        for entry in policy.kinds[key].entries
        if entry.rule is rule
    ]


def _binding(
    kind: str,
    name: str,
    namespace: str,
    subjects: list[tuple[str, str]],
    *,
    binding: str | None = None,
) -> dict[str, Any]:
    """A binding of the ``kind`` (Role or ClusterRole) ``name``; a ``binding`` kind of its own
    (a RoleBinding of a ClusterRole)."""
    binding_object: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": f"{binding or kind}Binding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dra-gatekeeper"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": account, "namespace": where}
            for where, account in subjects
        ],
    }
    if namespace:
        binding_object["metadata"]["namespace"] = namespace
    return binding_object


def namespace_role_name(policy: Policy, name: str = ROLE_NAME) -> str | None:
    """The ClusterRole of the policy's DriverNamespace kinds, bound in each driver namespace;
    None when the policy has none."""
    return f"{name}-driver-namespaces" if _entries(policy, KindRule.DRIVER_NAMESPACE) else None


def driver_namespace_role(policy: Policy, name: str = ROLE_NAME) -> dict[str, Any] | None:
    """The rights of the policy's DriverNamespace kinds, as a ClusterRole granting nothing by
    itself: only the RoleBindings of :func:`namespace_bindings` use it, one per namespace."""
    role_name = namespace_role_name(policy, name)
    if role_name is None:
        return None
    kinds = _entries(policy, KindRule.DRIVER_NAMESPACE)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": role_name, "labels": {"app.kubernetes.io/name": "dra-gatekeeper"}},
        "rules": [rule for spec in kinds for rule in _kind_rules(spec, policy.drivers)],
    }


def namespace_bindings(
    policy: Policy, service_account: str = _SELF, name: str = ROLE_NAME
) -> list[dict[str, Any]]:
    """A RoleBinding of :func:`driver_namespace_role` to the gatekeeper (``service_account``,
    namespace/name) in each namespace a DriverNamespace kind is reached in: the namespaces of
    the ServiceAccounts the policy maps to drivers."""
    role_name = namespace_role_name(policy, name)
    if role_name is None:
        return []
    namespaces = sorted({user.split(":")[2] for user in policy.service_accounts})
    own = tuple(service_account.split("/", 1))
    return [
        _binding("ClusterRole", role_name, namespace, [(own[0], own[1])], binding="Role")
        for namespace in namespaces
    ]


def driver_roles(policy: Policy) -> list[dict[str, Any]]:
    """For each driver with kinds of rule DriverCredentials: the ClusterRole its own
    ServiceAccounts need for them, and the binding to those accounts. The gatekeeper forwards
    these requests with the driver's token: it needs none of this itself."""
    kinds = _entries(policy, KindRule.DRIVER_CREDENTIALS)
    if not kinds:
        return []
    out: list[dict[str, Any]] = []
    for driver in sorted({d for d in policy.service_accounts.values()}):
        accounts = sorted(
            (user.split(":")[2], user.split(":")[3])
            for user, mapped in policy.service_accounts.items()
            if mapped == driver
        )
        name = f"dra-gatekeeper:driver:{driver}"
        rules: list[dict[str, Any]] = []
        for spec in kinds:
            rules.append({"apiGroups": [spec.group], "resources": [spec.resource],
                          "verbs": _sorted_verbs(set(spec.verbs))})  # fmt: skip
            for sub in sorted(spec.subresources):
                verbs = set(spec.verbs) & set(_SUBRESOURCE_VERBS)
                rules.append({"apiGroups": [spec.group], "resources": [f"{spec.resource}/{sub}"],
                              "verbs": _sorted_verbs(verbs)})  # fmt: skip
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dra-gatekeeper"}},
            "rules": rules,
        }
        out += [role, _binding("ClusterRole", name, "", accounts)]
    return out


def render_rbac(
    policy: Policy,
    name: str = ROLE_NAME,
    service_account: str = _SELF,
    *,
    namespace_bindings_too: bool = True,
) -> str:
    """Everything the policy needs outside the gatekeeper, as YAML documents, each part under a
    comment saying whose it is: the gatekeeper's ClusterRole and its binding, the
    DriverNamespace ClusterRole and (unless ``namespace_bindings_too`` is false: the deployment
    leaves them to ``publish-ca --bind-role``) its RoleBindings, the drivers' own roles."""
    namespace, account = service_account.split("/", 1)
    parts = [
        render_cluster_role(policy, name)
        + "---\n"
        + _dump_all([_binding("ClusterRole", name, "", [(namespace, account)])])
    ]
    if (role := driver_namespace_role(policy, name)) is not None:
        bindings = namespace_bindings(policy, service_account, name)
        where = ", ".join(b["metadata"]["namespace"] for b in bindings)
        text = (
            "# The gatekeeper's rights on rule DriverNamespace kinds, only in the namespaces the "
            f"policy maps drivers' ServiceAccounts to ({where}): a RoleBinding of this "
            "ClusterRole in each. `publish-ca --bind-role "
            f"{role['metadata']['name']} --bind-service-account {service_account}` makes them "
            "as the namespaces appear"
        )
        if namespace_bindings_too:
            parts.append(text + "; or apply these.\n" + _dump_all([role, *bindings]))
        else:
            parts.append(text + " (the chart and deploy/ca-distribution.yaml run it).\n"
                         + _dump_all([role]))  # fmt: skip
    if roles := driver_roles(policy):
        parts.append(
            "# What each driver's OWN ServiceAccount needs: rule DriverCredentials kinds are "
            "forwarded with the driver's token, and the apiserver checks the driver's RBAC.\n"
            + _dump_all(roles)
        )
    return "---\n".join(parts)


def _dump_all(documents: list[dict[str, Any]]) -> str:
    dumped: str = yaml.safe_dump_all(documents, sort_keys=False, width=100)
    return dumped


def render_cluster_role(policy: Policy, name: str = ROLE_NAME) -> str:
    """:func:`cluster_role` as YAML, with a header naming the drivers it was made for."""
    header = (
        "# Generated by `dra-gatekeeper policy rbac` for a policy with the drivers "
        f"{', '.join(sorted(policy.drivers))}: re-generate, do not edit.\n"
    )
    body: str = yaml.safe_dump(cluster_role(policy, name), sort_keys=False, width=100)
    return header + body


class _Parser(UsageParser):
    command = _PROG


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=_PROG, description="What a policy needs outside the gatekeeper.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    rbac = commands.add_parser(
        "rbac",
        help="print the RBAC the gatekeeper's credentials (and drivers') need for the policy",
    )
    vap = commands.add_parser(
        "vap",
        help="print the policy as a ValidatingAdmissionPolicy binding the gatekeeper to its node",
    )
    deploy = commands.add_parser(
        "deploy",
        help="write everything derived from the policy: RBAC, admission policy, APF, chart values",
    )
    for sub in (rbac, vap, deploy):
        sub.add_argument(
            "--policy",
            help="policy file (required)"
            if sub is deploy
            else "policy file (default: the packaged default policy)",
        )
        if sub is not deploy:  # deploy serves the file as it is: its drivers are in it
            sub.add_argument(
                "--driver", action="append", default=[], help="a driver allowed too (repeatable)"
            )
        sub.add_argument(
            "--service-account",
            default=_SELF,
            metavar="NAMESPACE/NAME",
            help=f"the gatekeeper's own ServiceAccount (default {_SELF})",
        )
    rbac.add_argument("--name", default=ROLE_NAME, help=f"ClusterRole name (default {ROLE_NAME})")
    vap.add_argument("--name", default=VAP_NAME, help=f"policy name (default {VAP_NAME})")
    deploy.add_argument(
        "--name", default=ROLE_NAME, help=f"the cluster-wide objects' name (default {ROLE_NAME})"
    )
    add_deploy_arguments(deploy)
    return parser


def run_policy_command(args: Sequence[str]) -> int:
    """Run ``dra-gatekeeper policy ARGS``; 0, or 2 with one line on stderr."""
    try:
        ns = _parser().parse_args(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        if ns.command == "deploy":
            served, policy = read_served_policy(ns.policy)
        else:
            policy = load_policy(ns.policy).with_drivers(frozenset(ns.driver))
        if not policy.drivers:
            how = "" if ns.command == "deploy" else " or pass --driver NAME"
            raise ConfigError(
                f"{policy.source}: no drivers: the rules bind writes to the drivers' names "
                f"(list them under `drivers:`{how})"
            )
        namespace, _, account = ns.service_account.partition("/")
        if not namespace or not account:
            raise ConfigError(f"--service-account {ns.service_account!r} is not NAMESPACE/NAME")
        if ns.command == "vap":
            text = render_admission_policy(policy, ns.service_account, ns.name)
        elif ns.command == "deploy":

            def rbac_for(service_account: str) -> str:
                return render_rbac(policy, ns.name, service_account, namespace_bindings_too=False)

            text = run_deploy(ns, served, policy, rbac_for, namespace_role_name(policy, ns.name))
        else:
            text = render_rbac(policy, ns.name, ns.service_account)
    except (ConfigError, ValueError) as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
