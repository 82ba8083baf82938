"""Codecs: bounded JSON, JSON paths and streams, YAML bodies, selectors, protobuf envelopes.

Pure functions on bytes and values; the layer just above the leaf values."""

__all__: list[str] = []
