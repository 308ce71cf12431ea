"""Sentinel URLs: what they mean, what a wrong one says, and which client each process gets.
Nothing here needs a Sentinel running (tests/test_sentinel_failover.py runs real ones)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from redis.sentinel import SentinelConnectionPool, SentinelManagedSSLConnection

from cli import main
from cli.devserver import free_port
from jobs.core.store import redis_url
from jobs.core.store.connection import SENTINEL_TIMEOUT, connect, masked
from jobs.core.store.redis_url import redis_url_problem
from jobs.worker.scheduler import LeashScheduler


def test_a_sentinel_url_names_the_sentinels_the_service_the_database_and_the_password():
    parsed = redis_url.parse_sentinel_url("redis+sentinel://:s%40cret@10.0.0.1:26380,sentinel-b,[::1]:5000/mymaster/3"
                            "?sentinel_password=other")
    assert parsed.sentinels == [("10.0.0.1", 26380), ("sentinel-b", 26379), ("::1", 5000)]
    assert (parsed.service, parsed.db, parsed.username, parsed.password, parsed.tls) == (
        "mymaster", 3, None, "s@cret", False)
    assert parsed.options == {"sentinel_password": "other"}
    assert redis_url.parse_sentinel_url("rediss+sentinel://app:pw@h:1/svc").tls
    assert redis_url.parse_sentinel_url("rediss+sentinel://app:pw@h:1/svc").username == "app"
    assert redis_url.parse_sentinel_url("redis+sentinel://h/svc").db == 0


@pytest.mark.parametrize("url,says", [
    ("redis+sentinel://h:26379", "names no service"),
    ("redis+sentinel://h:26379/", "names no service"),
    ("redis+sentinel://h:port/svc", "Sentinel port that is not a number"),
    ("redis+sentinel://h:70000/svc", "Sentinel port that is not a number"),
    ("redis+sentinel://h:1,,h:2/svc", "empty Sentinel address"),
    ("redis+sentinel://h:1/svc/zero", "database that is not a number"),
    ("redis+sentinel://h:1/svc/0/more", "too much path"),
    ("redis+sentinel://h:1/svc?socket_timeout=1", "option Sentinel URLs do not take (socket_timeout)"),
])
def test_a_wrong_sentinel_url_says_what_is_wrong_and_how_to_write_it(url, says):
    problem = redis_url_problem(url)
    assert problem is not None and says in problem and redis_url.SENTINEL_EXAMPLE in problem


@pytest.mark.parametrize("command", [("jobs",), ("worker",), ("web", "--port", "1")])
def test_a_wrong_sentinel_url_is_one_line_and_exit_2_without_the_password(env, command):
    env.setenv("REDIS_URL", "redis+sentinel://:pw-secret@h:port/svc")
    result = CliRunner().invoke(main, list(command))
    assert result.exit_code == 2
    assert "is not a Sentinel URL" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and "pw-secret" not in result.output


def test_no_sentinel_answering_is_one_line_naming_the_url_without_its_password(env):
    port = free_port()
    env.setenv("REDIS_URL", f"redis+sentinel://:hunter2@127.0.0.1:{port}/svc/0?sentinel_password=hunter3")
    result = CliRunner().invoke(main, ["status", "some-id"])
    assert result.exit_code == 3 and len(result.output.strip().splitlines()) == 1
    assert f"cannot reach Redis at redis+sentinel://:***@127.0.0.1:{port}/svc/0?sentinel_password=***" in result.output
    assert "hunter" not in result.output and "Traceback" not in result.output


def test_passwords_in_sentinel_urls_are_masked():
    assert masked("redis+sentinel://:pw@a:1,b:2/svc?sentinel_password=x") == (
        "redis+sentinel://:***@a:1,b:2/svc?sentinel_password=***")


def test_every_client_of_a_sentinel_url_follows_the_primary_through_the_sentinels():
    client = connect("redis+sentinel://:pw@127.0.0.1:1/svc/2", socket_timeout=5)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "svc"
    assert (pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (2, "pw")
    asked = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert asked["port"] == 1 and asked["socket_timeout"] == SENTINEL_TIMEOUT
    # RQ's scheduler process rebuilds its client from the worker's; it stays a Sentinel client.
    scheduler = LeashScheduler(["leash"], connection=client)
    scheduler._connection = None
    rebuilt = scheduler.connection
    assert isinstance(rebuilt.connection_pool, SentinelConnectionPool) and rebuilt is not client
    assert rebuilt.connection_pool.connection_kwargs["db"] == 2


def test_tls_sentinel_urls_speak_tls_to_the_sentinels_and_to_redis():
    client = connect("rediss+sentinel://127.0.0.1:1/svc?ssl_cert_reqs=required")
    assert client.connection_pool.connection_class is SentinelManagedSSLConnection
    assert client.connection_pool.connection_kwargs["ssl_cert_reqs"] == "required"
    asked = client.connection_pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert asked["ssl_cert_reqs"] == "required"
    plain_default = connect("rediss+sentinel://127.0.0.1:1/svc")
    assert plain_default.connection_pool.connection_kwargs["ssl_cert_reqs"] is None  # as for rediss://
