"""The token listener's certificate from the CSR API, against the embedded API server serving
CertificateSigningRequests over HTTP. The test answers the requests as a signer would (its
status: the condition, the certificate); the real signer against a real apiserver is
tests/realcluster/test_signer.py.

The key never leaves the process (the request carries the public key only, the certificate
served is for it), the wait is bounded and every way of not getting a certificate is one line
naming the request and the signer's words, and a renewal reaches new connections of a running
listener while established ones keep theirs."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ssl
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from gatekeeper.apiserver import TOKEN_KINDS, APIServer, ServedKind
from gatekeeper.cli.served import served_kinds
from gatekeeper.codec import pki
from gatekeeper.errors import ConfigError
from gatekeeper.listen.servingcert import USAGES, CertRequest, Issued, ServingCertificate
from gatekeeper.listen.tls import IssuedTLS
from gatekeeper.policy import Policy
from gatekeeper.testing.harness import GPU, NODE, NODE_TOKEN, PKI, metric_value, running_gatekeeper
from gatekeeper.types import KubeObject
from gatekeeper.upstream.csr import CSRS, csr_path
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import UpstreamSession, request
from tests.tokencluster import SA, token

SIGNER = "dra-gatekeeper.io/token-listener"
CSR_KIND = ServedKind(
    "certificates.k8s.io",
    "certificatesigningrequests",
    "CertificateSigningRequest",
    False,
    ("v1",),
    selectable_fields={"v1": {"spec.signerName": "spec.signerName"}},
    subresources=("status",),
)
ADDRESSES = ("127.0.0.1", "10.0.0.7")
SELECTOR = f"spec.nodeName%3D{NODE}%2Cspec.driver%3D{GPU}"


@pytest.fixture
async def cluster(policy: Policy) -> AsyncIterator[APIServer]:
    api = APIServer((*served_kinds(policy), *TOKEN_KINDS, CSR_KIND), token=NODE_TOKEN)
    await api.start()
    api.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    api.add({"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "gpu-driver", "namespace": "gpu-system"}})  # fmt: skip
    api.add({"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "plugin-a", "namespace": "gpu-system"},
             "spec": {"nodeName": NODE, "serviceAccountName": "gpu-driver"}})  # fmt: skip
    yield api
    await api.close()


@pytest.fixture
async def session(cluster: APIServer) -> AsyncIterator[UpstreamSession]:
    upstream = UpstreamSession(UpstreamConfig(server=cluster.url, token=NODE_TOKEN))
    await upstream.start()
    yield upstream
    await upstream.close()


Answer = Callable[[KubeObject], dict[str, Any] | None]
"""What the test's signer writes into a request's status (None: it leaves it pending)."""


def approve(ca: pki.IssuedCert, seconds: int = 3600) -> Answer:
    def answer(csr: KubeObject) -> dict[str, Any]:
        requested = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
        names = requested.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        hosts = [str(n.value) for n in names]
        public_key = requested.public_key()
        assert isinstance(public_key, ec.EllipticCurvePublicKey)
        until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
        cert = pki.sign_server_cert(ca, public_key, hosts, not_after=until)
        return {"conditions": [_condition("Approved", "Test")],
                "certificate": base64.b64encode(cert).decode()}  # fmt: skip

    return answer


def refuse(kind: str, reason: str, message: str) -> Answer:
    return lambda csr: {"conditions": [_condition(kind, reason, message)]}


def _condition(kind: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


@contextlib.asynccontextmanager
async def signing(session: UpstreamSession, answer: Answer) -> AsyncIterator[list[KubeObject]]:
    """Answer every request of SIGNER as ``answer`` says, as they come (polling the list);
    yields the requests answered so far."""
    answered: list[KubeObject] = []

    async def loop() -> None:
        while True:
            mine = f"{CSRS}?fieldSelector=spec.signerName%3D{SIGNER}"
            _, listed = await request(session, "GET", mine)
            for csr in listed["items"]:
                name = csr["metadata"]["name"]
                if csr.get("status") or name in {a["metadata"]["name"] for a in answered}:
                    continue
                status = answer(csr)
                answered.append(csr)
                if status is not None:
                    # Items of a list carry no kind: the update names it.
                    body = {**csr, "status": status, "kind": CSR_KIND.kind,
                            "apiVersion": "certificates.k8s.io/v1"}  # fmt: skip
                    code, _ = await request(session, "PUT", f"{csr_path(name)}/status", body)
                    assert code == 200
            await asyncio.sleep(0.05)

    task = asyncio.ensure_future(loop())
    try:
        yield answered
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def serving(session: UpstreamSession, wait: float = 10.0, **kw: Any) -> ServingCertificate:
    return ServingCertificate(CertRequest(SIGNER, ADDRESSES, wait), session, NODE, **kw)


@pytest.fixture(scope="module")
def signer_ca() -> pki.IssuedCert:
    return pki.create_ca("test signer CA")


async def test_the_key_stays_here_and_the_certificate_is_for_it(
    cluster: APIServer, session: UpstreamSession, signer_ca: pki.IssuedCert
) -> None:
    results: list[str] = []
    async with signing(session, approve(signer_ca)) as answered:
        issued = await serving(session, on_request=results.append).first()
    (csr,) = answered
    assert csr["spec"]["signerName"] == SIGNER and tuple(csr["spec"]["usages"]) == USAGES
    assert csr["metadata"]["name"].startswith(f"dra-gatekeeper-{NODE}-")
    sent = b"".join(e.body for e in cluster.journal if e.method == "POST" and e.path == CSRS)
    assert b"PRIVATE KEY" not in sent and b"PRIVATE KEY" not in base64.b64decode(
        csr["spec"]["request"]
    )
    leaf = x509.load_pem_x509_certificate(issued.cert_pem)
    requested = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
    assert leaf.public_key() == requested.public_key()
    assert pki.subject_alt_names(leaf) == ["IP:127.0.0.1", "IP:10.0.0.7"]
    assert issued.csr == csr["metadata"]["name"] and issued.serial == leaf.serial_number
    assert results == ["issued"]
    IssuedTLS(issued.cert_pem, issued.key_pem)  # the pair loads into a listener


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (refuse("Denied", "AddressNotOfNode", "10.0.0.7 is not node-a's"),
         "was denied by signer dra-gatekeeper.io/token-listener: AddressNotOfNode: "
         "10.0.0.7 is not node-a's"),
        (refuse("Failed", "SignerError", "out of paper"),
         "was failed by signer dra-gatekeeper.io/token-listener: SignerError: out of paper"),
        (lambda csr: None, "--token-cert-signer: no answer to CertificateSigningRequest "),
    ],
    ids=["denied", "failed", "no-answer"],
)  # fmt: skip
async def test_no_certificate_is_one_line_saying_why(
    session: UpstreamSession, answer: Answer, words: str
) -> None:
    async with signing(session, answer):
        with pytest.raises(ConfigError) as failed:
            await serving(session, wait=1).first()
    assert words in str(failed.value) and "--token-cert-signer" in str(failed.value)
    if "no answer" in words:
        assert " within 1 s (--token-cert-wait)" in str(failed.value)
        assert f"--signer-name {SIGNER}` running?" in str(failed.value)


async def test_a_certificate_for_another_key_is_refused(
    session: UpstreamSession, signer_ca: pki.IssuedCert
) -> None:
    def other_key(csr: KubeObject) -> dict[str, Any]:
        stranger = pki.issue_server_cert(signer_ca, ["127.0.0.1"])
        return {"conditions": [_condition("Approved", "Test")],
                "certificate": base64.b64encode(stranger.cert_pem).decode()}  # fmt: skip

    async with signing(session, other_key):
        with pytest.raises(ConfigError, match="the signer's certificate is for another key"):
            await serving(session).first()


async def test_a_request_deleted_unanswered_says_so(
    cluster: APIServer, session: UpstreamSession
) -> None:
    def delete(csr: KubeObject) -> None:
        cluster.store.delete(("certificates.k8s.io", "certificatesigningrequests"),
                             ("", csr["metadata"]["name"]))  # fmt: skip

    async with signing(session, delete):
        with pytest.raises(ConfigError, match="was deleted before it was answered"):
            await serving(session).first()


async def test_no_right_to_ask_is_one_line_too(cluster: APIServer) -> None:
    refused = UpstreamSession(UpstreamConfig(server=cluster.url, token="not-the-node-token"))
    await refused.start()
    try:
        with pytest.raises(ConfigError, match="a CertificateSigningRequest: HTTP 401"):
            await serving(refused).first()
    finally:
        await refused.close()


def _shares(*values: float) -> Callable[[], float]:
    given: Iterator[float] = iter(values)
    return lambda: next(given, 1.0)


async def _serial(port: int, ca: pki.IssuedCert) -> int:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return int(x509.load_der_x509_certificate(der).serial_number)


async def test_a_renewal_reaches_new_connections_and_leaves_established_ones(
    session: UpstreamSession, signer_ca: pki.IssuedCert
) -> None:
    """A TLS listener on the listener's context: after the renewal (asked at once here: the
    first share is 0), a new connection gets the new certificate; one made before still
    talks, on the old one."""
    issued: list[Issued] = []
    async with signing(session, approve(signer_ca)) as answered:
        certificate = serving(session, on_issued=issued.append, share=_shares(0.0))
        first = await certificate.first()
        tls = IssuedTLS(first.cert_pem, first.key_pem)

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=tls.context)
        port = server.sockets[0].getsockname()[1]
        context = ssl.create_default_context(cadata=signer_ca.cert_pem.decode())
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        before = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        renewal = asyncio.ensure_future(certificate.renew(tls, first))
        try:
            async with asyncio.timeout(20):
                while len(issued) < 2:
                    await asyncio.sleep(0.05)
                while await _serial(port, signer_ca) == first.serial:
                    await asyncio.sleep(0.05)
            assert await _serial(port, signer_ca) == issued[1].serial != first.serial
            writer.write(b"still here\n")
            assert await reader.readline() == b"still here\n"
            assert x509.load_der_x509_certificate(before).serial_number == first.serial
        finally:
            renewal.cancel()
            writer.close()
            server.close()
        assert len(answered) == 2


async def test_serve_waits_for_its_certificate_then_serves_drivers_with_it(
    cluster: APIServer, session: UpstreamSession, signer_ca: pki.IssuedCert, policy: Policy,
    pki: PKI,
) -> None:  # fmt: skip
    """``serve`` with a requested certificate: the token listener is not up before it is
    issued; then a driver's token is served over it, and its expiry is exported."""
    token_policy = replace(policy, service_accounts={SA: GPU})
    async with (
        signing(session, approve(signer_ca, seconds=7200)),
        running_gatekeeper(
            cluster,
            token_policy,
            pki,
            listen_token=("127.0.0.1", 0),
            token_cert=CertRequest(SIGNER, ADDRESSES, 10.0),
            health_listen=("127.0.0.1", 0),
        ) as running,
    ):
        server = running.server
        assert server.token_port is not None
        context = ssl.create_default_context(cadata=signer_ca.cert_pem.decode())
        reader, writer = await asyncio.open_connection("127.0.0.1", server.token_port,
                                                       ssl=context)  # fmt: skip
        target = f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector={SELECTOR}"
        writer.write(
            f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token(cluster)}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        head = await reader.readline()
        writer.close()
        assert head.startswith(b"HTTP/1.1 200"), head
        text = server.metrics.render().decode()
        left = metric_value(text, "dra_gatekeeper_certificate_expiry_seconds",
                            certificate="token-listener")  # fmt: skip
        assert 7000 < left <= 7200
        issued = metric_value(text, "dra_gatekeeper_certificate_requests_total", result="issued")
        assert issued == 1


def test_a_short_life_backdated_by_the_signer_is_not_due_at_once() -> None:
    """Signers backdate notBefore (5 minutes here, as ours and the kube-controller-manager's
    do): a 60 s certificate is renewed 36-45 s after it came, never at once."""
    now = datetime.datetime.now(datetime.UTC)
    issued = Issued(b"", b"", now - datetime.timedelta(minutes=5),
                    now + datetime.timedelta(seconds=60), 1, "csr", now.timestamp())  # fmt: skip
    assert issued.renew_at(0.60) == pytest.approx(now.timestamp() + 36)
    assert issued.renew_at(0.75) == pytest.approx(now.timestamp() + 45)
