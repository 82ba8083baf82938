"""`python -m gatekeeper` runs the command line."""

from gatekeeper.cli.main import main

__all__: list[str] = []

raise SystemExit(main())
