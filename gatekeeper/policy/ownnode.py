"""Rule OwnNode, purely: a driver reads the one object named after this node (DESIGN §4.3,
its publisher reads the Node). The kind (core/v1 ``nodes`` in the default policy) is policy data."""

from __future__ import annotations

from gatekeeper.policy.decision import Decision, allow, forbid
from gatekeeper.policy.model import OWN_NODE_VERBS, KindSpec
from gatekeeper.request.requestinfo import RequestInfo

__all__ = ["decide_own_node"]


def decide_own_node(driver: str, info: RequestInfo, kind: KindSpec, node_name: str) -> Decision:
    """Allow a get of exactly ``<kind>/<node_name>`` (no subresource); refuse the rest.

    Nothing is fetched or filtered: the object is this node's own, and what the node's
    credentials return for it is what the driver gets.
    """
    if info.verb in OWN_NODE_VERBS and info.name == node_name and not info.subresource:
        return allow(f"the {kind.kind} object of this node, read-only", info)
    # SECURITY: DESIGN §4.3 — nothing else about this kind: no other name, no list or watch
    # (which would show every node), no write, no subresource.
    return forbid(
        driver,
        info,
        f'a driver may only get this node\'s own {kind.kind} "{node_name}" '
        f"({kind.qualified}/{node_name})",
    )
