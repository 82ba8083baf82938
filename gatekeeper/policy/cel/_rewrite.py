"""An expression's source rewritten where its checked tree says it names a declaration (a
variable inlined, ``object`` read as ``oldObject``), never where its text merely looks like one
(a string, a comment, a comprehension's own variable of the same name)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gatekeeper.policy.cel._ast import Node, NodeKind
from gatekeeper.policy.cel._program import Program

__all__ = ["Reference", "Replacement", "references", "rewrite"]


@dataclass(frozen=True, slots=True)
class Reference:
    """Where a declaration is named in the source (``variables.node``: both words and the dot),
    and the comprehension variables in scope there."""

    name: str
    start: int
    end: int
    local: frozenset[str]


Replacement = Callable[[str], tuple[str, frozenset[str]] | None]
"""A declaration's new text and the names that text reads; None keeps it."""


def references(program: Program) -> list[Reference] | None:
    """Every place ``program`` names a declaration, in source order; None when one cannot be
    placed in the source exactly (it is then not rewritten)."""
    checked, source = program.checked, program.source
    found: list[Reference] = []
    for node, local in checked.scoped():
        if node.kind is NodeKind.IDENT and node.name not in local:
            name = checked.references.get(node.id, node.name)
            span = _span(source, name, checked.positions, node.id)
            if span is None:
                return None
            found.append(Reference(name, span[0], span[1], local))
    return sorted(found, key=lambda reference: reference.start)


def _span(
    source: str, name: str, positions: Mapping[int, int], ident: int
) -> tuple[int, int] | None:
    """Where ``name`` (a plain or a qualified name the checker resolved) is written. The parser
    numbers a chain ``a.b.c`` in order (``a``, ``a.b``, ``a.b.c``) and places a select at its
    dot: the chain starts where its first name was placed and ends after its last word."""
    words = name.split(".")
    first = positions.get(ident - (len(words) - 1))
    if first is None or not source.startswith(words[0], first):
        return None
    if len(words) == 1:
        return first, first + len(name)
    dot = positions.get(ident)
    if dot is None or source[dot : dot + 1] != ".":
        return None
    at = _skip_blank(source, dot + 1)
    if not source.startswith(words[-1], at):
        return None
    return first, at + len(words[-1])


def _skip_blank(source: str, at: int) -> int:
    """The first character at or after ``at`` that is not blank or in a ``//`` comment."""
    while at < len(source):
        if source[at].isspace():
            at += 1
        elif source.startswith("//", at):
            newline = source.find("\n", at)
            at = len(source) if newline < 0 else newline + 1
        else:
            break
    return at


def rewrite(
    program: Program, replace: Replacement, selects: Mapping[int, str] | None = None
) -> str | None:
    """``program``'s source with each declaration ``replace`` gives a new text for replaced,
    and each select of ``selects`` (node id → text) written as that text, from the identifier
    its chain of selects starts at to its field (``d.name`` as ``d``, ``object.spec.pool`` as
    a name bound to that value); None when a replacement would land where a comprehension
    variable of the same name as one it reads hides it, or a name cannot be placed."""
    found = references(program)
    if found is None:
        return None
    edits: list[tuple[int, int, str]] = []
    for reference in found:
        replaced = replace(reference.name)
        if replaced is None:
            continue
        text, reads = replaced
        if reads & reference.local:
            return None
        edits.append((reference.start, reference.end, text))
    for node in program.checked.root.walk() if selects else ():
        if selects is not None and node.id in selects:
            span = _chain(program, node)
            if span is None:
                return None
            edits.append((*span, selects[node.id]))
    out, at = [], 0
    for start, end, text in sorted(edits):
        if start < at:
            return None
        out += [program.source[at:start], text]
        at = end
    out.append(program.source[at:])
    return "".join(out)


def _chain(program: Program, select: Node) -> tuple[int, int] | None:
    """The span of a chain of selects ``x.f.g`` (up to ``select``; or of the identifier
    ``x`` alone): each select is placed at its dot, the identifier where its name is written."""
    positions, source = program.checked.positions, program.source
    root = select
    while root.kind is NodeKind.SELECT and root.operand is not None:
        root = root.operand
    start = positions.get(root.id)
    if root.kind is not NodeKind.IDENT or start is None or not source.startswith(root.name, start):
        return None
    if root is select:
        return start, start + len(root.name)
    dot = positions.get(select.id)
    if dot is None:
        return None
    at = _skip_blank(source, dot + 1)
    if source[dot : dot + 1] != "." or not source.startswith(select.name, at):
        return None
    return start, at + len(select.name)
