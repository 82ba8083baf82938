"""Reloads without a restart: the policy, the upstream token, the mTLS listener's files.

Each watched file is polled (inode, size, mtime, following symlinks, so a ConfigMap update —
an atomic swap of the ``..data`` symlink — is seen): for the policy, every file it was read
from, its includes too; SIGHUP reloads the policy and the TLS files at once. A new policy that
does not load is refused: the old one keeps serving, the failure is logged and counted.
Certificates close to expiry are logged and exported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence

from gatekeeper.errors import ConfigError
from gatekeeper.listen.tls import file_identity
from gatekeeper.policy.model import ANY_DRIVER, Policy
from gatekeeper.server.config import ServeConfig, load_serve_policy
from gatekeeper.server.expiry import CertificateExpiry
from gatekeeper.server.metrics import Metrics

__all__ = ["Reloader"]

log = logging.getLogger("gatekeeper.reload")

_EXPIRY_CHECK_SECONDS = 3600.0


class Reloader:
    """Watches the server's files; :meth:`reload` applies what changed (or everything).

    A new policy is handed to ``use`` (the server's
    :meth:`~gatekeeper.server.server.GatekeeperServer.use_policy`): the reloader reads and
    checks files, the server decides how it serves them."""

    def __init__(
        self,
        config: ServeConfig,
        metrics: Metrics,
        expiry: CertificateExpiry,
        *,
        use: Callable[[Policy], Awaitable[None]],
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._expiry = expiry
        self._use = use
        self._policy = config.policy
        # Every file the policy was read from (its includes too), and how each looked then.
        self._policy_seen = _identities(
            config.policy.files if config.policy_path is not None else ()
        )
        self._token_seen = _identity(config.tokens.token_file)
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._expiry_checked: float | None = None

    def start(self) -> None:
        self.check_expiry()
        if self._task is None:
            self._task = asyncio.ensure_future(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _poll(self) -> None:
        interval = self._config.reload_interval
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reload(force=False)
                if (
                    self._expiry_checked is None
                    or loop.time() - self._expiry_checked >= _EXPIRY_CHECK_SECONDS
                ):
                    self._expiry_checked = loop.time()
                    self.check_expiry()
            except Exception:  # the watcher must outlive any one bad file
                log.exception("reload check failed")

    async def reload(self, *, force: bool = True) -> None:
        """Reload what changed since the last look (``force``, SIGHUP: the policy regardless).

        The TLS files are reloaded (logged, counted) only when one of them changed: a SIGHUP
        that finds them as they were reports nothing about them."""
        async with self._lock:
            config = self._config
            policy_now = _identities(self._policy_seen)
            if config.policy_path is not None and (force or policy_now != self._policy_seen):
                self._policy_seen = policy_now
                await self._reload_policy()
            token_now = _identity(config.tokens.token_file)
            if token_now != self._token_seen:
                self._token_seen = token_now
                self._apply("token", config.tokens.reload)
            for tls in (config.listen_tls, config.token_tls):
                if tls is not None and tls.changed() and self._apply("tls", tls.reload):
                    self.check_expiry()

    def _apply(self, what: str, action: Callable[[], None]) -> bool:
        try:
            action()
        except ConfigError as exc:
            self._metrics.reloads.labels(what, "error").inc()
            log.error("reload refused file=%s keeping the previous one: %s", what, exc)
            return False
        self._metrics.reloads.labels(what, "ok").inc()
        log.info("reloaded file=%s", what)
        return True

    async def _reload_policy(self) -> None:
        config = self._config
        old = self._policy
        files_read: list[str] = []
        try:
            policy = load_serve_policy(
                config.policy_path, config.extra_drivers, files_read=files_read
            )
            if config.socket_dir is not None and ANY_DRIVER in policy.drivers:
                raise ConfigError(
                    f'{policy.source}: drivers: "*" needs --listen (mTLS), not --socket-dir'
                )
        except ConfigError as exc:
            # Watch what this attempt read too: an include named before it existed is
            # picked up once it appears.
            self._watch_policy_files([*old.files, *files_read])
            self._metrics.reloads.labels("policy", "error").inc()
            log.error("policy reload refused, keeping the previous policy: %s", exc)
            return
        self._watch_policy_files(policy.files)
        self._policy = policy
        await self._use(policy)
        self._metrics.reloads.labels("policy", "ok").inc()
        log.info(
            "policy reloaded policy=%s drivers=%s kinds=%s",
            policy.source,
            ",".join(sorted(policy.drivers)),
            ",".join(sorted(spec.qualified for spec in policy.kinds.values())),
        )

    def _watch_policy_files(self, files: Sequence[str]) -> None:
        """Watch ``files`` from now on, keeping how a file already watched looked before the
        reload read it (a change made during the reload is seen by the next look)."""
        seen = self._policy_seen
        self._policy_seen = {
            path: seen[path] if path in seen else file_identity(path) for path in files
        }

    def check_expiry(self) -> None:
        """Export the serving certificates' and client CA's remaining time; warn if close."""
        config = self._config
        tls = config.listen_tls or config.token_tls
        if tls is not None:
            files = {"serving": tls.files.cert_file}
            if tls.files.client_ca_file is not None:
                files["client-ca"] = tls.files.client_ca_file
            self._expiry.check_files(files)
        self._expiry.refresh()


def _identity(path: str | None) -> object:
    return None if path is None else file_identity(path)


def _identities(files: Iterable[str]) -> dict[str, object]:
    return {path: file_identity(path) for path in files}
