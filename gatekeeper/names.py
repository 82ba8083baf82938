"""Kubernetes name rules shared by flags, the policy, certificates, paths and selectors."""

from __future__ import annotations

import re

__all__ = [
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "is_dns_label",
    "is_dns_subdomain",
    "is_driver_name",
    "is_signer_name",
]

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""RFC 1123 subdomain (use with ``fullmatch``); at most 253 characters."""
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
"""RFC 1123 label (use with ``fullmatch``): a namespace name; at most 63 characters."""


def is_dns_label(name: str) -> bool:
    return len(name) <= 63 and DNS_LABEL.fullmatch(name) is not None


def is_dns_subdomain(name: str) -> bool:
    return len(name) <= 253 and DNS_SUBDOMAIN.fullmatch(name) is not None


def is_driver_name(name: str) -> bool:
    """A DRA driver name: a DNS subdomain of at most 63 characters (resource.k8s.io validation).

    It is also safe as a file name (no ``/``, no ``..``): socket directories are named by it.
    """
    return len(name) <= 63 and is_dns_subdomain(name)


def is_signer_name(name: str) -> bool:
    """A CertificateSigningRequest's ``signerName`` as the apiserver accepts it
    (``ValidateSignerName``): ``DOMAIN/PATH``, a domain of two labels or more, a path of DNS
    subdomains joined by dots; not a ``kubernetes.io`` signer (those are the cluster's own)."""
    domain, slash, path = name.partition("/")
    if not slash or "/" in path or len(domain) > 253 or len(path) > 253 + 63 + 1:
        return False
    labels = domain.split(".")
    if len(labels) < 2 or not all(is_dns_label(label) for label in labels):
        return False
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return False
    return all(is_dns_subdomain(part) for part in path.split("."))
