"""Reading a policy document: typed accessors that name the file and the key on every failure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NoReturn

from gatekeeper.codec.jsonpath import FieldPath, parse_field_path
from gatekeeper.errors import ConfigError

__all__ = ["Context", "join_key", "parse_enum"]


class Context:
    """The policy file being read: each accessor checks one value or fails naming its key."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, why: str) -> NoReturn:
        where = f"{self.source}: {key}" if key else self.source
        raise ConfigError(f"{where}: {why}")

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


def join_key(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def parse_enum(ctx: Context, enum_type: Any, value: Any, key: str) -> Any:
    allowed = [member.value for member in enum_type]
    if value not in allowed:
        ctx.fail(key, f"{value!r} is not one of {', '.join(allowed)}")
    return enum_type(value)
