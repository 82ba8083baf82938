"""The offline audit tools: read logs, summarize, check a policy against them, generate one."""

__all__: list[str] = []
