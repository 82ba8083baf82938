"""The gatekeeper's files read: policy files (with their includes) and policy test files, by
one strict YAML loader, checked by their JSON Schemas (the one definition of each format)."""

from gatekeeper.policyfile._files import (
    API_VERSION,
    DEFAULT_POLICY,
    PACKAGED,
    load_policy,
    packaged_policies,
    parse_policy,
)
from gatekeeper.policyfile._schema import POLICY, POLICY_TEST, Fault, faults, first_fault, schema
from gatekeeper.policyfile._yaml import (
    MAX_NODES,
    LineDict,
    LineList,
    YamlError,
    line_at,
    load_yaml,
    plain,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_POLICY",
    "MAX_NODES",
    "PACKAGED",
    "POLICY",
    "POLICY_TEST",
    "Fault",
    "LineDict",
    "LineList",
    "YamlError",
    "faults",
    "first_fault",
    "line_at",
    "load_policy",
    "load_yaml",
    "packaged_policies",
    "parse_policy",
    "plain",
    "schema",
]
