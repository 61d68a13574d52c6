"""Proof that nothing is lost: a money-transfer ledger run through a pooler while its
servers are terminated, its clients die mid-transaction and PostgreSQL restarts.

    python3 bench/ledger.py [--duration 60] [--clients 30] [--pool-size 4] \\
        [--pipeline-depth 4] [--terminate-every 0.5] [--kill-every 0.5] \\
        [--late-cancel-every 0.05] [--restarts 1] [--poolers pypool,pgbouncer] [--help]

Theory of operation. `accounts` rows hold a known total. Each transfer is one transaction
through the pooler: BEGIN, two UPDATEs (in account order, so that transfers never
deadlock), an INSERT of a journal row keyed by a transfer id the client chose, COMMIT; or
(`single_share` of them) the same as one statement, TRANSFER_STATEMENT, whose sending is
its COMMIT and whose reply names the transfer. Only the single statements can be
pipelined by pypool (`pipeline_depth`), so both shapes matter. Each client writes down
what it knows about each of its transfers (`Attempt.outcome`):

- acknowledged: COMMIT answered COMMIT. Its journal row must be there.
- failed: an error came before COMMIT was sent. Its row must not be there.
- killed: the harness killed the client itself inside the transaction, after its INSERT
  (and after one UPDATE only, so a leaked half-transfer would show in the total). A
  certain failure like the one before, and the one a pooler is most likely to get wrong:
  the server still holds the dead client's open transaction.
- ambiguous: the connection broke after COMMIT was sent and before its answer came back
  (by accident, or because the harness killed the client the moment its COMMIT left).
  Either outcome is allowed; they are counted apart.

The INSERT returns the transaction's id (pg_current_xact_id()), so afterwards
pg_xact_status() says what became of every transfer that got that far, ambiguous ones
included, and it must agree with the journal. Every BEGIN also listens for SQLSTATE 25001
("there is already a transaction in progress"): a client handed a server that is still
inside somebody else's transaction hears it at once.

The faults, all while the clients run: pg_terminate_backend() of a random server
connection of the ledger database (directly on PostgreSQL, as the superuser); a client
killed in the middle of a transaction, in turn by an abrupt close (asyncpg: a TCP RST;
psycopg: a shutdown that sends FIN with no Terminate message), by cancelling its task
while a query runs (the driver sends a CancelRequest, then closes), or abruptly right
after sending COMMIT; late cancels, a single statement given up after 0-4 ms so that the
CancelRequest races its end (off in the suite); and PostgreSQL restarted (`pg_ctl -m
immediate`, a crash, by default).

After the run, `check` reads PostgreSQL directly: the sum of the balances is unchanged;
the balances equal the initial state plus the journal, account by account; no backend is
left idle in transaction; no client that nobody cancelled saw a query cancelled; no
reply named another client's transfer; and the outcomes above hold row by row.

The ledger database runs with synchronous_commit = on (the embedded cluster has it off
for speed): otherwise an immediate restart could drop a commit PostgreSQL itself had
already acknowledged, and this harness would blame the pooler for it.

tests/integration/test_ledger.py runs the same code for a few seconds. Standalone, this
script starts a throwaway PostgreSQL (pypool.embedded) and each pooler in turn, prints a
summary per pooler, and exits 1 if any invariant broke.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import asyncpg
import psycopg
from psycopg.conninfo import make_conninfo

REPO = Path(__file__).resolve().parent.parent

RestartMode = Literal["fast", "immediate"]  # pg_ctl stop modes; immediate is a crash

ACTIVE_SQL_TRANSACTION = "25001"  # the WARNING a BEGIN inside a transaction gets
QUERY_CANCELED_MESSAGE = "canceling statement due to user request"  # 57014, both drivers
CONNECT_TIMEOUT = 5.0
CLOSE_TIMEOUT = 2.0

UPDATE_BALANCE = "UPDATE accounts SET balance = balance + $1 WHERE id = $2"
INSERT_JOURNAL = (
    "INSERT INTO journal (transfer_id, from_id, to_id, amount) VALUES ($1, $2, $3, $4)"
    " RETURNING pg_current_xact_id()::text"
)
# The whole transfer as one statement, so one implicit transaction: the shape pypool may
# pipeline (write waiting clients' requests behind it on a busy server, net/pipeline.py).
# The accounts are locked in id order as the explicit transfers lock them; the reply names
# the transfer, so a client handed another client's reply notices.
TRANSFER_STATEMENT = (
    "WITH locked AS (SELECT id FROM accounts WHERE id IN ($2::int, $3::int)"
    " ORDER BY id FOR UPDATE),"
    " moved AS (UPDATE accounts AS a"
    " SET balance = a.balance + CASE WHEN a.id = $2::int THEN -$4::int ELSE $4::int END"
    " FROM locked WHERE a.id = locked.id),"
    " entry AS (INSERT INTO journal (transfer_id, from_id, to_id, amount)"
    " VALUES ($1::text, $2::int, $3::int, $4::int) RETURNING transfer_id)"
    " SELECT transfer_id || ' ' || pg_current_xact_id()::text FROM entry, pg_sleep($5::float8)"
)


# -- what the clients know ---------------------------------------------------------------


class Outcome(enum.Enum):
    ACKNOWLEDGED = "acknowledged"  # COMMIT answered COMMIT
    FAILED = "failed"  # an error before COMMIT was sent, or COMMIT answered ROLLBACK
    KILLED = "killed"  # the harness killed the client inside the transaction
    AMBIGUOUS = "ambiguous"  # the connection broke after COMMIT was sent


@dataclass(frozen=True)
class Transfer:
    id: str
    from_id: int
    to_id: int
    amount: int


@dataclass
class Attempt:
    """One transfer as its client saw it. Updated step by step, so the record is true
    however the coroutine ends (an error, a timeout, a cancellation)."""

    transfer: Transfer
    driver: str
    single: bool = False  # one statement (TRANSFER_STATEMENT), not BEGIN ... COMMIT
    statement_seconds: float = 0.0  # how long the single statement sleeps (pg_sleep)
    xid: str | None = None  # known once the INSERT answered
    commit_sent: bool = False  # for a single statement: the statement itself was sent
    acknowledged: bool = False
    refused: bool = False  # COMMIT answered, but not with COMMIT
    killed: str = ""  # how the harness killed it, if it did
    own_cancel: bool = False  # its client cancelled it (a late cancel, racing the reply)
    misrouted: str = ""  # a reply that named another transfer
    error: str = ""
    epoch: int = 0  # PostgreSQL restarts before it began (a crash may reuse its xid)

    @property
    def outcome(self) -> Outcome:
        if self.acknowledged:
            return Outcome.ACKNOWLEDGED
        if self.killed:
            return Outcome.KILLED
        if self.commit_sent and not self.refused:
            return Outcome.AMBIGUOUS
        return Outcome.FAILED


# -- the two drivers -----------------------------------------------------------------------


def _linger_zero(sock: socket.socket) -> None:
    """The next close of this socket sends RST and drops whatever is unsent."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class PsycopgClient:
    """psycopg 3 AsyncConnection in autocommit, with the raw cursor so that the SQL reads
    `$1` as for asyncpg. Queries without parameters go as simple Query messages, the
    others as Parse/Bind/Execute (named and reused once psycopg decides to prepare)."""

    driver = "psycopg"
    kills = ("eof", "cancel", "commit-eof")  # see `kill`; abort() closes with EOF

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.inherited = 0  # BEGINs that found a transaction already open
        conn.add_notice_handler(self._notice)

    @classmethod
    async def connect(cls, dsn: str, prepared: bool) -> PsycopgClient:
        conn = await psycopg.AsyncConnection.connect(
            dsn,
            autocommit=True,
            connect_timeout=int(CONNECT_TIMEOUT),
            prepare_threshold=5 if prepared else None,
            cursor_factory=psycopg.AsyncRawCursor,
        )
        return cls(conn)

    def _notice(self, diag: psycopg.errors.Diagnostic) -> None:
        if diag.sqlstate == ACTIVE_SQL_TRANSACTION:
            self.inherited += 1

    async def execute(self, sql: str, *args: Any) -> str:
        cur = await self.conn.execute(sql, args or None)
        return cur.statusmessage or ""

    async def fetchval(self, sql: str, *args: Any) -> Any:
        cur = await self.conn.execute(sql, args or None)
        row = await cur.fetchone()
        return None if row is None else row[0]

    async def backend_pid(self) -> int:
        return int(await self.fetchval("SELECT pg_backend_pid()"))

    async def abort(self) -> None:
        """Die abruptly (`sever`), then close."""
        self.sever()
        await self.close()

    def sever(self) -> None:
        """Die abruptly as the pooler sees it: shutdown() on a duplicate of libpq's
        descriptor, so the pooler reads EOF with no Terminate before it (libpq's own
        Terminate then fails to go). libpq's connection stays allocated until `close`: a
        task still inside it (a COMMIT in flight) gets its error from the dead socket.
        Closing it under such a task frees the PGconn that task's wait still uses (seen as
        a hang in libpq's fflush of freed memory)."""
        sock = socket.socket(fileno=os.dup(self.conn.fileno()))
        _linger_zero(sock)
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.conn.close(), CLOSE_TIMEOUT)
        except Exception:  # noqa: BLE001 - a broken connection closes as well as it can
            pass


class AsyncpgClient:
    """asyncpg, with its statement cache (named prepared statements) unless the pooler
    cannot keep them (`statement_cache_size=0`)."""

    driver = "asyncpg"
    kills = ("reset", "cancel", "commit-reset")  # see `kill`; abort() closes with RST

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.inherited = 0
        conn.add_log_listener(self._notice)

    @classmethod
    async def connect(cls, dsn: str, prepared: bool) -> AsyncpgClient:
        conn = await asyncpg.connect(
            dsn, timeout=CONNECT_TIMEOUT, statement_cache_size=100 if prepared else 0
        )
        return cls(conn)

    def _notice(self, conn: Any, message: Any) -> None:
        if getattr(message, "sqlstate", None) == ACTIVE_SQL_TRANSACTION:
            self.inherited += 1

    async def execute(self, sql: str, *args: Any) -> str:
        return str(await self.conn.execute(sql, *args))

    async def fetchval(self, sql: str, *args: Any) -> Any:
        return await self.conn.fetchval(sql, *args)

    async def backend_pid(self) -> int:
        return int(await self.fetchval("SELECT pg_backend_pid()"))

    async def abort(self) -> None:
        self.sever()

    def sever(self) -> None:
        """Die abruptly: SO_LINGER 0 turns asyncpg's transport abort into an RST (asyncpg
        keeps its transport private; a task still inside the connection gets its error)."""
        _linger_zero(self.conn._transport.get_extra_info("socket"))
        self.conn.terminate()

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.conn.close(timeout=CLOSE_TIMEOUT), CLOSE_TIMEOUT)
        except Exception:  # noqa: BLE001
            self.conn.terminate()


Client = PsycopgClient | AsyncpgClient
DRIVERS: dict[str, type[PsycopgClient] | type[AsyncpgClient]] = {
    "psycopg": PsycopgClient,
    "asyncpg": AsyncpgClient,
}


async def kill(client: Client, how: str) -> None:
    """Kill a client inside its open transaction. "cancel": cancel the task while a query
    runs, as an application timeout would; the driver sends its CancelRequest (both do),
    then closes politely. Otherwise the abrupt close of `abort` (EOF or RST)."""
    if how != "cancel":
        await client.abort()
        return
    try:
        await asyncio.wait_for(client.execute("SELECT pg_sleep(30)"), 0.1)
    except Exception:  # noqa: BLE001 - TimeoutError, or the cancel's own error
        pass
    await client.close()


# -- one transfer ---------------------------------------------------------------------------


async def _until_commit(client: Client, attempt: Attempt) -> None:
    """BEGIN, debit and credit in account order, the journal row."""
    t = attempt.transfer
    await client.execute("BEGIN")
    for account in sorted((t.from_id, t.to_id)):
        delta = -t.amount if account == t.from_id else t.amount
        await client.execute(UPDATE_BALANCE, delta, account)
    attempt.xid = await client.fetchval(INSERT_JOURNAL, t.id, t.from_id, t.to_id, t.amount)


def _answered(attempt: Attempt, status: str) -> None:
    if status == "COMMIT":
        attempt.acknowledged = True
    else:
        attempt.refused = True
        attempt.error = f"COMMIT answered {status!r}"


def _replied(attempt: Attempt, reply: Any) -> None:
    transfer_id, _, xid = str(reply).partition(" ")
    if transfer_id != attempt.transfer.id:
        attempt.misrouted = str(reply)  # and its own outcome stays ambiguous
        return
    attempt.xid = xid
    attempt.acknowledged = True


def _send_single(client: Client, attempt: Attempt) -> Any:
    t = attempt.transfer
    attempt.commit_sent = True  # the statement is its own COMMIT
    return client.fetchval(
        TRANSFER_STATEMENT, t.id, t.from_id, t.to_id, t.amount, attempt.statement_seconds
    )


async def transfer(client: Client, attempt: Attempt) -> None:
    """One whole transfer; `attempt` records how far it got. Raises whatever the driver
    raised."""
    if attempt.single:
        _replied(attempt, await _send_single(client, attempt))
        return
    await _until_commit(client, attempt)
    attempt.commit_sent = True
    _answered(attempt, await client.execute("COMMIT"))


async def commit_and_die(client: Client, attempt: Attempt) -> None:
    """A whole transfer whose client dies abruptly as soon as its COMMIT (or its single
    statement) has left: ambiguous by design. The pooler must still take the answer off
    the server instead of handing it to the next client, also when the dead client was
    queued in a pipeline."""
    if attempt.single:
        sent, answered = asyncio.ensure_future(_send_single(client, attempt)), _replied
    else:
        await _until_commit(client, attempt)
        attempt.commit_sent = True
        sent, answered = asyncio.ensure_future(client.execute("COMMIT")), _answered
    await asyncio.sleep(0)  # the task's first step writes the request
    client.sever()
    try:  # done already if the answer beat the abort; no answer can come after it
        answered(attempt, await asyncio.wait_for(sent, 0.2))
    except Exception:  # noqa: BLE001 - the usual case
        pass
    await client.close()  # only now: no task is inside the driver's connection any more


async def cancel_late(client: Client, attempt: Attempt, rng: random.Random) -> None:
    """A single-statement transfer whose client gives up on it after 0-4 ms, about when
    its answer comes: the driver's CancelRequest races the end of the statement, as an
    application's timeout would. Whatever it hits must be this client's statement or
    nothing; the client then closes. Ambiguous by design."""
    attempt.own_cancel = True
    try:
        _replied(
            attempt, await asyncio.wait_for(_send_single(client, attempt), rng.uniform(0, 0.004))
        )
    except Exception:  # noqa: BLE001 - TimeoutError, or the cancel's own error
        pass
    await client.close()


async def doomed_transfer(client: Client, attempt: Attempt, how: str) -> None:
    """BEGIN, the debit only, the journal row, then the client dies inside the
    transaction. Were the pooler to pass this transaction on to the next client, that
    client's COMMIT would commit a debit without its credit and a row for a transfer
    whose client never sent COMMIT."""
    t = attempt.transfer
    await client.execute("BEGIN")
    await client.execute(UPDATE_BALANCE, -t.amount, t.from_id)
    attempt.xid = await client.fetchval(INSERT_JOURNAL, t.id, t.from_id, t.to_id, t.amount)
    attempt.killed = how
    await kill(client, how)


# -- a run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    duration: float = 60.0
    clients: int = 30
    accounts: int = 50
    initial_balance: int = 10_000
    drivers: tuple[str, ...] = ("psycopg", "asyncpg")
    prepared: bool = True  # let the drivers use named prepared statements
    terminate_every: float = 0.5  # mean seconds between terminated servers; 0: none
    kill_every: float = 0.5  # mean seconds between clients killed mid-transaction; 0: none
    restarts: int = 1  # PostgreSQL restarts, spread evenly over the run
    restart_mode: RestartMode = "immediate"
    transfer_timeout: float = 15.0  # a transfer stuck longer is given up (and counted)
    single_share: float = 0.5  # the share of transfers sent as one statement
    statement_ms: float = 0.0  # a single statement's pg_sleep, holding its server
    late_cancel_every: float = 0.0  # mean seconds between late cancels (cancel_late); 0: none
    seed: int | None = None


@dataclass
class Faults:
    terminated: int = 0
    killed: Counter[str] = field(default_factory=Counter)
    late_cancels: int = 0
    restarts: int = 0
    restart_seconds: float = 0.0


@dataclass
class Tally:
    """Everything the clients and the fault injectors wrote down."""

    attempts: list[Attempt] = field(default_factory=list)
    faults: Faults = field(default_factory=Faults)
    inherited_transactions: int = 0  # 25001 warnings heard by any BEGIN
    connect_failures: int = 0
    connect_errors: Counter[str] = field(default_factory=Counter)
    stalled: int = 0  # transfers given up after transfer_timeout
    seconds: float = 0.0

    def count(self, outcome: Outcome) -> int:
        return sum(1 for a in self.attempts if a.outcome is outcome)


def _xid_reused(attempt: Attempt, tally: Tally, status: str | None, present: bool) -> bool:
    """A transfer that never committed (ambiguous, killed or failed) and began before
    PostgreSQL crashed: if its xid was never made durable (its WAL still in shared buffers
    when the crash came), the restarted cluster may have given the xid to a new transaction,
    whose commit pg_xact_status then reports while the transfer's own row is absent. Not a
    disagreement of the pooler's. (Seen for a client killed a moment before the crash, on a
    loaded machine.) A transfer begun after the last restart has an xid of its own."""
    return (attempt.outcome is not Outcome.ACKNOWLEDGED
            and attempt.epoch < tally.faults.restarts
            and status == "committed" and not present)


class Run:
    """Shared state of one run: the clock, the random source, the kills that are due."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.tally = Tally()
        self.deadline = time.monotonic() + cfg.duration
        self.kills_due = 0
        self.late_cancels_due = 0
        self.kill_turns: Counter[tuple[str, ...]] = Counter()
        self.restarting = False

    def over(self) -> bool:
        return time.monotonic() >= self.deadline

    def stop(self) -> None:
        """End the run now: clients finish the transfer they are in, injectors stop."""
        self.deadline = time.monotonic()

    def new_transfer(self) -> Transfer:
        from_id, to_id = self.rng.sample(range(self.cfg.accounts), 2)
        return Transfer(str(uuid.uuid4()), from_id, to_id, self.rng.randint(1, 100))

    def take_kill(self, kills: tuple[str, ...]) -> str:
        """A kill flavour if a kill is due (the flavours taken in turn), else ''."""
        if self.kills_due <= 0:
            return ""
        self.kills_due -= 1
        self.kill_turns[kills] += 1
        return kills[self.kill_turns[kills] % len(kills)]

    def take_late_cancel(self) -> str:
        if self.late_cancels_due <= 0:
            return ""
        self.late_cancels_due -= 1
        return "cancel-late"

    async def sleep_until_over(self, seconds: float) -> bool:
        """Sleep up to `seconds`; False once the run is over."""
        left = self.deadline - time.monotonic()
        await asyncio.sleep(max(0.0, min(seconds, left)))
        return not self.over()


async def _client_loop(run: Run, n: int, dsn: str) -> None:
    cfg = run.cfg
    kind = DRIVERS[cfg.drivers[n % len(cfg.drivers)]]
    client: Client | None = None
    try:
        while not run.over():
            if client is None:
                try:
                    client = await asyncio.wait_for(
                        kind.connect(dsn, cfg.prepared), CONNECT_TIMEOUT * 2
                    )
                except Exception as exc:  # noqa: BLE001 - counted; PostgreSQL may be down
                    run.tally.connect_failures += 1
                    run.tally.connect_errors[f"{type(exc).__name__}: {exc}"[:120]] += 1
                    await asyncio.sleep(0.1)
                    continue
            how = run.take_kill(kind.kills) or run.take_late_cancel()
            single = how == "cancel-late" or (
                how in ("", "commit-eof", "commit-reset") and run.rng.random() < cfg.single_share
            )
            attempt = Attempt(run.new_transfer(), kind.driver, single, cfg.statement_ms / 1000,
                              epoch=run.tally.faults.restarts)
            run.tally.attempts.append(attempt)
            try:
                if how:
                    if how == "cancel-late":
                        dying = cancel_late(client, attempt, run.rng)
                    elif how.startswith("commit-"):
                        dying = commit_and_die(client, attempt)
                    else:
                        dying = doomed_transfer(client, attempt, how)
                    await asyncio.wait_for(dying, cfg.transfer_timeout)
                    if how == "cancel-late":
                        run.tally.faults.late_cancels += 1
                    else:
                        run.tally.faults.killed[f"{kind.driver} {how}"] += 1
                    run.tally.inherited_transactions += client.inherited
                    client = None
                else:
                    await asyncio.wait_for(transfer(client, attempt), cfg.transfer_timeout)
            except TimeoutError:
                attempt.error = "stalled"
                run.tally.stalled += 1
            except Exception as exc:  # noqa: BLE001 - recorded in the attempt
                attempt.error = f"{type(exc).__name__}: {exc}".strip()[:200]
            else:
                continue
            # Any error: this connection is done with. A fresh one for the next transfer.
            if client is not None:
                run.tally.inherited_transactions += client.inherited
                await client.close()
                client = None
    finally:
        if client is not None:
            run.tally.inherited_transactions += client.inherited
            await client.close()


async def _schedule_kills(run: Run) -> None:
    if run.cfg.kill_every <= 0:
        return
    while await run.sleep_until_over(run.rng.expovariate(1 / run.cfg.kill_every)):
        run.kills_due += 1


async def _schedule_late_cancels(run: Run) -> None:
    if run.cfg.late_cancel_every <= 0:
        return
    while await run.sleep_until_over(run.rng.expovariate(1 / run.cfg.late_cancel_every)):
        run.late_cancels_due += 1


async def _terminate_servers(run: Run, admin_dsn: str, dbname: str) -> None:
    """pg_terminate_backend() of one random server connection of the ledger database."""
    if run.cfg.terminate_every <= 0:
        return
    admin: psycopg.AsyncConnection[Any] | None = None
    try:
        while await run.sleep_until_over(run.rng.expovariate(1 / run.cfg.terminate_every)):
            if run.restarting:
                continue
            try:
                if admin is None or admin.closed:
                    admin = await psycopg.AsyncConnection.connect(
                        admin_dsn, autocommit=True, connect_timeout=int(CONNECT_TIMEOUT)
                    )
                cur = await admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND backend_type = 'client backend'"
                    " ORDER BY random() LIMIT 1",
                    (dbname,),
                )
                row = await cur.fetchone()
                if row and row[0]:
                    run.tally.faults.terminated += 1
            except psycopg.Error:
                if admin is not None:
                    await admin.close()
                admin = None  # PostgreSQL restarting: try again next time
    finally:
        if admin is not None:
            await admin.close()


async def _restart_postgres(run: Run, restart: Callable[[RestartMode], None] | None) -> None:
    if restart is None or run.cfg.restarts <= 0:
        return
    step = run.cfg.duration / (run.cfg.restarts + 1)
    for _ in range(run.cfg.restarts):
        if not await run.sleep_until_over(step):
            return
        run.restarting = True
        started = time.monotonic()
        try:
            await asyncio.to_thread(restart, run.cfg.restart_mode)
        finally:
            run.restarting = False
        run.tally.faults.restarts += 1
        run.tally.faults.restart_seconds += time.monotonic() - started


async def run_ledger(
    cfg: Config,
    pooler_dsn: str,
    admin_dsn: str,
    dbname: str,
    restart: Callable[[RestartMode], None] | None = None,
    stop_on_signal: bool = False,
) -> Tally:
    """Run `cfg.clients` clients through `pooler_dsn` (the ledger database) for
    `cfg.duration` seconds with the faults switched on. `admin_dsn` reaches PostgreSQL
    directly as a superuser (any database but the ledger's); `restart(mode)` restarts it.
    With `stop_on_signal`, SIGINT and SIGTERM end the run early, as if its time was up."""
    run = Run(cfg)
    if stop_on_signal:
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, run.stop)
    started = time.monotonic()
    injectors = [
        asyncio.create_task(_schedule_kills(run)),
        asyncio.create_task(_schedule_late_cancels(run)),
        asyncio.create_task(_terminate_servers(run, admin_dsn, dbname)),
        asyncio.create_task(_restart_postgres(run, restart)),
    ]
    clients = [asyncio.create_task(_client_loop(run, n, pooler_dsn)) for n in range(cfg.clients)]
    await asyncio.gather(*clients, *injectors)
    run.tally.seconds = time.monotonic() - started
    return run.tally


# -- the schema and the check ------------------------------------------------------------


def create_ledger(admin_dsn: str, dbname: str, owner: str, accounts: int, balance: int) -> None:
    """A fresh database `dbname` owned by `owner`: `accounts` accounts of `balance` each
    and an empty journal. `admin_dsn` is a superuser's, to any other database."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{dbname}" OWNER "{owner}"')
        conn.execute(f'ALTER DATABASE "{dbname}" SET synchronous_commit = on')
    with psycopg.connect(make_conninfo(admin_dsn, dbname=dbname), autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        conn.execute(
            "CREATE TABLE journal (transfer_id text PRIMARY KEY,"
            " from_id int NOT NULL, to_id int NOT NULL, amount int NOT NULL)"
        )
        conn.execute(
            "INSERT INTO accounts SELECT i, %s FROM generate_series(0, %s - 1) AS i",
            (balance, accounts),
        )
        for table in ("accounts", "journal"):
            conn.execute(f'ALTER TABLE {table} OWNER TO "{owner}"')


def drop_ledger(admin_dsn: str, dbname: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


def in_transaction_backends(admin_dsn: str, dbname: str) -> int:
    """Backends of `dbname` idle in a transaction (aborted or not) right now."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
            " AND state LIKE 'idle in transaction%%'",
            (dbname,),
        ).fetchone()
    return int(row[0]) if row else 0


@dataclass
class Verdict:
    """What PostgreSQL holds after the run, against what the clients were told."""

    total_expected: int
    total_found: int
    journal_rows: int
    missing_acknowledged: list[str]  # acknowledged, no row
    failed_with_row: list[str]  # certainly not committed (failed or killed), yet a row
    unexplained_rows: list[str]  # rows for transfers no client attempted
    mismatched_rows: list[str]  # a row that says another from/to/amount than was sent
    balance_mismatches: dict[int, tuple[int, int]]  # account: (from the journal, found)
    xid_disagreements: list[str]  # pg_xact_status says otherwise than the journal
    ambiguous_committed: int
    ambiguous_rolled_back: int
    inherited_transactions: int
    idle_in_transaction: int
    cancelled_innocents: list[str]  # a query cancelled that nobody meant to cancel
    misrouted_replies: list[str]  # a client got a reply naming another transfer

    def broken(self) -> list[str]:
        """One line per invariant that does not hold; empty when all do."""
        checks = [
            (
                self.total_found != self.total_expected,
                f"sum of balances {self.total_found}, expected {self.total_expected}",
            ),
            (
                bool(self.missing_acknowledged),
                f"{len(self.missing_acknowledged)} acknowledged transfers have no journal row: "
                f"{self.missing_acknowledged[:5]}",
            ),
            (
                bool(self.failed_with_row),
                f"{len(self.failed_with_row)} transfers that never sent COMMIT have a row: "
                f"{self.failed_with_row[:5]}",
            ),
            (
                bool(self.unexplained_rows),
                f"{len(self.unexplained_rows)} journal rows nobody wrote: "
                f"{self.unexplained_rows[:5]}",
            ),
            (
                bool(self.mismatched_rows),
                f"{len(self.mismatched_rows)} journal rows differ from what was sent: "
                f"{self.mismatched_rows[:5]}",
            ),
            (
                bool(self.balance_mismatches),
                f"{len(self.balance_mismatches)} accounts differ from initial + journal "
                f"(account: (expected, found)): {dict(list(self.balance_mismatches.items())[:5])}",
            ),
            (
                bool(self.xid_disagreements),
                f"{len(self.xid_disagreements)} transactions whose pg_xact_status disagrees "
                f"with the journal: {self.xid_disagreements[:5]}",
            ),
            (
                self.inherited_transactions > 0,
                f"{self.inherited_transactions} BEGINs found a transaction already open",
            ),
            (
                self.idle_in_transaction > 0,
                f"{self.idle_in_transaction} backends left idle in transaction",
            ),
            (
                bool(self.misrouted_replies),
                f"{len(self.misrouted_replies)} replies reached the wrong client:"
                f" {self.misrouted_replies[:5]}",
            ),
            (
                bool(self.cancelled_innocents),
                f"{len(self.cancelled_innocents)} queries cancelled in clients nobody"
                f" cancelled: {self.cancelled_innocents[:5]}",
            ),
        ]
        return [message for failed, message in checks if failed]


def check(cfg: Config, tally: Tally, admin_dsn: str, dbname: str) -> Verdict:
    """Read the ledger directly on PostgreSQL (`admin_dsn`: a superuser, any database)
    and hold it against `tally`. Call once the pooler's clients have all gone."""
    ledger_dsn = make_conninfo(admin_dsn, dbname=dbname)
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        balances = dict(conn.execute("SELECT id, balance FROM accounts").fetchall())
        journal = {
            row[0]: row[1:]
            for row in conn.execute("SELECT transfer_id, from_id, to_id, amount FROM journal")
        }
        xids = [a.xid for a in tally.attempts if a.xid is not None]
        status = dict(
            conn.execute(
                "SELECT x, pg_xact_status(x::xid8) FROM unnest(%s::text[]) AS x", (xids,)
            ).fetchall()
        )
    by_id = {a.transfer.id: a for a in tally.attempts}

    expected = {account: cfg.initial_balance for account in range(cfg.accounts)}
    for from_id, to_id, amount in journal.values():
        expected[from_id] -= amount
        expected[to_id] += amount
    ambiguous = [a for a in tally.attempts if a.outcome is Outcome.AMBIGUOUS]
    return Verdict(
        total_expected=cfg.accounts * cfg.initial_balance,
        total_found=sum(balances.values()),
        journal_rows=len(journal),
        missing_acknowledged=[
            a.transfer.id
            for a in tally.attempts
            if a.outcome is Outcome.ACKNOWLEDGED and a.transfer.id not in journal
        ],
        failed_with_row=[
            a.transfer.id
            for a in tally.attempts
            if a.outcome in (Outcome.FAILED, Outcome.KILLED) and a.transfer.id in journal
        ],
        unexplained_rows=[tid for tid in journal if tid not in by_id],
        mismatched_rows=[
            tid
            for tid, row in journal.items()
            if tid in by_id
            and row
            != (by_id[tid].transfer.from_id, by_id[tid].transfer.to_id, by_id[tid].transfer.amount)
        ],
        balance_mismatches={
            account: (expected[account], balances.get(account, 0))
            for account in expected
            if balances.get(account) != expected[account]
        },
        xid_disagreements=[
            f"{a.transfer.id} ({a.outcome.value}, xid {a.xid} {status.get(a.xid)},"
            f" row {'present' if a.transfer.id in journal else 'absent'})"
            for a in tally.attempts
            if a.xid is not None
            and (status.get(a.xid) == "committed") != (a.transfer.id in journal)
            and not _xid_reused(a, tally, status.get(a.xid), a.transfer.id in journal)
        ],
        ambiguous_committed=sum(1 for a in ambiguous if a.transfer.id in journal),
        ambiguous_rolled_back=sum(1 for a in ambiguous if a.transfer.id not in journal),
        inherited_transactions=tally.inherited_transactions,
        idle_in_transaction=in_transaction_backends(admin_dsn, dbname),
        # Only the "cancel" kills and late cancels send a CancelRequest; either may hit
        # its own query, never another client's.
        cancelled_innocents=[
            a.transfer.id
            for a in tally.attempts
            if not (a.killed or a.own_cancel) and QUERY_CANCELED_MESSAGE in a.error
        ],
        misrouted_replies=[
            f"{a.transfer.id} got {a.misrouted!r}" for a in tally.attempts if a.misrouted
        ],
    )


def summary(name: str, tally: Tally, verdict: Verdict, verbose: bool = False) -> str:
    f = tally.faults
    killed = ", ".join(f"{how} {n}" for how, n in sorted(f.killed.items())) or "none"
    errors = Counter(a.error.split(":")[0] for a in tally.attempts if a.error)
    lines = [
        f"== {name}: {tally.seconds:.1f} s",
        f"transfers attempted   {len(tally.attempts)}",
        f"  acknowledged        {tally.count(Outcome.ACKNOWLEDGED)}",
        f"  failed              {tally.count(Outcome.FAILED)}"
        f" (stalled {tally.stalled}; connect failures besides: {tally.connect_failures})",
        f"  killed mid-transaction {tally.count(Outcome.KILLED)}",
        f"  ambiguous           {tally.count(Outcome.AMBIGUOUS)}"
        f" (committed {verdict.ambiguous_committed},"
        f" rolled back {verdict.ambiguous_rolled_back})",
        f"  sent as one statement {sum(a.single for a in tally.attempts)}"
        f" ({sum(a.single and a.acknowledged for a in tally.attempts)} acknowledged)",
        f"journal rows          {verdict.journal_rows}",
        f"faults: servers terminated {f.terminated}; clients killed: {killed};"
        f" late cancels {f.late_cancels}; PostgreSQL restarts {f.restarts}"
        f" ({f.restart_seconds:.1f} s)",
        "errors seen: " + (", ".join(f"{k} {n}" for k, n in errors.most_common(6)) or "none"),
    ]
    if verbose:
        lines.append("distinct errors (first lines):")
        firsts = Counter(a.error.splitlines()[0] for a in tally.attempts if a.error)
        lines += [f"  {n:5d} x {text}" for text, n in firsts.most_common(20)]
        lines += [f"  {n:5d} x connect: {text}" for text, n in tally.connect_errors.most_common(10)]
    broken = verdict.broken()
    lines.append("invariants: all held" if not broken else "invariants BROKEN:")
    lines += [f"  - {line}" for line in broken]
    return "\n".join(lines)


# -- standalone: a throwaway cluster and each pooler in turn -------------------------------


APP_USER, APP_PASSWORD = "ledger_app", "ledger-secret"


def _start_pooler(
    kind: str, pg: Any, dbname: str, pool_size: int, work: Path, extra: str = ""
) -> tuple[subprocess.Popen[bytes], int]:
    from pypool.embedded import free_port

    port = free_port()
    userlist = work / "userlist.txt"
    userlist.write_text(f'"{APP_USER}" "{pg.scram_verifier(APP_USER)}"\n')
    ini = work / f"{kind}.ini"
    ini.write_text(
        f"[databases]\n{dbname} = host={pg.host} port={pg.port} dbname={dbname}\n\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = scram-sha-256\nauth_file = {userlist}\npool_mode = transaction\n"
        f"default_pool_size = {pool_size}\nmax_client_conn = 1000\n"
        "server_login_retry = 1\nquery_wait_timeout = 30\n"
        "log_connections = 0\nlog_disconnections = 0\n" + extra
    )
    log = open(work / f"{kind}.log", "ab")
    if kind == "pgbouncer":
        kwargs: dict[str, Any] = {}
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            for path in (work, userlist, ini, work / f"{kind}.log"):
                shutil.chown(path, "postgres", "postgres")
            kwargs = {"user": "postgres", "group": "postgres"}
        argv = ["/usr/sbin/pgbouncer", str(ini)]
    else:
        kwargs = {"env": {**os.environ, "PYTHONPATH": str(REPO)}}
        argv = [sys.executable, "-m", "pypool", str(ini)]
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=work, **kwargs
    )
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit((work / f"{kind}.log").read_text()) from None
            time.sleep(0.1)


def _stop_pooler(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per pooler")
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--pool-size", type=int, default=4, help="default_pool_size")
    parser.add_argument(
        "--pipeline-depth", type=int, default=0, help="pypool's pipeline_depth (its default: 0)"
    )
    parser.add_argument("--accounts", type=int, default=50)
    parser.add_argument(
        "--terminate-every",
        type=float,
        default=0.5,
        help="mean seconds between servers terminated (0: none)",
    )
    parser.add_argument(
        "--kill-every",
        type=float,
        default=0.5,
        help="mean seconds between clients killed mid-transaction (0: none)",
    )
    parser.add_argument("--restarts", type=int, default=1, help="PostgreSQL restarts per run")
    parser.add_argument("--restart-mode", choices=("immediate", "fast"), default="immediate")
    parser.add_argument("--drivers", default="psycopg,asyncpg")
    parser.add_argument(
        "--single-share",
        type=float,
        default=0.5,
        help="share of transfers sent as one statement (pipelined by pypool)",
    )
    parser.add_argument(
        "--statement-ms",
        type=float,
        default=0.0,
        help="pg_sleep in each single-statement transfer, in milliseconds",
    )
    parser.add_argument(
        "--late-cancel-every",
        type=float,
        default=0.05,
        help="mean seconds between late cancels, racing the end of a statement (0: none)",
    )
    parser.add_argument(
        "--poolers",
        default="pypool",
        help="pypool, pgbouncer (/usr/sbin/pgbouncer), or both: pypool,pgbouncer",
    )
    parser.add_argument(
        "--no-prepared",
        action="store_true",
        help="no named prepared statements for pypool either (PgBouncer 1.18 never gets them)",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--verbose", action="store_true", help="list the distinct errors")
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from pypool.embedded import EmbeddedPostgres

    # Outside a run (which stops early and is checked), SIGTERM or SIGHUP leave through
    # the finally blocks, which stop the pooler and the cluster and remove their folders.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))

    pg = EmbeddedPostgres()
    pg.start()
    work = Path(tempfile.mkdtemp(prefix="pypool-ledger-"))
    os.chmod(work, 0o755)
    all_held = True
    try:
        pg.create_role(APP_USER, APP_PASSWORD)
        for n, kind in enumerate(args.poolers.split(",")):
            cfg = Config(
                duration=args.duration,
                clients=args.clients,
                accounts=args.accounts,
                drivers=tuple(args.drivers.split(",")),
                # PgBouncer before 1.21 cannot keep prepared statements in transaction mode
                prepared=kind == "pypool" and not args.no_prepared,
                terminate_every=args.terminate_every,
                kill_every=args.kill_every,
                restarts=args.restarts,
                restart_mode=args.restart_mode,
                single_share=args.single_share,
                late_cancel_every=args.late_cancel_every,
                statement_ms=args.statement_ms,
                seed=args.seed,
            )
            dbname = f"ledger_{n}"
            create_ledger(pg.dsn(), dbname, APP_USER, cfg.accounts, cfg.initial_balance)
            extra = f"pipeline_depth = {args.pipeline_depth}\n" if kind == "pypool" else ""
            proc, port = _start_pooler(kind, pg, dbname, args.pool_size, work, extra)
            try:
                dsn = f"postgresql://{APP_USER}:{APP_PASSWORD}@127.0.0.1:{port}/{dbname}"
                tally = asyncio.run(
                    run_ledger(
                        cfg,
                        dsn,
                        pg.dsn(),
                        dbname,
                        restart=lambda mode: pg.restart(mode, keep_commits=False),
                        stop_on_signal=True,
                    )
                )
                # A pooler gets a moment to roll back after its last clients left.
                deadline = time.monotonic() + 5
                while in_transaction_backends(pg.dsn(), dbname) and time.monotonic() < deadline:
                    time.sleep(0.1)
                verdict = check(cfg, tally, pg.dsn(), dbname)
            finally:
                _stop_pooler(proc)
            depth = f", pipeline_depth {args.pipeline_depth}" if kind == "pypool" else ""
            print(
                summary(
                    f"{kind}, {cfg.clients} clients, pool {args.pool_size}{depth}",
                    tally,
                    verdict,
                    args.verbose,
                ),
                flush=True,
            )
            all_held = all_held and not verdict.broken()
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all_held else 1


if __name__ == "__main__":
    sys.exit(main())
