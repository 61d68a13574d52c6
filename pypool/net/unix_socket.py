"""The unix-domain listening socket, `<unix_socket_dir>/.s.PGSQL.<listen_port>`, and its lock.

libpq builds that path from `host=<dir> port=<port>`, so a client reaches the pooler as it
would reach PostgreSQL. Beside the socket sits `.s.PGSQL.<port>.lock` holding the owner's
pid, as PostgreSQL writes it (PgBouncer reads one and refuses the port, but writes none).

`open_unix_socket` claims the path and returns a bound, listening `UnixSocket`:
1. a socket there that accepts connections is someone's: refuse ("unix socket is in use",
   PgBouncer's words), naming the pid in the lock file if there is one;
2. otherwise a lock file left there is stale (its process died, or its pid now belongs to
   someone else): remove it, and write ours with O_EXCL, so two poolers starting at once
   cannot both win;
3. remove the stale socket file, bind, chmod to unix_socket_mode, chgrp to
   unix_socket_group, listen.
`UnixSocket.remove` unlinks both files at exit, only in the process that made them (a
forked worker shares the socket but never removes it) and only while the lock is ours.

It owns the two files and the listening socket object, nothing else: lifecycle.start serves
the socket with loop.create_unix_server; each accepted connection is a ClientConnection,
which reads its peer's uid with `peer_uid` (SO_PEERCRED).
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import socket
import stat
import struct
from dataclasses import dataclass
from typing import Final

log = logging.getLogger("pypool")

# sun_path is 108 bytes on Linux, its NUL included; PostgreSQL refuses longer paths too.
MAX_SOCKET_PATH: Final = 107


class UnixSocketError(OSError):
    """The unix socket cannot be set up; the message says why and which setting changes it."""


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of an accepted unix-socket connection
    (SO_PEERCRED), for `auth_type = peer` and the console's own-user login. OSError if
    the kernel will not say."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])  # pid, uid, gid


def os_user_name(uid: int | None) -> str | None:
    """The name of the OS user with this uid (a unix-socket peer's, from SO_PEERCRED), for
    `peer` logins and ident maps; None over TCP (no uid) or for a uid with no name."""
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def socket_path(directory: str, port: int) -> str:
    return os.path.join(directory, f".s.PGSQL.{port}")


@dataclass
class UnixSocket:
    """The listening socket and the two files it owns."""

    path: str
    lock_path: str
    sock: socket.socket
    owner_pid: int  # the process that wrote the lock; only it removes the files

    def remove(self) -> None:
        """Unlink the socket and the lock (at exit). Idempotent; a no-op in a forked worker,
        and for files another process has since taken over."""
        if os.getpid() != self.owner_pid or _lock_pid(self.lock_path) != self.owner_pid:
            return
        for path in (self.path, self.lock_path):
            try:
                os.unlink(path)
            except OSError:
                pass


def open_unix_socket(directory: str, port: int, mode: int, group: str,
                     backlog: int = 2048) -> UnixSocket:
    """Claim, bind and listen on the socket (see the module). Raises UnixSocketError."""
    path = socket_path(directory, port)
    lock_path = path + ".lock"
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise UnixSocketError(
            f"unix socket path {path} is {size} bytes, longer than the {MAX_SOCKET_PATH} a "
            "unix socket path may have: set unix_socket_dir to a shorter directory (or empty "
            "for no unix socket)"
        )
    gid = _group_id(group)
    holder = _lock_pid(lock_path)
    if _accepts_connections(path):
        who = f" by pid {holder} (lock file {lock_path})" if holder else ""
        raise UnixSocketError(
            f"unix socket is in use, cannot continue: {path} is served{who}; stop that "
            "process, or give this one another listen_port or unix_socket_dir"
        )
    if holder is not None:
        log.warning("removing stale lock file %s (%s does not serve %s)", lock_path,
                    f"pid {holder}" if holder else "its process", path)
        _unlink(lock_path)
    own = os.getpid()
    try:
        fd = os.open(lock_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UnixSocketError(
            f"unix socket is in use, cannot continue: {lock_path} was just created by another "
            "process starting on the same unix_socket_dir and listen_port"
        ) from None
    except OSError as exc:
        raise UnixSocketError(
            f"cannot write the lock file {lock_path}: {exc.strerror} (check unix_socket_dir)"
        ) from None
    with os.fdopen(fd, "w") as lock:
        lock.write(f"{own}\n")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _remove_stale_socket(path)
        sock.bind(path)
        os.chmod(path, mode)
        if gid is not None:
            os.chown(path, -1, gid)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as failure:  # own name: mypyc types a name by its first except
        sock.close()
        _unlink(path)
        _unlink(lock_path)
        if isinstance(failure, UnixSocketError):
            raise
        raise UnixSocketError(f"cannot listen on unix socket {path}: {failure.strerror}") \
            from None
    return UnixSocket(path, lock_path, sock, own)


def _group_id(group: str) -> int | None:
    """unix_socket_group as a gid: a group name, or a number as PgBouncer also takes."""
    if not group:
        return None
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise UnixSocketError(f"unix_socket_group {group!r}: no such group") from None


def _lock_pid(lock_path: str) -> int | None:
    """The pid on the lock file's first line; None without a lock file, 0 if unreadable."""
    try:
        with open(lock_path, encoding="ascii", errors="replace") as lock:
            first = lock.readline().strip()
    except FileNotFoundError:
        return None
    except OSError:
        return 0
    return int(first) if first.isdigit() else 0


def _accepts_connections(path: str) -> bool:
    """Whether a process answers on `path`: the only test a pid reused since a crash (pid 1
    in a container, say) cannot fool."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _remove_stale_socket(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise UnixSocketError(f"{path} exists and is not a socket; remove it or set another "
                              "unix_socket_dir")
    os.unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
