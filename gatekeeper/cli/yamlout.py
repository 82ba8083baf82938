"""YAML the generators print for people to review: keys in their order, and every multi-line
string (a policy, a CEL expression) as a literal block, so it reads as written."""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["dump_readable"]


class _Literal(str):
    """A string YAML prints as a literal block."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def dump_readable(document: Any) -> str:
    """``document`` as YAML: safe types only, keys unsorted, multi-line strings as ``|`` blocks."""

    def literal(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: literal(v) for k, v in value.items()}
        if isinstance(value, list):
            return [literal(v) for v in value]
        if isinstance(value, str) and "\n" in value:
            return _Literal(value)
        return value

    dumped: str = yaml.dump(literal(document), Dumper=_Dumper, sort_keys=False, width=100)
    return dumped
