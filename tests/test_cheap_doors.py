"""Doors that are cheap to ask and dear to answer are limited: dry runs and the form's Estimate
count against LEASH_DRY_RUN_RATE per owner and per client address (before the payload is
checked), a 429 with Retry-After beyond it; "Look now" (a provider call) at most once per job
every 30 s."""

from __future__ import annotations

import pytest

from tests.test_batch_jobs import submit_batch, waiting
from tests.web_support import CLASSIFY, HTML, TOKENS, bearer, create_app_with, csrf_from

TOKEN_LIST = ",".join(f"{o}={t}" for o, t in TOKENS.items())


def _from(app, address: str):
    client = app.test_client()
    client.environ_base["REMOTE_ADDR"] = address
    return client


def _dry_run(client, owner: str):
    return client.post("/jobs", json={**CLASSIFY, "dry_run": True}, headers=bearer(owner))


def test_dry_runs_are_limited_per_owner_and_per_address(conn, env):
    env.setenv("LEASH_DRY_RUN_RATE", "3/minute")
    app = create_app_with(LEASH_API_TOKENS=TOKEN_LIST)
    one = _from(app, "203.0.113.40")
    assert [_dry_run(one, "alice").status_code for _ in range(3)] == [200] * 3
    refused = _dry_run(one, "alice")
    assert refused.status_code == 429 and 1 <= int(refused.headers["Retry-After"]) <= 60
    assert "LEASH_DRY_RUN_RATE" in refused.get_json()["error"]
    assert _dry_run(one, "bob").status_code == 429  # the same address, another owner
    assert _dry_run(_from(app, "203.0.113.41"), "alice").status_code == 429  # the same owner elsewhere
    assert _dry_run(_from(app, "203.0.113.42"), "bob").status_code == 200
    # A refused dry run is not checked: even a payload the check would refuse gets the 429.
    assert one.post("/jobs", json={"kind": "extract", "items": ["a"], "schema": {"$ref": "#"}, "dry_run": True},
                    headers=bearer("alice")).status_code == 429
    # Submissions are another counter (LEASH_SUBMIT_RATE, unset here).
    assert one.post("/jobs", json=CLASSIFY, headers=bearer("alice")).status_code == 202


def test_the_public_forms_estimate_button_is_limited_per_address(conn, env):
    env.setenv("LEASH_DRY_RUN_RATE", "2/minute")
    app = create_app_with(LEASH_PUBLIC_SUBMIT=True)
    visitor = _from(app, "198.51.100.50")
    token = csrf_from(visitor.get("/", headers=HTML).data)

    def estimate(client, n):
        return client.post("/", headers=HTML, data={"kind": "classify", "labels": "a, b", "items": "one\ntwo",
                                                   "csrf_token": token, "submission": f"estimate-{n:04d}",
                                                   "estimate": "1"})

    assert [estimate(visitor, n).status_code for n in range(2)] == [200, 200]
    refused = estimate(visitor, 2)
    assert refused.status_code == 429 and "LEASH_DRY_RUN_RATE" in refused.data.decode()


@pytest.mark.slow
def test_look_now_is_taken_at_most_once_per_job_every_30_seconds(conn, burst, batch_env):
    job_id, _ = submit_batch(conn, "look", 2, owner="shared")
    burst()
    waiting(conn, job_id)
    client = create_app_with().test_client()
    assert client.post(f"/jobs/{job_id}/look").status_code == 202
    again = client.post(f"/jobs/{job_id}/look")
    assert again.status_code == 429 and 25 <= int(again.headers["Retry-After"]) <= 30
    assert "look again in" in again.get_json()["error"]
    other, _ = submit_batch(conn, "other", 2, owner="shared")  # another job has its own 30 s
    burst()
    waiting(conn, other)
    assert client.post(f"/jobs/{other}/look").status_code == 202
