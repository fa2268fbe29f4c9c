"""Fixtures for the Lua-script tests (helpers live in redis_support.py, a
uniquely named module, so `pytest tests/` with several conftest.py files works)."""
import pytest

from redis_support import RedisServer, Resp, Scripts


@pytest.fixture(scope="session")
def redis_server():
    srv = RedisServer().start()
    yield srv
    srv.cleanup()


@pytest.fixture
def conn(redis_server):
    c = Resp(redis_server.port)
    c.call("FLUSHALL")
    yield c
    c.close()


@pytest.fixture
def scripts(conn):
    return Scripts(conn)


@pytest.fixture
def connect(redis_server):
    """Extra connections (other "sidecars"), closed after the test."""
    conns = []

    def make():
        c = Resp(redis_server.port)
        conns.append(c)
        return c
    yield make
    for c in conns:
        c.close()
