"""The archive: every ended job, whole, in SQL (SQLite and a real PostgreSQL), read back the
same once Redis' copy of its items has left; an unreachable archive delays, never loses."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from jobs import cancel, keys
from jobs.archive import database, pending, sweep
from jobs.core import states
from jobs.enqueue import enqueue
from jobs.read import results
from jobs.worker.leash_worker import LeashWorker


@pytest.fixture(autouse=True)
def sweeps_by_hand(monkeypatch):
    """The in-process worker below archives nothing itself: each test sweeps when it means to."""
    monkeypatch.setattr(sweep, "tick", lambda connection: 0)


def run_burst(conn) -> None:
    LeashWorker(["leash"], connection=conn).work(burst=True, with_scheduler=False)


def rows(sql: str, **params) -> list:
    with database.engine().connect() as connection:
        return [tuple(r) for r in connection.execute(text(sql), params)]


def read_all(conn, job_id):
    """What a reader sees of a job: its status, every result row, the extract columns."""
    status = states.status(conn, job_id, now=0)
    return status, list(results.iter_results(conn, job_id, page_size=2)), results.result_columns(conn, job_id)


def leave_redis(conn, job_id) -> None:
    """The keep time has passed: what archived_v1 let go is gone."""
    for key in keys.archived_heavy(job_id, conn):
        conn.delete(key)


def test_an_ended_job_is_archived_whole_and_reads_the_same_once_redis_let_go(conn, archive_url):
    job_id, _ = enqueue(conn, "count", {"items": ["a", "b", "c", "d", "e"], "delay": 0}, owner="alice", name="five")
    failed_id, _ = enqueue(conn, "permanent", {}, owner="alice")
    run_burst(conn)
    assert conn.zscore(keys.ARCHIVE_DUE, job_id) is not None  # noted at its end
    before = read_all(conn, job_id)
    assert sweep.sweep(conn) == 2
    assert conn.zcard(keys.ARCHIVE_DUE) == 0
    assert rows("SELECT job_id, kind, owner, name, state, done, total, item_errors FROM leash_jobs WHERE job_id = :j",
                j=job_id) == [(job_id, "count", "alice", "five", "succeeded", 5, 5, 0)]
    assert rows("SELECT idx, item, result FROM leash_items WHERE job_id = :j ORDER BY idx", j=job_id) == [
        (n, json.dumps(v.lower()), json.dumps(v)) for n, v in enumerate("ABCDE")]
    # The document's failure query, as SQL on the archive.
    assert rows("SELECT kind, substr(error, 1, 80), count(*) FROM leash_jobs WHERE state = 'failed' "
                "GROUP BY 1, 2 ORDER BY 3 DESC")[0][0] == "permanent"
    # The heavy keys now leave after the keep time; the record stays.
    assert 0 < conn.ttl(keys.items(job_id)) <= 3600 and conn.ttl(keys.job(job_id)) > 3600
    leave_redis(conn, job_id)
    assert not conn.exists(keys.items(job_id)) and not conn.exists(keys.payload(job_id))
    after = read_all(conn, job_id)
    assert after[1] == before[1] and after[2] == before[2]
    assert {k: v for k, v in after[0].items() if k != "history"} == {k: v for k, v in before[0].items() if k != "history"}
    page = results.read_page(conn, job_id, 1, 2)
    assert page.items == [(1, "B"), (2, "C")]


def test_an_ending_is_archived_once_and_a_second_sweep_writes_nothing(conn, archive_url):
    job_id, _ = enqueue(conn, "count", {"items": ["a"], "delay": 0}, owner="bob")
    run_burst(conn)
    assert sweep.sweep(conn) == 1
    pending.note_ended(conn, job_id, archive_url)  # noted again (the sweep saw it ended once more)
    leave_redis(conn, job_id)
    assert sweep.sweep(conn) == 0  # this ending is archived: nothing overwrites it with less
    assert rows("SELECT count(*) FROM leash_items WHERE job_id = :j AND result IS NOT NULL", j=job_id) == [(1,)]


def test_a_crash_between_the_commit_and_redis_mark_is_harmless(conn, archive_url, monkeypatch):
    job_id, _ = enqueue(conn, "count", {"items": ["a", "b"], "delay": 0}, owner="bob")
    run_burst(conn)
    from jobs.lifecycle import transitions

    def crash(*args, **kwargs):
        raise ConnectionError("killed after the commit")

    with monkeypatch.context() as patched, pytest.raises(ConnectionError):
        patched.setattr(transitions, "archived", crash)
        sweep.sweep(conn)
    assert conn.zscore(keys.ARCHIVE_DUE, job_id) is not None and conn.exists(keys.items(job_id))
    assert sweep.sweep(conn) == 1
    assert rows("SELECT count(*) FROM leash_jobs WHERE job_id = :j", j=job_id) == [(1,)]
    assert rows("SELECT count(*) FROM leash_items WHERE job_id = :j", j=job_id) == [(2,)]


def test_a_canceled_job_is_archived_as_canceled(conn, archive_url):
    job_id, _ = enqueue(conn, "count", {"items": ["a"] * 3}, owner="carol")
    assert cancel(conn, job_id) == "queued"
    assert sweep.sweep(conn) == 1
    assert rows("SELECT state FROM leash_jobs WHERE job_id = :j", j=job_id) == [("canceled",)]


def test_without_an_archive_nothing_is_noted_and_results_stay_in_redis(conn, env):
    env.delenv("LEASH_ARCHIVE_URL", raising=False)
    env.delenv("DATABASE_URL", raising=False)
    job_id, _ = enqueue(conn, "count", {"items": ["a"], "delay": 0}, owner="dan")
    run_burst(conn)
    assert conn.zcard(keys.ARCHIVE_DUE) == 0 and conn.ttl(keys.items(job_id)) > 3600
    assert sweep.sweep(conn) == 0


def test_retention_deletes_archived_jobs_past_the_result_ttl(conn, archive_url, env):
    job_id, _ = enqueue(conn, "count", {"items": ["a"], "delay": 0}, owner="erin")
    run_burst(conn)
    sweep.sweep(conn)
    env.setenv("LEASH_RESULT_TTL", "60")
    import time

    assert sweep.expire(database.engine(), now=time.time() + 30) == 0
    assert sweep.expire(database.engine(), now=time.time() + 120) == 1
    assert rows("SELECT count(*) FROM leash_items WHERE job_id = :j", j=job_id) == [(0,)]


def test_a_platform_postgres_url_means_psycopg(env):
    from jobs.config import stores

    env.delenv("LEASH_ARCHIVE_URL", raising=False)
    env.setenv("DATABASE_URL", "postgres://u:p@db.example:5432/app")
    assert stores.archive().url == "postgresql+psycopg://u:p@db.example:5432/app"
    env.setenv("LEASH_ARCHIVE_URL", "sqlite:///x.db")
    assert stores.archive().url == "sqlite:///x.db"


REAL_TICK = sweep.tick


@pytest.mark.slow
def test_postgres_stopped_while_ten_jobs_end_then_all_ten_are_archived_once(conn, env, monkeypatch):
    """The archive goes away while jobs end: they end, stay whole in Redis, /readyz and doctor
    say the archive is behind; once it is back, every one is archived exactly once."""
    from jobs.read.redis_health import archive_check, readiness
    from tests.pg_support import Postgres

    server = Postgres()
    try:
        server.start()
        env.setenv("LEASH_ARCHIVE_URL", server.create_database())
        database.forget()
        database.engine()  # migrated while it answers
        server.stop()
        ids = [enqueue(conn, "count", {"items": [f"j{n}", "x"], "delay": 0}, owner="olga")[0] for n in range(10)]
        run_burst(conn)
        assert all(states.status(conn, j)["state"] == "succeeded" for j in ids)
        monkeypatch.setattr(sweep, "_next_at", 0.0)
        assert REAL_TICK(conn) == 0  # unreachable: recorded, nothing lost
        assert conn.zcard(keys.ARCHIVE_DUE) == 10
        assert all(conn.ttl(keys.items(j)) > 3600 for j in ids)  # whole in Redis, on the long retention
        check = archive_check(conn)
        assert check.verdict == "fail" and "10 ended jobs wait" in check.detail
        assert any(p.startswith("archive:") for p in readiness(conn))
        server.start()
        monkeypatch.setattr(sweep, "_next_at", 0.0)
        assert REAL_TICK(conn) == 10
        assert conn.zcard(keys.ARCHIVE_DUE) == 0 and archive_check(conn).verdict == "ok"
        assert rows("SELECT count(*), count(DISTINCT job_id) FROM leash_jobs") == [(10, 10)]
        assert rows("SELECT count(*) FROM leash_items") == [(20,)]
        monkeypatch.setattr(sweep, "_next_at", 0.0)
        for job_id in ids:
            pending.note_ended(conn, job_id, "x")  # seen ended again: archived once all the same
        assert REAL_TICK(conn) == 0
    finally:
        database.forget()
        server.close()


def test_backfill_archives_the_jobs_that_ended_before_the_archive_existed_and_migrate_says_its_version(
        conn, archive_url, env):
    from click.testing import CliRunner

    from cli import main

    env.delenv("LEASH_ARCHIVE_URL")
    for _ in range(3):
        enqueue(conn, "count", {"items": ["a", "b"], "delay": 0}, owner="fay")
    run_burst(conn)
    assert conn.zcard(keys.ARCHIVE_DUE) == 0  # no archive then: nothing noted
    env.setenv("LEASH_ARCHIVE_URL", archive_url)
    runner = CliRunner()
    migrated = runner.invoke(main, ["archive", "migrate", "--json"])
    assert migrated.exit_code == 0 and json.loads(migrated.output) == {"version": "0003"}
    done = runner.invoke(main, ["archive", "backfill"])
    assert done.exit_code == 0, done.output
    assert rows("SELECT count(*) FROM leash_jobs WHERE owner = 'fay'") == [(3,)]
    again = runner.invoke(main, ["archive", "backfill"])
    assert again.exit_code == 0 and again.output.strip().endswith("0 archived now")
    months = runner.invoke(main, ["archive", "months", "--owner", "fay", "--json"])
    assert [(r["owner"], r["jobs"]) for r in json.loads(months.output)] == [("fay", 3)]
    status = runner.invoke(main, ["archive", "status", "--json"])
    assert status.exit_code == 0 and json.loads(status.output)["waiting"] == 0


def test_the_archive_commands_without_an_archive_say_so(conn, env):
    from click.testing import CliRunner

    from cli import main

    env.delenv("LEASH_ARCHIVE_URL", raising=False)
    env.delenv("DATABASE_URL", raising=False)
    result = CliRunner().invoke(main, ["archive", "migrate"])
    assert result.exit_code == 2 and "no archive" in result.output
