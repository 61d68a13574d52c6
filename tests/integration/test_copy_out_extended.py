"""COPY ... TO STDOUT through the extended protocol in libpq's pipeline mode, as PgBouncer
1.25's suite runs it (test_copy.py::test_copy_stdout_extended)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import pq

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("prepared", ["0", "100"], ids=["unprepared", "prepared-statements"])
def test_copy_to_stdout_in_a_pipeline(pooler, postgres, prepared):
    postgres.execute("CREATE TABLE IF NOT EXISTS copy_out_x (i int)", dbname="app")
    postgres.execute("TRUNCATE copy_out_x", dbname="app")
    postgres.execute("INSERT INTO copy_out_x VALUES (1), (2)", dbname="app")
    postgres.execute("GRANT ALL ON copy_out_x TO app", dbname="app")
    p = pooler({"max_prepared_statements": prepared})
    for _ in range(2):  # and the server is whole for the next transaction
        with psycopg.connect(p.dsn(), connect_timeout=5) as conn:
            pg = conn.pgconn
            pg.enter_pipeline_mode()
            pg.send_query_params(b"COPY (SELECT i FROM copy_out_x ORDER BY i) TO STDOUT", [])
            pg.pipeline_sync()
            assert pg.get_result().status == pq.ExecStatus.COPY_OUT
            assert pg.get_copy_data(0) == (2, b"1\n")
            assert pg.get_copy_data(0) == (2, b"2\n")
            assert pg.get_copy_data(0) == (-1, b"")
            assert pg.get_result().status == pq.ExecStatus.COMMAND_OK
            assert pg.get_result() is None
            assert pg.get_result().status == pq.ExecStatus.PIPELINE_SYNC
            pg.exit_pipeline_mode()
            assert conn.execute("SELECT 1").fetchone() == (1,)
