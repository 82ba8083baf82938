"""Reading a policy document: typed accessors that name the file and the key on every failure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from gatekeeper.codec.jsonpath import FieldPath, parse_field_path
from gatekeeper.errors import ConfigError

__all__ = ["Context", "Located", "join_key", "parse_enum"]


class Context:
    """One policy file being read: each accessor checks one value or fails naming its key.

    ``legacy`` marks a file in the deprecated format (its versions a mapping, ``immutable``);
    ``included_by`` the files that include it, outermost first, named after every fault.
    """

    def __init__(
        self, source: str, *, legacy: bool = False, included_by: tuple[str, ...] = ()
    ) -> None:
        self.source = source
        self.legacy = legacy
        self.included_by = included_by
        self.legacy_immutable: list[str] = []
        """Where a deprecated-format file says ``immutable`` (for its one deprecation notice)."""

    def fail(self, key: str, why: str) -> NoReturn:
        where = f"{self.source}: {key}" if key else self.source
        chain = f" (included by {' <- '.join(reversed(self.included_by))})"
        raise ConfigError(f"{where}: {why}{chain if self.included_by else ''}")

    def mapping(self, value: Any, key: str, allowed: set[str]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            self.fail(key, "must be a mapping")
        for name in value:
            if name not in allowed:
                self.fail(
                    join_key(key, str(name)), f"unknown key (allowed: {', '.join(sorted(allowed))})"
                )
        return value

    def string(self, value: Any, key: str, pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(value, str):
            self.fail(key, "must be a string")
        if pattern is not None and not pattern.match(value):
            self.fail(key, f"{value!r} is not a valid value")
        return value

    def path(self, value: Any, key: str) -> FieldPath:
        try:
            return parse_field_path(value)
        except ValueError as exc:
            return self.fail(key, str(exc))

    def string_list(self, value: Any, key: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, "must be a list of strings")
        return value


@dataclass(frozen=True, slots=True)
class Located:
    """A raw value and where it was written: which file, at which key. A kind merged from
    several files keeps each of its values' own place, so a fault names the file that wrote it."""

    value: Any
    ctx: Context
    key: str

    def fail(self, why: str, key: str = "") -> NoReturn:
        self.ctx.fail(join_key(self.key, key), why)

    @property
    def where(self) -> str:
        """``file: key``, for messages that name a second place."""
        return f"{self.ctx.source}: {self.key}"


def join_key(prefix: str, key: str) -> str:
    if not key:
        return prefix
    if key.startswith("["):
        return f"{prefix}{key}"
    return f"{prefix}.{key}" if prefix else key


def parse_enum(ctx: Context, enum_type: Any, value: Any, key: str) -> Any:
    allowed = [member.value for member in enum_type]
    if value not in allowed:
        ctx.fail(key, f"{value!r} is not one of {', '.join(allowed)}")
    return enum_type(value)
