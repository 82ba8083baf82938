"""The policy-test file ``audit generate`` writes with the policy (docs/audit.md, "Tests written
with the policy"): each distinct request the log shows allowed is a case the policy must allow,
sent as the log shows it, with the object the log last showed stored first; after them, for the
first request of each kind and verb the policy allows, the oversteps a reviewer wants refused
(:mod:`._oversteps`). The file's header says what could not be written, and why.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from gatekeeper.audit.tools.generate._entries import note_lines
from gatekeeper.audit.tools.generate._examples import PER_KIND, Example, Examples
from gatekeeper.audit.tools.generate._observe import is_kind_object
from gatekeeper.audit.tools.generate._oversteps import Case, oversteps, token_elsewhere
from gatekeeper.audit.tools.generate._policy import Dumper
from gatekeeper.audit.tools.replay import method_of, patch_type
from gatekeeper.policy import KindRule, KindSpec, Policy
from gatekeeper.policy.changes import MAINTAINED

__all__ = ["generate_tests"]

_SA_PREFIX = "system:serviceaccount:"
_BODY_VERBS = frozenset({"create", "update", "patch"})
_NO_OBJECT = frozenset({"create", "list", "watch", "deletecollection"})
_NAMED = frozenset({KindRule.OWN_NODE, KindRule.OWN_POD, KindRule.DRIVER_CREDENTIALS})
"""Rules that decide a get on the request alone: no stored object needed."""
_SET_BY_APISERVER = tuple(sorted(name for _, name in MAINTAINED))
"""What the apiserver keeps in metadata itself: a create's body that brings them is refused."""


def generate_tests(examples: Examples, policy: Policy, *, policy_ref: str, source: str) -> str:
    """The test file for ``policy`` (named ``policy_ref`` from the file) from ``examples``;
    "" when the log has no allowed request of a driver to make a case of."""
    node = examples.node()
    if node is None:
        return ""
    notes: list[str] = []
    allowed: list[tuple[Example, Case]] = []
    refused: list[Case] = []
    firsts: set[tuple[Any, ...]] = set()
    names: set[str] = set()
    for example in examples.by_node[node].values():
        info = example.info
        entry = policy.kind_for(info.api_group, info.resource, info.verb)
        what = f"{info.verb} {info.path}"
        if entry is None or info.verb not in entry.verbs:
            notes.append(f"{what}: not allowed by the policy (see its NOT ALLOWED lines)")
            continue
        case = _allowed_case(example, entry)
        if isinstance(case, str):
            notes.append(f"{what}: {case}")
            continue
        case = _named(case, names, f"allowed: {_title(example)}")
        allowed.append((example, case))
        first = (entry.rule, info.verb, info.api_group, info.resource, info.subresource)
        if first in firsts:
            continue
        firsts.add(first)
        driver = example.record.driver or ""
        for overstep, variant in oversteps(case, entry, info.verb, node, driver):
            refused.append(_named(variant, names, f"refused: {_title(example)} {overstep}"))
    for example, case in allowed:
        if (found := token_elsewhere(case, node)) is not None:
            overstep, variant = found
            refused.append(_named(variant, names, f"refused: {_title(example)} {overstep}"))
            break
    for (where, kind), count in sorted(examples.beyond.items()):
        if where == node:
            notes.append(
                f"{count} more distinct {kind[0]} requests of {kind[2]} {kind[4]} (only the "
                f"first {PER_KIND} are cases)"
            )
    if not allowed:
        return ""
    others = sorted(set(examples.by_node) - {node})
    doc = {"policy": policy_ref, "node": node, "cases": [c for _, c in allowed] + refused}
    return _header(source, node, others, notes) + yaml.dump(
        doc, Dumper=Dumper, sort_keys=False, width=100
    )


def _allowed_case(example: Example, entry: KindSpec) -> Case | str:
    """The case sending ``example`` as the log shows it; or why the log cannot make one."""
    record, info = example.record, example.info
    path, _, query = record.request_uri.partition("?")
    request: dict[str, Any] = {"method": method_of(record.verb), "path": path}
    if query:
        request["query"] = query
    body = record.request_object
    if info.verb in _BODY_VERBS:
        if body is None:
            return "the log holds no body (record at --audit-level Request or RequestResponse)"
        if info.verb == "create" and is_kind_object(body):
            body = _without(body, *_SET_BY_APISERVER)
        elif info.verb == "update" and is_kind_object(body):
            # The resourceVersion it was read at is the logged cluster's: the gatekeeper pins
            # the write to the object the case stores instead. The managedFields it re-sends
            # are the logged cluster's too (the case stores none; the gatekeeper takes them out
            # of a protobuf body, which is how client-go sends them).
            body = _without(body, "resourceVersion", "managedFields")
        request["body"] = body
        if info.verb == "patch":
            request["headers"] = {"Content-Type": patch_type(record, body, info)}
    elif info.verb in ("delete", "deletecollection") and isinstance(body, dict):
        request["body"] = _delete_options(body)
    existing = _existing(example, entry)
    if isinstance(existing, str):
        return existing
    case: Case = {"name": "", **_caller(example), "request": request}
    if existing:
        case["existing"] = existing
    case["expect"] = {"allowed": True}
    return case


def _existing(example: Example, entry: KindSpec) -> list[Any] | str:
    """What the case stores first: the object the request read or wrote, as the log showed it
    (a get: its answer; an update the log shows no object before: its own body)."""
    record, info = example.record, example.info
    if info.verb in _NO_OBJECT:
        return []
    if record.code == 404:
        return "the object was absent (404): nothing to store for it"
    stored = example.before
    if info.verb == "get" and is_kind_object(record.response_object):
        stored = record.response_object
    if stored is None and info.verb == "update" and is_kind_object(record.request_object):
        stored = record.request_object
    if stored is None:
        if info.verb == "get" and entry.rule in _NAMED:
            return []
        return (
            "the log holds no object before it, to store first (record at --audit-level "
            "RequestResponse, from before the driver starts)"
        )
    return [_without(stored, "managedFields")]


def _without(obj: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``obj`` without these keys of its metadata: what the apiserver sets on a create (the
    gatekeeper's log holds a protobuf body as the apiserver's dry run decoded it), and
    ``managedFields`` of a stored object (what the apiserver maintains, which no rule reads)."""
    copied = copy.deepcopy(obj)
    metadata = copied.get("metadata")
    if isinstance(metadata, dict):
        for key in keys:
            metadata.pop(key, None)
    return copied


def _delete_options(body: dict[str, Any]) -> dict[str, Any]:
    """A delete's options as a client sends them, but for the stored object's resourceVersion,
    which only the cluster it was logged in has (the case stores the object anew). The
    kube-apiserver logs them in its internal version (``meta.k8s.io/__internal``), which no
    client sends."""
    options = copy.deepcopy(body)
    if str(options.get("apiVersion", "")).endswith("/__internal"):
        options["apiVersion"] = "meta.k8s.io/v1"
    preconditions = options.get("preconditions")
    if isinstance(preconditions, dict):
        preconditions.pop("resourceVersion", None)
    return options


def _caller(example: Example) -> dict[str, Any]:
    user = example.record.token_user
    if user is None or not user.username.startswith(_SA_PREFIX):
        return {"driver": example.record.driver}
    namespace, _, name = user.username.removeprefix(_SA_PREFIX).partition(":")
    token = {"serviceAccount": f"{namespace}/{name}"}
    if example.pod:
        token["pod"] = example.pod
    return {"token": token}


def _title(example: Example) -> str:
    info = example.info
    qualified = f"{info.resource}.{info.api_group}" if info.api_group else info.resource
    if info.subresource:
        qualified += f"/{info.subresource}"
    where = "/".join(part for part in (info.namespace, info.name) if part)
    return f"{info.verb} {qualified} {info.api_version}{' ' + where if where else ''}"


def _named(case: Case, names: set[str], name: str) -> Case:
    unique, number = name, 2
    while unique in names:
        unique, number = f"{name} ({number})", number + 1
    names.add(unique)
    return {"name": unique, **{key: value for key, value in case.items() if key != "name"}}


def _header(source: str, node: str, others: list[str], notes: list[str]) -> str:
    lines = [
        f"# Generated by `dra-gatekeeper audit generate` from {source or 'audit logs'} with its",
        f"# policy: each distinct request of node {node} the log shows allowed, then for each kind",
        "# and verb the oversteps a reviewer wants refused. Run: dra-gatekeeper test <this file>",
    ]
    if others:
        lines.append(f"# Not cases: the requests of other nodes ({', '.join(others)}).")
    for note in notes:
        lines += note_lines("NOT A CASE", note)
    return "\n".join(lines) + "\n"
