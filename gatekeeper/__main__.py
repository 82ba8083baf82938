"""`python -m gatekeeper` runs the command line."""

from gatekeeper.cli import main

raise SystemExit(main())
