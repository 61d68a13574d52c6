"""One pool per (database, user): its servers, its waiting clients, its counters.

Theory of operation. A server is in exactly one of four places: `login` (connecting and
authenticating), `idle` (a LIFO stack: the most recently used server is reused first, so the
others can age out through server_idle_timeout), `active` (linked to a client), or
`being_canceled` (free, but a CancelRequest aimed at its last client's query is still on its
way: handed to anyone now, the cancel could hit their query; PgBouncer's
sv_being_canceled). Each move takes a server out of the place it was in (`logged_in`,
`take_idle`, `put_idle`, `park_canceled`, `unpark`, `forget`); a server whose login just
ended or whose cancels just landed is `active` for the step that hands it to a client or
puts it idle, so a link and a release look at no other place (`listed_twice` names a
slip; the net unit tests also check that no open server is in none). Clients that need a
server and find none idle wait in `waiting`, served first-in first-out. Both orders are the
defaults of swappable policies (pooling/policies.py): `queue_policy` and `server_policy`
choose from `waiting` (kept in arrival order) and `idle` (kept in release order); None, the
default, pops inline with no call. The pool never opens sockets itself: `servers_wanted`
tells the asyncio layer how many to open, within pool_size (plus reserve_pool_size once a
client has waited reserve_pool_timeout) and the database-wide and user-wide caps.

Whether a server is idle is said twice, on purpose. Its ServerState (core/states.py) is the
truth about the connection: its transitions are checked (a server is LINKED only from IDLE;
one handed straight from a finished client to a waiting one stays ACTIVE), and a closing
server keeps it until its connection is gone. `idle` is an index over the pool's servers in
that state, in release order: the LIFO choice in O(1), the bottom of the stack for
server_idle_timeout and eviction, the list a server policy chooses from. Neither is derived
from the other: the list from the states would be a scan of every server at each link, and
the state from the list a search of it at each check. So they move together, in
pooler/linking.py (`server_available`: a link to a waiting client, or FREED then
`put_idle`; a link of an idle one: `take_idle`, then LINKED), pooler/replication.py (a
dedicated server: FREED and LINKED at once) and pooler/teardown.py (an idle server is
forgotten before it is closed), and `idle_out_of_step` names any server where they
disagree: none, whenever the pooler is between two events (the unit tests check it after
every step, tests/net/fakes.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.states import ServerState
from .listening import Listening
from .stats import WAIT_BUCKETS, XACT_BUCKETS, buckets


@dataclass
class PoolLimits:
    """The sizes that govern one pool, resolved from [databases], [users] and [pgbouncer]."""

    pool_size: int
    min_pool_size: int
    reserve_pool_size: int
    reserve_pool_timeout: float
    pool_mode: str
    server_lifetime: float = 3600.0  # [databases] server_lifetime, else [pgbouncer]'s
    # [users], else [databases], else [pgbouncer] query_wait_timeout (0: none)
    query_wait_timeout: float = 120.0
    # What a statement that changes session state does (transaction mode): follow, reject,
    # ignore (docs/session-state.md).
    session_state: str = "follow"


@dataclass
class PoolStats:
    """Plain integer counters, read by the admin console and metrics at their own pace."""

    server_assignment_count: int = 0
    xact_count: int = 0
    query_count: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    xact_time_us: int = 0
    query_time_us: int = 0
    wait_time_us: int = 0
    client_parse_count: int = 0
    server_parse_count: int = 0
    bind_count: int = 0
    client_login_count: int = 0  # clients logged in to this pool (PgBouncer 1.26)
    # Transactions queued on a busy server behind another client's (net/pipeline.py).
    pipelined_count: int = 0
    # Session state (pooling/session_state/): clients pinned to their server, statements
    # refused (session_state = reject), servers whose settings were synced for a client.
    session_pinned: int = 0
    session_refused: int = 0
    session_synced: int = 0
    # NotificationResponses written to clients from the pool's listening connection.
    notifications_delivered: int = 0
    # Prepared statements (incremented by the prepared-statement layer): a client's statement
    # already on the server it landed on (hit), one that had to be parsed there first (miss),
    # and one closed to make room under max_prepared_statements (eviction).
    prepared_hits: int = 0
    prepared_misses: int = 0
    prepared_evictions: int = 0
    # Errors by kind: "server" (an ErrorResponse relayed), or the pooler's own message
    # ("query_wait_timeout", "server_login_failed", ...).
    errors: dict[str, int] = field(default_factory=dict)
    # Histograms (pooling/stats.py): seconds a client waited in the queue (only clients that
    # waited), over WAIT_BUCKETS, and transaction times, over XACT_BUCKETS. Counted only
    # with metrics_port set (`Pooler.histograms`): /metrics is their one reader.
    wait_counts: list[int] = field(default_factory=lambda: buckets(WAIT_BUCKETS))
    xact_counts: list[int] = field(default_factory=lambda: buckets(XACT_BUCKETS))

    def count_error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


class Pool:
    """Servers and waiting clients of one (database, user). Servers and clients are opaque."""

    def __init__(self, database: str, user: str, limits: PoolLimits,
                 queue_policy: Any = None, server_policy: Any = None) -> None:
        self.database = database
        self.user = user
        self.limits = limits
        # pooling/policies.py's QueuePolicy and ServerPolicy; None: fifo and lifo, inline.
        self.queue_policy: Any = queue_policy
        self.server_policy: Any = server_policy
        self.idle: list[Any] = []
        self.active: set[Any] = set()
        self.login: set[Any] = set()
        self.being_canceled: set[Any] = set()
        self.waiting: deque[Any] = deque()
        # Its append and popleft, bound once: compiled code looks a deque's method up at
        # every call (bench/README.md, "Looked up by name"), and both run per transaction.
        self._join: Callable[[Any], None] = self.waiting.append
        self._next: Callable[[], Any] = self.waiting.popleft
        # Authenticated replication clients waiting for room for a server of their own
        # (pooler/replication.py), oldest first; None while none waits, as almost always.
        self.replication_waiting: deque[Any] | None = None
        # Busy servers that could take one more client's transaction behind their last one
        # (net/pipeline.py), most recent last; may be stale, checked when used.
        self.open_lines: list[Any] = []
        self.clients: set[Any] = set()
        # Clients past authentication waiting for server_params before their welcome.
        self.awaiting_params: list[Any] = []
        # ParameterStatus values of the first server to log in, shown to clients at login.
        self.server_params: dict[str, str] | None = None
        # The last server login error and when it happened (server_login_retry).
        self.login_error: tuple[bytes, float] | None = None
        self.paused = False  # PAUSE (or SIGUSR1): no server handed out, servers closed on release
        self.disabled = False  # DISABLE: new clients refused; the connected ones carry on
        self.removed = False  # its database left the config: no new clients, the rest carry on
        self.stats = PoolStats()
        # Its clients' LISTENs and its listening connection (listen_mode = shared;
        # pooling/listening.py); None until a client first LISTENs.
        self.listening: Listening | None = None
        # The janitor's last sweep that found it in use (pool_idle_timeout counts from it).
        self.last_used = 0.0

    def unused(self) -> bool:
        """No client and no server of any kind: nothing would be lost with it but counters."""
        return not (self.clients or self.server_count or self.waiting or self.awaiting_params)

    @property
    def server_count(self) -> int:
        return len(self.idle) + len(self.active) + len(self.login) + len(self.being_canceled)

    def below(self, limit: int) -> bool:
        """Whether the pool holds fewer than `limit` servers. The two places most servers are
        in are counted first: under load that answers, and the other two are not looked at."""
        held = len(self.active) + len(self.idle)
        return held < limit and held + len(self.login) + len(self.being_canceled) < limit

    def take_idle(self) -> Any | None:
        """The most recently released idle server (or the server policy's choice), moved to
        active; None if there is none."""
        if not self.idle:
            return None
        policy = self.server_policy
        server = self.idle.pop() if policy is None else policy.take(self.idle)
        self.active.add(server)
        return server

    def put_idle(self, server: Any) -> None:
        """An active server has nothing to do."""
        self.active.discard(server)
        self.idle.append(server)

    def logged_in(self, server: Any) -> None:
        """Its login is over: active until it is handed to a client or put idle, at once."""
        self.login.discard(server)
        self.active.add(server)

    def park_canceled(self, server: Any) -> None:
        """A free server that a cancel in flight may still hit: out of reach until it lands."""
        self.active.discard(server)
        self.being_canceled.add(server)

    def unpark(self, server: Any) -> None:
        """The cancels aimed at a parked server landed: active until it is handed to a client
        or put idle, at once."""
        self.being_canceled.discard(server)
        self.active.add(server)

    def forget(self, server: Any) -> None:
        """The server is closed: drop it from wherever it was."""
        self.active.discard(server)
        self.login.discard(server)
        self.being_canceled.discard(server)
        for where in (self.idle, self.open_lines):
            try:
                where.remove(server)
            except ValueError:
                pass

    def idle_out_of_step(self) -> list[Any]:
        """The servers whose ServerState disagrees with where this pool lists them: in
        `idle` but not IDLE, or IDLE in `active`, `login` or `being_canceled` (see the module
        docstring). A closing server the pool has forgotten is in none of them. For tests
        and debugging: it looks at every server."""
        idle = ServerState.IDLE
        wrong = [server for server in self.idle if server.state is not idle]
        for listed in (self.active, self.login, self.being_canceled):
            wrong.extend(server for server in listed if server.state is idle)
        return wrong

    def servers(self) -> list[Any]:
        """Every server in one of the four places (not those closing, already forgotten)."""
        return [*self.idle, *self.active, *self.login, *self.being_canceled]

    def close_pending(self) -> bool:
        """Whether a server tagged to close instead of serving again (`close_needed`:
        RECONNECT, a changed [databases] entry) is still in the pool."""
        return any(server.close_needed for server in self.servers())

    def listed_twice(self) -> list[Any]:
        """The servers in more than one of the four places (none ever should be: each move
        takes a server out of the place it was in). For tests and debugging."""
        seen: set[int] = set()
        twice = []
        for server in self.servers():
            if id(server) in seen:
                twice.append(server)
            seen.add(id(server))
        return twice

    def enqueue(self, client: Any) -> None:
        self._join(client)

    def dequeue(self) -> Any | None:
        """The oldest waiting client (or the queue policy's choice); None if none waits."""
        if not self.waiting:
            return None
        policy = self.queue_policy
        return self._next() if policy is None else policy.take(self.waiting)

    def unqueue(self, client: Any) -> None:
        try:
            self.waiting.remove(client)
        except ValueError:
            pass

    def servers_wanted(
        self, now: float, oldest_wait_start: float | None, room_db: int, room_user: int,
        lined: int = 0,
    ) -> int:
        """How many new servers to open now.

        Enough for the waiting clients not already covered by logins in progress, and for
        min_pool_size, within pool_size (or pool_size + reserve_pool_size when the oldest
        waiter has waited reserve_pool_timeout) and the room left under max_db_connections
        and max_user_connections. `lined` clients are queued on busy servers behind others
        (pipelining): they wait too, and count as waiting for the reserve pool.
        """
        limits = self.limits
        cap = limits.pool_size
        if (
            limits.reserve_pool_size > 0
            and oldest_wait_start is not None
            and now - oldest_wait_start >= limits.reserve_pool_timeout
        ):
            cap += limits.reserve_pool_size
        need = len(self.waiting) + lined - len(self.login)
        if self.awaiting_params and self.server_params is None and not self.login:
            need = max(need, 1)
        need = max(need, limits.min_pool_size - self.server_count)
        room = min(cap - self.server_count, room_db, room_user)
        return max(0, min(need, room))
