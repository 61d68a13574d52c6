"""pypool: a readable transaction-mode PostgreSQL connection pooler, drop-in for PgBouncer."""

__version__ = "0.1.0"
