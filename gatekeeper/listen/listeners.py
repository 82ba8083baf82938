"""The per-driver Unix sockets, made so that no driver can take them over (DESIGN §4.2).

- One instance per socket directory: ``DIR/.lock`` is held with ``flock`` for the life of the
  process; a second instance fails with "socket directory in use by PID n" (exit 2).
- ``DIR/<driver>`` must be a real directory (never a symlink); whatever a driver left at
  ``DIR/<driver>/api.sock`` is looked at without following links: a stale socket (nobody
  accepts on it) is replaced; anything else (file, directory, symlink, live socket) makes the
  gatekeeper skip that one driver's listener with a log line, and serve every other driver.
- Sockets are created with mode 0660 (through the umask, so no ``chmod`` ever follows a path
  a driver could have swapped) and, with ``--socket-group``, that group (``lchown``).
- On exit only the sockets this instance created, still the same inodes, are removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import logging
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from gatekeeper.errors import ConfigError
from gatekeeper.policy.model import ANY_DRIVER

__all__ = [
    "LOCK_NAME",
    "MAX_SOCKET_PATH",
    "SOCKET_NAME",
    "DriverSocket",
    "SocketListeners",
    "resolve_group",
    "too_long_for_a_socket",
]

log = logging.getLogger("gatekeeper.listeners")

SOCKET_NAME = "api.sock"
LOCK_NAME = ".lock"
_SOCKET_UMASK = 0o117  # 0660 sockets
_DIR_MODE = 0o750  # owner rwx, --socket-group may enter
MAX_SOCKET_PATH = 107
"""The longest path bind(2) takes for a Unix socket (``sun_path`` holds 108 bytes, its NUL
included); a longer one fails with a bare "AF_UNIX path too long"."""


def too_long_for_a_socket(path: str | os.PathLike[str]) -> str | None:
    """Why no Unix socket can be bound at ``path`` for its length, or None when it can."""
    size = len(os.fsencode(path))
    if size <= MAX_SOCKET_PATH:
        return None
    return (
        f"{os.fspath(path)} is {size} bytes long, over the {MAX_SOCKET_PATH} a Unix socket's "
        "path may have: choose a shorter socket directory"
    )


@dataclass(frozen=True, slots=True)
class DriverSocket:
    """A listening socket bound at ``path`` for ``driver``."""

    driver: str
    path: str
    """The bound path: also the accepted connections' sockname, hence the identity."""
    sock: socket.socket
    inode: tuple[int, int]
    """(st_dev, st_ino) of the socket file, so only our own file is removed on exit."""
    dir_fd: int


def resolve_group(name: str | None) -> int | None:
    """``--socket-group`` (a name or a numeric gid) as a gid; ConfigError if unknown."""
    if name is None or name == "":
        return None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError(f"--socket-group {name!r}: no such group") from None


class SocketListeners:
    """Owns the socket directory for one gatekeeper: the lock, and one socket per driver."""

    def __init__(self, socket_dir: Path, *, group: int | None = None) -> None:
        self.socket_dir = socket_dir
        self.group = group
        self.sockets: list[DriverSocket] = []
        self.refused: dict[str, str] = {}
        """Drivers without a listener, and why (also logged)."""
        self._lock_fd: int | None = None

    def acquire(self) -> None:
        """Create the directory if needed and lock it; ConfigError if another instance has it."""
        try:
            self.socket_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            dir_fd = os.open(self.socket_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            why = (
                "is a symlink: give the real directory"
                if exc.errno == errno.ELOOP
                else (exc.strerror)
            )
            raise ConfigError(f"--socket-dir {self.socket_dir}: {why}") from exc
        try:
            fd = os.open(
                LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                dir_fd=dir_fd,
            )  # fmt: skip
        except OSError as exc:
            raise ConfigError(
                f"--socket-dir {self.socket_dir}: cannot create {LOCK_NAME}: {exc.strerror}"
            ) from exc
        finally:
            os.close(dir_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise ConfigError(
                    f"socket directory {self.socket_dir} in use by PID {holder}"
                ) from None
            raise ConfigError(f"--socket-dir {self.socket_dir}: lock: {exc.strerror}") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def bind(self, drivers: list[str]) -> list[DriverSocket]:
        """Bind one socket per driver not yet bound; returns those bound now. A driver whose
        path cannot be used is skipped with a log line (and kept in :attr:`refused`)."""
        if self._lock_fd is None:
            self.acquire()
        have = {bound.driver for bound in self.sockets}
        added: list[DriverSocket] = []
        for driver in sorted(set(drivers) - have):
            if driver == ANY_DRIVER:
                continue  # "*" has no directory: it only means any mTLS client of the CA
            try:
                bound = self._bind_one(driver)
            except _Skip as skip:
                self.refused[driver] = str(skip)
                log.error(
                    "not listening for driver=%s socket=%s reason=%s",
                    driver,
                    self.socket_dir / driver / SOCKET_NAME,
                    skip,
                )
                continue
            self.refused.pop(driver, None)
            self.sockets.append(bound)
            added.append(bound)
            log.debug("bound driver=%s socket=%s", driver, bound.path)
        return added

    def release(self, driver: str) -> None:
        """Close ``driver``'s socket and remove its file if it is still ours."""
        for bound in [b for b in self.sockets if b.driver == driver]:
            self.sockets.remove(bound)
            _close(bound)

    def close(self) -> None:
        """Close every socket, remove those files that are still ours, release the lock."""
        for bound in self.sockets:
            _close(bound)
        self.sockets.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock; the file stays (no unlink race)
            self._lock_fd = None

    def _bind_one(self, driver: str) -> DriverSocket:
        if "/" in driver or driver.startswith("."):
            raise _Skip("not a usable directory name")
        dir_fd = self._driver_dir(driver)
        try:
            self._clear(dir_fd)
            path = str(self.socket_dir / driver / SOCKET_NAME)
            if (too_long := too_long_for_a_socket(path)) is not None:
                raise _Skip(too_long)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(_SOCKET_UMASK)
            try:
                sock.bind(path)  # bind(2) never follows a link: anything there is EADDRINUSE
            except OSError as exc:
                sock.close()
                raise _Skip(f"bind failed: {exc.strerror}") from exc
            finally:
                os.umask(old)
            st = os.stat(SOCKET_NAME, dir_fd=dir_fd, follow_symlinks=False)
            if self.group is not None:
                os.chown(SOCKET_NAME, -1, self.group, dir_fd=dir_fd, follow_symlinks=False)
            return DriverSocket(driver, path, sock, (st.st_dev, st.st_ino), dir_fd)
        except BaseException:
            os.close(dir_fd)
            raise

    def _driver_dir(self, driver: str) -> int:
        """An fd of ``DIR/<driver>``, created if absent; never through a symlink."""
        parent = os.open(self.socket_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(driver, _DIR_MODE, dir_fd=parent)
            try:
                fd = os.open(
                    driver, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                    dir_fd=parent,
                )  # fmt: skip
            except OSError as exc:
                what = "a symlink" if exc.errno == errno.ELOOP else "not a directory"
                raise _Skip(f"{self.socket_dir / driver} is {what}") from exc
            if self.group is not None:
                os.fchown(fd, -1, self.group)
                os.fchmod(fd, _DIR_MODE)
            return fd
        finally:
            os.close(parent)

    def _clear(self, dir_fd: int) -> None:
        """Make room at ``api.sock``: nothing there, or a stale socket (removed)."""
        try:
            st = os.stat(SOCKET_NAME, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise _Skip(f"{SOCKET_NAME} exists and is {_kind(st.st_mode)}, not a socket")
        if _accepting(dir_fd):
            raise _Skip(f"{SOCKET_NAME} is a socket something else is listening on")
        os.unlink(SOCKET_NAME, dir_fd=dir_fd)  # unlink(2) removes the entry, never a target
        log.info("removed a stale socket %s in directory fd %d", SOCKET_NAME, dir_fd)


def _close(bound: DriverSocket) -> None:
    bound.sock.close()
    with contextlib.suppress(OSError):
        st = os.stat(SOCKET_NAME, dir_fd=bound.dir_fd, follow_symlinks=False)
        if (st.st_dev, st.st_ino) == bound.inode:
            os.unlink(SOCKET_NAME, dir_fd=bound.dir_fd)
    os.close(bound.dir_fd)


class _Skip(Exception):
    """This driver gets no listener; the message says why."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a special file"


def _accepting(dir_fd: int) -> bool:
    """Whether something listens on ``api.sock`` (connected through the directory's fd)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}")
    except OSError:
        return False
    finally:
        probe.close()
    return True
