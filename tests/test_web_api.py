"""The JSON API against a real Redis: submit, poll, page results, cancel, list, and every
error code with a message that says how to fix the request."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from jobs import keys
from jobs.core import states
from tests.web_support import CLASSIFY, RoundTrips, create_app_with, finish_job


def submit(client, body=CLASSIFY, **kwargs):
    return client.post("/jobs", json=body, **kwargs)


def test_submit_answers_202_with_the_job_id_its_state_and_its_address(client, conn):
    response = submit(client)
    assert response.status_code == 202
    body = response.get_json()
    assert set(body) == {"job_id", "state", "url"}
    assert body["state"] == "queued"
    assert body["url"] == f"/jobs/{body['job_id']}" == response.headers["Location"]
    assert conn.hget(keys.job(body["job_id"]), "total") == b"2"


def test_a_repeat_with_the_same_idempotency_key_is_a_200_for_the_same_job(client, conn):
    first = submit(client, headers={"Idempotency-Key": "order-42"})
    again = submit(client, headers={"Idempotency-Key": "order-42"})
    other = submit(client, headers={"Idempotency-Key": "order-43"})
    assert first.status_code == 202 and again.status_code == 200 and other.status_code == 202
    assert again.get_json() == first.get_json()
    assert other.get_json()["job_id"] != first.get_json()["job_id"]
    assert client.get("/jobs").get_json()["total"] == 2


@pytest.mark.parametrize("headers, body, status, message", [
    ({}, b'{"kind": "classify"', 400, "not valid JSON"),
    ({}, b"\xff\xfe\x00garbage", 400, "not valid JSON"),
    ({}, b"[1, 2]", 400, "must be a JSON object"),
    ({}, b"[" * 100_000 + b"]" * 100_000, 400, "not valid JSON"),
    ({}, json.dumps({"items": ["a"]}).encode(), 400, "missing field 'kind'"),
    ({}, json.dumps({"kind": "translate", "items": ["a"]}).encode(), 400, "unknown kind 'translate'; known kinds:"),
    ({}, json.dumps({"kind": "classify", "labels": ["x"]}).encode(), 400, "missing field 'items'"),
    ({}, json.dumps({"kind": "classify", "items": ["a"]}).encode(), 400, "missing field 'labels'"),
    ({"Idempotency-Key": "has spaces in it"}, json.dumps(CLASSIFY).encode(), 400, "Idempotency-Key header must be"),
    ({"Content-Type": "text/plain"}, json.dumps(CLASSIFY).encode(), 415, "Content-Type: application/json"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, b"kind=classify", 415, "send the job as JSON"),
    ({}, json.dumps({"kind": 7, "items": ["a"]}).encode(), 422, "'kind' must be a string"),
    ({}, json.dumps({**CLASSIFY, "items": "one string"}).encode(), 422, "'items' must be a list of strings"),
    ({}, json.dumps({**CLASSIFY, "items": []}).encode(), 422, "'items' is empty"),
    ({}, json.dumps({**CLASSIFY, "items": ["a", 3]}).encode(), 422, "items[1] must be a string"),
    ({}, json.dumps({**CLASSIFY, "items": ["x"] * 1001}).encode(), 422, "too many items: 1001 (at most 1000, LEASH_MAX_ITEMS)"),
    ({}, json.dumps({**CLASSIFY, "items": ["x" * 10_001]}).encode(), 422, "10001 characters long (at most 10000, LEASH_MAX_ITEM_CHARS)"),
    ({}, json.dumps({**CLASSIFY, "labels": "positive"}).encode(), 422, "'labels' must be a non-empty list"),
    ({}, json.dumps({**CLASSIFY, "max_attempts": 0}).encode(), 422, "max_attempts must be an integer from 1 to 100"),
    ({}, json.dumps({**CLASSIFY, "max_attempts": "3"}).encode(), 422, "max_attempts must be an integer"),
    ({}, b'{"kind": "classify", "items": ["a"], "labels": ["x"], "n": NaN}', 422, "not JSON-serialisable"),
])
def test_bad_submissions_get_the_right_code_and_a_message_saying_what_to_fix(client, conn, headers, body, status,
                                                                              message):
    headers = {"Content-Type": "application/json", **headers}
    response = client.post("/jobs", data=body, headers=headers)
    assert response.status_code == status, response.get_json()
    assert response.mimetype == "application/json"
    assert message in response.get_json()["error"]
    assert not conn.keys(keys.job("*")), "a rejected submission wrote a job"


def test_a_body_over_the_limit_is_413_before_it_is_parsed(conn):
    small = create_app_with(LEASH_MAX_BODY_BYTES=1000).test_client()
    for content_type in ("application/json", "text/plain"):  # 413 wins over 415 and over bad JSON
        response = small.post("/jobs", data=b"{" * 1001, headers={"Content-Type": content_type})
        assert response.status_code == 413
        error = response.get_json()["error"]
        assert "1001 bytes" in error and "limit is 1000 bytes" in error and "LEASH_MAX_BODY_BYTES" in error


def test_the_default_limit_is_one_mebibyte(client, conn):
    items = ["x" * 1100] * 1000  # a valid shape, just over 1 MiB of JSON
    body = json.dumps({**CLASSIFY, "items": items}).encode()
    assert len(body) > 1024 * 1024
    response = client.post("/jobs", data=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert "limit is 1048576 bytes" in response.get_json()["error"]


def test_a_poll_returns_exactly_the_status_fields(client, conn):
    job_id = submit(client).get_json()["job_id"]
    body = client.get(f"/jobs/{job_id}").get_json()
    assert set(body) == set(states.FIELDS)
    assert body["job_id"] == job_id and body["state"] == "queued" and body["total"] == 2
    assert body["stale"] is False and body["result"] is None and body["error"] is None


def test_the_result_field_is_a_summary_and_a_link_never_the_per_item_output(client, conn):
    job_id = submit(client).get_json()["job_id"]
    finish_job(conn, job_id, ["positive", "negative"], summary={"items": 2, "labels": {"positive": 1, "negative": 1}})
    body = client.get(f"/jobs/{job_id}").get_json()
    assert body["state"] == "succeeded"
    assert body["result"] == {"summary": {"items": 2, "labels": {"positive": 1, "negative": 1}},
                              "url": f"/jobs/{job_id}/result"}


def test_an_unchanged_job_polls_as_304_and_a_changed_one_as_200(client, conn):
    job_id = submit(client).get_json()["job_id"]
    first = client.get(f"/jobs/{job_id}")
    etag = first.headers["ETag"]
    assert "Accept" in first.headers["Vary"] and first.headers["Cache-Control"] == "no-cache, private"
    unchanged = client.get(f"/jobs/{job_id}", headers={"If-None-Match": etag})
    assert unchanged.status_code == 304 and unchanged.data == b""
    conn.hset(keys.job(job_id), "done", 1)
    changed = client.get(f"/jobs/{job_id}", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.get_json()["done"] == 1 and changed.headers["ETag"] != etag


def test_unknown_jobs_are_404_no_such_job(client, conn):
    for path in ("/jobs/nope", "/jobs/nope/result", "/jobs/" + "x" * 300):
        response = client.get(path)
        assert response.status_code == 404 and response.get_json() == {"error": "no such job"}
    response = client.post("/jobs/nope/cancel")
    assert response.status_code == 404 and response.get_json() == {"error": "no such job"}


def test_results_are_paged_with_offset_and_limit(client, conn):
    job_id = submit(client).get_json()["job_id"]
    finish_job(conn, job_id, [f"label-{i}" for i in range(7)])
    page = client.get(f"/jobs/{job_id}/result?offset=2&limit=3").get_json()
    assert [item["index"] for item in page["items"]] == [2, 3, 4]
    assert [item["result"] for item in page["items"]] == ["label-2", "label-3", "label-4"]
    assert page["total"] == 7 and page["next"] == f"/jobs/{job_id}/result?offset=5&limit=3"
    last = client.get(page["next"]).get_json()
    assert [item["index"] for item in last["items"]] == [5, 6] and last["next"] is None


@pytest.mark.parametrize("query, message", [
    ("offset=-1", "'offset' must be an integer from 0"),
    ("offset=abc", "'offset' must be an integer"),
    ("limit=0", "'limit' must be an integer from 1 to 500"),
    ("limit=501", "'limit' must be an integer from 1 to 500"),
])
def test_bad_paging_parameters_are_400(client, conn, query, message):
    job_id = submit(client).get_json()["job_id"]
    response = client.get(f"/jobs/{job_id}/result?{query}")
    assert response.status_code == 400 and message in response.get_json()["error"]


def test_reading_a_result_page_never_reads_the_whole_items_hash(app, client, conn, monkeypatch):
    job_id = submit(client).get_json()["job_id"]
    finish_job(conn, job_id, ["x"] * 300)
    trips = RoundTrips(app.extensions["leash_redis"], monkeypatch)
    assert len(client.get(f"/jobs/{job_id}/result?offset=10&limit=20").get_json()["items"]) == 20
    assert trips.count == 1, trips.commands
    assert "HGETALL" not in " ".join(trips.commands) and "HMGET" in trips.commands[0]


def test_cancel_a_queued_job_is_202_and_it_ends_failed_canceled(client, conn):
    job_id = submit(client).get_json()["job_id"]
    response = client.post(f"/jobs/{job_id}/cancel")
    assert response.status_code == 202
    assert response.get_json() == {"job_id": job_id, "state": "failed", "cancel": "requested",
                                   "url": f"/jobs/{job_id}"}
    assert client.get(f"/jobs/{job_id}").get_json()["error"] == "canceled"
    again = client.post(f"/jobs/{job_id}/cancel")
    assert again.status_code == 409 and "already failed" in again.get_json()["error"]


def test_the_job_list_is_newest_first_and_paged(client, conn):
    ids = [submit(client).get_json()["job_id"] for _ in range(5)]
    first = client.get("/jobs?limit=2").get_json()
    assert first["total"] == 5 and [job["job_id"] for job in first["jobs"]] == ids[::-1][:2]
    assert set(first["jobs"][0]) == set(states.FIELDS)
    rest = client.get("/jobs?offset=2&limit=10").get_json()
    assert [job["job_id"] for job in rest["jobs"]] == ids[::-1][2:] and rest["next"] is None


def test_a_job_whose_record_expired_leaves_the_list_and_its_index(client, conn):
    ids = [submit(client).get_json()["job_id"] for _ in range(3)]
    conn.delete(keys.job(ids[1]))  # as LEASH_RESULT_TTL after the job ended
    listing = client.get("/jobs").get_json()
    assert [job["job_id"] for job in listing["jobs"]] == [ids[2], ids[0]]
    assert client.get("/jobs").get_json()["total"] == 2, "the index was trimmed as the expired id was met"


def test_unknown_addresses_and_methods_are_json_404_and_405(client, conn):
    missing = client.get("/nothing-here")
    assert missing.status_code == 404 and "no such address: GET /nothing-here" in missing.get_json()["error"]
    wrong = client.delete("/jobs")
    assert wrong.status_code == 405 and wrong.get_json()["error"] == "DELETE is not allowed on /jobs; use GET, POST"


def test_an_unexpected_error_is_a_json_500_without_a_traceback(conn):
    app = create_app_with()
    app.config["PROPAGATE_EXCEPTIONS"] = False  # Flask's own: the error handler answers, as in production

    @app.get("/explode")
    def explode():
        raise RuntimeError("secret internals")

    response = app.test_client().get("/explode")
    assert response.status_code == 500
    assert response.get_json()["error"] == "internal error; it has been logged. Try again, and report it if it persists"
    assert b"Traceback" not in response.data and b"secret" not in response.data


def test_healthz_is_200_when_redis_answers(client, conn):
    assert client.get("/healthz").get_json() == {"ok": True}


def _unreachable_requests(job_id="someid"):
    return [("get", "/healthz", None), ("post", "/jobs", CLASSIFY), ("get", f"/jobs/{job_id}", None),
            ("get", f"/jobs/{job_id}/result", None), ("post", f"/jobs/{job_id}/cancel", None), ("get", "/jobs", None)]


def _assert_all_503(client):
    for method, path, body in _unreachable_requests():
        response = getattr(client, method)(path, json=body)
        assert response.status_code == 503, (method, path, response.data)
        assert "Redis" in response.get_json()["error"] and "try again" in response.get_json()["error"]
        assert response.headers["Retry-After"] == "5"


def test_a_refused_redis_connection_is_503_everywhere(conn):
    _assert_all_503(create_app_with(REDIS_URL="redis://127.0.0.1:1/0").test_client())


def test_a_redis_that_does_not_answer_is_503_after_the_timeout(conn):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    accepted = []
    stop = threading.Event()

    def accept():  # accepts connections and never answers
        silent.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(silent.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        port = silent.getsockname()[1]
        _assert_all_503(create_app_with(REDIS_URL=f"redis://127.0.0.1:{port}/0", LEASH_REDIS_TIMEOUT=0.2).test_client())
        assert accepted, "the app never reached the silent server"
    finally:
        stop.set()
        thread.join(timeout=5)
        for sock in accepted:
            sock.close()
        silent.close()


def test_one_poll_costs_at_most_two_redis_round_trips(app, client, conn, monkeypatch):
    job_id = submit(client).get_json()["job_id"]
    trips = RoundTrips(app.extensions["leash_redis"], monkeypatch)
    first = client.get(f"/jobs/{job_id}")
    assert first.status_code == 200 and trips.count <= 2, trips.commands
    trips.reset()
    unchanged = client.get(f"/jobs/{job_id}", headers={"If-None-Match": first.headers["ETag"]})
    assert unchanged.status_code == 304 and trips.count <= 2, trips.commands
    assert trips.count == 1  # measured today: the job hash and RQ's status in one pipeline
