"""``serve`` loads only what serving needs: the embedded API server, ``dra-gatekeeper test``, the
offline audit tools and the test helpers stay out of the sidecar's memory (they are imported
only by their own subcommands)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.paths import REPO

# What ``dra-gatekeeper serve`` imports: the command line, then the server and its config.
PROBE = """
import json, sys
import gatekeeper.cli.main, gatekeeper.server.config, gatekeeper.server.server
print(json.dumps(sorted(sys.modules)))
"""
NOT_FOR_SERVE = (
    "gatekeeper.apiserver",
    "gatekeeper.policytest",
    "gatekeeper.audit.tools",
    "gatekeeper.testing",
    "gatekeeper.cli.demo",
    "gatekeeper.cli.certs",
    "gatekeeper.signer",
    # X.509 (8 MB): only a serve that requests its certificate (--token-cert-signer) loads it.
    "gatekeeper.codec.pki",
    "cryptography",
    # jsonschema is serve's too: it validates the policy file when serve loads it.
    "hypothesis",
    "pytest",
)


def test_serve_loads_none_of_the_other_subcommands() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, check=True
    )
    loaded = json.loads(result.stdout)
    assert "gatekeeper.server.server" in loaded
    found = [
        name for name in loaded if any(name == m or name.startswith(m + ".") for m in NOT_FOR_SERVE)
    ]
    assert found == []
