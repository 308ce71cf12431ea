"""A side effect that fails because Redis went away (a restart mid-effect) leaves no marker
behind: its ``once`` removes the marker once Redis is back, so the next attempt runs it --
before, the marker stayed and the job could succeed with its side effect never run (seen once
in the chaos run: a Redis restart, a job succeeded, its side effect ran 0 times)."""

from __future__ import annotations

import threading

import pytest
import redis

from jobs import keys
from jobs.core.running import effects
from tests.test_redis_outage import own_redis  # noqa: F401  (a Redis of the test's own, restartable)

pytestmark = pytest.mark.slow


def test_an_effect_that_fails_while_redis_restarts_can_run_again(own_redis, env):  # noqa: F811
    env.setenv("LEASH_LEASE_SECONDS", "20")
    client = redis.Redis.from_url(own_redis.url)
    restarted = threading.Event()

    def effect():  # Redis goes away under it: its own write fails
        own_redis.stop()
        threading.Timer(1.0, lambda: (own_redis.start(), restarted.set())).start()
        client.incr("effect:count")

    with pytest.raises(redis.exceptions.ConnectionError):
        effects.once(client, "j1", "notify", effect)
    assert restarted.wait(30)
    assert not client.exists(keys.effect("j1", "notify"))  # no marker left behind
    assert effects.once(client, "j1", "notify", lambda: client.incr("effect:count"))
    assert int(client.get("effect:count")) == 1
    client.close()


def test_a_marker_whose_reply_a_blip_lost_is_known_as_the_callers_own(conn, monkeypatch):
    """The SET that takes the marker lands but its reply is lost (a connection reset after
    Redis ran it): asked again, the caller finds its own token there and runs the effect --
    before, it found the marker taken, skipped the effect, and no attempt ever ran it."""
    real_set, ran = conn.set, []

    def lossy_set(*args, **kwargs):
        reply = real_set(*args, **kwargs)
        if not ran:
            ran.append("lost")
            raise redis.exceptions.ConnectionError("connection reset after the command ran")
        return reply

    monkeypatch.setattr(conn, "set", lossy_set)
    assert effects.once(conn, "j2", "notify", lambda: ran.append("effect"), token="attempt-1")
    assert ran == ["lost", "effect"]
    assert not effects.once(conn, "j2", "notify", lambda: ran.append("again"), token="attempt-2")
