"""The gatekeeper uses only the public surface of the libraries it builds on (aiohttp, asyncio,
ssl, yarl, multidict, uvloop): no ``obj._name`` of another object, no private name of a library
class read or defined by our subclasses of it (an override of a private hook, or an attribute
that would shadow the library's own), and no ``getattr``/``hasattr`` standing in for an
interface. An upgrade that renames a private name can then break nothing silently."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import gatekeeper

PACKAGE = Path(gatekeeper.__file__).parent
LIBRARIES = ("aiohttp", "asyncio", "ssl", "_ssl", "yarl", "multidict", "uvloop", "socket")

REFLECTION = {
    "gatekeeper/cli/main.py": 1,  # a subcommand's entry point, imported when it is run
    "gatekeeper/listen/identity/_peers.py": 1,  # socket.SO_PEERCRED exists on Linux only
    "gatekeeper/listen/tls.py": 1,  # os.memfd_create exists on Linux only
    "gatekeeper/upstream/kubeconfig/_config.py": 1,  # the dataclass's own fields, for __repr__
    "gatekeeper/audit/tools/generate/_base.py": 1,  # the dataclass's own fields, by name
    "gatekeeper/audit/tools/reader.py": 1,  # a file object that can peek (a buffered one)
}
"""``getattr``/``hasattr`` left, per file: reflection over our own values or the platform,
none of them an interface of another layer."""


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield str(path.relative_to(PACKAGE.parent)), ast.parse(path.read_text())


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_attribute_of_another_object() -> None:
    found = [
        f"{where}:{node.lineno}: {ast.unparse(node)}"
        for where, tree in _sources()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and _private(node.attr)
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert found == []


def test_getattr_stands_in_for_no_interface() -> None:
    counts: dict[str, int] = {}
    for where, tree in _sources():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
            ):
                counts[where] = counts.get(where, 0) + 1
    assert counts == REFLECTION


def _library_subclasses() -> list[type]:
    classes: dict[str, type] = {}
    for module in pkgutil.walk_packages(gatekeeper.__path__, "gatekeeper."):
        if module.name == "gatekeeper.__main__":
            continue  # runs the command line
        loaded = importlib.import_module(module.name)
        for value in vars(loaded).values():
            if (
                inspect.isclass(value)
                and value.__module__ == loaded.__name__
                and any(_from_library(base) for base in value.__mro__[1:])
            ):
                classes[f"{value.__module__}.{value.__qualname__}"] = value
    return [classes[name] for name in sorted(classes)]


def _from_library(cls: type) -> bool:
    return cls.__module__.split(".")[0] in LIBRARIES


def _library_names(cls: type) -> set[str]:
    """Every name the library classes in ``cls``'s MRO define: members, slots, and the
    attributes their methods assign (``self.x = ...``, read from their source)."""
    names: set[str] = set()
    for base in cls.__mro__:
        if not _from_library(base):
            continue
        names |= set(vars(base)) | set(getattr(base, "__slots__", ()))
        try:
            source = textwrap.dedent(inspect.getsource(base))
        except (OSError, TypeError):
            continue  # a C type: its members are all in vars()
        names |= _assigned(ast.parse(source))
    return names


def _assigned(tree: ast.AST) -> set[str]:
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


_METACLASS = {"_abc_impl"}
"""Set on every class by ``abc.ABCMeta``, not by our source."""


def _ours(cls: type) -> tuple[set[str], set[str]]:
    """The private names ``cls``'s own source defines (members, assigned attributes), and
    those it reads from ``self``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    defined = {name for name in vars(cls) if _private(name) and name not in _METACLASS} | {
        name for name in _assigned(body) if _private(name)
    }
    read = {
        node.attr
        for node in ast.walk(body)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Load)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and _private(node.attr)
    }
    return defined, read


SUBCLASSES = _library_subclasses()


def test_the_library_subclasses_are_found() -> None:
    """The check below sees the connection, server, runner, site and access-log subclasses."""
    names = {cls.__name__ for cls in SUBCLASSES}
    assert {"_GuardedHandler", "_GuardedServer", "GuardedRunner", "TLSGateSite"} <= names
    assert {"HealthServer", "_Answered"} <= names


@pytest.mark.parametrize("cls", SUBCLASSES, ids=lambda cls: cls.__qualname__)
def test_subclasses_keep_to_the_public_surface(cls: type) -> None:
    """A private name our subclass defines must not be the library's (no override of a private
    hook, no attribute shadowing one), and every private name it reads must be its own."""
    library = _library_names(cls)
    ours: set[str] = set()
    for base in cls.__mro__:
        if not _from_library(base) and base is not object:
            ours |= _ours(base)[0]
    defined, read = _ours(cls)
    assert sorted(defined & library) == []
    assert sorted(read - ours) == []
