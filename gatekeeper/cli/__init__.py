"""The command line: ``dra-gatekeeper`` and its subcommands."""

__all__: list[str] = []
