"""Completion webhook deliveries kept in the archive (``leash_webhook_deliveries``, SQLite and a
real PostgreSQL): every attempt, where the job's record keeps the last few; written by each
attempt, and when the job is archived for attempts the archive missed; read by the status and
the job page once the record's log no longer holds them; gone with the archive's retention."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text

from jobs.archive import database, sweep, webhook_log
from jobs.config import settings
from jobs.core import states
from jobs.enqueue import enqueue
from jobs.webhooks import delivery, outbox
from tests.test_webhooks import SECRET
from tests.web_support import CLASSIFY, HTML, csrf_from


@pytest.fixture(autouse=True)
def sweeps_by_hand(monkeypatch):
    """The in-process workers archive nothing themselves: each test sweeps when it means to."""
    monkeypatch.setattr(sweep, "tick", lambda connection: 0)


@pytest.fixture
def hooks(env):
    env.setenv("LEASH_WEBHOOK_SECRET", SECRET)
    env.setenv("LEASH_WEBHOOK_ALLOW_PRIVATE", "1")
    env.setenv("LEASH_WEBHOOK_BACKOFF", ",".join(["0"] * 7))  # seven retries at once
    return env


def rows(job_id: str) -> list[tuple]:
    with database.engine().connect() as connection:
        return [tuple(r) for r in connection.execute(text(
            "SELECT attempt, status, error FROM leash_webhook_deliveries WHERE job_id = :j ORDER BY attempt"),
            {"j": job_id})]


def deliver_all(conn, burst) -> None:
    burst()
    outbox.sweep(conn)
    burst(follow=5)


def test_every_attempt_is_kept_and_the_status_and_page_show_them_past_the_records_log(
        app, client, conn, burst, hooks, receiver, archive_url):
    receiver.statuses = [500] * 6
    job_id = client.post("/jobs", json={**CLASSIFY, "webhook_url": receiver.url}).get_json()["job_id"]
    deliver_all(conn, burst)
    assert len(receiver.received) == 7
    assert rows(job_id) == [(n, 500, "HTTP 500") for n in range(1, 7)] + [(7, 200, None)]
    in_record = states.status(conn, job_id)["webhook"]
    assert in_record["attempts"] == 7 and len(in_record["deliveries"]) == delivery.LOG_KEPT
    shown = client.get(f"/jobs/{job_id}").get_json()["webhook"]
    assert shown["state"] == "delivered" and [d["attempt"] for d in shown["deliveries"]] == list(range(1, 8))
    assert shown["deliveries"][2:] == in_record["deliveries"]  # the same entries the record keeps, as it wrote them
    browser = app.test_client()
    csrf_from(browser.get("/", headers=HTML).data)
    page = browser.get(f"/jobs/{job_id}", headers=HTML).get_data(as_text=True)
    table = page.split('id="webhook-deliveries"')[1].split("</table>")[0]
    assert table.count("HTTP 500") == 6 and "<td>200</td>" in table


def test_attempts_the_archive_missed_are_written_when_the_job_is_archived(conn, burst, hooks, receiver,
                                                                          archive_url, monkeypatch):
    monkeypatch.setattr(webhook_log, "record", lambda *args: False)  # the archive did not answer then
    receiver.statuses = [503]
    job_id, _ = enqueue(conn, "noop", {}, webhook_url=receiver.url)
    deliver_all(conn, burst)
    assert states.status(conn, job_id)["webhook"]["state"] == "delivered" and rows(job_id) == []
    assert sweep.sweep(conn) == 1
    assert rows(job_id) == [(1, 503, "HTTP 503"), (2, 200, None)]
    assert sweep.sweep(conn) == 0 and len(rows(job_id)) == 2  # written once


def test_an_attempt_after_the_job_was_archived_is_written_and_leaves_with_the_retention(
        conn, burst, hooks, receiver, archive_url):
    receiver.statuses = [500]
    job_id, _ = enqueue(conn, "noop", {}, webhook_url=receiver.url)
    burst()
    assert sweep.sweep(conn) == 1 and rows(job_id) == []  # archived before its webhook went
    outbox.sweep(conn)
    burst(follow=5)
    assert rows(job_id) == [(1, 500, "HTTP 500"), (2, 200, None)]
    sweep.expire(database.engine(), now=time.time() + settings().result_ttl + 60)
    assert rows(job_id) == []


def test_an_archive_that_does_not_answer_changes_no_delivery_and_no_read(client, conn, burst, hooks, receiver, env):
    env.setenv("LEASH_ARCHIVE_URL", "postgresql://nobody@127.0.0.1:1/nothing")  # nothing listens there
    database.forget()
    try:
        receiver.statuses = [500] * 6
        job_id = client.post("/jobs", json={**CLASSIFY, "webhook_url": receiver.url}).get_json()["job_id"]
        deliver_all(conn, burst)
        shown = client.get(f"/jobs/{job_id}").get_json()["webhook"]
    finally:
        database.forget()
    assert len(receiver.received) == 7 and shown["state"] == "delivered" and shown["attempts"] == 7
    assert len(shown["deliveries"]) == delivery.LOG_KEPT  # the record's, as before
