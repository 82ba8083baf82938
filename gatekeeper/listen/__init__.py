"""Listening: sockets, TLS and its requested certificate, connection caps, and who is calling
(:mod:`gatekeeper.listen.identity`)."""

__all__: list[str] = []
