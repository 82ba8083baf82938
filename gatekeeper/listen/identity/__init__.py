"""Who is calling, decided in one place: the driver behind a Unix socket directory or a
verified client certificate (once per connection), or behind a service-account token on the
token listener (per request: reviewed by the apiserver, cached, within a budget, mapped by the
policy). The pipeline asks :meth:`Identifier.identify`; the upstream layer only carries the
TokenReview exchange (:mod:`gatekeeper.upstream.tokenreview`).

The :class:`~gatekeeper.types.Identity` value itself lives in :mod:`gatekeeper.types` (no I/O);
it is re-exported here.
"""

from gatekeeper.listen.identity._budget import (
    KNOWN_FOR,
    MAX_SOURCES,
    ReviewBudget,
    ReviewCaller,
    Scope,
    source_key,
)
from gatekeeper.listen.identity._callers import Connection, Identifier, token_reviewer
from gatekeeper.listen.identity._failures import TokenFailure, TokenRefusal
from gatekeeper.listen.identity._peers import client_cert_common_name, identify
from gatekeeper.listen.identity._reviews import Ask, DriverOf, TokenReviewer
from gatekeeper.listen.identity._tokens import shown_token, token_driver, token_identity
from gatekeeper.types import DRIVERS_GROUP, NODE_NAME_EXTRA, Identity

__all__ = [
    "DRIVERS_GROUP",
    "KNOWN_FOR",
    "MAX_SOURCES",
    "NODE_NAME_EXTRA",
    "Ask",
    "Connection",
    "DriverOf",
    "Identifier",
    "Identity",
    "ReviewBudget",
    "ReviewCaller",
    "Scope",
    "TokenFailure",
    "TokenRefusal",
    "TokenReviewer",
    "client_cert_common_name",
    "identify",
    "shown_token",
    "source_key",
    "token_driver",
    "token_identity",
    "token_reviewer",
]
