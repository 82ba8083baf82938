"""The differential run's script and its comparison: recorded calls (``tests/recordings``) made
fresh for one run, sent to two servers, and their answers put in a form that can be compared.

A call is a recording's method, path with query, request headers and body. Before it is sent
it is rewritten for the run (``Run.request``):

- names, drivers, the claims' namespace and the ``test`` label get the run's token, so that the
  real apiserver (shared with the rest of the tier) holds nothing else under them;
- every collection request (list, watch, deletecollection) also selects ``test=<token>``, so
  that it sees only this run's objects;
- uids and resourceVersions in bodies and queries are the server's own for the same object
  (learned from the recorded and the received answers, as the recording replay does);
- a continue token or a list's resourceVersion is taken from the server's own earlier answer
  where the recording used one (``FROM_EARLIER``).

Answers are then normalized (``Normalizer``): uids and object resourceVersions become labels
in order of first appearance (so "unchanged", "new" and "same as that one" are still compared),
a list's or bookmark's resourceVersion becomes ``<list rv>`` (checked to be no older than the
objects in it: the real apiserver's counter also moves for leases and other tests' writes),
timestamps become ``<time>`` (managedFields entries, which the apiserver orders by their time to
the second, are checked in that order and then compared in an order without it), generated name
suffixes ``<suffix>``, a Table's ``Age`` cell
``<age>``, and the numbers of other writes inside messages ``<rv>``. Bookmarks other than the
end of initial events are dropped (when one comes is timing). ``FOCUS`` narrows the two
discovery documents that list every group to the groups both servers serve.

``tests/realcluster/test_differential.py`` runs the script and holds the table of known
differences.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, quote

from tests.recorded import parse, recording

__all__ = [
    "FOCUS",
    "SEQUENCE",
    "Answer",
    "Difference",
    "Known",
    "Normalizer",
    "Run",
    "differences",
    "is_watch",
]

# The recordings sent, in order. Left out: calls that need an identity other than an admin
# (RBAC, the node authorizer: 9-11, 65-69, 71, 73, 75, 76, 100, 113, 142), RBAC objects and
# access reviews (62, 63, 128, 129, 131-134, 145-147), the v1alpha3 discovery this cluster does
# not serve (7), protobuf (28, 108, 206-211, 214-219, 221-224), the node's own Node object
# (197, 198: another cluster's node), tokens, pods and secrets (228-259), and what depends on when
# the real apiserver last compacted etcd or on how far its watch cache reaches back (47, 92, 93,
# 95, 105-107: the other tests of the tier write ResourceSlices at their own pace, so whether
# resourceVersion 1 or 100 is "too old" is not the same from run to run), and 109 (a DeviceClass
# the recorded session re-created out of band).
SEQUENCE: tuple[int, ...] = (
    *range(1, 7),
    8,
    *range(14, 28),
    *range(29, 47),
    48,
    *range(49, 62),
    64,
    70,
    72,
    74,
    77,
    *range(78, 92),
    94,
    96,
    97,
    98,
    99,
    *range(101, 105),
    *range(110, 113),
    *range(114, 128),
    130,
    *range(135, 142),
    143,
    144,
    *range(148, 197),
    *range(199, 206),
    212,
    213,
    220,
    225,
    226,
    227,
    *range(260, 263),
)

# Calls whose query names something only the server's own earlier answer holds.
FROM_EARLIER: dict[int, Callable[[Run], dict[str, str]]] = {
    # limit=1, then the continue token the first page gave.
    40: lambda run: {"continue": str(run.answers[39]["metadata"]["continue"])},
    # A watch from the resourceVersion of the list before it (recording 39's).
    44: lambda run: {"resourceVersion": str(run.answers[39]["metadata"]["resourceVersion"])},
}

_GROUPS = ("resource.k8s.io", "devmgmtproto.k8s.io")
# The parts of an answer compared where the whole would compare the clusters' configuration:
# the real apiserver serves every built-in group, the embedded server only the policy's.
FOCUS: dict[int, Callable[[Any], Any]] = {
    2: lambda body: {**body, "groups": [g for g in body["groups"] if g["name"] in _GROUPS]},
    8: lambda body: {
        **body,
        "items": [i for i in body["items"] if i["metadata"].get("name") in _GROUPS],
    },
}

_DROPPED_HEADERS = ("authorization", "host", "content-length")
_BARE_NAMES = ("gk-claim-1", "claim-1", "bad-slice", "bad-slice-2", "other-name")
_TEST_LABELS = ("dra-proxy", "dra-gatekeeper", "rec2", "rec3")
_COLLECTIONS = re.compile(r"^/apis/[^/]+/[^/]+/(namespaces/[^/]+/)?[a-z]+$")


def is_watch(path: str) -> bool:
    return "watch=true" in path.split("?", 1)[-1] or "watch=1" in path.split("?", 1)[-1]


@dataclass
class Answer:
    """What one server answered: status, Content-Type, and the body parsed (a watch: its
    events, in order)."""

    status: int
    content_type: str
    body: Any


@dataclass
class Run:
    """One server's side of the run: the run's token, and what that server has said so far."""

    token: str
    answers: dict[int, Any] = field(default_factory=dict)
    uids: dict[str, str] = field(default_factory=dict)
    rvs: dict[str, str] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return f"diff-{self.token}"

    @property
    def namespace(self) -> str:
        return f"diff-{self.token}"

    def rename(self, text: str) -> str:
        """The recording's names, drivers, namespace and test label, made this run's."""
        t = self.token
        text = text.replace("gpu.example.com", f"gpu-{t}.example.com")
        text = text.replace("nic.example.com", f"nic-{t}.example.com")
        text = re.sub(r"(?<![A-Za-z0-9.-])(rec2|rec3)-", rf"{self.prefix}-\1-", text)
        for name in _BARE_NAMES:
            text = re.sub(
                rf"(?<![A-Za-z0-9.$-]){re.escape(name)}(?![A-Za-z0-9.-])",
                f"{self.prefix}-{name}",
                text,
            )
        text = text.replace("/namespaces/default/", f"/namespaces/{self.namespace}/")
        text = re.sub(r'("namespace"\s*:\s*)"default"', rf'\1"{self.namespace}"', text)
        labels = "|".join(_TEST_LABELS)
        text = re.sub(rf'("test"\s*:\s*)"({labels})"', rf'\1"{self.prefix}"', text)
        return re.sub(rf"test%3D({labels})\b", f"test%3D{self.prefix}", text)

    def _map_ids(self, text: str) -> str:
        def uid(match: re.Match[str]) -> str:
            return match.group(1) + self.uids.get(match.group(2), match.group(2)) + '"'

        def rv(match: re.Match[str]) -> str:
            return match.group(1) + self.rvs.get(match.group(2), match.group(2)) + '"'

        text = re.sub(r'("uid"\s*:\s*")([0-9a-f-]{36})"', uid, text)
        return re.sub(r'("resourceVersion"\s*:\s*")(\d+)"', rv, text)

    def request(self, n: int) -> tuple[str, str, dict[str, str], bytes | None]:
        """Method, path with query, headers and body of recording ``n`` for this run."""
        rec = recording(n)
        path, _, query = rec["path"].partition("?")
        path = self.rename(path)
        params = [(k, self.rename(quote(v, safe=""))) for k, v in parse_qsl(query)]
        overrides = FROM_EARLIER[n](self) if n in FROM_EARLIER else {}
        params = [(k, quote(overrides[k], safe="") if k in overrides else v) for k, v in params]
        params = [(k, self.rvs.get(v, v) if k == "resourceVersion" else v) for k, v in params]
        if _COLLECTIONS.match(path) and not path.startswith("/apis/devmgmtproto"):
            # Only this run's objects: the tier's other tests share the real apiserver.
            selector = f"test%3D{self.prefix}"
            found = [v for k, v in params if k == "labelSelector"]
            if found and selector not in found[0]:
                params = [
                    (k, f"{selector}%2C{v}" if k == "labelSelector" else v) for k, v in params
                ]
            elif not found:
                params.append(("labelSelector", selector))
        if params:
            path += "?" + "&".join(f"{k}={v}" for k, v in params)
        headers = {
            k: v for k, v in rec["request_headers"].items() if k.lower() not in _DROPPED_HEADERS
        }
        raw = rec.get("request_body")
        if raw is None:
            return rec["method"], path, headers, None
        text = raw if isinstance(raw, str) else json.dumps(raw)
        return rec["method"], path, headers, self._map_ids(self.rename(text)).encode()

    def learn(self, n: int, answer: Answer) -> None:
        """Keep the answer; pair the recording's uids and resourceVersions with this server's."""
        self.answers[n] = answer.body
        expected = recording(n)
        recorded: Any = expected.get("watch_events") or expected.get("response_body")
        if isinstance(recorded, str):
            try:
                recorded = (
                    [json.loads(line) for line in recorded.splitlines() if line.strip()]
                    if is_watch(expected["path"])
                    else parse(recorded)
                )
            except ValueError:
                return
        for theirs, ours in _objects_in_parallel(recorded, answer.body):
            tmeta, ometa = theirs.get("metadata") or {}, ours.get("metadata") or {}
            if isinstance(tmeta.get("uid"), str) and isinstance(ometa.get("uid"), str):
                self.uids.setdefault(tmeta["uid"], ometa["uid"])
            trv, orv = tmeta.get("resourceVersion"), ometa.get("resourceVersion")
            if isinstance(trv, str) and isinstance(orv, str) and "items" not in theirs:
                self.rvs.setdefault(trv, orv)


def _objects_in_parallel(theirs: Any, ours: Any) -> Iterator[tuple[dict[str, Any], Any]]:
    if isinstance(theirs, list) and isinstance(ours, list):
        for t, o in zip(theirs, ours, strict=False):
            yield from _objects_in_parallel(t, o)
    elif isinstance(theirs, dict) and isinstance(ours, dict):
        if "type" in theirs and "object" in theirs:
            yield from _objects_in_parallel(theirs["object"], ours.get("object"))
            return
        if theirs.get("kind") == "Status":
            return
        yield theirs, ours
        if isinstance(theirs.get("items"), list):
            yield from _objects_in_parallel(theirs["items"], ours.get("items"))


# --- normalizing ---------------------------------------------------------------------------------

_TIME_KEYS = ("creationTimestamp", "deletionTimestamp", "time")
_MESSAGE_RVS = (
    (re.compile(r"current: \d+"), "current: <rv>"),
    (
        re.compile(r"too old resource version: (\d+) \(\d+\)"),
        r"too old resource version: \1 (<rv>)",
    ),
)


class Normalizer:
    """Makes one server's answers comparable with the other's (see the module docstring).

    One per server, fed every answer of the run in order: labels are given in order of first
    appearance over the whole run."""

    def __init__(self) -> None:
        self.uids: dict[str, str] = {}
        self.rvs: dict[str, str] = {}
        self.generated: dict[str, str] = {}
        self.newest_object_rv = 0
        self.problems: list[str] = []
        self.call = 0
        self.one_object = False

    def answer(self, call: int, answer: Answer) -> Any:
        self.call = call
        # A Table of one object (a GET of a name) carries that object's resourceVersion.
        self.one_object = not _COLLECTIONS.match(recording(call)["path"].split("?", 1)[0])
        body = answer.body
        self._learn_generated(body)
        if isinstance(body, list):  # watch events
            return [self._event(e) for e in body if not self._plain_bookmark(e)]
        return self._value(body, "")

    @staticmethod
    def _plain_bookmark(event: Any) -> bool:
        """A bookmark other than the end of initial events: when one comes is timing."""
        if not isinstance(event, dict) or event.get("type") != "BOOKMARK":
            return False
        annotations = (event.get("object") or {}).get("metadata", {}).get("annotations") or {}
        return "k8s.io/initial-events-end" not in annotations

    def _event(self, event: Any) -> Any:
        if isinstance(event, dict) and event.get("type") == "BOOKMARK":
            obj = event.get("object") or {}
            meta = dict(obj.get("metadata") or {})
            meta["resourceVersion"] = self._list_rv(meta.get("resourceVersion"))
            return {"type": "BOOKMARK", "object": {**obj, "metadata": meta}}
        return self._value(event, "")

    def _learn_generated(self, value: Any) -> None:
        if isinstance(value, dict):
            meta = value.get("metadata")
            if isinstance(meta, dict):
                name, prefix = meta.get("name"), meta.get("generateName")
                generated = isinstance(name, str) and isinstance(prefix, str) and name != prefix
                if generated and str(name).startswith(str(prefix)):
                    self.generated.setdefault(str(name), f"{prefix}<suffix>")
            for item in value.values():
                self._learn_generated(item)
        elif isinstance(value, list):
            for item in value:
                self._learn_generated(item)

    def _list_rv(self, rv: Any) -> Any:
        if not isinstance(rv, str) or not rv.isdigit():
            return rv
        if int(rv) < self.newest_object_rv:
            self.problems.append(
                f"call {self.call}: a list or bookmark at {rv}, older than an object it has "
                f"answered before ({self.newest_object_rv})"
            )
        return "<list rv>"

    def _object_rv(self, rv: Any) -> Any:
        if not isinstance(rv, str) or not rv.isdigit():
            return rv
        self.newest_object_rv = max(self.newest_object_rv, int(rv))
        return self.rvs.setdefault(rv, f"rv#{len(self.rvs) + 1}")

    def _string(self, text: str) -> str:
        for name, shown in self.generated.items():
            text = text.replace(name, shown)
        # A precondition's 409 names the stored object's resourceVersion: its label.
        text = re.sub(
            r"ResourceVersion in record \((\d+)\)",
            lambda m: f"ResourceVersion in record ({self.rvs.get(m.group(1), '<rv>')})",
            text,
        )
        for pattern, replacement in _MESSAGE_RVS:
            text = pattern.sub(replacement, text)
        return text

    def _value(self, value: Any, key: str) -> Any:
        if isinstance(value, list):
            return [self._value(v, key) for v in value]
        if isinstance(value, str):
            return self._string(value)
        if not isinstance(value, dict):
            return value
        is_list = "items" in value or (value.get("kind") == "Table" and not self.one_object)
        out: dict[str, Any] = {}
        for k in sorted(value):
            v = value[k]
            if k == "metadata" and is_list and isinstance(v, dict):
                out[k] = self._list_meta(v)
            elif k == "uid" and isinstance(v, str):
                out[k] = self.uids.setdefault(v, f"uid#{len(self.uids) + 1}")
            elif k == "resourceVersion" and key == "metadata":
                out[k] = self._object_rv(v)
            elif k in _TIME_KEYS and isinstance(v, str):
                out[k] = "<time>"
            elif k == "managedFields" and key == "metadata" and isinstance(v, list):
                out[k] = self._value(self._managed_fields(v), k)
            else:
                out[k] = self._value(v, k)
        if value.get("kind") == "Table":
            out["rows"] = self._table_rows(out.get("rows"), value.get("columnDefinitions"))
        return out

    def _managed_fields(self, entries: list[Any]) -> list[Any]:
        """The entries in an order that does not depend on when each write was made.

        The apiserver sorts them by operation, then by time to the second, manager, apiVersion
        and subresource (``sortEncodedManagedFields``, k8s.io/apimachinery's managedfields): two
        managers' writes fall in one second or in two as the machine's load has it, and come
        out in either order. Each server's order is checked on its own times; the two are
        compared in that order without the times."""
        if not all(isinstance(entry, dict) for entry in entries):
            return entries
        timed = [_managed_order(entry, timed=True) for entry in entries]
        if timed != sorted(timed):
            self.problems.append(
                f"call {self.call}: managedFields are not in the apiserver's order: "
                + ", ".join(f"{e.get('manager')}/{e.get('operation')}" for e in entries)
            )
        return sorted(entries, key=lambda entry: _managed_order(entry, timed=False))

    def _list_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        out = dict(meta)
        if "resourceVersion" in out:
            out["resourceVersion"] = self._list_rv(out["resourceVersion"])
        token = out.get("continue")
        if isinstance(token, str) and token:
            decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            decoded["rv"] = "<list rv>"
            decoded["start"] = self._string(str(decoded.get("start")))
            out["continue"] = decoded
        return out

    @staticmethod
    def _table_rows(rows: Any, columns: Any) -> Any:
        if not isinstance(rows, list) or not isinstance(columns, list):
            return rows
        names = [c.get("name") for c in columns]
        if "Age" not in names:
            return rows
        age = names.index("Age")
        for row in rows:
            cells = row.get("cells")
            if isinstance(cells, list) and len(cells) > age:
                cells[age] = "<age>"
        return rows


def _managed_order(entry: dict[str, Any], *, timed: bool) -> tuple[Any, ...]:
    """An entry's place among managedFields as the apiserver sorts them; without its time
    (``timed`` False), its place among entries made in one second."""
    when = entry.get("time")
    seconds = 0
    if timed and isinstance(when, str):
        seconds = int(datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp())
    fields = ("manager", "apiVersion", "subresource")
    return (str(entry.get("operation", "")), seconds, *(str(entry.get(f, "")) for f in fields))


# --- comparing -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """Where two normalized answers differ: ``status``, ``content-type`` or ``body/<path>``."""

    call: int
    where: str
    embedded: Any
    real: Any

    def __str__(self) -> str:
        e, r = json.dumps(self.embedded)[:300], json.dumps(self.real)[:300]
        return f"{recording(self.call)['call']} ({self.call}) {self.where}: embedded {e}, real {r}"


@dataclass(frozen=True)
class Known:
    """A difference the embedded server keeps, on purpose: the calls it shows in, the places
    (``fnmatch`` patterns over ``Difference.where``), and why."""

    calls: tuple[int, ...]
    where: tuple[str, ...]
    reason: str

    def explains(self, difference: Difference) -> bool:
        return difference.call in self.calls and any(
            fnmatch.fnmatchcase(difference.where, pattern) for pattern in self.where
        )


_ABSENT = "<absent>"


def _diff(a: Any, b: Any, where: str) -> Iterator[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            yield from _diff(a.get(key, _ABSENT), b.get(key, _ABSENT), f"{where}/{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _diff(x, y, f"{where}/{i}")
    elif a != b:
        yield where, a, b


def differences(
    n: int, embedded: Any, real: Any, eanswer: Answer, ranswer: Answer
) -> list[Difference]:
    """Every place where the two normalized answers to call ``n`` differ."""
    found = []
    if eanswer.status != ranswer.status:
        found.append(Difference(n, "status", eanswer.status, ranswer.status))
    etype, rtype = (a.content_type.replace(" ", "").lower() for a in (eanswer, ranswer))
    if etype != rtype:
        found.append(Difference(n, "content-type", etype, rtype))
    found += [Difference(n, w, e, r) for w, e, r in _diff(embedded, real, "body")]
    return found
