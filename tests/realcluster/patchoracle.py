"""The differential patch oracle (docs/security.md, "What the apiserver will store"): seeded,
reproducible random and mutated JSON and merge patches of stored objects, each sent to the real
kube-apiserver as a dry run and decided by the gatekeeper's own prediction, called directly.

What is compared is what matters: where the gatekeeper decides on the result it computed, every
field a rule reads must be what the apiserver's dry run stores, or the patch must be refused.
Where it decides on the apiserver's dry run, it decides on exactly that answer.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import ssl
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from gatekeeper.codec.jsonpath import get_field
from gatekeeper.errors import Refusal
from gatekeeper.policy import Decision
from gatekeeper.policy.changes import MAINTAINED, forbidden_change
from gatekeeper.policy.claims import status_change_violation
from gatekeeper.policy.model import KindRule
from gatekeeper.policy.patching import JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE
from gatekeeper.policy.plan import Plan
from gatekeeper.policy.stored import predict
from gatekeeper.request.body import decode_json
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.types import Identity
from tests.policy.stored_cases import CORPUS_ENTRIES, ENGINE, GPU, corpus_raw, decide, value_at

__all__ = [
    "Case",
    "Tally",
    "Target",
    "Verdict",
    "generate",
    "generate_bodies",
    "judge",
    "send_all",
]

DRIVER = "gpu.example.com"
NODE = "node-a"


@dataclass(frozen=True)
class Target:
    """A stored object the patches are sent to, and the rule that decides them."""

    name: str
    path: str
    stored: dict[str, Any]
    identity: Identity = GPU


@dataclass(frozen=True)
class Case:
    number: int
    target: Target
    media_type: str
    raw: bytes
    """Exactly what is sent (a patch with duplicate keys is sent as text)."""
    origin: str
    """Which generator made it (for the tally)."""
    entry: dict[str, Any] | None = None
    """The corpus entry it replays (None for a generated case)."""
    method: str = "PATCH"
    """PATCH, or a body's POST (a create, to the target's collection) or PUT (an update)."""

    @property
    def path(self) -> str:
        """Where it is sent: the target, or for a create the target's collection."""
        return self.target.path.rsplit("/", 1)[0] if self.method == "POST" else self.target.path


@dataclass
class Verdict:
    case: Case
    code: int
    """The apiserver's answer to the dry run (0: it closed the connection)."""
    served: Any
    prediction: str
    """refused-parse, refused, local or dry-run."""
    decision: Decision | None = None
    local: dict[str, Any] | None = None
    divergence: str | None = None
    """Where the local result and the apiserver's differ in a field a rule reads."""


# --- generation ---------------------------------------------------------------------------------

KEYS = [
    "gpu.example.com/clique", "gpu.example.com/x", "node-role.kubernetes.io/control-plane",
    "node.kubernetes.io/exclude-from-external-load-balancers", "app", "x", "", "0", "01", "-",
    "~", "a/b", "a~b", "Labels", "labels", "driver", "nodeName", "name", "pool", "managedFields",
    "resourceVersion", "generation", "uid", "$patch", "data", "conditions", "taint", "effect",
]  # fmt: skip
VALUES: list[Any] = [
    None, None, "", "x", DRIVER, "nic.example.com", NODE, "node-b", "node-a/oracle",
    "node-b/gpus", "01", "1e3", "true", "null", "1000m", "2026-12-01T10:00:00+02:00", 0, 1, -1,
    2**53 + 1, 1.5, True, False, [], [None], ["a", None], {}, {"k": None},
    {"k": "v", "n": None}, {"string": "s"}, {"int": 5}, {"a": {"b": {"c": None}}},
    {"name": "gpu-9"}, {"driver": DRIVER, "pool": "node-a/oracle", "device": "gpu-9"},
    {"driver": "nic.example.com", "pool": "node-a/oracle", "device": "nic-9"},
    {"key": "k", "effect": "NoSchedule"}, "~1", "a/b",
]  # fmt: skip


def generate(rng: random.Random, targets: list[Target], count: int) -> list[Case]:
    """``count`` cases: the corpus first (tests/corpus/patches, the attacks of issue 39 among
    them), then random ones."""
    by_name = {t.name: t for t in targets}
    cases = [
        Case(i, by_name[entry["target"]], entry["media_type"], corpus_raw(entry), "corpus", entry)
        for i, entry in enumerate(CORPUS_ENTRIES)
    ]
    generators = [
        (_json_patch, JSON_PATCH, 46),
        (_merge_patch, MERGE_PATCH, 34),
        (_read_fields_json, JSON_PATCH, 12),
        (_read_fields_merge, MERGE_PATCH, 6),
        (_duplicate_keys, MERGE_PATCH, 1),
        (_strategic, STRATEGIC_MERGE, 1),
    ]
    weights = [w for _, _, w in generators]
    while len(cases) < count:
        target = rng.choice(targets)
        make, media_type, _ = rng.choices(generators, weights)[0]
        raw = make(rng, target.stored, target.name)
        origin = make.__name__.lstrip("_")
        cases.append(Case(len(cases), target, media_type, raw, origin))
    return cases


def _encode(patch: Any) -> bytes:
    return json.dumps(patch).encode()


def _paths(obj: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> Iterator[tuple[Any, ...]]:
    """Every member and element of ``obj`` below the root, by path."""
    if depth > 8:
        return
    items: Any = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for key, value in items:
        path = (*prefix, key)
        yield path
        yield from _paths(value, path, depth + 1)


def _token(rng: random.Random, key: Any) -> str:
    if isinstance(key, int):
        return str(key)
    text = str(key)
    roll = rng.random()
    if roll < 0.05:
        return text  # unescaped: a "/" in a key reads as a path step
    if roll < 0.07:
        return text.replace("~", "~2")
    return text.replace("~", "~0").replace("/", "~1")


def _pointer(rng: random.Random, path: tuple[Any, ...]) -> str:
    return "".join("/" + _token(rng, step) for step in path)


def _value(rng: random.Random, obj: Any, paths: list[tuple[Any, ...]]) -> Any:
    if paths and rng.random() < 0.2:
        # A value of another field: a type change where it lands.
        return copy.deepcopy(value_at(obj, rng.choice(paths)))
    return copy.deepcopy(rng.choice(VALUES))


def _location(rng: random.Random, obj: Any, paths: list[tuple[Any, ...]]) -> str:
    """An existing path, a new member beside one, or an index of a list."""
    path = rng.choice(paths)
    parent = value_at(obj, path[:-1]) if path[:-1] else obj
    roll = rng.random()
    if isinstance(parent, list) and roll < 0.5:
        index = rng.choice(["-", str(len(parent)), str(len(parent) + 1), "01", "-1", "+0", "0"])
        return _pointer(rng, path[:-1]) + "/" + index
    if isinstance(parent, dict) and roll < 0.5:
        return _pointer(rng, path[:-1]) + "/" + _token(rng, rng.choice(KEYS))
    if roll < 0.55:
        return _pointer(rng, path) + "/" + _token(rng, rng.choice(KEYS)) + "/deep"
    return _pointer(rng, path)


def _json_patch(rng: random.Random, obj: Any, target: str) -> bytes:
    paths = list(_paths(obj))
    ops: list[dict[str, Any]] = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 4])):
        kind = rng.choice(["add"] * 4 + ["replace"] * 3 + ["remove"] * 2 + ["copy", "move", "test"])
        op: dict[str, Any] = {"op": kind, "path": _location(rng, obj, paths)}
        if kind in ("copy", "move"):
            op["from"] = (
                _location(rng, obj, paths)
                if rng.random() < 0.2
                else _pointer(rng, rng.choice(paths))
            )
        if kind == "test":
            source = rng.choice(paths)
            op["path"] = _pointer(rng, source)
            op["value"] = (
                copy.deepcopy(value_at(obj, source))
                if rng.random() < 0.6
                else _value(rng, obj, paths)
            )
        elif kind in ("add", "replace") and rng.random() > 0.03:
            op["value"] = _value(rng, obj, paths)
        ops.append(op)
    return _encode(ops)


def _merge_patch(rng: random.Random, obj: Any, target: str) -> bytes:
    patch: dict[str, Any] = {}
    paths = [p for p in _paths(obj) if all(isinstance(step, str) for step in p)]
    for _ in range(rng.choice([1, 1, 2, 3])):
        path = rng.choice(paths)
        if rng.random() < 0.3:
            path = (*path[:-1], rng.choice(KEYS))
        node = patch
        for step in path[:-1]:
            child = node.get(step)
            if not isinstance(child, dict):
                child = node[step] = {}
            node = child
        node[path[-1]] = _value(rng, obj, paths)
    return _encode(patch)


# The fields the rules read, where most patches that matter land.
_READ = {
    "node": [("metadata", "labels"), ("metadata", "annotations"), ("metadata", "managedFields"),
             ("spec",), ("metadata", "finalizers")],
    "pod": [("metadata", "labels"), ("metadata", "annotations"), ("spec", "nodeName"),
            ("metadata", "ownerReferences")],
    "slice": [("spec", "driver"), ("spec", "nodeName"), ("spec", "pool"), ("spec", "nodeSelector"),
              ("spec", "allNodes"), ("spec", "perDeviceNodeSelection"), ("spec", "devices")],
    "claim-status": [("status", "devices"), ("status", "allocation"), ("metadata", "labels")],
    "taint-rule": [("spec", "deviceSelector"), ("spec", "taint"), ("metadata", "labels")],
}  # fmt: skip


def _read_fields_json(rng: random.Random, obj: Any, target: str) -> bytes:
    base = rng.choice(_READ[target])
    key = rng.choice(KEYS)
    ops: list[dict[str, Any]] = []
    current = value_at(obj, base)
    if isinstance(current, list) and current and rng.random() < 0.5:
        index = rng.randrange(len(current))
        inner = current[index]
        step = rng.choice(list(inner)) if isinstance(inner, dict) and inner else key
        where = _pointer(rng, (*base, index, step))
        ops.append(
            {"op": rng.choice(["add", "replace"]), "path": where, "value": rng.choice(VALUES)}
        )
    elif rng.random() < 0.3:
        ops.append({"op": "replace", "path": _pointer(rng, base), "value": _value(rng, obj, [])})
    else:
        ops.append({"op": "add", "path": _pointer(rng, (*base, key)), "value": rng.choice(VALUES)})
    if rng.random() < 0.3:
        ops.insert(0, {"op": "add", "path": _pointer(rng, ("metadata", "labels", DRIVER + "/a")),
                       "value": "1"})  # fmt: skip
    return _encode(ops)


def _read_fields_merge(rng: random.Random, obj: Any, target: str) -> bytes:
    base = rng.choice(_READ[target])
    patch: dict[str, Any] = {}
    node = patch
    for step in base[:-1]:
        node = node.setdefault(step, {})
    roll = rng.random()
    if roll < 0.5:
        node[base[-1]] = {rng.choice(KEYS): rng.choice(VALUES)}
    else:
        node[base[-1]] = _value(rng, obj, list(_paths(obj)))
    return _encode(patch)


def _duplicate_keys(rng: random.Random, obj: Any, target: str) -> bytes:
    key = json.dumps(rng.choice(KEYS))
    again = rng.choice([key, key.upper()])
    return ('{"metadata":{"labels":{' + f'{key}:"a",{again}:"b"' + "}}}").encode()


def _strategic(rng: random.Random, obj: Any, target: str) -> bytes:
    choices: list[Any] = [
        {"metadata": {"labels": {rng.choice(KEYS): rng.choice(["1", None])}}},
        {"metadata": {"$retainKeys": ["labels"]}},
        {"metadata": {"annotations": {"$patch": "replace", DRIVER + "/x": "1"}}},
        {"spec": {rng.choice(KEYS): rng.choice(VALUES)}},
        copy.deepcopy(obj),
    ]
    return _encode(rng.choice(choices))


# Bodies: a create (of a kind a driver creates) or an update of a target, with nulls where Go
# may store something else, beside the ones read here as Go reads them.
_CREATED = ("slice", "taint-rule")
_SET_BY_APISERVER = ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation")


def generate_bodies(
    rng: random.Random, targets: list[Target], count: int, first: int
) -> list[Case]:
    """``count`` JSON create and update bodies of ``targets`` with nulls (numbered from
    ``first``): random members, list items and new keys set to null, in every part of the
    object, labels, annotations and the fields the apiserver maintains among them; one in ten
    with no null at all."""
    cases = []
    for number in range(first, first + count):
        target = rng.choice(targets)
        body = copy.deepcopy(target.stored)
        creating = target.name in _CREATED and rng.random() < 0.5
        if creating:
            meta = body["metadata"]
            for key in _SET_BY_APISERVER:
                meta.pop(key, None)
            meta["name"] = f"oracle-body-{number}"
            meta["creationTimestamp"] = None  # client-go's JSON encoding of a new object
        if rng.random() < 0.9:
            for _ in range(rng.choice([1, 1, 2, 3])):
                _set_null(rng, body)
        method = "POST" if creating else "PUT"
        cases.append(Case(number, target, "application/json", _encode(body),
                          f"body-{'create' if creating else 'update'}", method=method))  # fmt: skip
    return cases


def _set_null(rng: random.Random, body: dict[str, Any]) -> None:
    roll, meta = rng.random(), body["metadata"]
    if roll < 0.25:
        name = rng.choice(["labels", "annotations"])
        if not isinstance(meta.get(name), dict):
            meta[name] = {}
        meta[name][rng.choice(KEYS) or "x"] = None
        return
    if roll < 0.35:
        meta[rng.choice(_SET_BY_APISERVER)] = None
        return
    # Anywhere but the object's own metadata as a whole (a body without one is refused alike).
    paths = [p for p in _paths(body) if p != ("metadata",)
             and (p[:1] != ("metadata",) or rng.random() < 0.3)]  # fmt: skip
    path = rng.choice(paths)
    parent = value_at(body, path[:-1]) if path[:-1] else body
    if isinstance(parent, dict) and rng.random() < 0.3:
        parent[rng.choice(KEYS)] = None  # a member the object did not have
    else:
        parent[path[-1]] = None


# --- the gatekeeper's side ----------------------------------------------------------------------


def judge(case: Case, code: int, served: Any) -> Verdict:
    """The gatekeeper's prediction and decision for ``case``, against the apiserver's answer."""
    target = case.target
    try:
        sent = decode_json(case.raw)
    except Refusal:
        return Verdict(case, code, served, "refused-parse")
    current = None if case.method == "POST" else target.stored
    info = parse_request(case.method, case.path)
    screened = ENGINE.screen(target.identity, info)
    assert isinstance(screened, Plan), screened
    plan = ENGINE.accept(screened, case.media_type, sent)
    assert isinstance(plan, Plan), plan
    if plan.fetch is None and case.method == "PUT":
        current = None  # an update decided without a read
    stored = predict(plan, copy.deepcopy(sent), current)
    answer = served if isinstance(served, dict) else {"kind": "Status", "code": code}
    outcome = decide(case.path, sent, current, case.media_type, method=case.method,
                     identity=target.identity, answer=answer, code=code or 503)  # fmt: skip
    if isinstance(stored, Decision):
        assert not outcome.asked and not outcome.decision.allowed, case
        return Verdict(case, code, served, "refused", outcome.decision)
    if stored is None:
        # Nothing predicted: refused on the stored object alone (not the caller's).
        assert not outcome.asked and not outcome.decision.allowed, case
        return Verdict(case, code, served, "refused", outcome.decision)
    if stored.preview is not None:
        assert outcome.asked, case  # decided on exactly the apiserver's answer
        return Verdict(case, code, served, "dry-run", outcome.decision, stored.local)
    assert not outcome.asked, case
    verdict = Verdict(case, code, served, "local", outcome.decision, stored.local)
    if code in (200, 201) and stored.local is not None:
        verdict.divergence = (
            _read_divergence(plan, stored.local, served)
            if case.method == "PATCH"
            else _body_divergence(stored.local, served)
        )
    return verdict


def _body_divergence(local: Any, served: Any, path: tuple[Any, ...] = ()) -> str | None:
    """The first place where a body decided as read here says something other than what the
    apiserver stores (every value it holds, outside the fields the apiserver maintains: what
    the apiserver adds, a default, is not something the body said)."""
    if path in MAINTAINED:
        return None
    if isinstance(local, dict) and isinstance(served, dict):
        for key, value in local.items():
            if key not in served and value is not None:
                return ".".join(map(str, (*path, key)))
            found = _body_divergence(value, served.get(key), (*path, key))
            if found:
                return found
        return None
    if isinstance(local, list) and isinstance(served, list) and len(local) == len(served):
        for index, (mine, theirs) in enumerate(zip(local, served, strict=True)):
            found = _body_divergence(mine, theirs, (*path, index))
            if found:
                return found
        return None
    if local is None and served is None:
        return None
    return ".".join(map(str, path)) if local != served else None


def _read_divergence(plan: Plan, local: dict[str, Any], served: dict[str, Any]) -> str | None:
    """The first field a rule reads where the local result is not what the apiserver stores."""
    for path in (("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")):
        if get_field(local, path) != get_field(served, path):
            return ".".join(path)
    rule, version = plan.kind.rule, plan.version
    if rule is KindRule.NODE_LOCAL:
        read = [*version.paths.values(), *version.forbidden, ("metadata", "ownerReferences")]
        if version.node_selector is not None:
            read.append(version.node_selector)
        for path in read:
            if get_field(local, path) != get_field(served, path):
                return ".".join(path)
        return None
    if rule is KindRule.ALLOCATED_TO_DRIVER:
        assert version.allocation is not None
        return status_change_violation(version.allocation, served, local, plan.driver)
    if rule in (KindRule.OWN_NODE, KindRule.OWN_POD):
        problem = forbidden_change(served, local, version.may_change)
        return problem.message if problem else None
    return f"rule {rule.value} decided on a local result"


# --- the apiserver's side -----------------------------------------------------------------------


async def send_all(
    url: str,
    context: ssl.SSLContext,
    cases: list[Case],
    judged: Callable[[Case, int, Any], None],
    concurrency: int = 16,
) -> None:
    """Each case as a dry run, ``concurrency`` at a time; ``judged`` is called with each answer
    as it arrives (the gatekeeper's side runs while the apiserver works on the next ones)."""
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(case: Case) -> None:
            headers = {"Content-Type": case.media_type, "Accept": "application/json"}
            async with gate:
                try:
                    async with session.request(
                        case.method, f"{url}{case.path}?dryRun=All", data=case.raw,
                        headers=headers,
                    ) as answer:  # fmt: skip
                        text = await answer.read()
                        code, served = answer.status, json.loads(text) if text else None
                except aiohttp.ServerDisconnectedError:
                    code, served = 0, None  # the apiserver closed the connection (a panic)
            judged(case, code, served)

        await asyncio.gather(*(one(case) for case in cases))


@dataclass
class Tally:
    """Counts for the closing note: the patches', and the bodies' apart."""

    cases: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    by_origin: Counter[str] = field(default_factory=Counter)
    refused_rules: Counter[str] = field(default_factory=Counter)
    local_equal: int = 0
    local_read_divergent_refused: int = 0
    compat: Counter[str] = field(default_factory=Counter)
    """Refused by the gatekeeper, stored by the apiserver: by rule."""
    bodies: Counter[str] = field(default_factory=Counter)
    """The create and update bodies' outcomes (method, gatekeeper/apiserver)."""

    def add(self, verdict: Verdict) -> None:
        self.cases += 1
        self.by_origin[verdict.case.origin] += 1
        served_ok = verdict.code in (200, 201)
        outcome = f"{verdict.prediction}/{'stored' if served_ok else verdict.code}"
        if verdict.case.method != "PATCH":
            self.bodies[f"{verdict.case.method} {outcome}"] += 1
            return
        self.outcomes[outcome] += 1
        decision = verdict.decision
        if verdict.prediction == "refused" and decision is not None and decision.rule:
            self.refused_rules[decision.rule.value] += 1
            if served_ok:
                self.compat[decision.rule.value] += 1
        if verdict.prediction == "local" and served_ok:
            if verdict.divergence is None:
                self.local_equal += 1
            elif decision is not None and not decision.allowed:
                self.local_read_divergent_refused += 1

    def report(self, seed: int) -> str:
        lines = [
            f"patch oracle: seed {seed}, {self.cases} cases",
            "generators: " + _counts(self.by_origin),
            "patches (gatekeeper/apiserver): " + _counts(self.outcomes),
            "patches refused by rule: " + _counts(self.refused_rules),
            f"patches decided locally and stored: {self.local_equal} with every read field "
            f"equal, {self.local_read_divergent_refused} diverging in a read field (all refused)",
            "patches refused here, stored by the apiserver (by rule): " + _counts(self.compat),
            "bodies (method gatekeeper/apiserver): " + _counts(self.bodies),
        ]
        return "\n".join(lines)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{key} {value}" for key, value in sorted(counter.items())) or "none"
