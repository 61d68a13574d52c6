"""The process around the pooler: `-d/--daemon`, the pidfile, `-u/--user`.

PgBouncer's start-up as an init script or the suite drives it: the pidfile is checked before
anything is bound (a live pid there means another instance, a dead one is a stale file and
is removed), `-d` detaches from the terminal (two forks and a new session, stdio on
/dev/null) and needs a pidfile to be found again, and the pidfile is written by the process
that serves, once it listens (pooler/lifecycle.py). Each failure is a `StartError` whose
text is one line the operator can act on; cli.py prints it and exits 1.
"""

from __future__ import annotations

import os


class StartError(Exception):
    """pypool cannot start as asked; the message says why, in one line."""


def check_pidfile(path: str) -> bool:
    """Refuse to start while the pid in `path` is alive; remove a stale pidfile (True: one
    was removed, for the log once it is set up)."""
    if not path:
        return False
    try:
        with open(path) as fh:
            text = fh.read(128)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise StartError(f"could not read pidfile '{path}': {exc.strerror}") from None
    try:
        pid = int(text.strip())
    except ValueError:
        pid = 0
    if pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            try:
                os.unlink(path)
            except OSError as exc:
                raise StartError(f"could not remove stale pidfile: {exc.strerror}") from None
            return True
        except PermissionError:
            pass  # alive, someone else's
    raise StartError(f"pidfile '{path}' exists, another instance running?")


def daemonize(pidfile: str) -> None:
    """Detach: the caller's process exits 0 and a grandchild, in a session of its own with
    stdin, stdout and stderr on /dev/null, carries on."""
    if not pidfile:
        raise StartError("daemon needs pidfile configured")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:  # not a session leader: it can never get a controlling terminal
        os._exit(0)


def switch_user(name: str) -> None:
    """`-u USER`: as root, become `name` (its primary group and groups) before anything is
    opened; as anyone else, only `name` itself is accepted."""
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise StartError(f"could not find user '{name}' to switch to") from None
    if os.getuid() == entry.pw_uid:
        return
    if os.geteuid() != 0:
        raise StartError(f"cannot switch to user '{name}': not running as root")
    os.initgroups(name, entry.pw_gid)
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
