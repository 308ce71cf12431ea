"""Replay from a failed job's page: a button (the caller's jobs only, CSRF-checked) that takes
`leash replay`'s own path and leaves an audit entry naming the web user, the command to copy,
and attempts that say when no retry is coming."""

from __future__ import annotations

import pytest

from jobs import deadletter, keys
from jobs.core import lease, states
from tests.web_support import CLASSIFY, HTML, bearer, csrf_from


@pytest.fixture
def browser(app):
    browser = app.test_client()
    browser.token = csrf_from(browser.get("/", headers=HTML).data)
    return browser


def failed_job(client, conn, headers=None, permanent=True) -> str:
    headers = headers or {"X-CSRFToken": client.token}  # a browser session proves its page sent it
    job_id = client.post("/jobs", json=dict(CLASSIFY, max_attempts=3), headers=headers).get_json()["job_id"]
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, '"positive"'))
    assert attempt.fail("PermanentError: context length exceeded\nTraceback ...", permanent=permanent) == (
        "failed" if permanent else "queued")
    return job_id


def test_a_permanently_failed_page_says_no_retry_and_offers_the_button_and_the_command(browser, conn):
    job_id = failed_job(browser, conn)
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert '<dd id="attempts">1 (no retry: permanent error)</dd>' in html and "1 of 3" not in html
    assert 'id="replay-button"' in html and f'action="/jobs/{job_id}/replay"' in html
    assert f'<code id="replay-command" class="copy">leash replay {job_id}</code>' in html


def test_a_job_still_retrying_has_no_replay_button(browser, conn):
    job_id = failed_job(browser, conn, permanent=False)
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert "replay-button" not in html and '<dd id="attempts">1 of 3</dd>' in html
    refused = browser.post(f"/jobs/{job_id}/replay", data={"csrf_token": browser.token})
    assert refused.status_code == 409 and "only failed jobs can be replayed" in refused.get_json()["error"]


def test_the_replay_button_requeues_the_job_and_audits_the_web_user(browser, conn):
    job_id = failed_job(browser, conn)
    asked = browser.post(f"/jobs/{job_id}/replay", data={"csrf_token": browser.token}, headers=HTML)
    assert asked.status_code == 200 and 'name="confirm" value="yes"' in asked.data.decode()
    assert states.status(conn, job_id)["state"] == "failed", "nothing replayed before the confirm"
    response = browser.post(f"/jobs/{job_id}/replay", data={"csrf_token": browser.token, "confirm": "yes"},
                            headers=HTML)
    assert response.status_code == 303 and response.headers["Location"] == f"/jobs/{job_id}"
    fields = states.status(conn, job_id)
    assert (fields["state"], fields["attempts"], fields["done"]) == ("queued", 0, 1), "checkpoint kept"
    [entry] = deadletter.audit_log(conn, 1)
    assert (entry["actor"], entry["ids"], entry["count"]) == ("web:shared", [job_id], 1)
    html = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert "replay-button" not in html


def test_a_replay_without_the_csrf_token_is_refused_and_changes_nothing(browser, conn):
    job_id = failed_job(browser, conn)
    refused = browser.post(f"/jobs/{job_id}/replay", data={})
    assert refused.status_code == 403 and "error" in refused.get_json()
    assert states.status(conn, job_id)["state"] == "failed"
    assert conn.xlen(keys.REPLAY_AUDIT) == 0


def test_replay_is_the_owners_only(token_app, conn):
    client = token_app.test_client()
    job_id = failed_job(client, conn, headers=bearer("alice"))
    stranger = client.post(f"/jobs/{job_id}/replay", headers=bearer("bob"))
    assert stranger.status_code == 404 and stranger.get_json() == {"error": "no such job"}
    assert states.status(conn, job_id)["state"] == "failed"
    mine = client.post(f"/jobs/{job_id}/replay", headers=bearer("alice"))
    assert mine.status_code == 202 and mine.get_json()["state"] == "queued"
    assert deadletter.audit_log(conn, 1)[0]["actor"] == "web:alice"
