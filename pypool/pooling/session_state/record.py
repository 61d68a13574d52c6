"""One client's record of the session state it made: the settings that follow it to its
next server and what pins it to this one (`ClientSession`).

Told what the client sent and when its transaction ended; never reads SQL (statements.py
does) and never writes to a server (replay.py builds that SQL).
"""

from __future__ import annotations

from typing import Final

from .commands import (
    CLOSE_ALL,
    DISCARD_ALL,
    DISCARD_TEMP,
    HOLD_CURSOR,
    LISTEN,
    LOCK,
    PIN_REASONS,
    RESET,
    RESET_ALL,
    ROLE,
    ROLLBACK,
    ROLLBACK_TO,
    SESSION_AUTHORIZATION,
    SET,
    TEMP_TABLE,
    UNLISTEN,
    UNLISTEN_ALL,
    UNLOCK,
    UNLOCK_ALL,
    UNTRACKABLE,
    Command,
)

# A marker among the names of a hidden SET (core/backend.py): the SET also syncs these.
SESSION_SETTINGS: Final = "pypool.session_state"
# A marker among a server's settings (listen_mode = shared): a client's LISTEN ran there, so
# the server may be listening; it is undone (UNLISTEN *, replay.py) before its next client.
LISTENED: Final = b"pypool.listen"


class ClientSession:
    """One client's session state in transaction mode: the settings that follow it (`sets`,
    name -> the statement that makes it, in the order it ran them) and what pins it to its
    server (`pins`, kind -> count). Commands are told as they are sent (`sent`) and take
    effect at the ReadyForQuery that ends their transaction (`ready`), as PostgreSQL makes
    them: a failed or rolled-back transaction's settings are dropped. A pin is taken as its
    statement is sent and never given back on a guess (a LISTEN in a transaction that failed
    keeps its client pinned until UNLISTEN, DISCARD ALL or the end): when unsure, pin.

    With listen_mode = shared (`shared_listen`) a LISTEN pins nothing: the pool's listening
    connection hears the channel for it (pooling/listening.py), and the notifications it
    cannot be given yet (mid-reply, or its LISTEN not committed) wait in `held`."""

    def __init__(self, tracked: frozenset[bytes] = frozenset()) -> None:
        # Settings that follow their client already, as reported parameters (lower case;
        # pooling/params.py): never recorded here, or the undo would fight their SET.
        self.tracked = tracked
        self.sets: dict[bytes, bytes] = {}
        # The settings its startup packet made that only this record follows (an unreported
        # search_path: net/client_login.py): what RESET, RESET ALL and DISCARD ALL go back
        # to, as PostgreSQL's reset value is the session's startup value (`started_with`).
        self.startup: dict[bytes, bytes] = {}
        self.pins: dict[int, int] = {}
        # The channels LISTENed to, as a dict's keys: an empty dict is a quarter of an empty
        # set's size, and every idle client holds one.
        self.listening: dict[bytes, None] = {}
        self.pending: list[Command] = []  # sent, their transaction not over yet
        self.doomed = False  # an error in the open transaction: it will roll back
        self.errors_seen = 0  # the FrontendLedger's error count at the last ready()
        self.noticed = False  # the first-pin NOTICE went out
        self.shared_listen = False  # listen_mode = shared: a LISTEN does not pin
        # (channel, NotificationResponse) not yet written: the client was mid-reply
        # (pooler/notifications.py flushes them at its next ReadyForQuery).
        self.held: list[tuple[bytes, bytes]] = []
        # The channels it listened on as of its last ReadyForQuery, and those its own server
        # hears for it until the listening connection does (pooler/notifications.py).
        self.heard: frozenset[bytes] = frozenset()
        self.bridged: frozenset[bytes] = frozenset()

    def started_with(self, name: bytes, replay: bytes) -> None:
        """Its startup packet set `name`; `replay` makes it on a server."""
        self.startup[name] = replay
        self.sets[name] = replay

    def pinned(self) -> str:
        """Why the client keeps its server ("" when it need not)."""
        pins = self.pins
        if not pins:
            return ""
        return ", ".join(PIN_REASONS[kind] for kind in sorted(pins))

    def busy(self) -> bool:
        """Pinned, or changes whose transaction is not over: no one may be queued behind
        this client on its server (net/pipeline.py)."""
        return bool(self.pins or self.pending)

    def sent(self, commands: list[Command], server: dict[bytes, bytes | None] | None) -> bool:
        """Commands went to the server whose settings are `server` (None: not yet linked).
        Returns whether the client became pinned."""
        was = bool(self.pins)
        for command in commands:
            kind = command.kind
            if (kind == SET or kind == RESET) and command.name in self.tracked:
                continue
            if kind == LISTEN and self.shared_listen:
                if server is not None:
                    server[LISTENED] = None  # UNLISTEN * there before its next client
            elif kind in PIN_REASONS:
                self.pins[kind] = self.pins.get(kind, 0) + 1
            elif kind == ROLLBACK_TO:
                # The settings sent since the savepoint may be undone: unsure which, drop
                # them all from the record (the server keeps them marked unsure).
                self.pending = [c for c in self.pending if c.kind != SET and c.kind != RESET]
                continue
            if (kind == SET or kind == RESET or kind == UNTRACKABLE) and server is not None:
                server[command.name] = None  # unsure until the transaction is over
            self.pending.append(command)
        return not was and bool(self.pins)

    def ready(self, status: int, errors: int, server: dict[bytes, bytes | None] | None) -> None:
        """The client's transaction status after a ReadyForQuery that left it owed nothing;
        `errors`: its ledger's count of ErrorResponses so far."""
        if errors != self.errors_seen:
            self.errors_seen = errors
            self.doomed = True
        if status != 73:
            return  # "T", "E": still inside a transaction block
        pending, self.pending = self.pending, []
        if self.doomed or any(command.kind == ROLLBACK for command in pending):
            self.doomed = False
            for command in pending:  # not transactional: an unlock that ran before the error
                if command.kind == UNLOCK_ALL:
                    self.pins.pop(LOCK, None)
            return
        sets = self.sets
        for command in pending:
            kind = command.kind
            name = command.name
            if kind == SET:
                sets.pop(name, None)
                sets[name] = command.replay
                if server is not None:
                    server[name] = command.replay
            elif kind == RESET:
                sets.pop(name, None)
                if server is not None:
                    server.pop(name, None)  # the server's own default now
                if name in self.startup:
                    sets[name] = self.startup[name]  # made again at its next link
            elif kind == RESET_ALL:
                for table in (sets, server):
                    if table is not None:
                        for key in [k for k in table
                                    if k not in (ROLE, SESSION_AUTHORIZATION, LISTENED)]:
                            del table[key]
                sets.update(self.startup)
            elif kind == DISCARD_ALL:
                sets.clear()
                if server is not None:
                    server.clear()
                sets.update(self.startup)
                self.listening.clear()
                for pin in (LISTEN, TEMP_TABLE, HOLD_CURSOR, LOCK, UNTRACKABLE):
                    self.pins.pop(pin, None)
            elif kind == DISCARD_TEMP:
                self.pins.pop(TEMP_TABLE, None)
            elif kind == LISTEN:
                self.listening[name] = None
            elif kind == UNLISTEN:
                self.listening.pop(name, None)
                if not self.listening:
                    self.pins.pop(LISTEN, None)
            elif kind == UNLISTEN_ALL:
                self.listening.clear()
                self.pins.pop(LISTEN, None)
            elif kind == CLOSE_ALL:
                self.pins.pop(HOLD_CURSOR, None)
            elif kind == UNLOCK:
                self._unpin(LOCK)
            elif kind == UNLOCK_ALL:
                self.pins.pop(LOCK, None)

    def _unpin(self, kind: int) -> None:
        count = self.pins.get(kind, 0) - 1
        if count > 0:
            self.pins[kind] = count
        else:
            self.pins.pop(kind, None)

    def on_server(self) -> dict[bytes, bytes | None]:
        """What a server holds once this client's settings are made there: its record, and
        the names its unfinished transaction sets (unsure until it is over)."""
        held: dict[bytes, bytes | None] = dict(self.sets)
        for command in self.pending:
            if command.kind == SET or command.kind == RESET or command.kind == UNTRACKABLE:
                held[command.name] = None
            elif command.kind == LISTEN and self.shared_listen:
                held[LISTENED] = None
        return held

    def channels(self) -> tuple[frozenset[bytes], frozenset[bytes]]:
        """The channels it listens on (committed) and those whose LISTEN is not yet."""
        pending = frozenset(c.name for c in self.pending if c.kind == LISTEN)
        return frozenset(self.listening), pending
