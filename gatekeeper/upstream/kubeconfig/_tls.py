"""The client TLS context for the upstream (CA, client certificate, tls-server-name)."""

from __future__ import annotations

import os
import shutil
import ssl
import tempfile

from gatekeeper.errors import ConfigError
from gatekeeper.upstream.kubeconfig._config import UpstreamConfig

__all__ = ["build_ssl_context"]


def build_ssl_context(
    cfg: UpstreamConfig, *, client_certificate: bool = True
) -> ssl.SSLContext | None:
    """The client TLS context for ``cfg.server``; None for http://.

    Verifies against the configured CA (else the system roots) unless insecure-skip-tls-verify;
    presents the client certificate if any (not with ``client_certificate`` False: a request
    under a driver's own token must not also carry the gatekeeper's certificate, which the
    apiserver would authenticate first). ConfigError if a CA or key cannot be loaded.

    A ``tls_server_name`` is not the context's: each request names it (aiohttp's
    ``server_hostname``), and it is checked, and sent as SNI, instead of the URL's host.
    """
    if not cfg.server.startswith("https://"):
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cfg.insecure_skip_tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        _load_ca(ctx, cfg)
    if client_certificate:
        _load_client_cert(ctx, cfg)
    return ctx


def _load_ca(ctx: ssl.SSLContext, cfg: UpstreamConfig) -> None:
    try:
        if cfg.ca_data:
            ctx.load_verify_locations(cadata=cfg.ca_data.decode("ascii"))
        elif cfg.ca_file:
            ctx.load_verify_locations(cafile=cfg.ca_file)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except (ssl.SSLError, OSError, ValueError, UnicodeDecodeError) as exc:
        source = cfg.ca_file or "certificate-authority-data"
        raise ConfigError(f"upstream TLS: cannot load CA from {source}: {_reason(exc)}") from None


def _load_client_cert(ctx: ssl.SSLContext, cfg: UpstreamConfig) -> None:
    if not (cfg.client_cert_file or cfg.client_cert_data):
        return
    tmpdir = None
    try:
        cert_file, key_file = cfg.client_cert_file, cfg.client_key_file
        if cfg.client_cert_data or cfg.client_key_data:
            # SECURITY: ssl only loads keys from files. Use a fresh 0700 directory (in memory
            # where /dev/shm exists), 0600 files, removed as soon as the key is loaded.
            tmpdir = tempfile.mkdtemp(prefix="dra-gatekeeper-", dir=_private_tmp_root())
            if cfg.client_cert_data:
                cert_file = _write_private(tmpdir, "client.crt", cfg.client_cert_data)
            if cfg.client_key_data:
                key_file = _write_private(tmpdir, "client.key", cfg.client_key_data)
        ctx.load_cert_chain(certfile=str(cert_file), keyfile=str(key_file))
    except (ssl.SSLError, OSError) as exc:
        source = cfg.client_cert_file or "client-certificate-data"
        raise ConfigError(
            f"upstream TLS: cannot load client certificate/key ({source}): {_reason(exc)}"
        ) from None
    finally:
        if tmpdir is not None:
            shutil.rmtree(tmpdir, ignore_errors=True)


def _private_tmp_root() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def _write_private(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return type(exc).__name__
