"""Does a core/v1 ``NodeSelector`` (as plain JSON) select this node? Pure, fail-closed.

Semantics of k8s.io/component-helpers ``nodeaffinity``: terms are ORed; within a term the
``matchExpressions`` (labels) and ``matchFields`` (only ``metadata.name``) are ANDed; a term
with neither matches nothing. Anything malformed matches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["HOSTNAME_LABEL", "names_only", "node_labels_with_hostname", "selects_node"]

HOSTNAME_LABEL = "kubernetes.io/hostname"
_NODE_NAME_FIELD = "metadata.name"


def node_labels_with_hostname(node_name: str, labels: Mapping[str, str]) -> dict[str, str]:
    """``labels`` plus ``kubernetes.io/hostname`` = the node name when not given.

    The kubelet sets that label to the hostname, which is the node name unless
    ``--hostname-override`` says otherwise (then pass the label explicitly).
    """
    return {HOSTNAME_LABEL: node_name, **labels}


def selects_node(selector: Any, node_name: str, labels: Mapping[str, str]) -> bool:
    """True when ``selector`` selects the node ``node_name`` with ``labels``.

    ``labels`` are the labels the gatekeeper knows, not necessarily all the node has: a
    ``NotIn`` or ``DoesNotExist`` on a label it does not know is never assumed to hold.
    """
    if not isinstance(selector, dict):
        return False
    terms = selector.get("nodeSelectorTerms")
    if not isinstance(terms, list):
        return False
    return any(_term_matches(term, node_name, labels) for term in terms)


def _term_matches(term: Any, node_name: str, labels: Mapping[str, str]) -> bool:
    if not isinstance(term, dict):
        return False
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(fields, list):
        return False
    if not expressions and not fields:
        return False
    return all(_label_matches(req, labels) for req in expressions) and all(
        _field_matches(req, node_name) for req in fields
    )


def _requirement(req: Any) -> tuple[str, str, list[str]] | None:
    if not isinstance(req, dict):
        return None
    key, operator, values = req.get("key"), req.get("operator"), req.get("values") or []
    if not isinstance(key, str) or not isinstance(operator, str) or not isinstance(values, list):
        return None
    if not all(isinstance(value, str) for value in values):
        return None
    return key, operator, values


def _field_matches(req: Any, node_name: str) -> bool:
    parsed = _requirement(req)
    if parsed is None:
        return False
    key, operator, values = parsed
    if key != _NODE_NAME_FIELD or not values:
        return False
    if operator == "In":
        return node_name in values
    if operator == "NotIn":
        return node_name not in values
    return False


def _label_matches(req: Any, labels: Mapping[str, str]) -> bool:
    parsed = _requirement(req)
    if parsed is None:
        return False
    key, operator, values = parsed
    value = labels.get(key)
    if value is None:
        # Unknown label: only positive operators can be decided (they fail); never assume
        # absence (fail closed).
        return False
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return True
    if operator in ("Gt", "Lt"):
        if len(values) != 1:
            return False
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # DoesNotExist on a label that exists, or an unknown operator


def names_only(selector: Any, node_name: str) -> bool:
    """True when ``selector`` selects exactly the node ``node_name`` and can select no other:
    one term with one requirement, ``matchFields`` ``metadata.name In [node_name]``.

    Labels are never enough: a label (even ``kubernetes.io/hostname``) is what a node says of
    itself, so another node could carry the same one.
    """
    if not isinstance(selector, dict) or set(selector) != {"nodeSelectorTerms"}:
        return False
    terms = selector["nodeSelectorTerms"]
    if not isinstance(terms, list) or len(terms) != 1 or not isinstance(terms[0], dict):
        return False
    term = terms[0]
    if term.get("matchExpressions") or set(term) - {"matchFields", "matchExpressions"}:
        return False
    fields = term.get("matchFields")
    if not isinstance(fields, list) or len(fields) != 1:
        return False
    return _requirement(fields[0]) == (_NODE_NAME_FIELD, "In", [node_name]) and set(fields[0]) == {
        "key",
        "operator",
        "values",
    }
