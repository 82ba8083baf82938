"""What the CEL of a kind version reads of ``object`` and ``oldObject``, from the checked trees:
every field path its selects, indexes and loops reach, and how each is read (whole: compared,
passed to a function, put in a list; only tested with ``has()`` or compared with null; only
measured: ``size``, a loop's range). Per request the objects are cut to it
(:mod:`gatekeeper.policy.cel._cut`), and its paths name the sizes a cost depends on
(:mod:`gatekeeper.policy.cel._cost`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gatekeeper.policy.cel._ast import Checked, Node, NodeKind
from gatekeeper.policy.cel._env import OBJECT_ROOTS

__all__ = ["EACH", "Flattenable", "Path", "Read", "Reads", "chains"]

EACH = "*"
"""A step to every element of a list, or every value of a map."""
Path = tuple[str, tuple[str, ...]]
"""A root (``object``, ``oldObject``) and the steps below it."""


@dataclass(slots=True)
class Read:
    """How one path is read: whole, only tested with ``has()``, only measured, or through
    the fields and elements below it."""

    path: str
    slot: int
    whole: bool = False
    present: bool = False
    shape: bool = False
    fields: dict[str, Read] = field(default_factory=dict)
    each: Read | None = None


class Reads:
    """The paths the expressions of one kind version read, built one expression at a time
    (:meth:`add`), variables first: a variable's value is the paths it may alias."""

    def __init__(self) -> None:
        self._roots: dict[str, Read] = {}
        self._slots: list[str] = []
        self.values: dict[int, dict[int, frozenset[Path]]] = {}
        """Per expression (by ``id`` of its Checked), per node: the paths its value may be."""

    def add(self, checked: Checked, variables: Mapping[str, frozenset[Path]]) -> frozenset[Path]:
        """Record what ``checked`` reads; the paths its value may be (for a variable)."""
        walk = _Walk(self, checked, variables)
        value = walk.value(checked.root, {})
        self.values[id(checked)] = walk.seen
        return value

    def slot(self, path: Path) -> int:
        """The size slot of ``path`` (created when first asked)."""
        return self._node(path).slot

    def describe(self, slot: int) -> str:
        """``object.spec.devices[*]``: the path a size slot measures."""
        return self._slots[slot]

    @property
    def slots(self) -> int:
        return len(self._slots)

    def mark(self, paths: Iterable[Path], how: str) -> None:
        for path in paths:
            node = self._node(path)
            setattr(node, how, True)

    def _node(self, path: Path) -> Read:
        root, steps = path
        node = self._roots.get(root)
        if node is None:
            node = self._roots[root] = self._new(root)
        shown = root
        for step in steps:
            shown += "[*]" if step == EACH else f".{step}"
            if step == EACH:
                if node.each is None:
                    node.each = self._new(shown)
                node = node.each
            else:
                child = node.fields.get(step)
                if child is None:
                    child = node.fields[step] = self._new(shown)
                node = child
        return node

    def _new(self, shown: str) -> Read:
        self._slots.append(shown)
        return Read(shown, len(self._slots) - 1)

    @property
    def roots(self) -> Mapping[str, Read]:
        """How each root is read."""
        return self._roots

    @property
    def paths(self) -> tuple[str, ...]:
        """The path each size slot measures."""
        return tuple(self._slots)

    def flattenable(self, trees: Iterable[Checked], measured: frozenset[int]) -> Flattenable:
        """The lists read only element by element through one field, in loops over them
        (``devices.all(d, d.name.startsWith('gpu-'))``, and ``size()``): the runtime converts
        a list of that field's values in a fraction of the time it converts a list of mappings,
        and an expression written with ``d`` for ``d.name`` gives the same. Each such path with
        its field, and per expression (``id`` of its Checked) the selects to rewrite."""
        found: dict[Path, str] = {}
        for root, node in self._roots.items():
            _candidates(root, (), node, measured, found)
        selects: dict[Path, list[tuple[int, int, str]]] = {path: [] for path in found}
        for tree in trees:
            _verify(tree, self.values.get(id(tree), {}), found, selects)
        collapse: dict[int, dict[int, str]] = {}
        for path in found:
            for tree_id, node_id, name in selects[path]:
                collapse.setdefault(tree_id, {})[node_id] = name
        return Flattenable(found, collapse)


@dataclass(frozen=True, slots=True)
class Flattenable:
    """Lists read through one field of their elements (:meth:`Reads.flattenable`)."""

    fields: Mapping[Path, str]
    """Each list's path, and the field its elements are read through."""
    collapse: Mapping[int, Mapping[int, str]]
    """Per expression (``id`` of its Checked): the selects ``x.field`` to write as ``x`` (node
    id → ``x``)."""


def chains(tree: Checked) -> dict[int, Path]:
    """The chains of selects from ``object`` or ``oldObject`` in ``tree`` (``object``,
    ``object.spec.pool.name``; not ``has()``'s select), by the id of their last node: the path
    each reads."""
    parents = {child.id: node for node in tree.root.walk() for child in node.children()}
    found: dict[int, Path] = {}
    for node, local in tree.scoped():
        if node.kind is not NodeKind.IDENT or node.name not in OBJECT_ROOTS or node.name in local:
            continue
        steps: list[str] = []
        top = node
        while (parent := parents.get(top.id)) is not None and (
            parent.kind is NodeKind.SELECT and not parent.test_only and parent.operand is top
        ):
            steps.append(parent.name)
            top = parent
        found[top.id] = (node.name, tuple(steps))
    return found


def _candidates(
    root: str, steps: tuple[str, ...], node: Read, measured: frozenset[int], found: dict[Path, str]
) -> None:
    element = node.each
    if (
        element is not None
        and not (node.whole or node.present or node.fields)
        and not (element.whole or element.present or element.shape or element.each)
        and len(element.fields) == 1
        and element.slot not in measured
    ):
        ((name, leaf),) = element.fields.items()
        if not (leaf.fields or leaf.each) and leaf.slot not in measured:
            found[(root, steps)] = name
    for name, child in node.fields.items():
        _candidates(root, (*steps, name), child, measured, found)


def _verify(
    tree: Checked,
    values: Mapping[int, frozenset[Path]],
    found: dict[Path, str],
    selects: dict[Path, list[tuple[int, int, str]]],
) -> None:
    """Drop from ``found`` a list whose elements ``tree`` reads otherwise than through the
    field, as the variable of a loop over that list alone; record the selects of the field."""
    parents = {child.id: node for node in tree.root.walk() for child in node.children()}
    stack: list[tuple[Node, Mapping[str, frozenset[Path]]]] = [(tree.root, {})]
    while stack:
        node, loops = stack.pop()
        paths = values.get(node.id, frozenset())
        for (root, steps), name in list(found.items()):
            if (root, (*steps, EACH)) not in paths:
                continue
            ranged = loops.get(node.name) if node.kind is NodeKind.IDENT else None
            select = parents.get(node.id)
            if (
                ranged == frozenset({(root, steps)})
                and select is not None
                and select.kind is NodeKind.SELECT
                and select.name == name
                and not select.test_only
            ):
                selects[(root, steps)].append((id(tree), select.id, node.name))
            else:
                del found[(root, steps)]
        if node.loop is not None:
            loop = node.loop
            over = values.get(loop.iter_range.id, frozenset())
            inner = dict(loops)
            inner[loop.iter_var] = frozenset() if loop.iter_var2 else over
            if loop.iter_var2:
                for path in over:
                    found.pop(path, None)
            stack += [(loop.iter_range, loops), (loop.accu_init, loops)]
            stack += [(loop.loop_condition, inner), (loop.loop_step, inner)]
            stack.append((loop.result, loops))
            continue
        stack.extend((child, loops) for child in node.children())


class _Walk:
    """One expression's tree walked for the paths each value may be."""

    def __init__(
        self, reads: Reads, checked: Checked, variables: Mapping[str, frozenset[Path]]
    ) -> None:
        self.reads, self.checked, self.variables = reads, checked, variables
        self.seen: dict[int, frozenset[Path]] = {}

    def value(self, node: Node, scope: Mapping[str, frozenset[Path]]) -> frozenset[Path]:
        paths = self._value(node, scope)
        self.seen[node.id] = paths
        return paths

    def use(self, node: Node | None, scope: Mapping[str, frozenset[Path]]) -> None:
        """``node``'s value is used whole."""
        if node is not None:
            self.reads.mark(self.value(node, scope), "whole")

    def _value(self, node: Node, scope: Mapping[str, frozenset[Path]]) -> frozenset[Path]:
        kind = node.kind
        if kind is NodeKind.IDENT:
            if node.name in scope:
                return scope[node.name]
            name = self.checked.references.get(node.id, node.name)
            if name in OBJECT_ROOTS:
                return frozenset({(name, ())})
            return self.variables.get(name, frozenset())
        if kind is NodeKind.SELECT:
            assert node.operand is not None
            below = _below(self.value(node.operand, scope), node.name)
            if node.test_only:
                self.reads.mark(below, "present")
                return frozenset()
            return below
        if kind is NodeKind.CALL:
            return self._call(node, scope)
        if kind is NodeKind.COMPREHENSION:
            return self._loop(node, scope)
        for child in node.children():  # list and map literals keep their values whole
            self.use(child, scope)
        return frozenset()

    def _call(self, node: Node, scope: Mapping[str, frozenset[Path]]) -> frozenset[Path]:
        name, args, target = node.name, node.args, node.operand
        if name in ("_?._", "_[_]", "_[?_]") and len(args) == 2:
            operand = self.value(args[0], scope)
            key = args[1]
            if key.kind is NodeKind.CONST and isinstance(key.value, str):
                self.value(key, scope)
                return _below(operand, key.value)
            self.use(key, scope)
            return _below(operand, EACH)
        if name == "_?_:_" and len(args) == 3:
            self.use(args[0], scope)
            return self.value(args[1], scope) | self.value(args[2], scope)
        if name in ("orValue", "or") and target is not None and len(args) == 1:
            return self.value(target, scope) | self.value(args[0], scope)
        if name in ("value", "optional.of", "dyn") and len(args) + (target is not None) == 1:
            return self.value(target if target is not None else args[0], scope)
        if name == "hasValue" and target is not None and not args:
            self.reads.mark(self.value(target, scope), "present")
            return frozenset()
        if name in ("_==_", "_!=_") and any(_null(arg) for arg in args):
            # Compared with null: only whether it is there, not what it holds (``object ==
            # null ? … : …`` on a delete, where object is null).
            for arg in args:
                self.reads.mark(self.value(arg, scope), "present")
            return frozenset()
        if name == "type" and len(args) == 1:
            self.reads.mark(self.value(args[0], scope), "present")
            return frozenset()
        if name == "size" and len(args) + (target is not None) == 1:
            self.reads.mark(self.value(target if target is not None else args[0], scope), "shape")
            return frozenset()
        if name == "@in" and len(args) == 2:
            self.use(args[0], scope)
            collection = self.value(args[1], scope)
            self.reads.mark(collection, "shape")
            self.reads.mark(_below(collection, EACH), "whole")
            return frozenset()
        self.use(target, scope)
        for arg in args:
            self.use(arg, scope)
        return frozenset()

    def _loop(self, node: Node, scope: Mapping[str, frozenset[Path]]) -> frozenset[Path]:
        loop = node.loop
        assert loop is not None
        over = self.value(loop.iter_range, scope)
        self.reads.mark(over, "shape")
        inner = dict(scope)
        if loop.iter_var2:  # (index or key, element or value)
            inner[loop.iter_var], inner[loop.iter_var2] = frozenset(), _below(over, EACH)
        else:
            inner[loop.iter_var] = _below(over, EACH)
        accumulated = self.value(loop.accu_init, scope)
        for _ in range(4):  # what the accumulator may hold, to a fixed point
            inner[loop.accu_var] = accumulated
            self.use(loop.loop_condition, inner)
            grown = accumulated | self.value(loop.loop_step, inner)
            if grown == accumulated:
                break
            accumulated = grown
        else:  # still growing (it never should): every path it reached is read whole
            self.reads.mark(accumulated, "whole")
        inner[loop.accu_var] = accumulated
        after = {**scope, loop.accu_var: accumulated}
        return self.value(loop.result, after)


def _null(node: Node) -> bool:
    return node.kind is NodeKind.CONST and node.value is None


def _below(paths: frozenset[Path], step: str) -> frozenset[Path]:
    return frozenset((root, (*steps, step)) for root, steps in paths)
