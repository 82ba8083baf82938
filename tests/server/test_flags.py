"""The one table of ``serve`` flags: the parser, the checks, the limits and the docs' table all
come from it."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from gatekeeper.cli.main import build_parser
from gatekeeper.errors import ConfigError
from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.server.flags import (
    SERVE_FLAGS,
    TABLE_BEGIN,
    TABLE_END,
    flag_table,
    limits_from,
    read_flags,
    write_flag_tables,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _serve_options() -> list[str]:
    serve = build_parser().parse_args(["serve"])
    assert serve.command == "serve"
    return sorted(key for key in vars(serve) if key != "command")


def test_the_docs_flag_tables_are_the_generated_one() -> None:
    """Regenerate with: .venv/bin/python -m gatekeeper.server.flags README.md"""
    tables = 0
    for path in DOCS:
        text = path.read_text()
        if TABLE_BEGIN not in text:
            continue
        tables += 1
        block = text.split(TABLE_BEGIN + "\n", 1)[1].split(TABLE_END, 1)[0]
        assert block == flag_table(), f"{path.name}: python -m gatekeeper.server.flags {path}"
    assert tables >= 1


def test_every_flag_is_in_the_table_once_and_every_limit_has_one() -> None:
    keys = [flag.key for flag in SERVE_FLAGS]
    assert len(keys) == len(set(keys))
    assert _serve_options() == sorted(keys)  # the parser adds none of its own
    limits = [flag.limit for flag in SERVE_FLAGS if flag.limit]
    unflagged = {field.name for field in fields(Limits)} - set(limits)
    assert len(limits) == len(set(limits)) and unflagged == {"upstream_own"}  # not the drivers'

    assert all(f"`{flag.name} {flag.metavar}`" in flag_table() for flag in SERVE_FLAGS)


def test_the_flags_defaults_are_the_values_read_without_them() -> None:
    values = read_flags({})
    assert limits_from(values) == DEFAULT_LIMITS
    assert values.number("token_cache_ttl") == 2.0 and values.items("driver") == []
    assert values.address("listen") is None
    parsed = vars(build_parser().parse_args(["serve"]))
    del parsed["command"]
    assert limits_from(read_flags(parsed)) == DEFAULT_LIMITS


def test_a_repeatable_flags_default_is_not_shared() -> None:
    read_flags({}).items("driver").append("gpu.example.com")
    assert read_flags({}).items("driver") == []


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"listen": "8443"}, "--listen '8443' must be HOST:PORT (e.g. 127.0.0.1:8443)"),
        ({"listen_token": "[::1]:x"}, "--listen-token '[::1]:x' must be HOST:PORT"),
        ({"token_cache_ttl": -1.0}, "--token-cache-ttl must be between 0 and 10 seconds"),
        ({"audit_log_maxsize": -1}, "--audit-log-maxsize must not be negative"),
    ],
)
def test_each_flag_checks_its_value(given: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        read_flags(given)  # type: ignore[arg-type]
    assert str(refused.value).startswith(message)


def test_a_key_that_is_no_flag_is_the_callers_bug() -> None:
    with pytest.raises(ValueError, match="not serve flags: drivers"):
        read_flags({"drivers": []})


def test_the_generator_writes_between_the_markers(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Flags\n\n{TABLE_BEGIN}\nold\n{TABLE_END}\n\nafter\n")
    assert write_flag_tables([doc]) == [doc]
    assert doc.read_text() == f"# Flags\n\n{TABLE_BEGIN}\n{flag_table()}{TABLE_END}\n\nafter\n"
    assert write_flag_tables([doc]) == []  # already current
    bare = tmp_path / "bare.md"
    bare.write_text("no table\n")
    with pytest.raises(ValueError, match="no <!-- serve-flags:begin"):
        write_flag_tables([bare])
