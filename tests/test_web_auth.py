"""Owners: a job is visible only to its owner. API callers are named by their bearer token,
browsers by their signed session cookie; a cookie-authenticated change needs the CSRF token."""

from __future__ import annotations

import pytest

from jobs import keys
from jobs.read.owners import SHARED_OWNER, parse_tokens
from tests.web_support import CLASSIFY, HTML, TOKENS, bearer, csrf_from, finish_job, sign_in


def test_owner_b_gets_404_on_owner_a_job_its_result_and_its_cancel(token_app, conn):
    client = token_app.test_client()
    job_id = client.post("/jobs", json=CLASSIFY, headers=bearer("alice")).get_json()["job_id"]
    finish_job(conn, job_id, ["positive", "negative"])
    for method, path in (("get", f"/jobs/{job_id}"), ("get", f"/jobs/{job_id}/result"),
                         ("post", f"/jobs/{job_id}/cancel")):
        response = getattr(client, method)(path, headers=bearer("bob"))
        assert response.status_code == 404 and response.get_json() == {"error": "no such job"}, (method, path)
    assert client.get("/jobs", headers=bearer("bob")).get_json()["jobs"] == []
    mine = client.get(f"/jobs/{job_id}", headers=bearer("alice"))
    assert mine.status_code == 200 and mine.get_json()["state"] == "succeeded"  # bob's cancel changed nothing


@pytest.mark.parametrize("headers, message", [
    ({}, "missing API token: send 'Authorization: Bearer <token>'"),
    ({"Authorization": "Bearer wrong-token-0123456789"}, "unknown API token"),
    ({"Authorization": "Basic YWxpY2U6eA=="}, "must be 'Bearer <token>'"),
    ({"Authorization": "Bearer"}, "must be 'Bearer <token>'"),
])
def test_a_missing_or_wrong_token_is_401_with_what_to_send(token_app, conn, headers, message):
    client = token_app.test_client()
    for method, path in (("post", "/jobs"), ("get", "/jobs"), ("get", "/jobs/anything"),
                         ("get", "/jobs/anything/result"), ("post", "/jobs/anything/cancel")):
        response = getattr(client, method)(path, json=CLASSIFY, headers=headers)
        assert response.status_code == 401, (method, path)
        assert message in response.get_json()["error"]
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="leash"'
    assert not conn.keys(keys.job("*"))


def test_an_unknown_owner_never_sees_jobs_and_idempotency_keys_are_per_owner(token_app, conn):
    client = token_app.test_client()
    alice = client.post("/jobs", json=CLASSIFY, headers={**bearer("alice"), "Idempotency-Key": "k1"}).get_json()
    bob = client.post("/jobs", json=CLASSIFY, headers={**bearer("bob"), "Idempotency-Key": "k1"})
    assert bob.status_code == 202 and bob.get_json()["job_id"] != alice["job_id"]
    assert [j["job_id"] for j in client.get("/jobs", headers=bearer("alice")).get_json()["jobs"]] == [alice["job_id"]]


def test_with_tokens_browsers_are_owners_by_their_sign_in_and_cannot_see_each_other(token_app, conn):
    first, second = token_app.test_client(), token_app.test_client()
    assert sign_in(first, "alice").status_code == 303
    assert sign_in(second, "bob").status_code == 303
    page = first.get("/", headers=HTML)
    response = first.post("/", data={"kind": "classify", "labels": "a, b", "items": "one\ntwo",
                                     "csrf_token": csrf_from(page.data), "submission": "submission-1"})
    assert response.status_code == 303
    job_path = response.headers["Location"]
    assert first.get(job_path, headers=HTML).status_code == 200
    assert first.get(job_path).get_json()["state"] == "queued"  # the page's own poll, by cookie
    assert conn.hget(keys.job(job_path.rsplit("/", 1)[1]), "owner") == b"alice"
    assert second.get(job_path, headers=HTML).status_code == 404
    assert second.get(job_path).status_code == 404
    assert second.get("/jobs").get_json()["jobs"] == []


def test_a_cookie_authenticated_change_without_the_csrf_token_is_refused(app, conn):
    browser = app.test_client()
    page = browser.get("/", headers=HTML)  # the browser now has a session owner
    forged = browser.post("/jobs", json=CLASSIFY, headers={"Origin": "https://evil.example"})
    assert forged.status_code == 403 and "CSRF token is missing" in forged.get_json()["error"]
    assert not conn.keys(keys.job("*"))
    allowed = browser.post("/jobs", json=CLASSIFY, headers={"X-CSRFToken": csrf_from(page.data)})
    assert allowed.status_code == 202
    job_id = allowed.get_json()["job_id"]
    forged_cancel = browser.post(f"/jobs/{job_id}/cancel")
    assert forged_cancel.status_code == 403
    assert browser.get(f"/jobs/{job_id}").get_json()["state"] == "queued"


def test_open_mode_callers_share_one_owner_and_need_no_token(client, conn):
    job_id = client.post("/jobs", json=CLASSIFY).get_json()["job_id"]
    assert conn.hget(keys.job(job_id), "owner").decode() == SHARED_OWNER
    ignored = client.get(f"/jobs/{job_id}", headers={"Authorization": "Bearer anything-at-all-here"})
    assert ignored.status_code == 200


def test_open_mode_a_job_from_the_form_or_curl_is_visible_at_its_address_from_both(app, conn):
    browser, curl = app.test_client(), app.test_client()
    page = browser.get("/", headers=HTML)
    posted = browser.post("/", data={"kind": "classify", "labels": "a, b", "items": "one\ntwo",
                                     "csrf_token": csrf_from(page.data), "submission": "submission-1"})
    from_form = posted.headers["Location"]
    assert curl.get(from_form).status_code == 200  # no cookie at all, as curl
    from_curl = curl.post("/jobs", json=CLASSIFY).get_json()["url"]
    assert browser.get(from_curl, headers=HTML).status_code == 200
    assert browser.get(f"{from_curl}/result").status_code == 200
    listed = {j["job_id"] for j in curl.get("/jobs").get_json()["jobs"]}
    assert {from_form.rsplit("/", 1)[1], from_curl.rsplit("/", 1)[1]} <= listed


def test_token_requests_need_no_csrf_token(token_app, conn):
    client = token_app.test_client()
    job_id = client.post("/jobs", json=CLASSIFY, headers=bearer("alice")).get_json()["job_id"]
    assert client.post(f"/jobs/{job_id}/cancel", headers=bearer("alice")).status_code == 202


@pytest.mark.parametrize("raw, message", [
    ("alice", "has no '='"),
    ("alice=short", "shorter than 16 characters"),
    ("bad owner=" + "t" * 20, "must be 1-200 letters"),
    ("a=" + "t" * 20 + ",b=" + "t" * 20, "same token"),
])
def test_a_bad_token_setting_fails_at_startup_with_the_fix(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_tokens(raw)


def test_tokens_parse_into_a_token_to_owner_map():
    assert parse_tokens(",".join(f"{o}={t}" for o, t in TOKENS.items())) == {t: o for o, t in TOKENS.items()}
    assert parse_tokens("") == {}
