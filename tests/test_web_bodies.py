"""No body shape is a 500 at any door: JSON of any type where a form is read (sign-in, sign-out,
the form, replay), numbers a decimal box cannot compare, and rq-dashboard's views while a job runs."""

from __future__ import annotations

import json

import pytest
from rq import Queue, Worker
from rq.job import Job
from rq.serializers import JSONSerializer

from tests.web_support import CLASSIFY, HTML, TOKENS, basic, create_app_with, csrf_from, sign_in

ODD_JSON = [[1, 2], 1, "x", None, True, 1.5, {"token": 1}, {"token": [1, 2]}, {"token": {"a": 1}},
            {"csrf_token": 5, "kind": ["classify"]}, {}]


@pytest.fixture
def token_client(conn):
    return create_app_with(LEASH_API_TOKENS=",".join(f"{o}={t}" for o, t in TOKENS.items())).test_client()


@pytest.mark.parametrize("body", ODD_JSON, ids=repr)
@pytest.mark.parametrize("path", ["/signin", "/signout", "/"])
def test_any_json_body_to_an_anonymous_form_is_a_415(token_client, path, body):
    for headers in ({}, HTML):
        response = token_client.post(path, data=json.dumps(body), content_type="application/json", headers=headers)
        assert response.status_code == 415, (path, body, response.status_code, response.data[:300])
        if headers:
            continue
        assert "not JSON" in response.get_json()["error"]


@pytest.mark.parametrize("body", ODD_JSON, ids=repr)
def test_any_json_body_to_a_signed_in_form_is_a_415(token_client, body):
    sign_in(token_client, "alice")
    for path in ("/", "/signout", "/signin"):
        response = token_client.post(path, data=json.dumps(body), content_type="application/json", headers=HTML)
        assert response.status_code == 415, (path, body, response.status_code, response.data[:300])


@pytest.mark.parametrize("value", ["sNaN", "NaN", "-sNaN", "Infinity", "-inf", "1e999999", "snan123"])
def test_a_usd_budget_that_is_not_a_finite_number_is_a_422_naming_the_box(token_client, value):
    sign_in(token_client, "alice")
    page = token_client.get("/", headers=HTML)
    response = token_client.post("/", headers=HTML, data={
        "csrf_token": csrf_from(page.data), "kind": "classify", "items": "good film", "labels": "good\nbad",
        "budget_usd": value, "submission": "abcdefgh12345678"})
    assert response.status_code == 422, (value, response.status_code, response.data[:300])
    assert b"USD budget" in response.data


def test_the_dashboards_workers_tab_answers_while_a_leash_job_runs(conn):
    app = create_app_with(LEASH_DASHBOARD_USER="op", LEASH_DASHBOARD_PASSWORD="pw")
    client = app.test_client()
    job_id = client.post("/jobs", json=CLASSIFY).get_json()["job_id"]
    worker = Worker([Queue("leash", connection=conn, serializer=JSONSerializer)], connection=conn,
                    serializer=JSONSerializer)
    worker.register_birth()
    try:
        worker.execution = worker.prepare_execution(Job.fetch(job_id, connection=conn, serializer=JSONSerializer))
        response = client.get("/rq/0/data/workers.json", headers=basic("op", "pw"))
        assert response.status_code == 200, response.data[:300]
        [shown] = response.get_json()["workers"]
        assert shown["current_job"]["job_id"] == job_id
    finally:
        worker.register_death()
