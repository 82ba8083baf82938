"""Listening: sockets, TLS, connection caps, and who is calling (identity per connection)."""

__all__: list[str] = []
