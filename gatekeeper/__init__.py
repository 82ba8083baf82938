"""dra-gatekeeper: a per-node authorization proxy between DRA drivers and the kube-apiserver."""

__all__ = ["__version__"]

__version__ = "0.1.0"
