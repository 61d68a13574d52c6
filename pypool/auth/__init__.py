"""Authentication, both sides, as steps that take and return bytes (no sockets here).

`auth_file` reads userlist.txt; `scram` is the client-facing server side and the
server-facing client side (scramp's with a plaintext password, its own with a ClientKey
recovered from a client's proof); `md5` is PostgreSQL's md5 scheme;
`server_credentials` is what the pooler logs into PostgreSQL with.
"""
