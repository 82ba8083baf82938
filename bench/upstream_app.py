"""A fixed-answer HTTPS upstream in its own process: fast, no store, no checks.

    python -m bench.upstream_app --port P --cert F --key F --workdir DIR [--list-count N]
        [--big-mb M]

- GET  .../resourceslices/NAME          the stored slice NAME (owned by the bench driver/node)
- POST .../resourceslices                201, the request body echoed
- PUT  .../resourceslices/NAME          200, the request body echoed
  (a protobuf body: echoed in protobuf when ``Accept`` prefers it, as client-go asks; else, as
  the gatekeeper's ``dryRun=All`` asks, the JSON of the slice it encodes, as the apiserver
  answers: ``item_slice`` of the envelope's name, without resourceVersion for a create)
- GET  .../resourceslices?...            a list of ``--list-count`` slices (~2 KB each);
                                         with ``labelSelector=bench=big`` a ``--big-mb`` MB list
                                         (a file, sent with sendfile)
- GET  ...?watch=true                    a watch held open; events only on /bench/emit
- POST /bench/emit                       one MODIFIED event to every open watch, stamped with
                                         ``time.monotonic_ns()`` (system-wide on Linux)
- GET  /bench/watches                    how many watches are open

Also the throughput upstream when nginx is not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from aiohttp import web

from bench.fixtures import NODE, PROTOBUF, SLICES, item_slice, list_document, serve_tls
from gatekeeper.codec.kubeproto import read_envelope
from gatekeeper.server.runtime import loop_factory

__all__ = ["build_app", "main"]

_JSON = "application/json"
_WATCHES = web.AppKey("watches", set)
_BIG_SLICE = 1930  # bytes per slice in a list, roughly


def build_app(list_count: int, big_file: Path | None) -> web.Application:
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app[_WATCHES] = set()
    one_cache: dict[str, bytes] = {}
    listing = list_document(list_count)

    def one(name: str) -> bytes:
        if name not in one_cache:
            if len(one_cache) > 1000:
                one_cache.clear()
            one_cache[name] = json.dumps(item_slice(name)).encode()
        return one_cache[name]

    async def collection(request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            if request.content_type == PROTOBUF:
                return await _protobuf_write(request, 201)
            return web.Response(status=201, body=await request.read(), content_type=_JSON)
        if request.query.get("watch") in ("true", "1"):
            return await _watch(request)
        if big_file is not None and request.query.get("labelSelector") == "bench=big":
            return web.FileResponse(big_file, headers={"Content-Type": _JSON})
        return web.Response(body=listing, content_type=_JSON)

    async def item(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if request.method == "PUT":
            if request.content_type == PROTOBUF:
                return await _protobuf_write(request, 200)
            return web.Response(body=await request.read(), content_type=_JSON)
        return web.Response(body=one(name), content_type=_JSON)

    async def emit(request: web.Request) -> web.Response:
        watches: set[web.StreamResponse] = request.app[_WATCHES]
        obj = item_slice()
        obj["metadata"]["annotations"] = {"bench/sent": "%d"}
        template = json.dumps({"type": "MODIFIED", "object": obj}) + "\n"
        sent = 0
        for response in list(watches):
            line = (template % time.monotonic_ns()).encode()
            try:
                await response.write(line)
                sent += 1
            except (ConnectionError, RuntimeError):
                watches.discard(response)
        return web.json_response({"sent": sent})

    async def count(request: web.Request) -> web.Response:
        return web.json_response({"watches": len(request.app[_WATCHES])})

    app.router.add_route("*", SLICES, collection)
    app.router.add_route("*", SLICES + "/{name}", item)
    app.router.add_post("/bench/emit", emit)
    app.router.add_get("/bench/watches", count)
    return app


async def _protobuf_write(request: web.Request, status: int) -> web.Response:
    """A protobuf create (201) or update (200): the bytes echoed when the client prefers
    protobuf, else the JSON of the slice they encode (what the gatekeeper's dry run reads)."""
    raw = await request.read()
    preferred = request.headers.get("Accept", "").split(",")[0].split(";")[0].strip()
    if preferred == PROTOBUF:
        return web.Response(status=status, body=raw, content_type=PROTOBUF)
    obj = item_slice(read_envelope(raw).name)
    if request.method == "POST":  # the apiserver's create: generation 1, no version on a dry run
        obj["metadata"]["generation"] = 1
        del obj["metadata"]["resourceVersion"]
    return web.Response(status=status, body=json.dumps(obj).encode(), content_type=_JSON)


async def _watch(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": _JSON})
    await response.prepare(request)
    watches = request.app[_WATCHES]
    watches.add(response)
    try:
        timeout = float(request.query.get("timeoutSeconds", "600"))
        await asyncio.sleep(min(timeout, 600))
    finally:
        watches.discard(response)
    return response


def _write_big(path: Path, megabytes: int) -> Path:
    if megabytes > 0 and not path.exists():
        path.write_bytes(list_document(max(1, megabytes * 1_000_000 // _BIG_SLICE)))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--list-count", type=int, default=500)
    parser.add_argument("--big-mb", type=int, default=0)
    args = parser.parse_args()
    big = _write_big(Path(args.workdir) / f"big-{args.big_mb}.json", args.big_mb)
    factory = loop_factory()
    loop = factory() if factory is not None else asyncio.new_event_loop()
    app = build_app(args.list_count, big if args.big_mb > 0 else None)
    print(f"upstream for node {NODE} on port {args.port}", flush=True)
    serve_tls(app, args.port, args.cert, args.key, loop=loop)


if __name__ == "__main__":
    main()
