"""The schema version in Redis: migrations from the previous release's layout, run once and
safely from several processes at once; a Redis written by a newer layout that no longer
accepts this code keeps workers and the web server from starting, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import redis

from jobs import enqueue, keys
from jobs.core.store import schema

from .conftest import REDIS_URL, ROOT


def _previous_release_job(conn, owner: str, key: str, items: list[str]) -> str:
    """A job as leash 0.2 left it: its idempotency key in the old form, no payload copy."""
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "{item}"}, owner=owner)
    conn.delete(keys.payload(job_id))
    conn.set(keys.legacy_idempotency(owner, key), job_id, ex=3600)
    conn.delete(keys.SCHEMA)
    return job_id


def test_a_fresh_redis_is_marked_with_this_schema(conn):
    found = schema.ensure(conn)
    assert found["version"] == schema.UNMARKED
    marker = schema.stored(conn)
    assert marker["version"] == schema.VERSION and marker["compatible_from"] == schema.COMPATIBLE_FROM
    assert marker["release"] == schema.release()
    assert schema.ensure(conn)["version"] == schema.VERSION  # the second start migrates nothing


def test_the_previous_releases_idempotency_keys_and_payloads_are_migrated(conn):
    plain = _previous_release_job(conn, "alice", "batch-1", ["a"])
    colon = _previous_release_job(conn, "team:ops", "k1", ["b"])
    conn.expire(keys.job(plain), 7200)  # an ended job: its copy expires with it
    schema.ensure(conn)
    assert conn.get(keys.idempotency("alice", "batch-1")).decode() == plain
    assert conn.get(keys.idempotency("team:ops", "k1")).decode() == colon
    assert conn.get(keys.idempotency("team", "ops:k1")) is None  # the owner told the two readings apart
    assert 3500 < conn.ttl(keys.idempotency("alice", "batch-1")) <= 3600
    assert conn.get(keys.legacy_idempotency("alice", "batch-1")) is not None  # 0.2 processes still read it
    assert conn.get(keys.payload(plain)) == b'{"items":["a"],"template":"{item}"}'
    assert 7100 < conn.ttl(keys.payload(plain)) <= 7200
    # Queued: kept LEASH_RESULT_TTL at most, as enqueue does (a 0.2 worker ending it sets none).
    assert 6 * 7 * 24 * 3600 - 100 < conn.ttl(keys.payload(colon)) <= 6 * 7 * 24 * 3600
    again, created = enqueue(conn, "prompt", {"items": ["a"], "template": "{item}"}, owner="alice",
                             idempotency_key="batch-1")
    assert (again, created) == (plain, False)


def test_migrations_run_from_many_processes_at_once(conn):
    job_ids = [_previous_release_job(conn, f"owner{n}", "k", ["x"]) for n in range(30)]
    errors: list[BaseException] = []

    def start():
        client = redis.Redis.from_url(REDIS_URL)
        try:
            schema.ensure(client)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert schema.stored(conn)["version"] == schema.VERSION
    assert all(conn.get(keys.idempotency(f"owner{n}", "k")).decode() == job_id for n, job_id in enumerate(job_ids))
    assert all(conn.exists(keys.payload(job_id)) for job_id in job_ids)
    assert not conn.exists(keys.SCHEMA_LOCK)


def test_a_process_that_finds_the_lock_taken_starts_without_migrating(conn):
    job_id = _previous_release_job(conn, "alice", "k", ["x"])
    conn.set(keys.SCHEMA_LOCK, "another process", ex=60)
    schema.ensure(conn)
    assert schema.stored(conn)["version"] == schema.UNMARKED
    assert not conn.exists(keys.payload(job_id))
    assert enqueue(conn, "prompt", {"items": ["x"], "template": "{item}"}, owner="alice",
                   idempotency_key="k") == (job_id, False)  # the old form is read meanwhile


def test_a_newer_schema_that_accepts_this_code_is_left_alone(conn):
    conn.hset(keys.SCHEMA, mapping={"version": schema.VERSION + 1, "compatible_from": schema.VERSION,
                                    "release": "9.0.0"})
    schema.ensure(conn)
    assert schema.stored(conn) == {"version": schema.VERSION + 1, "compatible_from": schema.VERSION,
                                   "release": "9.0.0"}


def _newer_than_this_code(conn) -> None:
    conn.hset(keys.SCHEMA, mapping={"version": schema.VERSION + 1, "compatible_from": schema.VERSION + 1,
                                    "release": "9.0.0"})


def test_a_schema_newer_than_the_code_refuses_in_one_line(conn):
    _newer_than_this_code(conn)
    try:
        schema.ensure(conn)
    except schema.SchemaTooNew as exc:
        message = str(exc)
    else:
        raise AssertionError("ensure accepted a schema that does not accept this code")
    assert "\n" not in message and "9.0.0" in message and f"schema {schema.VERSION}" in message


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), SECRET_KEY="test-secret")
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=60)


def test_worker_and_web_server_refuse_to_start_on_a_newer_schema(conn):
    _newer_than_this_code(conn)
    for command in (("worker", "--burst"), ("web", "--host", "127.0.0.1", "--port", "1")):
        done = _run(*command)
        assert done.returncode == 2, (command, done.stderr)
        refusals = [line for line in done.stderr.splitlines() if "schema" in line]
        assert len(refusals) == 1 and "9.0.0" in refusals[0], (command, done.stderr)
        assert "Traceback" not in done.stderr
