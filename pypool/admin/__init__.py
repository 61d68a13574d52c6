"""The admin console on the virtual database `pgbouncer` (alias `pypool`)."""
