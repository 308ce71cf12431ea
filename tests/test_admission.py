"""Quotas at the door: an owner's queued jobs (LEASH_MAX_QUEUED_PER_OWNER) and submission rate
(LEASH_SUBMIT_RATE), answered alike by the API, the form and `leash submit`, and never applied
to a job already accepted."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from cli import main
from jobs import config, keys
from jobs.core import state_index, states
from jobs.enqueue import enqueue
from jobs.intake import admission
from tests.conftest import wait_for
from tests.web_support import CLASSIFY, HTML, bearer, csrf_from, sign_in

ITEMS = {"items": ["a"], "labels": ["x", "y"]}


def job_count(conn) -> int:
    return len(conn.keys(keys.job("*")))


def form_post(browser, submission: str):
    page = browser.get("/", headers=HTML)
    return browser.post("/", headers=HTML, data={
        "kind": "classify", "labels": "a, b", "items": "one\ntwo", "csrf_token": csrf_from(page.data),
        "submission": submission})


def cli_submit(*args: str):
    return CliRunner().invoke(main, ["submit", "--labels", "x,y", *args, "-"], input="one\n")


def test_the_api_answers_a_submission_past_the_queued_cap_with_429_and_retry_after(token_app, conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "2")
    client = token_app.test_client()
    first = client.post("/jobs", json=CLASSIFY, headers={**bearer("alice"), "Idempotency-Key": "k1"})
    assert client.post("/jobs", json=CLASSIFY, headers=bearer("alice")).status_code == 202
    refused = client.post("/jobs", json=CLASSIFY, headers=bearer("alice"))
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == str(admission.QUEUED_RETRY_AFTER)
    assert "2 queued (at most 2, LEASH_MAX_QUEUED_PER_OWNER)" in refused.get_json()["error"]
    assert job_count(conn) == 2
    # A repeat of a key already used writes nothing: it still gets its job.
    again = client.post("/jobs", json=CLASSIFY, headers={**bearer("alice"), "Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.get_json()["job_id"] == first.get_json()["job_id"]
    # So does a key written by the previous release's form of the key (a retry across a deploy).
    conn.set(keys.legacy_idempotency("alice", "k0"), first.get_json()["job_id"])
    old = client.post("/jobs", json=CLASSIFY, headers={**bearer("alice"), "Idempotency-Key": "k0"})
    assert old.status_code == 200 and old.get_json()["job_id"] == first.get_json()["job_id"]
    assert client.post("/jobs", json=CLASSIFY, headers=bearer("bob")).status_code == 202  # per owner
    # Once one of them starts, there is room again.
    conn.zrem(keys.owner_state("alice", "queued"), first.get_json()["job_id"])
    assert client.post("/jobs", json=CLASSIFY, headers=bearer("alice")).status_code == 202


def test_the_form_answers_the_queued_cap_with_429_the_message_and_no_job(token_app, conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "1")
    browser = token_app.test_client()
    sign_in(browser, "alice")
    assert form_post(browser, "submission-1").status_code == 303
    refused = form_post(browser, "submission-2")
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "60"
    assert re.search(rb'id="refusal">Too many jobs waiting: owner &#39;alice&#39; has 1 queued', refused.data)
    assert job_count(conn) == 1


def test_leash_submit_past_the_queued_cap_is_refused_at_the_door_in_one_line_and_exit_2(conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "1")
    assert cli_submit().exit_code == 0
    refused = cli_submit()
    assert refused.exit_code == 2
    assert refused.stderr.count("\n") == 1 and "LEASH_MAX_QUEUED_PER_OWNER" in refused.stderr
    assert job_count(conn) == 1


def test_the_submission_rate_is_one_counter_for_the_api_and_the_cli_with_retry_after(app, conn, env):
    env.setenv("LEASH_SUBMIT_RATE", "2/minute")
    client = app.test_client()
    assert client.post("/jobs", json=CLASSIFY).status_code == 202
    assert cli_submit().exit_code == 0
    refused = client.post("/jobs", json=CLASSIFY)
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert "LEASH_SUBMIT_RATE" in refused.get_json()["error"]
    cli_refused = cli_submit()
    assert cli_refused.exit_code == 2 and "too many submissions" in cli_refused.stderr
    assert job_count(conn) == 2
    # Its counter lives in the job store's Redis, under leash's prefix, and expires.
    counters = conn.keys(keys.SUBMIT_RATE_PREFIX + "*")
    assert counters and all(conn.ttl(key) > 0 for key in counters)


def test_the_form_answers_the_submission_rate_with_429(app, conn, env):
    env.setenv("LEASH_SUBMIT_RATE", "1/hour")
    browser = app.test_client()
    assert form_post(browser, "submission-1").status_code == 303
    refused = form_post(browser, "submission-2")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 60
    assert job_count(conn) == 1


@pytest.mark.parametrize("value", ["60 per fortnight", "often", "-1/minute"])
def test_a_bad_submission_rate_is_one_line_naming_the_setting(env, value):
    env.setenv("LEASH_SUBMIT_RATE", value)
    with pytest.raises(ValueError, match=r"^LEASH_SUBMIT_RATE must be a rate like 60/minute"):
        config.check_all()


@pytest.mark.slow
def test_limits_apply_at_the_door_only_a_job_accepted_earlier_runs_to_the_end(conn, env, burst):
    ids = [enqueue(conn, "count", {"items": ["a", "b"]}, owner="ann")[0] for _ in range(3)]
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "1")  # lowered after they were accepted
    env.setenv("LEASH_SUBMIT_RATE", "1/hour")
    assert admission.check(conn, "ann") is not None
    burst()
    wait_for(lambda: all(states.status(conn, i)["state"] == "succeeded" for i in ids), 60,
             message="every job accepted earlier succeeds")
    assert [states.status(conn, i)["error"] for i in ids] == [None, None, None]
    assert state_index.count(conn, "ann", "succeeded") == 3 and state_index.count(conn, "ann", "queued") == 0


def test_an_owner_past_its_daily_budget_gets_429_until_the_next_utc_day_from_api_form_and_cli(
        token_app, conn, env):
    from jobs.usage.budget import seconds_to_next_utc_day
    from jobs.usage.meter import utc_day

    env.setenv("LEASH_OWNER_DAILY_TOKENS", "1000")
    conn.hset(keys.usage_owner_day("alice", utc_day()), mapping={"input_tokens": 900, "output_tokens": 99})
    client = token_app.test_client()
    assert client.post("/jobs", json=CLASSIFY, headers=bearer("alice")).status_code == 202  # 999 of 1000
    conn.hincrby(keys.usage_owner_day("alice", utc_day()), "output_tokens", 1)
    refused = client.post("/jobs", json=CLASSIFY, headers=bearer("alice"))
    assert refused.status_code == 429 and refused.json["error"].startswith("budget reached: owner 'alice'")
    assert "LEASH_OWNER_DAILY_TOKENS" in refused.json["error"]
    assert abs(int(refused.headers["Retry-After"]) - seconds_to_next_utc_day()) <= 5
    assert client.post("/jobs", json=CLASSIFY, headers=bearer("bob")).status_code == 202  # bob's day is his own
    result = cli_submit("--owner", "alice")
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "budget reached" in result.output
    browser = token_app.test_client()
    sign_in(browser, "alice")
    assert form_post(browser, "daily-budget-1").status_code == 429
    assert job_count(conn) == 2
