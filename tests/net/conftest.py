"""The `fake_pooler` fixture: Poolers over fake sockets (tests/net/fakes.py)."""

from tests.net.fakes import fake_pooler as fake_pooler
