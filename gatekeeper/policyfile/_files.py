"""Policy files read: from disk or shipped inside the gatekeeper (``packaged:<name>``), each
with the files it includes, each checked by the schema before anything else reads it.

A policy file may include others (``include: [base.yaml, packaged:default]``): they are loaded
first, in order; the file then adds drivers, service accounts and kinds, and overrides keys or
versions of included kinds under ``overrides`` (docs/policy.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import resources
from typing import Any

from gatekeeper.errors import ConfigError
from gatekeeper.policy.build import build_policy
from gatekeeper.policy.draft import KeyPath, Located, Source
from gatekeeper.policy.model import Policy
from gatekeeper.policyfile._compose import Composed, compose, draft
from gatekeeper.policyfile._schema import POLICY, first_fault, schema
from gatekeeper.policyfile._yaml import YamlError, line_at, load_yaml, position_at

__all__ = [
    "API_VERSION",
    "DEFAULT_POLICY",
    "PACKAGED",
    "load_policy",
    "packaged_policies",
    "parse_policy",
]

API_VERSION: str = schema(POLICY)["properties"]["apiVersion"]["const"]
"""The policy format's group and version (the schema's ``apiVersion``): a domain this project
can own (``k8s.io`` belongs to the Kubernetes project), as its audit annotations."""
PACKAGED = "packaged:"
"""``packaged:<name>`` names a policy shipped inside the gatekeeper (``packaged:default``)."""
DEFAULT_POLICY = f"{PACKAGED}default"


def load_policy(path: str | None, *, files_read: list[str] | None = None) -> Policy:
    """Load ``path`` (``packaged:<name>``, or the packaged default when None) and what it
    includes, and validate it. ``files_read`` collects every file on disk tried, even when the
    load fails (a reload watches them)."""
    loader = _Loader(files_read)
    source = path or DEFAULT_POLICY
    composed = loader.file(source, source, ())
    return build_policy(draft(composed, source, tuple(loader.files)))


def parse_policy(text: str, source: str = "<policy>", *, directory: str | None = None) -> Policy:
    """Validate policy YAML ``text``; ConfigError naming ``source``, the line and the key on any
    fault. Relative includes are found in ``directory`` (without one, only ``packaged:`` names)."""
    loader = _Loader(None)
    composed = loader.document(text, source, directory, ())
    return build_policy(draft(composed, source, ()))


def packaged_policies() -> list[str]:
    """The ``packaged:<name>`` policies shipped inside the gatekeeper."""
    folder = resources.files("gatekeeper").joinpath("policies")
    return sorted(
        f"{PACKAGED}{entry.name.removesuffix('.yaml')}"
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )


class _Lines:
    """The lines of a loaded document, for the build's messages."""

    def __init__(self, doc: Any, text: str) -> None:
        self._doc, self._text = doc, text

    def line(self, path: KeyPath) -> int:
        return line_at(self._doc, path)

    def position(self, path: KeyPath, offset: int) -> tuple[int, int]:
        return position_at(self._text, self._doc, path, offset)


class _AtLine:
    """One line for every path: where the YAML parser stopped."""

    def __init__(self, line: int) -> None:
        self._line = line

    def line(self, path: KeyPath) -> int:
        return self._line

    def position(self, path: KeyPath, offset: int) -> tuple[int, int]:
        return self._line, 0


class _Loader:
    """One load: the files in progress (cycles), those loaded (each once)."""

    def __init__(self, files_read: list[str] | None) -> None:
        self.active: list[tuple[str, str]] = []
        """The files being read, outermost first: (identity, as shown)."""
        self.loaded: dict[str, str] = {}
        """Identity of each file read → the file that included it."""
        self.files: list[str] = []
        self.files_read = files_read if files_read is not None else []

    def file(self, ref: str, shown: str, included_by: tuple[str, ...]) -> Composed:
        """Read ``ref`` (a path or a ``packaged:`` name), shown in messages as ``shown``."""
        self.active.append((_identity(ref), shown))
        try:
            return self._read(ref, shown, included_by)
        finally:
            self.active.pop()

    def _read(self, ref: str, shown: str, included_by: tuple[str, ...]) -> Composed:
        where = Source(shown, included_by)
        if ref.startswith(PACKAGED):
            if ref not in packaged_policies():
                shipped = ", ".join(packaged_policies())
                where.fail((), f"no such packaged policy (packaged: {shipped})")
            folder = resources.files("gatekeeper").joinpath("policies")
            text = folder.joinpath(f"{ref.removeprefix(PACKAGED)}.yaml").read_text("utf-8")
            return self.document(text, shown, None, included_by)
        self.files_read.append(ref)
        try:
            with open(ref, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            where.fail((), f"cannot read policy: {exc.strerror}")
        except UnicodeDecodeError:
            where.fail((), "policy is not UTF-8 text")
        self.files.append(ref)
        return self.document(text, shown, os.path.dirname(ref), included_by)

    def document(
        self, text: str, shown: str, directory: str | None, included_by: tuple[str, ...]
    ) -> Composed:
        """One file's text: YAML, then the schema, then its includes, then its own keys."""
        doc = _parsed(text, shown, included_by)
        source = Source(shown, included_by, _Lines(doc, text))
        _not_a_test_file(source, doc)
        fault = first_fault(POLICY, doc)
        if fault is not None:
            source.fail(fault.path, fault.message)
        return compose(source, doc, self._includes(source, doc, directory))

    def _includes(
        self, source: Source, doc: Mapping[str, Any], directory: str | None
    ) -> list[Composed]:
        read = []
        for index, ref in enumerate(doc.get("include", ())):
            where = Located(ref, source, ("include", index))
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
            self.loaded[identity] = source.name
            read.append(self.file(target, shown, (*source.included_by, source.name)))
        return read


def _parsed(text: str, shown: str, included_by: tuple[str, ...]) -> Any:
    try:
        return load_yaml(text)
    except YamlError as exc:
        message = Source(shown, included_by, _AtLine(exc.line)).message((), exc.message)
    raise ConfigError(message)


def _not_a_test_file(source: Source, doc: Any) -> None:
    """A policy test file given where a policy was expected (``serve --policy x_test.yaml``)."""
    if isinstance(doc, dict) and "kind" not in doc and "cases" in doc:
        source.fail(
            ("cases",),
            "this is a policy test file (it lists cases), not a policy: a policy says "
            "`kind: Policy`; run a test file with `dra-gatekeeper test`",
        )


def _identity(ref: str) -> str:
    """The same file however it is reached (``a/../b.yaml``, a symlink)."""
    return ref if ref.startswith(PACKAGED) else os.path.realpath(ref)


def _resolve(where: Located, directory: str | None) -> tuple[str, str]:
    """An include's file: (what to read, how messages name it). The schema allows only
    ``packaged:<name>`` and relative paths."""
    ref: str = where.value
    if ref.startswith(PACKAGED):
        return ref, ref
    if directory is None:
        where.fail(f"{ref!r}: a relative include needs the policy to be a file")
    path = os.path.normpath(os.path.join(directory, ref))
    return path, path
