"""GET /metrics: the queue's numbers read from Redis at scrape time, request counters, and an
answer (leash_redis_up 0) even when Redis is down."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from jobs import keys
from tests.web_support import CLASSIFY, create_app_with


def samples(response) -> dict[tuple[str, tuple], float]:
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    found = {}
    for family in text_string_to_metric_families(response.data.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_metrics_report_the_queue_from_redis(env, conn):
    env.setenv("LEASH_OWNER_CONCURRENCY", "10")  # all three ready at once, none held by the owner's limit
    env.setenv("LEASH_QUEUE", "leash,bulk")
    client = create_app_with().test_client()
    for _ in range(3):
        assert client.post("/jobs", json=CLASSIFY).status_code == 202
    assert client.post("/jobs", json={**CLASSIFY, "queue": "bulk"}).status_code == 202
    now = time.time()
    conn.zadd(keys.LEASES, {"fresh-job": now + 60, "stale-job-1": now - 5, "stale-job-2": now - 1})
    conn.hset(keys.STATS_TOTALS, mapping={"succeeded:classify": 7, "failed:classify": 2, "failed:summarise": 1,
                                             "canceled:classify": 5})
    conn.set(keys.RECLAIMS, 4)
    conn.zadd(keys.FAILED_INDEX, {"a": 1, "b": 2})
    found = samples(client.get("/metrics"))
    assert found[("leash_redis_up", ())] == 1
    assert found[("leash_queue_depth", (("queue", "leash"),))] == 3
    assert found[("leash_queue_depth", (("queue", "bulk"),))] == 1
    assert found[("leash_jobs_scheduled", (("queue", "bulk"),))] == 0
    assert found[("leash_jobs_running", ())] == 3
    assert found[("leash_jobs_stale", ())] == 2
    assert found[("leash_jobs_succeeded_total", (("kind", "classify"),))] == 7
    assert found[("leash_jobs_failed_total", (("kind", "classify"),))] == 2
    assert found[("leash_jobs_failed_total", (("kind", "summarise"),))] == 1
    assert found[("leash_jobs_canceled_total", (("kind", "classify"),))] == 5
    assert found[("leash_lease_reclaims_total", ())] == 4
    assert found[("leash_jobs_failed_index", ())] == 2
    assert found[("leash_jobs_scheduled", (("queue", "leash"),))] == 0


def test_metrics_count_requests_by_route_and_status(client, conn):
    # The counters live for the whole process (as they do in the web process): compare counts.
    sample = ("leash_http_requests_total", (("method", "GET"), ("route", "/jobs/<job_id>"), ("status", "404")))
    before = samples(client.get("/metrics")).get(sample, 0)
    client.get("/jobs/unknown")
    client.get("/jobs/unknown")
    assert samples(client.get("/metrics"))[sample] - before == 2


def test_metrics_still_answer_when_redis_is_down(conn):
    found = samples(create_app_with(REDIS_URL="redis://127.0.0.1:1/0").test_client().get("/metrics"))
    assert found[("leash_redis_up", ())] == 0
    assert ("leash_queue_depth", (("queue", "leash"),)) not in found


def test_metrics_content_type_names_its_charset_once(client, conn):
    content_type = client.get("/metrics").headers["Content-Type"]
    assert content_type.count("charset") == 1 and content_type.startswith("text/plain; version=")


def test_with_a_metrics_token_only_a_scraper_presenting_it_sees_the_numbers(conn):
    client = create_app_with(LEASH_METRICS_TOKEN="scrape-token-0123456789").test_client()
    for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": "Basic c2NyYXBlOng="},
                    {"Authorization": "Bearer scrape-token-012345678"}):
        refused = client.get("/metrics", headers=headers)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert "LEASH_METRICS_TOKEN" in refused.get_json()["error"] and b"leash_" not in refused.data
    found = samples(client.get("/metrics", headers={"Authorization": "Bearer scrape-token-0123456789"}))
    assert found[("leash_redis_up", ())] == 1


def test_metrics_token_comes_from_the_environment(env, conn):
    env.setenv("LEASH_METRICS_TOKEN", "from-the-env-0123456789")
    client = create_app_with().test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer from-the-env-0123456789"}).status_code == 200


def test_in_production_metrics_need_a_token_unless_made_public_on_purpose(conn, caplog):
    from tests.web_support import TOKENS, create_app_with

    tokens = ",".join(f"{o}={t}" for o, t in TOKENS.items())
    closed = create_app_with(LEASH_API_TOKENS=tokens).test_client().get("/metrics")
    assert closed.status_code == 403
    assert "LEASH_METRICS_TOKEN" in closed.get_json()["error"] and "LEASH_METRICS_PUBLIC" in closed.get_json()["error"]
    assert "leash_queue_depth" not in closed.get_data(as_text=True)
    assert any("LEASH_METRICS_TOKEN" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    assert create_app_with(LEASH_API_TOKENS=tokens, LEASH_METRICS_PUBLIC=True).test_client().get("/metrics").status_code == 200
    assert create_app_with(LEASH_TRUSTED_USER_HEADER="X-User").test_client().get("/metrics").status_code == 403
    assert create_app_with().test_client().get("/metrics").status_code == 200  # development: open


def test_the_deploy_recipes_set_a_metrics_token():
    import json

    from tests.conftest import ROOT

    assert json.loads((ROOT / "app.json").read_text())["env"]["LEASH_METRICS_TOKEN"]["generator"] == "secret"
    render = (ROOT / "render.yaml").read_text()
    assert "key: LEASH_METRICS_TOKEN" in render.split("type: worker")[0]
    assert "LEASH_METRICS_TOKEN" in (ROOT / "docs" / "DEPLOY.md").read_text()
