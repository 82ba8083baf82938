"""Load and validate a policy file and the files it includes; every problem names the file, the
key and the rule.

A policy file may include others (``include: [base.yaml, packaged:default]``): they are loaded
first, in order; the file then adds drivers, service accounts and kinds, and overrides keys or
versions of included kinds under ``overrides``. README "The policy file" has the whole format.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import yaml

from gatekeeper.errors import ConfigError
from gatekeeper.names import is_dns_label, is_dns_subdomain, is_driver_name
from gatekeeper.policy._context import Context, Located, join_key, parse_enum
from gatekeeper.policy._kinds import RawKind, build_kind, read_kind, read_override
from gatekeeper.policy._versions import ALLOCATION_KEYS, APISERVER_IMMUTABLE, LEGACY_IMMUTABLE
from gatekeeper.policy.model import ANY_DRIVER, KindSpec, Policy, UnboundTokens

__all__ = [
    "ALLOCATION_KEYS",
    "API_VERSION",
    "DEFAULT_POLICY",
    "DEPRECATED_API_VERSION",
    "PACKAGED",
    "load_policy",
    "packaged_policies",
    "parse_policy",
]

log = logging.getLogger("gatekeeper.policy")

API_VERSION = "dra-gatekeeper.io/v1alpha1"
"""The policy format's group and version: a domain this project can own (``k8s.io`` belongs to
the Kubernetes project), as the ``dra-gatekeeper.io/…`` audit annotations."""
DEPRECATED_API_VERSION = "gatekeeper.dra.k8s.io/v1alpha1"
"""The first format: still read (versions as a mapping, ``immutable``), with a notice."""
PACKAGED = "packaged:"
"""``packaged:<name>`` names a policy shipped inside the gatekeeper (``packaged:default``)."""
DEFAULT_POLICY = f"{PACKAGED}default"

_TOP_KEYS = {
    "apiVersion",
    "kind",
    "include",
    "drivers",
    "kinds",
    "overrides",
    "serviceAccounts",
    "unboundTokens",
}
_SA_PREFIX = "system:serviceaccount:"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (YAML silently keeps the last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_policy(path: str | None, *, files_read: list[str] | None = None) -> Policy:
    """Load ``path`` (``packaged:<name>``, or the packaged default when None) and what it
    includes, and validate it. ``files_read`` collects every file on disk tried, even when the
    load fails (a reload watches them)."""
    loader = _Loader(files_read)
    source = path or DEFAULT_POLICY
    return loader.finish(loader.file(source, source, ()), source)


def parse_policy(text: str, source: str = "<policy>", *, directory: str | None = None) -> Policy:
    """Validate policy YAML ``text``; ConfigError naming ``source`` and the key on any fault.
    Relative includes are found in ``directory`` (without one, only ``packaged:`` names)."""
    loader = _Loader(None)
    return loader.finish(loader.document(text, source, directory, ()), source)


def packaged_policies() -> list[str]:
    """The ``packaged:<name>`` policies shipped inside the gatekeeper."""
    folder = resources.files("gatekeeper").joinpath("policies")
    return sorted(
        f"{PACKAGED}{entry.name.removesuffix('.yaml')}"
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )


@dataclass(slots=True)
class _Partial:
    """What one file says once its includes are merged in."""

    drivers: dict[str, None] = field(default_factory=dict)
    accounts: dict[str, tuple[str, Located]] = field(default_factory=dict)
    """``system:serviceaccount:<ns>:<name>`` → (driver, where it was mapped)."""
    unbound: Located | None = None
    unbound_conflict: tuple[Located, Located] | None = None
    kinds: dict[tuple[str, str, str], RawKind] = field(default_factory=dict)
    """(group, resource, rule) → the kind: a resource may be listed once per rule."""


class _Loader:
    """One load: the files in progress (cycles), those loaded (each once), the deprecation
    notices to log."""

    def __init__(self, files_read: list[str] | None) -> None:
        self.active: list[tuple[str, str]] = []
        """The files being read, outermost first: (identity, as shown)."""
        self.loaded: dict[str, str] = {}
        """Identity of each file read → the file that included it."""
        self.files: list[str] = []
        self.files_read = files_read if files_read is not None else []
        self.notices: list[str] = []

    def file(self, ref: str, shown: str, included_by: tuple[str, ...]) -> _Partial:
        """Read ``ref`` (a path or a ``packaged:`` name), shown in messages as ``shown``."""
        self.active.append((_identity(ref), shown))
        try:
            return self._read(ref, shown, included_by)
        finally:
            self.active.pop()

    def _read(self, ref: str, shown: str, included_by: tuple[str, ...]) -> _Partial:
        where = Context(shown, included_by=included_by)
        if ref.startswith(PACKAGED):
            name = ref.removeprefix(PACKAGED)
            if ref not in packaged_policies():
                where.fail(
                    "", f"no such packaged policy (packaged: {', '.join(packaged_policies())})"
                )
            policies = resources.files("gatekeeper").joinpath("policies")
            return self.document(
                policies.joinpath(f"{name}.yaml").read_text(encoding="utf-8"),
                shown,
                None,
                included_by,
            )
        self.files_read.append(ref)
        try:
            with open(ref, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            where.fail("", f"cannot read policy: {exc.strerror}")
        except UnicodeDecodeError:
            where.fail("", "policy is not UTF-8 text")
        self.files.append(ref)
        return self.document(text, shown, os.path.dirname(ref), included_by)

    def document(
        self, text: str, source: str, directory: str | None, included_by: tuple[str, ...]
    ) -> _Partial:
        stream = io.StringIO(text)
        stream.name = source  # PyYAML names the stream in its messages (else "<unicode string>")
        try:
            doc = yaml.load(stream, Loader=_StrictLoader)
        except yaml.YAMLError as exc:
            Context(source, included_by=included_by).fail("", f"not valid YAML: {_one_line(exc)}")
        ctx = Context(source, included_by=included_by)
        top = ctx.mapping(doc, "", _TOP_KEYS)
        self._format(ctx, top)
        merged = self._includes(ctx, top, directory)
        self._own(ctx, top, merged)
        if ctx.legacy_immutable:
            shown = ", ".join(ctx.legacy_immutable[:2]) + (
                ", …" if len(ctx.legacy_immutable) > 2 else ""
            )
            self.notices.append(
                f"{source}: `{LEGACY_IMMUTABLE}` is deprecated: rename it "
                f"`{APISERVER_IMMUTABLE}` ({shown})"
            )
        return merged

    def _format(self, ctx: Context, top: Mapping[str, Any]) -> None:
        """Which format the file is in: its apiVersion's."""
        version = top.get("apiVersion")
        if version == API_VERSION:
            if top.get("kind") != "Policy":
                ctx.fail("kind", "must be Policy")
            return
        if version not in (None, DEPRECATED_API_VERSION):
            ctx.fail("apiVersion", f"must be {API_VERSION}")
        if top.get("kind", "Policy") != "Policy":
            ctx.fail("kind", "must be Policy")
        ctx.legacy = True
        said = f"apiVersion {version} is deprecated" if version else "no apiVersion"
        self.notices.append(
            f"{ctx.source}: {said}: read in the old format; write `apiVersion: {API_VERSION}` "
            "with versions listed as [{names: […], …}] (README, The policy file)"
        )

    def _includes(self, ctx: Context, top: Mapping[str, Any], directory: str | None) -> _Partial:
        merged = _Partial()
        refs = ctx.string_list(top.get("include", []), "include")
        for index, ref in enumerate(refs):
            where = Located(ref, ctx, f"include[{index}]")
            target, shown = _resolve(where, directory)
            identity = _identity(target)
            active = [ident for ident, _ in self.active]
            if identity in active:
                cycle = [name for _, name in self.active[active.index(identity) :]]
                where.fail(f"{shown} includes itself: {' -> '.join([*cycle, shown])}")
            if identity in self.loaded:
                where.fail(
                    f"{shown} is included twice (also by {self.loaded[identity]}): a file is "
                    "included once"
                )
            self.loaded[identity] = ctx.source
            _merge_included(merged, self.file(target, shown, (*ctx.included_by, ctx.source)))
        return merged

    def _own(self, ctx: Context, top: Mapping[str, Any], merged: _Partial) -> None:
        """This file's keys, over what its includes said."""
        for name in _drivers(ctx, top.get("drivers", [])):
            merged.drivers[name] = None
        _service_accounts(ctx, top.get("serviceAccounts", {}), merged.accounts)
        if "unboundTokens" in top:
            merged.unbound = Located(top["unboundTokens"], ctx, "unboundTokens")
            merged.unbound_conflict = None
        elif merged.unbound_conflict is not None:
            first, second = merged.unbound_conflict
            ctx.fail(
                "unboundTokens",
                f"the included files disagree ({first.where}: {first.value}, {second.where}: "
                f"{second.value}): set it here",
            )
        included = set(merged.kinds)
        for index, raw in enumerate(_list(ctx, top, "kinds")):
            kind = read_kind(ctx, f"kinds[{index}]", raw)
            if kind.key in included:
                kind.origin.fail(
                    f"{kind.qualified} (rule {kind.rule}) is defined by "
                    f"{merged.kinds[kind.key].origin.where} already: change it under `overrides` "
                    "(a kind is defined once per rule)"
                )
            if kind.key in merged.kinds:
                kind.origin.fail(f"{kind.qualified} is listed twice under rule {kind.rule}")
            merged.kinds[kind.key] = kind
        overridden: set[tuple[str, str, str]] = set()
        for index, raw in enumerate(_list(ctx, top, "overrides")):
            change = read_override(ctx, f"overrides[{index}]", raw)
            key = _overridden(change, included, merged)
            if key in overridden:
                change.origin.fail(f"{change.qualified} is overridden twice")
            overridden.add(key)
            change.keys.pop("rule", None)  # it selected the entry; it changes nothing
            merged.kinds[key].keys.update(change.keys)
            merged.kinds[key].versions.update(change.versions)

    def finish(self, merged: _Partial, source: str) -> Policy:
        if not merged.kinds:
            raise ConfigError(
                f"{source}: kinds: no kind is defined (here or in an included file): an empty "
                "policy would allow nothing"
            )
        kinds = _combined([(raw, build_kind(raw)) for raw in merged.kinds.values()])
        unbound = merged.unbound
        for notice in self.notices:
            log.warning("%s", notice)
        return Policy(
            kinds=kinds,
            drivers=frozenset(merged.drivers),
            source=source,
            files=tuple(self.files),
            # The core group ("", e.g. an OwnNode kind) has no /apis/<group> discovery path.
            groups=frozenset(spec.group for spec in kinds.values() if spec.group),
            service_accounts={user: driver for user, (driver, _) in merged.accounts.items()},
            unbound_tokens=(
                UnboundTokens.REFUSE
                if unbound is None
                else parse_enum(unbound.ctx, UnboundTokens, unbound.value, unbound.key)
            ),
        )


def _identity(ref: str) -> str:
    """The same file however it is reached (``a/../b.yaml``, a symlink)."""
    return ref if ref.startswith(PACKAGED) else os.path.realpath(ref)


def _resolve(where: Located, directory: str | None) -> tuple[str, str]:
    """An include's file: (what to read, how messages name it)."""
    ref = where.value
    if ref.startswith(PACKAGED):
        return ref, ref
    if not ref or os.path.isabs(ref):
        where.fail(f"{ref!r} must be a path relative to this file, or {PACKAGED}<name>")
    if directory is None:
        where.fail(f"{ref!r}: a relative include needs the policy to be a file")
    path = os.path.normpath(os.path.join(directory, ref))
    return path, path


def _overridden(
    change: RawKind, included: set[tuple[str, str, str]], merged: _Partial
) -> tuple[str, str, str]:
    """The included kind an override changes: the one of its group and resource, or (for a
    kind listed under two rules) the one of the rule it names."""
    candidates = [
        key
        for key in included
        if key[:2] == (change.group, change.resource) and change.rule in ("", key[2])
    ]
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        rules = ", ".join(sorted(key[2] for key in candidates))
        change.origin.fail(
            f"{change.qualified} is listed under rules {rules}: name the one to change (rule: …)"
        )
    listed = sorted(key[2] for key in included if key[:2] == (change.group, change.resource))
    if listed:
        change.keys["rule"].fail(
            f"{change.qualified} is listed under rule {', '.join(listed)}, not {change.rule}: "
            "an override names the rule of the entry it changes, it cannot change a rule"
        )
    defined_here = any(key[:2] == (change.group, change.resource) for key in merged.kinds)
    change.origin.fail(
        f"overrides {change.qualified}"
        + (f" (rule {change.rule})" if change.rule else "")
        + ", which no included file defines"
        + (" (this file does: edit it there)" if defined_here else "")
    )


def _combined(built: list[tuple[RawKind, KindSpec]]) -> dict[tuple[str, str], KindSpec]:
    """The policy's kinds by (group, resource): a resource listed under several rules is one
    KindSpec with the others as its ``alternatives``, each deciding its own verbs."""
    kinds: dict[tuple[str, str], KindSpec] = {}
    firsts: dict[tuple[str, str], RawKind] = {}
    for raw, spec in built:
        key = (spec.group, spec.resource)
        first = kinds.get(key)
        if first is None:
            kinds[key], firsts[key] = spec, raw
            continue
        if (spec.kind, spec.scope) != (first.kind, first.scope):
            raw.origin.fail(
                f"is {spec.kind} ({spec.scope.value}), but {firsts[key].origin.where} lists "
                f"{spec.qualified} as {first.kind} ({first.scope.value}): one resource is one kind"
            )
        for other in (first, *first.alternatives):
            if shared := other.verbs & spec.verbs:
                raw.keys["verbs"].fail(
                    f"{', '.join(sorted(shared))} of {spec.qualified} is decided by rule "
                    f"{other.rule.value} already: each verb of a resource has one rule"
                )
        kinds[key] = replace(first, alternatives=(*first.alternatives, spec))
    return kinds


def _merge_included(merged: _Partial, included: _Partial) -> None:
    """An included file's result into what the includes before it gave."""
    merged.drivers.update(included.drivers)
    for user, (driver, where) in included.accounts.items():
        if user in merged.accounts and merged.accounts[user][0] != driver:
            other = merged.accounts[user]
            where.fail(f"is mapped to {other[0]} by {other[1].where}: one driver per account")
        merged.accounts.setdefault(user, (driver, where))
    for key, kind in included.kinds.items():
        if key in merged.kinds:
            kind.origin.fail(
                f"{kind.qualified} is defined by {merged.kinds[key].origin.where} too: include "
                "one of them"
            )
        merged.kinds[key] = kind
    if included.unbound is not None:
        if merged.unbound is not None and merged.unbound.value != included.unbound.value:
            merged.unbound_conflict = (merged.unbound, included.unbound)
        else:
            merged.unbound = included.unbound


def _list(ctx: Context, top: Mapping[str, Any], key: str) -> list[Any]:
    """``kinds`` or ``overrides``: absent, or a non-empty list (an empty one is a mistake)."""
    raw = top.get(key, [])
    if not isinstance(raw, list) or (key in top and not raw):
        ctx.fail(key, "must be a non-empty list when given")
    return raw


def _service_accounts(ctx: Context, raw: Any, mapped: dict[str, tuple[str, Located]]) -> None:
    """``serviceAccounts``: driver → ``[namespace/name, …]``, as the user names a token's
    TokenReview gives (``system:serviceaccount:<namespace>:<name>``) → driver."""
    if not isinstance(raw, dict):
        ctx.fail("serviceAccounts", "must be a mapping of driver name to namespace/name list")
    for driver, accounts in raw.items():
        key = join_key("serviceAccounts", str(driver))
        if not isinstance(driver, str) or not is_driver_name(driver):
            ctx.fail(key, f"{driver!r} is not a DNS subdomain driver name")
        for index, account in enumerate(ctx.string_list(accounts, key)):
            namespace, _, name = account.partition("/")
            where = Located(account, ctx, f"{key}[{index}]")
            if not is_dns_label(namespace) or not is_dns_subdomain(name):
                where.fail(f"{account!r} is not namespace/name")
            user = f"{_SA_PREFIX}{namespace}:{name}"
            if user in mapped and (mapped[user][0] != driver or mapped[user][1].ctx is ctx):
                other = mapped[user]
                by = "" if other[1].ctx is ctx else f" by {other[1].where}"
                where.fail(
                    f"{account} is mapped to {other[0]} already{by}: a service account "
                    "identifies one driver"
                )
            mapped[user] = (driver, where)


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _drivers(ctx: Context, raw: Any) -> list[str]:
    names = ctx.string_list(raw, "drivers")
    for index, name in enumerate(names):
        if name != ANY_DRIVER and not is_driver_name(name):
            ctx.fail(f"drivers[{index}]", f"{name!r} is not a DNS subdomain driver name")
    return names
