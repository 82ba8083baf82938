"""The differential run: one scripted sequence of recorded calls (``differential.SEQUENCE``)
sent to the embedded API server and to the real kube-apiserver 1.36 of this tier, as an
admin, on names and a namespace fresh for the run; status codes, Content-Types and bodies are
compared after ``differential.Normalizer``. Every difference is either fixed in the embedded
server or listed in ``KNOWN`` with its reason; a listed difference that no longer shows is an
error too, so the table says what is true today."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import operator
import os
import secrets
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import yarl

from gatekeeper.apiserver import APIServer, ServedKind
from gatekeeper.apiserver import _objects as objects_module
from gatekeeper.apiserver._json import deep
from gatekeeper.apiserver.store import object_key
from gatekeeper.cli.served import served_kinds
from gatekeeper.policyfile import load_policy
from tests.apiserver.test_recordings import REPLAY_KINDS
from tests.realcluster.cluster import ApiError, RealCluster
from tests.realcluster.conftest import DEFAULT_POLICY
from tests.realcluster.differential import (
    FOCUS,
    SEQUENCE,
    Answer,
    Difference,
    Known,
    Normalizer,
    Run,
    differences,
    is_watch,
)
from tests.recorded import parse, recording

TOKEN = "differential-token"
WATCH_BOUND = 20.0  # seconds: every watch of the script ends by its own timeoutSeconds

_CLAIM_CALLS = (*range(98, 144), *range(178, 194), 203, 212, 213, 260)
KNOWN: tuple[Known, ...] = (
    Known(
        (1,),
        ("body/buildDate", "body/gitCommit", "body/gitVersion", "body/goVersion"),
        "/version: the embedded server names its own build (major and minor are 1.36, as "
        "compared); the real one is built from the Go module here",
    ),
    Known(
        (20, 21, 137, 138),
        ("status", "body/*"),
        "per-kind validation (422 Invalid) is not implemented beyond names, immutable fields "
        "and _typed's rules: a ResourceSlice's driver name and node selection, a claim's "
        "status.devices entries that are not allocated, a change to status.allocation; the "
        "write is undone on the embedded side so that later answers compare",
    ),
    Known(
        (173,),
        ("status", "body/*"),
        "a ResourceSlice's pool name is immutable on the apiserver, but the policy's served "
        "kinds keep it mutable (RESOURCE_SLICES does not): the policy and kubectl tests change "
        "a pool to reach the gatekeeper's own check, which this 422 would pre-empt; undone on "
        "the embedded side",
    ),
    Known(
        (27,),
        ("body/spec/devices/*",),
        "no conversion between versions: a v1beta1 ResourceSlice wraps device fields in "
        "`basic` (recording 27)",
    ),
    Known(
        _CLAIM_CALLS,
        ("*/exactly/allocationMode", "*/exactly/count"),
        "no defaulting: the apiserver fills a claim request's allocationMode (ExactCount) and "
        "count (1)",
    ),
    Known(
        _CLAIM_CALLS,
        ("*/managedFields/*/fieldsV1/f:status/*",),
        "managedFields are computed without the type's schema (_managed): no '.' markers "
        "for structs and list items, lists are owned whole (no k:{...} keys), and an "
        "atomic struct (a NodeSelector) is split into its fields",
    ),
    Known(
        (59, 64, 70, 72, 77, 79, 80),
        ("*/managedFields",),
        "managedFields sent in an update body (recording 59 sends the recorded ones, manager "
        "'unknown') are taken by the apiserver; the embedded server ignores them (_objects)",
    ),
    Known(
        (46, 188, 189),
        ("body/*/object/spec", "body/*/object/status"),
        "a bookmark's object is the Go type's zero value (an empty spec, and status {} for a "
        "claim); the embedded server sends kind, apiVersion and metadata only, all a client "
        "reads",
    ),
)


def _kinds_as_served_by(real_cluster: RealCluster) -> tuple[ServedKind, ...]:
    """The policy's kinds and the recording replay's extra ones, each in the versions the real
    apiserver serves (its discovery): the same API on both sides, so that the run compares
    behaviour, not configuration."""
    admin = real_cluster.admin
    served: set[tuple[str, str, str]] = set()
    for group, versions in (
        ("resource.k8s.io", ("v1", "v1beta2", "v1beta1", "v1alpha3")),
        ("devmgmtproto.k8s.io", ("v1alpha1",)),
        ("", ("v1",)),
    ):
        for version in versions:
            path = f"/apis/{group}/{version}" if group else f"/api/{version}"
            try:
                resources = admin.get(path)["resources"]
            except ApiError as error:  # a version this apiserver does not serve
                if error.code != 404:
                    raise
                continue
            served |= {(group, version, r["name"]) for r in resources}
    policy_kinds = served_kinds(load_policy(str(DEFAULT_POLICY)))
    taken = {(k.group, k.resource) for k in policy_kinds}
    kinds = []
    for kind in (*policy_kinds, *(k for k in REPLAY_KINDS if (k.group, k.resource) not in taken)):
        versions = tuple(v for v in kind.versions if (kind.group, v, kind.resource) in served)
        if not versions:
            continue
        kinds.append(
            dataclasses.replace(
                kind,
                versions=versions,
                selectable_fields={
                    v: f for v, f in kind.selectable_fields.items() if v in versions
                },
                immutable_fields={v: f for v, f in kind.immutable_fields.items() if v in versions},
            )
        )
    return tuple(kinds)


async def _send(
    session: aiohttp.ClientSession, base: str, run: Run, n: int, auth: dict[str, str]
) -> Answer:
    method, path, headers, body = run.request(n)
    url = yarl.URL(base + path, encoded=True)
    async with session.request(method, url, headers={**headers, **auth}, data=body) as response:
        content_type = response.headers.get("Content-Type", "")
        if is_watch(path) and response.status == 200:
            events = []
            async with asyncio.timeout(WATCH_BOUND):
                while line := await response.content.readline():
                    events.append(parse(line.decode()))
            return Answer(response.status, content_type, events)
        text = await response.text()
    try:
        parsed: Any = parse(text) if text else None
    except ValueError:
        parsed = text
    return Answer(response.status, content_type, parsed)


def _compare(
    n: int, norms: dict[str, Normalizer], eanswer: Answer, ranswer: Answer
) -> list[Difference]:
    focus = FOCUS.get(n)
    if focus is not None and eanswer.status == ranswer.status == 200:
        eanswer = dataclasses.replace(eanswer, body=focus(eanswer.body))
        ranswer = dataclasses.replace(ranswer, body=focus(ranswer.body))
    embedded, real = norms["embedded"].answer(n, eanswer), norms["real"].answer(n, ranswer)
    return differences(n, embedded, real, eanswer, ranswer)


def _resource_of(server: APIServer, path: str) -> tuple[str, str] | None:
    """The (group, resource) a request path names, if the embedded server serves it."""
    parts = path.split("?", 1)[0].split("/")[1:]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if len(rest) >= 2 and rest[0] == "namespaces":
        rest = rest[2:]
    served = {(k.group, k.resource) for k in server.kinds}
    return (group, rest[0]) if rest and (group, rest[0]) in served else None


def _stored(server: APIServer, key: tuple[str, str]) -> dict[Any, Any]:
    # Copies of objects nesting up to 2,000 levels (recording 191) need a deeper stack.
    return {object_key(o): o for o in deep(server.objects, *key)}


def _undo(server: APIServer, key: tuple[str, str], before: dict[Any, Any], run: Run) -> None:
    """Put the embedded server's objects of ``key`` back as they were before a write the real
    apiserver refused (a known difference), so that it does not spill into every later
    answer; the run's resourceVersions follow the restored objects."""
    now = _stored(server, key)
    for okey in now.keys() - before.keys():
        server.store.delete(key, okey)
    for okey, old in before.items():
        if okey in now and deep(operator.ne, now[okey], old):
            restored = server.store.replace(key, deep(copy.deepcopy, old))
            old_rv, new_rv = (
                old["metadata"]["resourceVersion"],
                restored["metadata"]["resourceVersion"],
            )
            run.rvs = {r: (new_rv if ours == old_rv else ours) for r, ours in run.rvs.items()}


@dataclasses.dataclass
class Outcome:
    """What the run found: differences, normalizer problems, the real apiserver's status code
    per call, and the calls undone on the embedded side."""

    found: list[Difference]
    problems: list[str]
    statuses: dict[int, int]
    undone: list[int]


async def _differential(real_cluster: RealCluster) -> Outcome:
    token = secrets.token_hex(3)
    runs = {"embedded": Run(token), "real": Run(token)}
    norms = {side: Normalizer() for side in runs}
    admin = real_cluster.admin
    admin.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": runs["real"].namespace}},
    )
    server = APIServer(_kinds_as_served_by(real_cluster), token=TOKEN)
    await server.start()
    found: list[Difference] = []
    statuses: dict[int, int] = {}
    undone: list[int] = []
    real_ssl: ssl.SSLContext = admin.context
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with (
            aiohttp.ClientSession() as esession,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=real_ssl)) as rsession,
        ):
            for n in SEQUENCE:
                method, path = recording(n)["method"], runs["embedded"].request(n)[1]
                resource = _resource_of(server, path) if method != "GET" else None
                before = _stored(server, resource) if resource else {}
                if method == "POST":
                    # The real apiserver first: a name it generates is the embedded server's
                    # too, so that both list the same names in the same order.
                    ranswer = await _send(rsession, real_cluster.url, runs["real"], n, {})
                    with _generated_as(ranswer):
                        eanswer = await _send(esession, server.url, runs["embedded"], n, bearer)
                else:
                    eanswer, ranswer = await asyncio.gather(
                        _send(esession, server.url, runs["embedded"], n, bearer),
                        _send(rsession, real_cluster.url, runs["real"], n, {}),
                    )
                runs["real"].learn(n, ranswer)
                statuses[n] = ranswer.status
                saved = copy.deepcopy(norms["embedded"])
                found += deep(_compare, n, norms, eanswer, ranswer)
                if resource and eanswer.status < 300 <= ranswer.status:
                    _undo(server, resource, before, runs["embedded"])
                    undone.append(n)
                    norms["embedded"] = saved  # what it answered is not the run's state
                else:
                    runs["embedded"].learn(n, eanswer)
    finally:
        await server.close()
        admin.delete(
            f"/apis/resource.k8s.io/v1/resourceslices?labelSelector=test%3D{runs['real'].prefix}"
        )
        admin.delete(f"/api/v1/namespaces/{runs['real'].namespace}")
    problems = [f"{side}: {p}" for side, norm in norms.items() for p in norm.problems]
    return Outcome(found, problems, statuses, undone)


@contextlib.contextmanager
def _generated_as(real: Answer) -> Iterator[None]:
    """The embedded server generates the name the real apiserver generated for this create."""
    meta = real.body.get("metadata") if isinstance(real.body, dict) else None
    name = meta.get("name") if isinstance(meta, dict) and meta.get("generateName") else None
    original = objects_module.generate_name
    if name:
        objects_module.generate_name = lambda prefix: (
            name if name.startswith(prefix) else original(prefix)
        )
    try:
        yield
    finally:
        objects_module.generate_name = original


async def test_embedded_and_real_apiserver_answer_alike(real_cluster: RealCluster) -> None:
    outcome = await _differential(real_cluster)
    dump = os.environ.get("DRA_GATEKEEPER_DIFF_DUMP")
    if dump:  # every difference in full, to read when one is new
        found = [dataclasses.asdict(d) for d in outcome.found]
        Path(dump).write_text(json.dumps(found, indent=1))
    unexplained = [d for d in outcome.found if not any(k.explains(d) for k in KNOWN)]
    stale = [k.reason for k in KNOWN if not any(k.explains(d) for d in outcome.found)]
    assert not unexplained, "\n".join(map(str, unexplained))
    assert not stale, stale
    assert not outcome.problems
    # The run compared what it set out to: every call answered, the error cases included.
    assert list(outcome.statuses) == list(SEQUENCE)
    assert {200, 201, 400, 404, 405, 409, 415, 422, 504} <= set(outcome.statuses.values())
    assert outcome.undone == [20, 21, 137, 138, 173]  # the known 422s, nothing else


def _entry(manager: str, time: str, operation: str = "Update") -> dict[str, Any]:
    return {"manager": manager, "operation": operation, "apiVersion": "v1", "time": time,
            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {}}}  # fmt: skip


def test_managed_fields_compare_whatever_second_each_write_fell_in() -> None:
    """Two managers' writes one second apart on one server and in the same second on the
    other: the apiserver orders them by time first, so the answers differ only by the clock;
    an order no apiserver makes is still found."""
    call = SEQUENCE[0]
    apart = [_entry("b", "2026-12-07T10:00:01Z"), _entry("a", "2026-12-07T10:00:02Z")]
    together = [_entry("a", "2026-12-07T10:00:05Z"), _entry("b", "2026-12-07T10:00:05Z")]
    answers = []
    for entries in (apart, together):
        norm = Normalizer()
        body = {"kind": "Node", "metadata": {"name": "n", "managedFields": entries}}
        answers.append(norm.answer(call, Answer(200, "application/json", body)))
        assert norm.problems == []
    assert answers[0] == answers[1]
    norm = Normalizer()
    wrong = [_entry("b", "2026-12-07T10:00:05Z"), _entry("a", "2026-12-07T10:00:05Z")]
    norm.answer(call, Answer(200, "application/json", {"metadata": {"managedFields": wrong}}))
    assert norm.problems and "not in the apiserver's order" in norm.problems[0]
