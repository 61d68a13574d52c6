"""The sans-IO connection core: what each connection has sent and is owed, as plain state.

Nothing here imports asyncio or touches a socket. The asyncio Protocols in `net/` feed it the
message types they see and act on what it returns; tests feed it byte sequences
(tests/core/).

- `ledger`: the frontend ledger, what a client has sent and is still owed (ReadyForQuery per
  Query, FunctionCall and Sync; COPY sub-states for the simple and the extended protocol),
  which decides when its server may go back to the pool.
"""
