"""pypool: a readable transaction-mode PostgreSQL connection pooler, drop-in for PgBouncer."""

from . import compiled

__version__ = "0.1.0"

compiled.choose()  # the hot path's mypyc extensions, or its Python source (see compiled.py)
