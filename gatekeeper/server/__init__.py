"""The running gatekeeper: server, config, reload, health, metrics, expiry."""

__all__: list[str] = []
