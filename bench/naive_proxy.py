"""A naive aiohttp pass-through (no checks at all), in its own process: the floor of the stack.

    python -m bench.naive_proxy --upstream URL --ca F --token T (--port P --cert F --key F
        --client-ca F | --socket PATH)

Same listener shape as the gatekeeper (mTLS or a Unix socket), same upstream session shape
(one keep-alive pool, node token added), the answer streamed back as it arrives, and the same
event loop (uvloop when the gatekeeper would use it; ``--asyncio`` for asyncio's own).
"""

from __future__ import annotations

import argparse
import asyncio
import ssl

import aiohttp
from aiohttp import web

from bench.fixtures import serve_tls
from gatekeeper.server.runtime import loop_factory

__all__ = ["main"]

_FORWARDED = ("Accept", "Content-Type", "User-Agent")
_SESSION = web.AppKey("session", aiohttp.ClientSession)


def build_app(upstream: str, ca: str, token: str) -> web.Application:
    app = web.Application(client_max_size=0)

    async def start(app: web.Application) -> None:
        context = ssl.create_default_context(cafile=ca)
        app[_SESSION] = aiohttp.ClientSession(
            base_url=upstream, connector=aiohttp.TCPConnector(ssl=context, limit=100)
        )

    async def stop(app: web.Application) -> None:
        await app[_SESSION].close()

    async def handle(request: web.Request) -> web.StreamResponse:
        headers = {k: request.headers[k] for k in _FORWARDED if k in request.headers}
        headers["Authorization"] = f"Bearer {token}"
        body = await request.read() if request.can_read_body else None
        session = request.app[_SESSION]
        async with session.request(
            request.method, request.raw_path, headers=headers, data=body, allow_redirects=False
        ) as upstream_response:
            response = web.StreamResponse(
                status=upstream_response.status,
                headers={"Content-Type": upstream_response.headers.get("Content-Type", "")},
            )
            await response.prepare(request)
            async for chunk in upstream_response.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--port", type=int)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--client-ca")
    parser.add_argument("--socket")
    parser.add_argument("--asyncio", action="store_true", help="asyncio's loop, not uvloop")
    args = parser.parse_args()
    factory = None if args.asyncio else loop_factory()
    loop = factory() if factory is not None else asyncio.new_event_loop()
    app = build_app(args.upstream, args.ca, args.token)
    if args.socket:
        web.run_app(
            app, path=args.socket, access_log=None, print=None, shutdown_timeout=1, loop=loop
        )
        return
    serve_tls(app, args.port, args.cert, args.key, client_ca=args.client_ca, loop=loop)


if __name__ == "__main__":
    main()
