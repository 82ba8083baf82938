"""How the gatekeeper reaches the kube-apiserver: kubeconfig or in-cluster credentials.

Loads and checks the upstream configuration before anything listens (DESIGN.md §4.1), builds
the TLS context, and supplies the bearer token, re-reading a rotated token file.
"""

from gatekeeper.upstream.kubeconfig._config import UpstreamConfig
from gatekeeper.upstream.kubeconfig._load import (
    IN_CLUSTER_ROOT,
    load_in_cluster,
    load_kubeconfig,
    resolve_upstream,
)
from gatekeeper.upstream.kubeconfig._tls import build_ssl_context
from gatekeeper.upstream.kubeconfig._token import TokenSource

__all__ = [
    "IN_CLUSTER_ROOT",
    "TokenSource",
    "UpstreamConfig",
    "build_ssl_context",
    "load_in_cluster",
    "load_kubeconfig",
    "resolve_upstream",
]
