"""The generated policy: every resource's entries, the drivers and their ServiceAccounts, and a
header naming what the log cannot express (``NOT ALLOWED``) and what a reviewer must check
(``REVIEW``).

Drivers, kinds, versions, verbs and subresources come from the allowed requests in the log. Each
verb goes to the base policy's entry that lists it (the packaged default unless ``--base``), else
to the narrowest rule its requests fit (:mod:`._rules`): this node's own Node, the caller's own
pod, objects on this node, the driver's namespace, objects naming driver and node, a CEL scope,
and last the driver's own credentials.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from gatekeeper.audit.tools.generate._entries import Notes, entry_doc, note_lines
from gatekeeper.audit.tools.generate._observe import Observation, Traffic, observe
from gatekeeper.audit.tools.generate._rules import Facts, assign
from gatekeeper.audit.tools.reader import Record
from gatekeeper.policy import KindRule, KindSpec, Policy
from gatekeeper.policyfile import API_VERSION

__all__ = ["Dumper", "generate_policy"]

_SA_PREFIX = "system:serviceaccount:"
_CREDENTIALS = (
    "forwarded under the driver's own ServiceAccount token (rule DriverCredentials): {kinds}. "
    "The apiserver's RBAC for that ServiceAccount decides, exactly as when the driver went "
    "direct, and the gatekeeper audits each request. Only a driver on the token listener has a "
    "token to forward: over a Unix socket or a client certificate these requests are refused. "
    "`dra-gatekeeper policy rbac --policy <this file>` prints what each ServiceAccount needs."
)


def generate_policy(records: Iterable[Record], base: Policy, *, source: str = "") -> str:
    """The policy YAML for the allowed requests in ``records``, its header first."""
    seen = observe(records, base)
    notes = Notes()
    kinds: list[dict[str, Any]] = []
    for key in sorted(seen.traffic):
        kinds += _kind_entries(seen.traffic[key], base.kind_for(*key), notes)
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "Policy"}
    doc["drivers"] = sorted(seen.drivers)
    if accounts := _accounts(seen, base):
        doc["serviceAccounts"] = accounts
    doc["kinds"] = kinds
    body = yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=100)
    return _header(source, notes, bool(kinds)) + body


class Dumper(yaml.SafeDumper):
    """Mappings in block style, lists of plain values in flow style (``verbs: [get, list]``), a
    long one-line string (a CEL expression) folded over lines, none of it changing a value."""


def _mapping(dumper: yaml.SafeDumper, data: dict[str, Any]) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=False)


def _sequence(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(isinstance(item, str | int | float | bool) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _string(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    # Folded only where folding reads back the same: no line breaks, no runs of spaces, no space
    # at either end.
    fold = len(data) > 60 and "\n" not in data and "  " not in data and data == data.strip()
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=">" if fold else None)


Dumper.add_representer(dict, _mapping)
Dumper.add_representer(list, _sequence)
Dumper.add_representer(str, _string)


def _kind_entries(traffic: Traffic, base: KindSpec | None, notes: Notes) -> list[dict[str, Any]]:
    """One entry per rule deciding some verb of the resource."""
    facts = Facts(traffic, base)
    assignment = assign(traffic, base, facts)
    notes.not_allowed.extend(assignment.unfit)
    if not assignment.rules:
        return []
    if not traffic.kind:
        traffic.kind = _guessed_kind(traffic.resource)
        notes.review.append(
            f"{traffic.qualified}: kind {traffic.kind} is guessed from the resource name (the log "
            "holds no object of it): write the kind's own name (in camel case, e.g. "
            "DeviceTaintRule)"
        )
    listed = {entry.rule: entry for entry in base.entries} if base else {}
    entries = []
    for rule in KindRule:
        requests = assignment.rules.get(rule)
        if requests and (doc := entry_doc(traffic, rule, requests, listed.get(rule), facts, notes)):
            entries.append(doc)
    return entries


def _guessed_kind(resource: str) -> str:
    """``leases`` → ``Lease``, ``policies`` → ``Policy``: a kind name that loads, to be checked."""
    if resource.endswith("ies"):
        singular = resource[:-3] + "y"
    elif resource.endswith(("sses", "xes", "ches", "shes")):
        singular = resource[:-2]
    else:
        singular = resource.removesuffix("s")
    name = "".join(part.capitalize() for part in singular.split("-"))
    return name if name[:1].isalpha() else f"K{name}"


def _accounts(seen: Observation, base: Policy) -> dict[str, list[str]]:
    """driver → ``namespace/name`` of its ServiceAccounts: those the log showed, and those the
    base maps to a driver of the log (which name its namespace for a socket caller)."""
    mapped: dict[tuple[str, str], str] = {}
    for user, driver in base.service_accounts.items():
        namespace, _, name = user.removeprefix(_SA_PREFIX).partition(":")
        if driver in seen.drivers:
            mapped[(namespace, name)] = driver
    mapped.update(seen.accounts)
    accounts: dict[str, list[str]] = {}
    for (namespace, name), driver in sorted(mapped.items()):
        accounts.setdefault(driver, []).append(f"{namespace}/{name}")
    return {driver: accounts[driver] for driver in sorted(accounts)}


def _header(source: str, notes: Notes, loads: bool) -> str:
    lines = [f"# Generated by `dra-gatekeeper audit generate` from {source or 'audit logs'}."]
    lines += [f"# NOT ALLOWED: {note}" for note in notes.not_allowed]
    reviews = list(notes.review)
    if notes.credentials:
        reviews.append(_CREDENTIALS.format(kinds=", ".join(notes.credentials)))
    for note in reviews:
        lines += note_lines("REVIEW", note)
    if not loads:
        lines.append("# No resource traffic could be expressed: this policy does not load.")
    return "\n".join(lines) + "\n"
