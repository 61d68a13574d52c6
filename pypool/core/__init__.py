"""The sans-IO connection core: what each connection has sent and is owed, as plain state.

Nothing here imports asyncio or touches a socket. The asyncio Protocols in `net/` feed it the
message types they see and act on what it returns; tests feed it byte sequences
(tests/core/).

- `ledger`: the frontend ledger, what a client has sent and is still owed (ReadyForQuery per
  Query, FunctionCall and Sync; COPY sub-states for the simple and the extended protocol),
  which decides when its server may go back to the pool.
- `frontend`: the request reader, a client's bytes after login: framed, counted in its
  ledger, rewritten for prepared statements.
- `replies`: the reply reader, a server's bytes after login: framed, forwarded, stopped at
  each ReadyForQuery and at each settled pooler-issued query.
- `backend`: the backend ledger (the pooler's own queries in flight on a server).
- `states`: the (state, event) -> state tables of a client and a server connection.
- `link`: the life of a client's link to a server, one (state, event) -> (state, actions)
  table, and what a client's ReadyForQuery means for its server (`ready_event`).
- `exchange`: how a login exchange runs, a generator sent bytes that yields bytes (`advance`).
- `client_login`: a client logging into the pooler: the startup packet, then the cleartext,
  md5 or SCRAM-SHA-256 password exchange (mock SCRAM for an unknown user).
- `server_login`: the pooler logging into PostgreSQL: StartupMessage, the Authentication
  requests, ParameterStatus and BackendKeyData up to ReadyForQuery, or ServerLoginError.
- `socket_ids`: the one id sequence of client and server connections (SHOW's `id`).
"""
