"""The command-line parsers' one rule for usage errors: exit 2 with one line naming the command."""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["UsageParser"]


class UsageParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line, ``<command>: <message>``, exit 2.

    Subclasses set ``command``; their subcommands' parsers (``parser_class``) keep it, so an
    error in ``dra-gatekeeper audit check`` still names ``dra-gatekeeper audit``.
    """

    command = "dra-gatekeeper"

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.command}: {message}\n")
