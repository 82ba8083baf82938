"""The proxy pipeline: composed once (pipeline), its steps (flow, filtering, limits, drain)."""

__all__: list[str] = []
