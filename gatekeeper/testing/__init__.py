"""Test helpers that ship with the gatekeeper. The harnesses that start a gatekeeper are in
:mod:`gatekeeper.testing.harness`; the embedded API server, and the objects to seed it with, in
:mod:`gatekeeper.apiserver`."""

__all__: list[str] = []
