"""Every read of an ended job is the same before and after its Redis copy leaves (the archive
answers): results, inputs, per-item usage, the owner's usage, failure groups and alerts, the
command line's status, results, usage and failures; and a failed job replays from the archive,
its stored items not asked again. Against SQLite and a real PostgreSQL."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from cli import main
from jobs import keys
from jobs.archive import database, sweep
from jobs.core import states
from jobs.deadletter import alerts, failures
from jobs.enqueue import enqueue
from jobs.intake.submission import price_or_none
from jobs.read import results
from jobs.usage.report import owner_usage
from tests.conftest import run_burst
from tests.kinds_for_tests import item_calls
from tests.web_support import bearer

pytestmark = pytest.mark.slow

PRICES = '{"fake-model": {"input": 1.0, "output": 2.0}}'


@pytest.fixture(autouse=True)
def sweeps_by_hand(monkeypatch):
    """The in-process workers archive nothing themselves: each test sweeps when it means to."""
    monkeypatch.setattr(sweep, "tick", lambda connection: 0)


def leave_redis(conn, job_id) -> None:
    """The keep time has passed: what archived_v1 let go is gone."""
    for key in keys.archived_heavy(job_id, conn):
        conn.delete(key)


def cli(*args) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code in (0, 1), result.output
    return result.output


def api_reads(api, job_id: str, owner: str) -> dict:
    """What the API answers of the job, its results and the owner's list and search."""
    headers = bearer(owner)
    status = api.get(f"/jobs/{job_id}", headers=headers).get_json()
    status.pop("history")
    return {"api_status": status,
            "api_page": api.get(f"/jobs/{job_id}/result?offset=1&limit=3", headers=headers).get_json(),
            "api_csv": api.get(f"/jobs/{job_id}/result.csv", headers=headers).data,
            "api_jsonl": api.get(f"/jobs/{job_id}/result.jsonl", headers=headers).data,
            "api_search": api.get("/jobs?search=kettle&state=succeeded", headers=headers).get_json(),
            "cli_search": cli("jobs", "--owner", owner, "--search", "kettle", "--json")}


def everything_read(conn, job_id: str, failed_id: str, owner: str, api) -> dict:
    """What the pages, the API and the command line show of the two jobs."""
    status = states.status(conn, job_id, now=0)
    status.pop("history")  # when each attempt was last seen: not what this compares
    failed = states.status(conn, failed_id, now=0)
    failed.pop("history")
    page = results.read_page(conn, job_id, 1, 3)
    return {
        "status": status, "failed": failed,
        "rows": list(results.iter_results(conn, job_id, page_size=2)),
        "page": (page.items, page.usage), "inputs": results.item_inputs(conn, job_id, 1, 3),
        "columns": results.result_columns(conn, job_id),
        "owner_usage": owner_usage(conn, owner, days=2),
        "groups": failures.report(conn, since=None), "alert": alerts.check(conn, window=3600, max_failures=0).breaches,
        "cli_results": cli("results", job_id), "cli_csv": cli("results", job_id, "--format", "csv"),
        "cli_status": json.loads(cli("status", job_id, "--json")) | {"history": None},
        "cli_usage": cli("usage", "--owner", owner, "--since", "2d", "--json"),
        "cli_failures": cli("failures", "--json"),
    } | api_reads(api, job_id, owner)


def test_results_usage_and_failures_read_the_same_once_the_archive_answers(
        conn, model_server, env, archive_url, token_app):
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    env.setenv("LEASH_MODEL_MAX_TOKENS", "64")
    payload = {"items": [f"review {n}: the kettle is fine" for n in range(5)], "template": "Say it back: {item}"}
    job_id, _ = enqueue(conn, "prompt", payload, owner="alice", name="kettle reviews",
                        price=price_or_none(conn, "prompt", payload, "alice"))
    failed_id, _ = enqueue(conn, "permanent", {}, owner="alice", name="kettle reviews")
    run_burst()
    assert states.status(conn, job_id)["usage"]["calls"] == 5
    before = everything_read(conn, job_id, failed_id, "alice", token_app.test_client())
    assert before["page"][1] and before["inputs"] == payload["items"][1:4]
    assert job_id in json.dumps(before["api_search"]) and failed_id not in json.dumps(before["api_search"])
    assert job_id in before["cli_search"] and before["api_csv"].count(b"\n") == 6
    assert sweep.sweep(conn) == 2
    for ended in (job_id, failed_id):
        leave_redis(conn, ended)
    assert not conn.exists(keys.items(job_id), keys.usage(job_id), keys.payload(job_id), keys.rq_job(job_id))
    after = everything_read(conn, job_id, failed_id, "alice", token_app.test_client())
    for name, seen in before.items():
        assert after[name] == seen, name


def test_a_failed_job_replays_from_the_archive_without_asking_its_stored_items_again(conn, archive_url):
    conn.set("test:broken:a", 1)
    job_id, _ = enqueue(conn, "breaks_at", {"items": ["a", "b", "c", "d"], "break_at": 2, "flag": "a"},
                        owner="bea", max_attempts=1)
    run_burst()
    assert states.status(conn, job_id)["state"] == "failed"
    stored = item_calls(conn, job_id)
    assert 2 not in stored and {0, 1} <= set(stored)
    assert sweep.sweep(conn) == 1
    leave_redis(conn, job_id)
    conn.delete("test:broken:a")  # the bug is fixed
    replayed = CliRunner().invoke(main, ["replay", job_id, "--yes"])
    assert replayed.exit_code == 0, replayed.output
    run_burst()
    status = states.status(conn, job_id)
    assert status["state"] == "succeeded", status
    assert item_calls(conn, job_id) == {0: 1, 1: 1, 2: 1, 3: 1}  # the archived checkpoints kept, none asked again
    assert [row[2] for row in results.iter_results(conn, job_id)] == ["A", "B", "C", "D"]
    assert sweep.sweep(conn) == 1  # the replay's ending replaces the failed one
    with database.engine().connect() as sql:
        assert list(sql.execute(text("SELECT state, done FROM leash_jobs WHERE job_id = :j"), {"j": job_id})) == [
            ("succeeded", 4)]


def test_a_replay_while_the_archive_does_not_answer_says_why(conn, archive_url, env):
    job_id, _ = enqueue(conn, "permanent", {}, owner="cy")
    run_burst()
    assert sweep.sweep(conn) == 1
    leave_redis(conn, job_id)
    env.setenv("LEASH_ARCHIVE_URL", "postgresql+psycopg://leash@127.0.0.1:9/none")
    database.forget()
    replayed = CliRunner().invoke(main, ["replay", job_id, "--yes"])
    assert "in the archive, which did not answer" in replayed.output
    assert states.status(conn, job_id)["state"] == "failed"


def test_a_month_of_usage_reads_the_archive_and_the_days_leave_redis_sooner(conn, model_server, env, archive_url):
    import time

    env.setenv("LEASH_MODEL_PRICES", PRICES)
    payload = {"items": ["one", "two", "three"], "template": "Say it back: {item}"}
    job_id, _ = enqueue(conn, "prompt", payload, owner="mo", price=price_or_none(conn, "prompt", payload, "mo"))
    enqueue(conn, "count", {"items": ["a"], "delay": 0}, owner="mo")
    run_burst()
    assert sweep.sweep(conn) == 2
    status = states.status(conn, job_id)
    month = time.strftime("%Y-%m", time.gmtime())
    report = json.loads(cli("usage", "--owner", "mo", "--month", month, "--json"))
    assert report["by_kind"] == [
        {"kind": "count", "jobs": 1, "calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0},
        {"kind": "prompt", "jobs": 1, "calls": 3, "input_tokens": status["usage"]["input_tokens"],
         "output_tokens": status["usage"]["output_tokens"], "cost_usd": status["cost_usd"]}]
    assert report["total"]["jobs"] == 2 and report["total"]["cost_usd"] == status["cost_usd"]
    assert "prompt" in cli("usage", "--owner", "mo", "--month", month)
    # The archive keeps the months: an owner's days stay 40 days in Redis (after the day), not 400.
    day_key = keys.usage_owner_day("mo", time.strftime("%Y-%m-%d", time.gmtime()))
    assert 40 * 86400 < conn.ttl(day_key) <= 41 * 86400
    too_far = CliRunner().invoke(main, ["usage", "--owner", "mo", "--since", "100d"])
    assert too_far.exit_code == 2 and "--month YYYY-MM" in too_far.output
    bad = CliRunner().invoke(main, ["usage", "--owner", "mo", "--month", "2026-13"])
    assert bad.exit_code == 2 and "YYYY-MM" in bad.output


def test_without_an_archive_the_days_stay_400_days_and_a_month_says_there_is_no_archive(conn, env, model_server):
    import time

    from jobs.archive import reading

    env.delenv("LEASH_ARCHIVE_URL", raising=False)
    env.delenv("DATABASE_URL", raising=False)
    enqueue(conn, "prompt", {"items": ["one"], "template": "Say it back: {item}"}, owner="mo")
    run_burst()
    day_key = keys.usage_owner_day("mo", time.strftime("%Y-%m-%d", time.gmtime()))
    assert conn.ttl(day_key) > 399 * 86400 and reading.usage_days_kept() == 400
    result = CliRunner().invoke(main, ["usage", "--owner", "mo", "--month", "2026-12"])
    assert result.exit_code == 2 and "no archive" in result.output


def test_cached_answers_move_to_the_archive_and_are_still_never_paid_for_twice(
        conn, model_server, env, archive_url, monkeypatch):
    import time

    from jobs.archive import answers
    from jobs.intake.submission import dry_run
    from jobs.models import cache
    from tests.test_usage_workers import billed

    monkeypatch.setattr(cache, "archived", answers.lookup)  # as `leash worker` and the web app set it
    env.setenv("LEASH_MODEL_PRICES", PRICES)
    payload = {"items": [f"line {n}" for n in range(6)], "template": "Say it back: {item}"}
    first, _ = enqueue(conn, "prompt", payload, owner="cas")
    run_burst()
    assert billed(model_server)[0] == 6 and conn.zcard(keys.CACHE_INDEX) == 6
    assert sweep.sweep(conn) == 1 and conn.zcard(keys.CACHE_INDEX) == 6  # used within the keep time: stay
    assert answers.retire(conn, database.engine(), now=time.time() + 3601) == 6  # the keep time has passed
    assert conn.zcard(keys.CACHE_INDEX) == 0 and not list(conn.scan_iter("leash:cache:*"))
    assert int(conn.get(keys.CACHE_BYTES) or 0) == 0
    with database.engine().connect() as sql:
        assert list(sql.execute(text("SELECT count(*) FROM leash_answers"))) == [(6,)]
    assert dry_run(conn, "prompt", payload, owner="cas")["cached_items"] == 6
    second, _ = enqueue(conn, "prompt", payload, owner="cas")
    run_burst()
    status = states.status(conn, second)
    assert status["state"] == "succeeded" and billed(model_server)[0] == 6  # not one call more
    assert status["usage"]["cache_hits"] == 6 and status["cost_usd"] == 0
    assert [r[2] for r in results.iter_results(conn, second)] == [r[2] for r in results.iter_results(conn, first)]
    monkeypatch.setattr(cache, "archived", None)  # without the archive's answers: asked again
    third, _ = enqueue(conn, "prompt", payload, owner="cas")
    run_burst()
    assert billed(model_server)[0] == 12
