"""pypool: a readable transaction-mode PostgreSQL connection pooler, drop-in for PgBouncer."""

from . import compiled

__version__ = "0.1.0"
# The PgBouncer release whose console and defaults pypool answers as (SHOW VERSION, the
# pgbouncer.version ParameterStatus): tools gate features on it.
PGBOUNCER_VERSION = "1.24.1"

compiled.choose()  # the hot path's mypyc extensions, or its Python source (see compiled.py)
