"""A server that is starting up (or shutting down) refuses logins with SQLSTATE 57P03
("the database system is starting up"). That is a passing state, not a broken login: as
PgBouncer does, pypool fails no one for it and keeps no cached error; the clients queued
wait for the next try, server_login_retry later. Any other login error still fails them
at once (test_guarantees.py, section 6).
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from typing import Any

import psycopg
import pytest

from pypool.protocol import messages as m
from tests.integration.app_client import connect
from tests.integration.tcp_pipe import pipe

pytestmark = pytest.mark.timeout(60)


class StartingUpServer:
    """A TCP relay to PostgreSQL that answers the first `refusals` logins itself with
    PostgreSQL's FATAL 57P03, as a server still starting up does, then relays the rest."""

    def __init__(self, target: tuple[str, int], refusals: int) -> None:
        self.target = target
        self.refusals = refusals
        self.refused_at: list[float] = []
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self.loop).result(5)
        self.port: int = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readexactly(8)
            length, _ = struct.unpack("!II", head)
            if len(self.refused_at) < self.refusals:
                await reader.readexactly(length - 8)
                self.refused_at.append(time.monotonic())
                writer.write(m.error_response("the database system is starting up", "57P03",
                                              "FATAL"))
                await writer.drain()
                return
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            up_writer.write(head)
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shut(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_clients_wait_for_a_server_that_is_starting_up(postgres: Any, pooler: Any) -> None:
    proxy = StartingUpServer((postgres.host, postgres.port), refusals=2)
    try:
        p = pooler(ini_overrides={"server_login_retry": "1", "query_wait_timeout": "20"},
                   databases={"app": f"host=127.0.0.1 port={proxy.port} dbname=app"})
        results: list[Any] = []

        def one() -> None:
            try:
                with connect(p.dsn()) as conn:
                    results.append(conn.execute("SELECT 7").fetchone())
            except psycopg.Error as exc:
                results.append(exc)

        start = time.monotonic()
        first = threading.Thread(target=one)
        first.start()
        time.sleep(0.3)  # after the first refusal: a second client, no cached error for it
        second = threading.Thread(target=one)
        second.start()
        first.join(15)
        second.join(15)
        assert results == [(7,), (7,)], results
        assert len(proxy.refused_at) == 2
        # One try per server_login_retry, not a storm of them.
        assert proxy.refused_at[1] - proxy.refused_at[0] >= 0.9
        assert time.monotonic() - start >= 1.8
        assert "server login failed: FATAL the database system is starting up" in p.log()
        assert "cached error" not in p.log()
    finally:
        proxy.close()
