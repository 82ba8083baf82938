"""The command-line parsers' one rule for usage errors: exit 2 with one line naming the command,
and for a flag it does not know, the one it likely meant."""

from __future__ import annotations

import argparse
import difflib
import re
from typing import Any, NoReturn

__all__ = ["UsageParser"]

_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (.*)$")
_MADE: list[argparse.ArgumentParser] = []
"""The parsers of this run, subcommands' included: an unrecognized argument is reported by the
top-level parser, which does not know their flags; their help texts do."""


class UsageParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, ``<command>: <message>``, exit 2.

    Subclasses set ``command``; their subcommands' parsers (``parser_class``) keep it, so an
    error in ``dra-gatekeeper audit check`` still names ``dra-gatekeeper audit``. An unknown
    flag is answered with the closest known one (``--nodename``: did you mean ``--node-name``?)
    and where the flags are listed.
    """

    command = "dra-gatekeeper"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _MADE.append(self)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.command}: {message}{_hint(message)}\n")


_FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")


def _hint(message: str) -> str:
    match = _UNRECOGNIZED.match(message)
    if match is None:
        return ""
    flags = [word.split("=", 1)[0] for word in match.group(1).split() if word[:2] == "--"]
    guesses = [
        f"{flag}: did you mean {close[0]}?"
        for flag in flags
        if (close := difflib.get_close_matches(flag, _known_flags(), n=1))
    ]
    listed = "--help lists every flag"
    return f" ({'; '.join([*guesses, listed])})"


def _known_flags() -> list[str]:
    return sorted({flag for parser in _MADE for flag in _FLAG.findall(parser.format_help())})
