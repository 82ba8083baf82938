"""Service-account tokens as a kube-apiserver 1.36 issues and reviews them (recordings 228-259):
TokenRequest (``serviceaccounts/<name>/token``, bound to a Pod) and TokenReview.

Tokens are JWTs with the apiserver's claims (``kubernetes.io`` namespace, serviceaccount, pod
and node, ``jti``) and the reviews answer with the same ``user.extra`` (credential-id, node-name,
node-uid, pod-name, pod-uid). Deliberate differences: tokens are signed with a per-server HMAC
key (HS256), not RSA, so there is no OIDC discovery or JWKS; a bound token is invalid as soon
as its pod is gone (the apiserver keeps accepting it for a few seconds, recording 253); only
Pods are bound objects.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gatekeeper.apiserver._errors import APIError, field_invalid, invalid, not_found
from gatekeeper.apiserver._kinds import ServedKind
from gatekeeper.apiserver._status import status_body
from gatekeeper.apiserver._types import KubeObject
from gatekeeper.apiserver.store import Store

__all__ = [
    "ISSUER",
    "PODS",
    "SERVICE_ACCOUNTS",
    "TOKEN_KINDS",
    "TOKEN_REQUEST",
    "TOKEN_REVIEW",
    "TokenAuthority",
]

TOKEN_REQUEST = ServedKind("authentication.k8s.io", "tokenrequests", "TokenRequest", True, ("v1",))
TOKEN_REVIEW = ServedKind("authentication.k8s.io", "tokenreviews", "TokenReview", False, ("v1",))
ISSUER = "https://kubernetes.default.svc.cluster.local"
"""The issuer and default audience (``--service-account-issuer``) of a typical cluster."""
SERVICE_ACCOUNTS = ServedKind("", "serviceaccounts", "ServiceAccount", True, ("v1",))
PODS = ServedKind("", "pods", "Pod", True, ("v1",), subresources=("status",))
TOKEN_KINDS = (SERVICE_ACCOUNTS, PODS)
"""The kinds to serve beside the policy's for TokenRequest and TokenReview."""

_CORE = ""
_MIN_SECONDS = 600
_INVALID = "invalid bearer token"
_EXTRA = "authentication.kubernetes.io/"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class TokenAuthority:
    """Issues and reviews the tokens of one embedded API server (``store()``: its store now)."""

    def __init__(self, store: Callable[[], Store]) -> None:
        self._store = store
        self._key = secrets.token_bytes(32)

    @property
    def store(self) -> Store:
        return self._store()

    # --- issuing ---------------------------------------------------------------------------

    def mint(
        self,
        namespace: str,
        service_account: str,
        *,
        pod: str | None = None,
        seconds: int = 3600,
        audiences: list[str] | None = None,
        now: float | None = None,
    ) -> str:
        """A token of ``namespace/service_account`` (bound to ``pod`` if given), as a
        TokenRequest would return it; ``seconds`` may be anything here (also negative: an
        expired token). APIError 404 when the service account or pod does not exist."""
        account = self._get(SERVICE_ACCOUNTS, namespace, service_account)
        issued = time.time() if now is None else now
        scope: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": service_account, "uid": account["metadata"]["uid"]},
        }
        if pod is not None:
            bound = self._get(PODS, namespace, pod)
            scope["pod"] = {"name": pod, "uid": bound["metadata"]["uid"]}
            node = str((bound.get("spec") or {}).get("nodeName") or "")
            if node:
                stored = (
                    self.store.get((_CORE, "nodes"), ("", node)) if self._serves_nodes else None
                )
                scope["node"] = {
                    "name": node,
                    "uid": (stored or {}).get("metadata", {}).get("uid", ""),
                }
        claims = {
            "aud": audiences or [ISSUER],
            "exp": int(issued) + seconds,
            "iat": int(issued),
            "iss": ISSUER,
            "jti": str(uuid.uuid4()),
            "kubernetes.io": scope,
            "nbf": int(issued),
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
        }
        return self._sign(claims)

    def mint_legacy(self, namespace: str, service_account: str) -> str:
        """A token as the token controller once put in a ServiceAccount's Secret: no expiry,
        no audience, no pod or node (recording 250)."""
        account = self._get(SERVICE_ACCOUNTS, namespace, service_account)
        prefix = "kubernetes.io/serviceaccount/"
        return self._sign(
            {
                "iss": "kubernetes/serviceaccount",
                f"{prefix}namespace": namespace,
                f"{prefix}secret.name": f"{service_account}-token",
                f"{prefix}service-account.name": service_account,
                f"{prefix}service-account.uid": account["metadata"]["uid"],
                "sub": f"system:serviceaccount:{namespace}:{service_account}",
            }
        )

    def token_request(self, namespace: str, name: str, body: Any) -> KubeObject:
        """The answer to ``POST .../serviceaccounts/<name>/token`` (201)."""
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict):
            spec = {}
        seconds = spec.get("expirationSeconds", 3600)
        if not isinstance(seconds, int) or seconds < _MIN_SECONDS:
            detail = "may not specify a duration less than 10 minutes"
            cause = field_invalid("spec.expirationSeconds", seconds, detail)
            raise invalid(TOKEN_REQUEST, name, [cause])
        audiences = spec.get("audiences") or [ISSUER]
        ref = spec.get("boundObjectRef")
        pod = None
        if isinstance(ref, dict):
            if ref.get("kind") != "Pod":
                detail = "the embedded API server binds tokens to Pods only"
                cause = field_invalid("spec.boundObjectRef.kind", ref.get("kind"), detail)
                raise invalid(TOKEN_REQUEST, name, [cause])
            pod = str(ref.get("name", ""))
            stored = self._get(PODS, namespace, pod)
            if ref.get("uid") and ref["uid"] != stored["metadata"]["uid"]:
                raise APIError(
                    status_body(
                        409,
                        f"the UID in the bound object reference ({ref['uid']}) does not match "
                        "the UID in record. The object might have been deleted and then "
                        "recreated",
                    )
                )
        now = time.time()
        token = self.mint(namespace, name, pod=pod, seconds=seconds, audiences=audiences, now=now)
        account = self._get(SERVICE_ACCOUNTS, namespace, name)
        out_spec: dict[str, Any] = {"audiences": audiences, "expirationSeconds": seconds}
        if isinstance(ref, dict):
            out_spec["boundObjectRef"] = ref
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": account["metadata"]["uid"],
                "creationTimestamp": _timestamp(now),
            },
            "spec": out_spec,
            "status": {"token": token, "expirationTimestamp": _timestamp(now + seconds)},
        }

    # --- reviewing -------------------------------------------------------------------------

    def token_review(self, body: Any) -> KubeObject:
        """The answer to ``POST /apis/authentication.k8s.io/v1/tokenreviews`` (201)."""
        spec = body.get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("token"), str):
            cause = {
                "reason": "FieldValueRequired",
                "message": "Required value",
                "field": "spec.token",
            }
            raise invalid(TOKEN_REVIEW, "", [cause])
        audiences = spec.get("audiences") or [ISSUER]
        review: KubeObject = {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {},
            "spec": spec,
        }
        try:
            user = self._authenticate(spec["token"], list(audiences))
        except _Rejected as rejected:
            review["status"] = {"user": {}, "error": str(rejected)}
            return review
        review["status"] = {"authenticated": True, "user": user, "audiences": audiences}
        return review

    def user_of(self, token: str) -> dict[str, Any] | None:
        """Who a bearer token on a request is, as the apiserver's own service-account
        authenticator sees it (the issuer's audience); None when it is not a valid token."""
        try:
            return self._authenticate(token, [ISSUER])
        except (_Rejected, APIError):
            return None

    def _authenticate(self, token: str, audiences: list[str]) -> dict[str, Any]:
        claims = self._verified(token)
        if claims.get("iss") == "kubernetes/serviceaccount":
            return self._legacy_user(claims)
        if not set(claims.get("aud") or []) & set(audiences):
            raise _Rejected(
                f"[{_INVALID}, token audiences {json.dumps(claims.get('aud'))} is invalid for "
                f"the target audiences {json.dumps(audiences)}]"
            )
        if claims.get("exp", 0) <= time.time():
            raise _Rejected(f"[{_INVALID}, service account token has expired]")
        scope = claims.get("kubernetes.io") or {}
        namespace = str(scope.get("namespace", ""))
        account = scope.get("serviceaccount") or {}
        stored = self._find(SERVICE_ACCOUNTS, namespace, str(account.get("name", "")))
        if stored is None or stored["metadata"]["uid"] != account.get("uid"):
            raise _Rejected(f"[{_INVALID}, service account token has been invalidated]")
        extra = {f"{_EXTRA}credential-id": [f"JTI={claims.get('jti', '')}"]}
        pod = scope.get("pod")
        if isinstance(pod, dict):
            bound = self._find(PODS, namespace, str(pod.get("name", "")))
            if bound is None or bound["metadata"]["uid"] != pod.get("uid"):
                raise _Rejected(f"[{_INVALID}, service account token has been invalidated]")
            node = scope.get("node") or {}
            if node.get("name"):
                extra[f"{_EXTRA}node-name"] = [str(node["name"])]
                extra[f"{_EXTRA}node-uid"] = [str(node.get("uid", ""))]
            extra[f"{_EXTRA}pod-name"] = [str(pod["name"])]
            extra[f"{_EXTRA}pod-uid"] = [str(pod["uid"])]
        return {
            "username": f"system:serviceaccount:{namespace}:{account.get('name', '')}",
            "uid": stored["metadata"]["uid"],
            "groups": _groups(namespace),
            "extra": extra,
        }

    def _legacy_user(self, claims: dict[str, Any]) -> dict[str, Any]:
        prefix = "kubernetes.io/serviceaccount/"
        namespace = str(claims.get(f"{prefix}namespace", ""))
        name = str(claims.get(f"{prefix}service-account.name", ""))
        stored = self._find(SERVICE_ACCOUNTS, namespace, name)
        if stored is None or stored["metadata"]["uid"] != claims.get(
            f"{prefix}service-account.uid"
        ):
            raise _Rejected(f"[{_INVALID}, service account token has been invalidated]")
        return {
            "username": f"system:serviceaccount:{namespace}:{name}",
            "uid": stored["metadata"]["uid"],
            "groups": _groups(namespace),
        }

    # --- helpers ---------------------------------------------------------------------------

    @property
    def _serves_nodes(self) -> bool:
        return self.store.serves((_CORE, "nodes"))

    def _find(self, kind: ServedKind, namespace: str, name: str) -> KubeObject | None:
        if not self.store.serves((kind.group, kind.resource)):
            return None
        return self.store.get((kind.group, kind.resource), (namespace, name))

    def _get(self, kind: ServedKind, namespace: str, name: str) -> KubeObject:
        found = self._find(kind, namespace, name)
        if found is None:
            raise not_found(kind, name)
        return found

    def _sign(self, claims: dict[str, Any]) -> str:
        header = _b64(json.dumps({"alg": "HS256", "kid": "embedded"}).encode())
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        signature = hmac.new(self._key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        return f"{header}.{payload}.{_b64(signature)}"

    def _verified(self, token: str) -> dict[str, Any]:
        parts = token.split(".")
        if len(parts) != 3:
            raise _Rejected(_INVALID)
        header, payload, signature = parts
        expected = hmac.new(self._key, f"{header}.{payload}".encode(), hashlib.sha256).digest()
        try:
            valid = hmac.compare_digest(_unb64(signature), expected)
            claims = json.loads(_unb64(payload)) if valid else None
        except ValueError:
            raise _Rejected(_INVALID) from None
        if not isinstance(claims, dict):
            raise _Rejected(_INVALID)
        return claims


class _Rejected(Exception):
    """A token the review does not authenticate; the message is the review's ``error``."""


def _groups(namespace: str) -> list[str]:
    return ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
