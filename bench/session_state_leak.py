"""Make session state leak from one client to the next, and watch the guard catch it
(docs/lab/README.md, exercise 3).

    python3 bench/session_state_leak.py --session-state ignore|follow|reject

Starts a throwaway PostgreSQL and a pypool in front of it (transaction mode, a pool of two
servers, trust login) with the `session_state` given (docs/session-state.md). Two clients,
A and B, connected at once and taking turns, each statement its own transaction. A sets
its search_path and creates a temporary table; B looks for both, then says where it runs.
Each statement is printed with its answer and, for a SELECT, the backend that ran it
(`pg_backend_pid()`): with statements one after another, the pool hands B the server A has
just released.

- `ignore` (PgBouncer's behaviour): B runs on A's server and gets A's search_path and
  A's temporary table.
- `follow` (pypool's default): B gets its own search_path on that same server (the pooler
  undoes A's SET for B and makes it again for A), and A's temporary table keeps A on its
  server (pinned), so B runs on another one and finds no table.
- `reject`: the SET and the CREATE TEMP TABLE fail with SQLSTATE 0A000; A stays connected.

Then the pooler's own log lines about it (pinned, refused) and what leaked, if anything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pypool.embedded import EmbeddedPostgres, free_port, wait_listening  # noqa: E402

SEARCH_PATH = "lab, public"
SHOW_PATH = "SELECT current_setting('search_path'), pg_backend_pid()"
READ_NOTES = "SELECT note, pg_backend_pid() FROM pg_temp.notes"
STEPS = (
    ("A", "SET search_path = lab, public"),
    ("A", SHOW_PATH),
    ("B", SHOW_PATH),
    ("A", SHOW_PATH),
    ("A", "CREATE TEMP TABLE notes (note text)"),
    ("A", "INSERT INTO notes VALUES ('written by A')"),
    ("B", READ_NOTES),
    ("A", READ_NOTES),
    ("B", "SELECT pg_backend_pid()"),
)


def run(conn: Any, sql: str) -> tuple[str, list[Any]]:
    """What the client was answered: the command tag or the error, and the row."""
    import psycopg

    try:
        cur = conn.execute(sql)
    except psycopg.Error as error:
        diag = error.diag
        return f"ERROR {diag.sqlstate}: {diag.message_primary}", []
    row = list(cur.fetchone() or []) if cur.description else []
    return (cur.statusmessage or ""), row


def verdict(answers: dict[int, tuple[str, list[Any]]]) -> list[str]:
    """What reached B, and what A kept, from the steps' answers (indexes into STEPS)."""
    lines = []
    b_path, a_path = answers[2][1], answers[3][1]
    if answers[0][0].startswith("ERROR"):
        lines.append(f"search_path: A's SET was refused ({answers[0][0].split(':')[0]})")
    elif b_path and b_path[0] == SEARCH_PATH:
        lines.append("search_path: LEAKED, B got A's setting")
    elif b_path and a_path and a_path[0] == SEARCH_PATH:
        same = "on the same server" if b_path[1] == a_path[1] else "on another server"
        lines.append(f"search_path: kept per client ({same}): B has {b_path[0]}, "
                     f"A has {a_path[0]}")
    b_notes, a_notes = answers[6], answers[7]
    if answers[4][0].startswith("ERROR"):
        lines.append(f"temp table: A's CREATE TEMP TABLE was refused "
                     f"({answers[4][0].split(':')[0]})")
    elif b_notes[1]:
        lines.append(f"temp table: LEAKED, B read A's row '{b_notes[1][0]}'")
    elif a_notes[1]:
        lines.append(f"temp table: stayed with A (backend {a_notes[1][1]}); B, on backend "
                     f"{answers[8][1][0]}, got {b_notes[0].split(':')[0]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--session-state", choices=("ignore", "follow", "reject"),
                        default="follow")
    args = parser.parse_args()
    import psycopg

    work = Path(tempfile.mkdtemp(prefix="pypool-leak-"))
    pg = EmbeddedPostgres()
    pg.start()
    try:
        pg.create_role("app", "app-secret")
        pg.execute("CREATE DATABASE app OWNER app")
        port = free_port()
        (work / "userlist.txt").write_text('"app" ""\n')  # trust admits the users it lists
        (work / "pypool.ini").write_text(
            f"[databases]\napp = host={pg.host} port={pg.port} dbname=app user=app "
            f"password=app-secret\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
            f"listen_port = {port}\nunix_socket_dir =\nauth_type = trust\n"
            f"auth_file = {work / 'userlist.txt'}\npool_mode = transaction\n"
            f"default_pool_size = 2\nsession_state = {args.session_state}\n"
            f"log_connections = 0\nlog_disconnections = 0\n")
        log_path = work / "pypool.log"
        with open(log_path, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "pypool", str(work / "pypool.ini")],
                                    cwd=HERE.parent, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_listening(port)
            dsn = f"host=127.0.0.1 port={port} user=app dbname=app"
            with psycopg.connect(dsn, autocommit=True) as a, \
                    psycopg.connect(dsn, autocommit=True) as b:
                clients = {"A": a, "B": b}
                for name, conn in clients.items():
                    conn.add_notice_handler(
                        lambda d, name=name: print(f"{name}  NOTICE: {d.message_primary}"))
                print(f"## session_state = {args.session_state}")
                answers = {}
                for index, (name, sql) in enumerate(STEPS):
                    answer, row = run(clients[name], sql)
                    answers[index] = (answer, row)
                    shown = " | ".join([*map(str, row[:-1]), f"backend {row[-1]}"]) if row \
                        else answer
                    print(f"{name}> {sql}\n   {shown}")
            time.sleep(0.3)  # the pooler's last log lines
        finally:
            proc.terminate()
            proc.wait(10)
        print("## the pooler's log")
        for line in log_path.read_text(errors="replace").splitlines():
            if "pinned" in line or "refused" in line:
                print(line.split(" INFO ", 1)[-1])
        print("## what happened")
        print("\n".join(verdict(answers)))
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
