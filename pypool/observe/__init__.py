"""Read-only views of the running pooler: what SHOW rows and metrics are built from.

Plain data and no asyncio. The network layer never imports this package; the start-up
composition (cli.py) hands the pooler to it.
"""
