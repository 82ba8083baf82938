"""The token listener's callers: the driver a reviewed service-account token is (DESIGN §4.2).

Every way a request there fails to be a driver's is a :class:`TokenFailure`, carried by the
:class:`TokenRefusal` that answers it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gatekeeper.listen.identity._failures import TokenFailure, TokenRefusal
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy.model import Policy, UnboundTokens
from gatekeeper.request.headers import bearer_token
from gatekeeper.types import NODE_NAME_EXTRA, Identity, UserInfo
from gatekeeper.upstream.tokenreview import ReviewOutcome

__all__ = ["shown_token", "token_driver", "token_identity"]


_SA_PREFIX = "system:serviceaccount:"
# What of a reviewed token goes into the audit event (never the token itself).
_TOKEN_FACTS = {
    "serviceAccount": None,
    "podName": "authentication.kubernetes.io/pod-name",
    "podUID": "authentication.kubernetes.io/pod-uid",
    "nodeName": NODE_NAME_EXTRA,
    "credentialID": "authentication.kubernetes.io/credential-id",
}


def shown_token(headers: Mapping[str, str]) -> str:
    """The token of ``Authorization: Bearer <token>``; 401 without one."""
    token = bearer_token(headers)
    if token is None:
        raise TokenRefusal(
            TokenFailure.NO_BEARER,
            401,
            "no bearer token on the token listener",
            "Unauthorized: this listener identifies drivers by their service account token "
            "(Authorization: Bearer)",
        )
    return token


def token_identity(outcome: ReviewOutcome, policy: Policy, node_name: str) -> Identity:
    """The driver a reviewed token identifies (DESIGN §4.2): an authenticated service account
    the policy maps to a driver (``serviceAccounts``), whose token is bound to a pod on this
    node; 401 or 403 naming the rule otherwise."""
    if not outcome.authenticated:
        why = outcome.error or "the token was not authenticated"
        raise TokenRefusal(
            TokenFailure.REJECTED, 401, f"token review: {why}", f"Unauthorized: {why}"
        )
    user = outcome.username
    driver = policy.service_accounts.get(user)
    if driver is None:
        account = user.removeprefix(_SA_PREFIX).replace(":", "/", 1)
        raise TokenRefusal(
            TokenFailure.UNMAPPED,
            403,
            f"{user} is not mapped to a driver (policy serviceAccounts)",
            f'User "{user}" is not a driver on node "{node_name}": '
            + (
                f"service account {account} is not listed under serviceAccounts in the policy"
                if user.startswith(_SA_PREFIX)
                else "only service accounts listed under serviceAccounts in the policy are"
            ),
        )
    nodes = outcome.extra.get(NODE_NAME_EXTRA, ())
    if not nodes and policy.unbound_tokens is not UnboundTokens.ALLOW:
        raise TokenRefusal(
            TokenFailure.UNBOUND,
            403,
            f"token of {user} is bound to no node",
            f'User "{user}": the token names no node ({NODE_NAME_EXTRA}): a token not bound to '
            "a pod, or a legacy Secret token, cannot show that the driver runs on this node "
            "(policy unboundTokens: Refuse)",
        )
    if nodes and tuple(nodes) != (node_name,):
        raise TokenRefusal(
            TokenFailure.WRONG_NODE,
            403,
            f"token of {user} is bound to node {nodes[0]}",
            f'User "{user}": the token is bound to a pod on node "{nodes[0]}", not this node '
            f'"{node_name}" ({NODE_NAME_EXTRA})',
        )
    peer = {"serviceAccount": user}
    if outcome.uid:
        peer["serviceAccountUID"] = outcome.uid
    for fact, extra in _TOKEN_FACTS.items():
        if extra is not None and (values := outcome.extra.get(extra)):
            peer[fact] = values[0]
    user_info = UserInfo(outcome.username, outcome.uid, outcome.groups, dict(outcome.extra))
    return Identity(driver=driver, transport=ListenerKind.TOKEN, peer=peer, user=user_info)


def token_driver(outcome: ReviewOutcome, policy: Policy, node_name: str) -> str | None:
    """The driver ``outcome`` identifies on this node (as :func:`token_identity`), or None."""
    try:
        return token_identity(outcome, policy, node_name).driver
    except TokenRefusal:
        return None
