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


# The write end of the pipe the detached process tells its verdict on (-1: not detached).
_verdict = -1


def daemonize(pidfile: str) -> None:
    """Detach: a grandchild, in a session of its own with stdin, stdout and stderr on
    /dev/null, carries on; the caller's process waits for its verdict (`ready`, `failed`)
    and exits 0 once it listens, or prints why it did not and exits 1, so that an init
    script or a shell sees a failed start as one."""
    global _verdict
    if not pidfile:
        raise StartError("daemon needs pidfile configured")
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        _exit_with_verdict(read_end)
    os.close(read_end)
    _verdict = write_end
    os.setsid()
    if os.fork() > 0:  # not a session leader: it can never get a controlling terminal
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    if devnull > 2:
        os.close(devnull)


def _exit_with_verdict(read_end: int) -> None:
    chunks = []
    while True:
        chunk = os.read(read_end, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    said = b"".join(chunks).decode("utf-8", "replace")
    if said == "ok":
        os._exit(0)
    why = said or "the daemon exited before it was listening (see the logfile)"
    os.write(2, f"pypool: {why}\n".encode())
    os._exit(1)


def _tell(text: str) -> None:
    global _verdict
    if _verdict < 0:
        return
    fd, _verdict = _verdict, -1
    try:
        os.write(fd, text.encode())
    except OSError:
        pass
    os.close(fd)


def ready() -> None:
    """The detached pooler listens: its starter exits 0 (nothing when not detached)."""
    _tell("ok")


def failed(why: str) -> None:
    """The detached pooler cannot start: its starter prints `why` and exits 1."""
    _tell(why or "the daemon failed to start (see the logfile)")


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
