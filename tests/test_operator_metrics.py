"""What an operator alerts on, at /metrics: workers by state, the oldest queued job's age and the
paused queues, jobs deferred while they wait for a budget or their provider, the archive's
backlog; and one JSON access line per request, on by default in production, with no secret."""

from __future__ import annotations

import json
import logging
import time

from rq.serializers import JSONSerializer
from rq.worker import Worker

from jobs import keys
from jobs.core import deferrals, switches
from jobs.enqueue import enqueue
from tests.test_web_metrics import samples
from tests.web_support import CLASSIFY, TOKENS, bearer, create_app_with


def test_metrics_say_workers_by_state_the_oldest_queued_age_paused_queues_waits_and_the_archive_lag(env, conn):
    env.setenv("LEASH_OWNER_CONCURRENCY", "10")
    client = create_app_with().test_client()
    job_ids = [client.post("/jobs", json=CLASSIFY).get_json()["job_id"] for _ in range(3)]
    # Written, not waited for: the head of the queue was enqueued 120 s ago.
    head = time.time() - 120
    conn.hset(keys.rq_job(job_ids[0]), "enqueued_at", time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(head)))
    switches.pause(conn, "leash")
    idle = Worker(["leash"], connection=conn, name="w-idle", serializer=JSONSerializer)
    idle.register_birth()
    idle.set_state("idle")
    quiet = Worker(["leash"], connection=conn, name="w-quiet", serializer=JSONSerializer)
    quiet.register_birth()
    quiet.set_state("idle")
    switches.quiet(conn, ["w-quiet"])
    budget_job, _ = enqueue(conn, "classify", {"items": ["a"], "labels": ["x", "y"]})
    deferrals.note(conn, budget_job, "budget", time.time() - 30)
    deferrals.note(conn, "an-ended-job", "provider", time.time() - 30)  # no longer waiting: pruned
    conn.zadd(keys.ARCHIVE_DUE, {"ended-1": time.time() - 90, "ended-2": time.time() - 10})

    found = samples(client.get("/metrics"))
    assert found[("leash_workers", (("state", "idle"),))] == 1
    assert found[("leash_workers", (("state", "quiet"),))] == 1
    assert found[("leash_workers", (("state", "busy"),))] == 0
    assert 119 <= found[("leash_queue_oldest_age_seconds", (("queue", "leash"),))] < 200
    assert found[("leash_queue_paused", (("queue", "leash"),))] == 1
    assert found[("leash_jobs_waiting", (("for", "budget"),))] == 1
    assert found[("leash_jobs_waiting", (("for", "provider"),))] == 0
    assert found[("leash_archive_backlog_jobs", ())] == 2
    assert 89 <= found[("leash_archive_lag_seconds", ())] < 150

    switches.resume(conn, "leash")
    conn.delete(keys.rq_queue("leash"))
    found = samples(client.get("/metrics"))
    assert found[("leash_queue_paused", (("queue", "leash"),))] == 0
    assert found[("leash_queue_oldest_age_seconds", (("queue", "leash"),))] == 0


def access_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "leash.access"]


def test_production_writes_one_json_access_line_per_request_without_secrets(conn, caplog):
    client = create_app_with(LEASH_API_TOKENS=",".join(f"{o}={t}" for o, t in TOKENS.items())).test_client()
    with caplog.at_level(logging.INFO, logger="leash.access"):
        assert client.get("/jobs?token=do-not-log-me", headers=bearer("alice")).status_code == 200
        assert client.get("/jobs/nope", headers=bearer("bob")).status_code == 404
    first, second = access_lines(caplog)
    assert first["method"] == "GET" and first["path"] == "/jobs" and first["status"] == 200
    assert first["owner"] == "alice" and first["duration_ms"] >= 0
    assert second["path"] == "/jobs/nope" and second["status"] == 404 and second["owner"] == "bob"
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "do-not-log-me" not in said and TOKENS["alice"] not in said


def test_development_writes_no_access_line_unless_asked(conn, caplog):
    with caplog.at_level(logging.INFO, logger="leash.access"):
        create_app_with().test_client().get("/healthz")
        assert access_lines(caplog) == []
        create_app_with(LEASH_ACCESS_LOG="1").test_client().get("/healthz")
    [line] = access_lines(caplog)
    assert line["path"] == "/healthz" and line["status"] == 200 and line["owner"] is None
