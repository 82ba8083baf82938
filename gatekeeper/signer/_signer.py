"""``dra-gatekeeper signer``, running: it holds the only copy of the token listener's CA key
(:mod:`gatekeeper.signer._ca`), follows the CertificateSigningRequests of its ``signerName``
(a list, then a watch, again whenever the watch ends), and answers each by its rules
(:mod:`gatekeeper.signer._rules`): approved and signed, or denied with the reason.

A request someone else approved (an admin's ``kubectl certificate approve``) is signed only if
the rules allow it too; otherwise it gets the Failed condition with their reason. The CA Secret
is read again every ``resync`` seconds (a rotation), and its certificates re-published.

With ``approve_only`` it holds no CA: it approves or denies by the same rules, and another
signer of the same name signs what it approved (cert-manager's CertificateSigningRequest
support: docs/operating.md#cert-manager).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gatekeeper.codec import pki
from gatekeeper.errors import ConfigError, UpstreamError
from gatekeeper.names import is_dns_subdomain
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.signer._ca import HeldCA, load_ca, publish_certificates
from gatekeeper.signer._rules import Approval, Denial, SignerRules, decide, node_of
from gatekeeper.types import KubeObject
from gatekeeper.upstream.csr import CSRS, CSRState, Verdict, answer_csr, sign_csr
from gatekeeper.upstream.kubeconfig import TokenSource
from gatekeeper.upstream.session import Upstream, read_json_object, request

__all__ = ["APPROVED_REASON", "Signer", "SignerConfig"]

log = logging.getLogger("gatekeeper.signer")

APPROVED_REASON = "GatekeeperNodeAddresses"
_WATCH_SECONDS = 300
_RETRY_SECONDS = 5.0
_MAX_EVENT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SignerConfig:
    """The signer's checked settings."""

    rules: SignerRules
    namespace: str
    """Where its Secret and ConfigMap are (its own namespace)."""
    secret: str
    configmap: str
    ca_days: int = 3650
    """Validity of a CA made at the first start."""
    resync: float = 60.0
    approve_only: bool = False
    """Approve or deny only; another signer signs (no CA, no Secret, no ConfigMap)."""


class Signer:
    """Answers the requests of ``config.rules.signer_name`` through ``upstream`` (the signer's
    own credentials; ``tokens`` re-read at every resync: a projected token rotates)."""

    def __init__(
        self, config: SignerConfig, upstream: Upstream, tokens: TokenSource | None = None
    ) -> None:
        self.config = config
        self._upstream = upstream
        self._tokens = tokens
        self._held: HeldCA | None = None
        self.answered: dict[str, str] = {}
        """Request name → what the signer did last (approved, denied, signed, failed)."""

    async def start(self) -> None:
        """Load the CA (made at the first start) and publish its certificates; ConfigError
        when the Secret cannot hold one. Nothing to load when it only approves."""
        if not self.config.approve_only:
            await self._load()
        rules = self.config.rules
        log.info(
            "signer started signer=%s gatekeeper=%s approve_only=%s",
            rules.signer_name,
            rules.gatekeeper,
            self.config.approve_only,
        )

    async def run(self, stopping: asyncio.Event) -> None:
        """Answer requests until ``stopping`` is set (after :meth:`start`)."""
        tasks = [asyncio.ensure_future(self._follow_requests())]
        if not self.config.approve_only:
            tasks.append(asyncio.ensure_future(self._follow_ca()))
        try:
            await stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _load(self) -> None:
        config = self.config
        held = await load_ca(
            self._upstream,
            config.namespace,
            config.secret,
            days=config.ca_days,
            common_name=f"{config.rules.signer_name} CA",
        )
        if self._held is None or held.version != self._held.version:
            log.info(
                "ca loaded secret=%s/%s sha256=%s trusted_too=%d not_after=%s",
                config.namespace,
                config.secret,
                held.fingerprint,
                held.trust.count(b"BEGIN CERTIFICATE"),
                held.ca.certificate.not_valid_after_utc.isoformat(),
            )
        self._held = held
        await publish_certificates(self._upstream, config.namespace, config.configmap, held)

    async def _follow_ca(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync)
            if self._tokens is not None:
                with contextlib.suppress(ConfigError):  # the last good token stays
                    self._tokens.reload()
            try:
                await self._load()
            except (ConfigError, UpstreamError) as exc:
                why = exc.message if isinstance(exc, UpstreamError) else str(exc)
                log.error("ca reload failed, signing with the previous one: %s", why)

    async def _follow_requests(self) -> None:
        while True:
            try:
                version = await self.pass_once()
                async for obj in self._watch(version):
                    await self._answer(obj)
            except UpstreamError as exc:
                log.warning("requests not followed, retrying in %gs: %s", _RETRY_SECONDS,
                            exc.message)  # fmt: skip
                await asyncio.sleep(_RETRY_SECONDS)

    async def pass_once(self) -> str:
        """Answer every request of the signer's name that waits for an answer; the list's
        resourceVersion (to watch from)."""
        code, listed = await request(self._upstream, "GET", self._target())
        if code != 200:
            raise UpstreamError(502, f"cannot list CertificateSigningRequests: HTTP {code}")
        for obj in listed.get("items") or ():
            if isinstance(obj, dict):
                await self._answer(obj)
        return str(listed.get("metadata", {}).get("resourceVersion", ""))

    def _target(self, watch_from: str | None = None) -> str:
        """The list (or, from a resourceVersion, the watch) of the signer's requests, in the
        canonical form of every query the gatekeeper sends (RequestInfo's)."""
        raw = CSRS if watch_from is None else f"{CSRS}?watch=true"
        selector = f"spec.signerName={self.config.rules.signer_name}"
        info = parse_request("GET", raw).with_query("fieldSelector", selector)
        if watch_from is not None:
            info = info.with_query("resourceVersion", watch_from)
            info = info.with_query("timeoutSeconds", str(_WATCH_SECONDS))
        return info.target

    async def _watch(self, version: str) -> AsyncIterator[KubeObject]:
        headers = {"Accept": "application/json"}
        async with self._upstream.stream(
            "GET", self._target(version), headers, None, pool="watches"
        ) as answer:
            if answer.status != 200:
                body = await read_json_object(answer.chunks(), CSRS, limit=_MAX_EVENT_BYTES)
                raise UpstreamError(
                    502, f"cannot watch CertificateSigningRequests: HTTP {answer.status} {body}"
                )
            buffered = b""
            async for chunk in answer.chunks():
                buffered += chunk
                if len(buffered) > _MAX_EVENT_BYTES:
                    raise UpstreamError(502, "a watch event of more than 1 MiB")
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    event = json.loads(line) if line.strip() else {}
                    if event.get("type") == "ERROR":
                        return  # expired resourceVersion and the like: list again
                    obj = event.get("object")
                    if event.get("type") in ("ADDED", "MODIFIED") and isinstance(obj, dict):
                        yield obj

    async def _answer(self, csr: KubeObject) -> None:
        """Answer one request, if it waits for an answer of this signer."""
        spec = csr.get("spec") if isinstance(csr.get("spec"), dict) else {}
        assert isinstance(spec, dict)
        state = CSRState.of(csr)
        if spec.get("signerName") != self.config.rules.signer_name or state.verdict in (
            Verdict.DENIED,
            Verdict.FAILED,
        ):
            return
        if state.issued:
            return
        if not is_dns_subdomain(state.name):
            # Not addressable in a path as the gatekeeper writes them (nor a gatekeeper's: those
            # are named dra-gatekeeper-<node>-…): left to an admin.
            log.warning("csr skipped name=%r reason=not a DNS subdomain", state.name[:80])
            return
        node, others = await self._nodes(node_of(csr))
        verdict = decide(csr, node, self.config.rules, others)
        name = state.name
        if state.verdict is Verdict.PENDING:
            if isinstance(verdict, Denial):
                await answer_csr(self._upstream, csr, Verdict.DENIED, verdict.reason,
                                 verdict.message)  # fmt: skip
                self._did(name, "denied", f"reason={verdict.reason} {verdict.message}")
                return
            csr = await answer_csr(self._upstream, csr, Verdict.APPROVED, APPROVED_REASON,
                                   verdict.message)  # fmt: skip
            self._did(name, "approved", f"node={verdict.node}")
        if self.config.approve_only:
            return  # the other signer signs (or fails) what is approved
        if isinstance(verdict, Denial):
            # Approved by someone else, against the rules: never signed.
            await sign_csr(self._upstream, csr, None, reason=verdict.reason,
                           message=verdict.message)  # fmt: skip
            self._did(name, "failed", f"reason={verdict.reason} {verdict.message}")
            return
        await self._sign(csr, verdict)

    async def _nodes(self, name: str | None) -> tuple[KubeObject | None, list[KubeObject]]:
        """The requester's Node (None: no such node, or none named) and all the others."""
        if name is None:
            return None, []
        code, listed = await request(self._upstream, "GET", "/api/v1/nodes")
        if code != 200:
            raise UpstreamError(502, f"cannot list nodes: HTTP {code} (the signer needs list)")
        nodes = [n for n in listed.get("items") or () if isinstance(n, dict)]
        mine = [n for n in nodes if n.get("metadata", {}).get("name") == name]
        return (mine[0] if mine else None), [n for n in nodes if n not in mine]

    async def _sign(self, csr: KubeObject, approval: Approval) -> None:
        held = self._held
        assert held is not None, "start() loads the CA first"
        ca_end = held.ca.certificate.not_valid_after_utc
        now = datetime.datetime.now(datetime.UTC)
        not_after = min(now + datetime.timedelta(seconds=approval.lifetime), ca_end)
        certificate = pki.sign_server_cert(
            held.ca,
            approval.requested.public_key,
            approval.requested.addresses,
            not_after=not_after,
            common_name=f"dra-gatekeeper:{approval.node}",
        )
        await sign_csr(self._upstream, csr, certificate)
        name = CSRState.of(csr).name
        self._did(name, "signed", f"node={approval.node} not_after={not_after.isoformat()}")

    def _did(self, name: str, what: str, detail: str) -> None:
        self.answered[name] = what
        log.info("csr %s name=%s %s", what, name, detail)
