"""The request as the gatekeeper reads it: its canonical info, headers, body."""

__all__: list[str] = []
