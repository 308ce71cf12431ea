"""rq-dashboard at /rq: behind basic auth, CSRF on its actions, never mounted by accident."""

from __future__ import annotations

import html
import json

import pytest

from tests.web_support import CLASSIFY, basic, create_app_with

USER, PASSWORD = "operator", "correct horse battery staple"


@pytest.fixture
def dashboard_app(conn):
    return create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD)


def test_without_credentials_configured_the_dashboard_is_not_mounted(conn):
    client = create_app_with().test_client()
    assert client.get("/rq/").status_code == 404
    assert create_app_with(LEASH_DASHBOARD_USER=USER).test_client().get("/rq/").status_code == 404  # half-configured


def test_under_leash_dev_it_is_mounted_without_a_password(conn):
    assert create_app_with(LEASH_DEV=True).test_client().get("/rq/").status_code == 200


@pytest.mark.parametrize("headers", [{}, basic(USER, "wrong"), basic("someone", PASSWORD),
                                     {"Authorization": "Basic !!!notbase64"}, {"Authorization": "Bearer x"}])
def test_without_the_right_credentials_it_is_401(dashboard_app, headers):
    client = dashboard_app.test_client()
    for path in ("/rq/", "/rq/0/data/queues.json", "/rq/static/js/dashboard.js"):
        response = client.get(path, headers=headers)
        assert response.status_code == 401, path
        assert response.headers["WWW-Authenticate"].startswith('Basic realm="leash dashboard"')
        assert "LEASH_DASHBOARD_USER" in response.get_json()["error"]


def test_with_the_right_credentials_it_is_200_and_shows_leash_jobs(dashboard_app, conn):
    client = dashboard_app.test_client()
    job_id = client.post("/jobs", json=CLASSIFY).get_json()["job_id"]
    auth = basic(USER, PASSWORD)
    assert client.get("/rq/", headers=auth).status_code == 200
    queues = client.get("/rq/0/data/queues.json", headers=auth).get_json()["queues"]
    assert [(q["name"], q["count"]) for q in queues] == [("leash", 1)]
    job = client.get(f"/rq/0/data/job/{job_id}.json", headers=auth).get_json()
    # JSON serializer: meta is readable (HTML-escaped, as the page inserts it as markup)
    assert json.loads(html.unescape(job["metadata"]))["leash_kind"] == "classify"
    assert client.get(f"/rq/0/view/job/{job_id}", headers=auth).status_code == 200


def test_a_cross_site_post_without_the_csrf_token_is_refused(dashboard_app, conn):
    client = dashboard_app.test_client()
    auth = basic(USER, PASSWORD)
    client.get("/rq/", headers=auth)  # a logged-in operator's browser
    forged = client.post("/rq/queue/leash/compact", headers={**auth, "Origin": "https://evil.example"})
    assert forged.status_code == 403 and "CSRF token is missing" in forged.get_json()["error"]
    bad = client.post("/rq/queue/leash/compact", headers={**auth, "X-CSRFToken": "forged"})
    assert bad.status_code == 403


def test_its_own_javascript_gets_the_token_from_the_cookie_and_its_post_works(dashboard_app, conn):
    client = dashboard_app.test_client()
    auth = basic(USER, PASSWORD)
    client.get("/rq/", headers=auth)
    cookie = client.get_cookie("_csrf_token", path="/rq")
    assert cookie is not None and cookie.same_site == "Strict"
    response = client.post("/rq/requeue/leash", headers={**auth, "X-CSRFToken": cookie.value})
    assert response.status_code == 200 and response.get_json() == {"status": "OK", "count": 0}


def test_requeue_all_by_get_is_refused(dashboard_app, conn):
    response = dashboard_app.test_client().get("/rq/requeue/leash", headers=basic(USER, PASSWORD))
    assert response.status_code == 405 and response.headers["Allow"] == "POST"


def test_a_second_app_in_the_same_process_still_works(conn):
    first = create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD)
    second = create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD)
    for app in (first, second):
        client = app.test_client()
        assert client.get("/rq/").status_code == 401
        assert client.get("/rq/", headers=basic(USER, PASSWORD)).status_code == 200
    assert create_app_with().test_client().get("/rq/").status_code == 404  # nothing leaks into a later app


def test_the_dashboard_reuses_one_redis_client_instead_of_one_per_request(dashboard_app, conn):
    client = dashboard_app.test_client()
    auth = basic(USER, PASSWORD)
    clients = []  # kept alive, so a new client cannot reuse an old one's id
    for _ in range(20):
        assert client.get("/rq/0/data/queues.json", headers=auth).status_code == 200
        clients.append(dashboard_app.redis_conn)
    assert len({id(c) for c in clients}) == 1


XSS = '<img src=x onerror="alert(1)"><script>alert(2)</script>'


def _failed_job_with_error(conn, client, text: str) -> str:
    from rq.job import Job
    from rq.results import Result
    from rq.serializers import JSONSerializer

    job_id = client.post("/jobs", json={**CLASSIFY, "items": [text]}).get_json()["job_id"]
    Result.create_failure(Job.fetch(job_id, connection=conn, serializer=JSONSerializer), ttl=600,
                          exc_string=f"BadRequest: the provider said: {text}")
    return job_id


def test_the_error_text_and_items_its_data_show_are_escaped(dashboard_app, conn):
    client = dashboard_app.test_client()
    job_id = _failed_job_with_error(conn, client, XSS)
    auth = basic(USER, PASSWORD)
    job = client.get(f"/rq/0/data/job/{job_id}.json", headers=auth).get_json()
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in job["exc_info"]
    listed = client.get("/rq/0/data/jobs/leash/queued/10/asc/1.json", headers=auth)
    for response in (client.get(f"/rq/0/data/job/{job_id}.json", headers=auth), listed,
                     client.get("/rq/0/data/workers.json", headers=auth),
                     client.get("/rq/0/data/queues.json", headers=auth)):
        assert response.status_code == 200
        data = json.loads(response.data)
        # The values its templates insert as they are hold no markup; the two they escape
        # themselves (the list's description and error) are left for them.
        for row in data.get("jobs", [data]):
            for key, value in row.items():
                if isinstance(value, str) and key not in ("description", "exc_info"):
                    assert "<" not in value, (key, value)
    assert "&lt;" not in listed.get_json()["jobs"][0]["description"]  # not escaped twice


def test_its_pages_get_a_strict_policy_allowing_only_their_own_inline_script(dashboard_app, conn):
    import base64
    import hashlib
    import re

    client = dashboard_app.test_client()
    job_id = _failed_job_with_error(conn, client, XSS)
    for path in ("/rq/", f"/rq/0/view/job/{job_id}", "/rq/0/view/workers", "/rq/0/view/jobs"):
        response = client.get(path, headers=basic(USER, PASSWORD))
        assert response.status_code == 200, path
        policy = response.headers["Content-Security-Policy"]
        scripts = dict(part.strip().split(" ", 1) for part in policy.split(";"))["script-src"].split()
        assert "'unsafe-inline'" not in scripts and "*" not in scripts and "data:" not in scripts
        inline = re.findall(r'<script type="text/javascript">(.*?)</script>', response.get_data(as_text=True), re.S)
        assert inline
        for script in inline:
            digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in scripts
        assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy
