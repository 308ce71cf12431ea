"""A provider outage is waited out: when the model provider fails every call (5xx here), the
job is deferred with backoff -- it keeps its checkpoint, frees its worker and spends no
attempt -- and says "waiting for the model provider since ..." on its page, the overview and
/metrics; when the provider is back, it resumes and succeeds, every item answered once."""

from __future__ import annotations

import time

import pytest

from jobs import keys
from jobs.core import states
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.fake_openai import Error
from tests.test_items_workers import ended, stored
from tests.web_support import create_app_with

pytestmark = pytest.mark.slow

#: How long the provider stays down once the job is waiting for it: a short outage, and the
#: issue's full 5 minutes (the job's waits grow to a minute; the worker sleeps meanwhile).
OUTAGES = [pytest.param(6.0, id="6s"), pytest.param(300.0, id="5min", marks=pytest.mark.timeout(600))]


@pytest.mark.parametrize("outage", OUTAGES)
def test_a_provider_down_mid_job_is_waited_out_with_no_attempt_spent_and_the_worker_free(
        conn, workers, model_server, env, outage):
    server = model_server
    server.latency = 0.1
    env.setenv("LEASH_ITEM_CONCURRENCY", "2")
    items = [f"o{i}" for i in range(12)]
    job_id, _ = enqueue(conn, "prompt", {"items": items, "template": "{item}"}, max_attempts=3)
    workers.start()  # one worker, with RQ's scheduler: it brings the waiting job back
    wait_for(lambda: states.status(conn, job_id)["done"] >= 3, 60, message="three items stored")
    server.down = Error(503, "the provider is down")

    waiting = wait_for(lambda: (s := states.status(conn, job_id))["waiting"]
                       and "waiting for the model provider since" in s["waiting"] and s, 60,
                       message="the job to wait for its provider")
    assert waiting["state"] == "queued" and waiting["attempts"] == 0  # given back: not counted
    checkpoint = set(stored(conn, job_id))
    assert len(checkpoint) >= 3

    # The worker is free meanwhile: it runs a job that needs no provider.
    other, _ = enqueue(conn, "count", {"items": ["x"], "delay": 0.01})
    assert ended(conn, other)["state"] == "succeeded"
    client = create_app_with().test_client()
    assert 'id="provider-wait"' in client.get("/overview").get_data(as_text=True)
    assert 'leash_jobs_waiting{for="provider"} 1.0' in client.get("/metrics").get_data(as_text=True)

    deadline = time.monotonic() + outage  # down for a while: the job keeps waiting, spending nothing
    while time.monotonic() < deadline:
        status = states.status(conn, job_id)
        assert status["state"] in ("queued", "running") and status["attempts"] <= 1, status
        time.sleep(0.2 if outage < 60 else 1.0)
    if outage >= 60:  # the worker is still free late in a long outage
        late, _ = enqueue(conn, "count", {"items": ["y"], "delay": 0.01})
        assert ended(conn, late)["state"] == "succeeded"
    assert conn.llen(keys.errors(job_id)) == 0
    server.down = None

    final = ended(conn, job_id, timeout=120)
    assert final["state"] == "succeeded", final["error"]
    assert final["attempts"] == 1 and final["done"] == len(items)
    assert checkpoint <= set(stored(conn, job_id))
    assert len(server.billed) == len(items), "an item answered twice"
    assert final["waiting"] is None
    assert 'leash_jobs_waiting{for="provider"} 0.0' in client.get("/metrics").get_data(as_text=True)
