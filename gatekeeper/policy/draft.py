"""A policy as its files wrote it, before it is built: every value with the file, the key path
and the line it was written at, so that each fault of the build names them.

The files are read, checked against the schema and composed (includes, overrides) by
``gatekeeper.policyfile``; :func:`gatekeeper.policy.build.build_policy` turns a draft into a
:class:`~gatekeeper.policy.model.Policy`, checking what a schema cannot say.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from gatekeeper.errors import ConfigError

__all__ = ["KeyPath", "Lines", "Located", "PolicyDraft", "RawKind", "Source", "render_path"]

KeyPath = tuple[str | int, ...]
"""Where a value is in a document: mapping keys and list indexes from the top."""


class Lines(Protocol):
    """Where a file wrote its values (its loader knows)."""

    def line(self, path: KeyPath) -> int:
        """The 1-based line of the value at ``path`` (or of its nearest parent); 0 if unknown."""
        ...

    def position(self, path: KeyPath, offset: int) -> tuple[int, int]:
        """The 1-based line and column in the file of the character at ``offset`` of the string
        value at ``path`` (however the YAML wrote it: plain, quoted, folded or literal); the
        value's own line and column 0 when it cannot tell."""
        ...


def render_path(path: KeyPath) -> str:
    """``("kinds", 0, "versions")`` → ``kinds[0].versions``, as messages name a key."""
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else f".{step}" if out else step
    return out


@dataclass(frozen=True, slots=True)
class Source:
    """One policy file: its name in messages, the files that include it (outermost first), and
    the lines of its values."""

    name: str
    included_by: tuple[str, ...] = ()
    lines: Lines | None = None

    def message(self, path: KeyPath, why: str, offset: int | None = None) -> str:
        """``file:line: key: why (included by …)``: one line (DESIGN §4.1); with ``offset``
        (into the string at ``path``), ``file:line:column:``."""
        line = column = 0
        if self.lines is not None:
            if offset is None:
                line = self.lines.line(path)
            else:
                line, column = self.lines.position(path, offset)
        where = f"{self.name}:{line}" if line else self.name
        where += f":{column}" if line and column else ""
        key = render_path(path)
        chain = f" (included by {' <- '.join(reversed(self.included_by))})"
        return f"{where}: {key + ': ' if key else ''}{why}{chain if self.included_by else ''}"

    def fail(self, path: KeyPath, why: str, offset: int | None = None) -> NoReturn:
        raise ConfigError(self.message(path, why, offset))


@dataclass(frozen=True, slots=True)
class Located:
    """A value and where it was written. A kind composed from several files keeps each of its
    values' own place, so a fault names the file that wrote it."""

    value: Any
    source: Source
    path: KeyPath

    def fail(self, why: str, *more: str | int) -> NoReturn:
        """Refuse this value (or the key ``more`` under it)."""
        self.source.fail((*self.path, *more), why)

    def fail_at(self, offset: int, why: str) -> NoReturn:
        """Refuse this string value, naming the line and column of its character ``offset``."""
        self.source.fail(self.path, why, offset)

    def at(self, *more: str | int) -> Located:
        """The value at ``more`` under this one (which the schema guarantees is there)."""
        value = self.value
        for step in more:
            value = value[step]
        return Located(value, self.source, (*self.path, *more))

    def get(self, key: str) -> Located | None:
        """The value at ``key`` of this mapping, if given."""
        return self.at(key) if key in self.value else None

    @property
    def where(self) -> str:
        """``file: key``, for messages that name a second place."""
        return f"{self.source.name}: {render_path(self.path)}"


@dataclass(slots=True)
class RawKind:
    """A kind as its files wrote it: its keys and versions, each where it was written."""

    group: str
    resource: str
    origin: Located
    """The ``kinds[i]`` entry that defined it."""
    keys: dict[str, Located]
    """Every kind-level key given, ``group``, ``resource`` and ``versions`` aside."""
    versions: dict[str, Located]
    """Version name → the entry that lists it (names listed together share one entry)."""

    @property
    def qualified(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def rule(self) -> str:
        """The rule as written ("" for an override that names none)."""
        loc = self.keys.get("rule")
        return loc.value if loc is not None else ""

    @property
    def key(self) -> tuple[str, str, str]:
        """(group, resource, rule): a kind may be listed once per rule."""
        return (self.group, self.resource, self.rule)


@dataclass(frozen=True, slots=True)
class PolicyDraft:
    """What a policy file and the files it includes say together, checked against the schema."""

    source: str
    """The policy's name in messages (its top file, or ``packaged:<name>``)."""
    files: tuple[str, ...]
    """The files on disk it was read from (a reload watches them)."""
    drivers: frozenset[str]
    service_accounts: Mapping[str, str]
    """``system:serviceaccount:<namespace>:<name>`` → driver."""
    unbound_tokens: Located | None
    kinds: tuple[RawKind, ...]
