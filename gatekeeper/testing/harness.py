"""A gatekeeper under test: started in front of the embedded API server and reached as a driver
would (Unix socket, mTLS, kubectl, raw bytes), or its engine driven offline.

Not imported by :mod:`gatekeeper.testing` itself: this module loads the gatekeeper, parsers
included, which the embedded API server must not share (it is the oracle the gatekeeper is
checked against).
"""

from gatekeeper.testing._engine import decide_offline, planned_fetch
from gatekeeper.testing._fixtures import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    PINNED,
    PKI,
    SLICES,
    Audited,
    RecordingSink,
    Running,
    raw_request,
    running_gatekeeper,
    seed,
    serve_config,
    slice_body,
)
from gatekeeper.testing._kubectl import (
    KUBECTL,
    SELECTOR,
    Kubectl,
    slice_manifest,
    write_kubeconfig,
)
from gatekeeper.testing._metrics import metric_samples, metric_value
from gatekeeper.testing._process import SERVE, free_port, run_process, token_kubeconfig, wait_ready
from gatekeeper.testing._upstream import (
    InterleavedUpstream,
    MockResponse,
    MockUpstream,
    UpstreamCall,
)

__all__ = [
    "GPU",
    "KUBECTL",
    "NIC",
    "NODE",
    "NODE_TOKEN",
    "PINNED",
    "PKI",
    "SELECTOR",
    "SERVE",
    "SLICES",
    "Audited",
    "InterleavedUpstream",
    "Kubectl",
    "MockResponse",
    "MockUpstream",
    "RecordingSink",
    "Running",
    "UpstreamCall",
    "decide_offline",
    "free_port",
    "metric_samples",
    "metric_value",
    "planned_fetch",
    "raw_request",
    "run_process",
    "running_gatekeeper",
    "seed",
    "serve_config",
    "slice_body",
    "slice_manifest",
    "token_kubeconfig",
    "wait_ready",
    "write_kubeconfig",
]
