"""The operator's controls on real ``leash worker`` processes: a paused queue starts nothing
while its workers sit idle, and starts again on resume; a quiet worker (``leash quiet`` or
SIGTSTP) finishes the job it runs and takes no new one; ``leash workers`` and ``leash queue``
say so, as JSON too."""

from __future__ import annotations

import json
import signal
import time

import pytest
from click.testing import CliRunner
from rq.serializers import JSONSerializer
from rq.worker import Worker

from cli import main
from jobs.core import states
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.web_support import create_app_with

pytestmark = pytest.mark.slow

#: How long a paused queue (or a quiet worker) is watched with idle workers beside it: several
#: dequeue waits, and the issue's full 30 s.
HOLDS = [pytest.param(8.0, id="8s"), pytest.param(30.0, id="30s")]


def leash(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def registered(conn, count: int) -> list[Worker]:
    return wait_for(lambda: len(found := Worker.all(connection=conn, serializer=JSONSerializer)) >= count and found,
                    30, message=f"{count} workers to register")


@pytest.mark.parametrize("hold", HOLDS)
def test_a_paused_queue_starts_nothing_while_three_workers_idle_and_resume_starts_its_jobs(conn, workers, hold):
    for _ in range(3):
        workers.start("--no-scheduler")
    registered(conn, 3)
    assert leash("pause", "leash") == (0, "paused leash: workers take none of its jobs until `leash resume leash`\n")
    # Queued right after the pause, while the workers wait in their dequeues: a worker that
    # takes one must give it back unclaimed.
    job_ids = [enqueue(conn, "count", {"items": ["a", "b"], "delay": 0.05})[0] for _ in range(6)]
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        started = [j for j in job_ids if states.status(conn, j)["state"] != "queued"]
        assert started == [], "a job of a paused queue started"
        time.sleep(0.25)
    assert all(states.status(conn, j)["attempts"] == 0 for j in job_ids)

    code, out = leash("queue", "--json")
    (row,) = [q for q in json.loads(out)["queues"] if q["queue"] == "leash"]
    # The owner's concurrency limit holds back what does not fit its slots (RQ's RateLimit).
    assert code == 0 and row["queued"] + row["held"] == 6 and row["paused_since"] is not None
    assert row["owners"] == {"default": {"queued": row["queued"], "waiting": 0, "held": row["held"]}}
    assert row["oldest_age"] >= hold - 1
    client = create_app_with().test_client()
    ready = client.get("/readyz")
    assert ready.status_code == 200 and list(ready.get_json()["paused"]) == ["leash"]
    assert 'id="paused-leash"' in client.get("/overview").get_data(as_text=True)
    code, out = leash("workers", "--json")
    assert code == 0 and sorted(w["state"] for w in json.loads(out)["workers"]) == ["idle"] * 3

    assert leash("resume", "leash") == (0, "resumed leash\n")
    for job_id in job_ids:
        final = wait_for(lambda j=job_id: (s := states.status(conn, j))["state"] == "succeeded" and s, 60,
                         message=f"job {job_id} to run after the resume")
        assert final["attempts"] == 1
    assert create_app_with().test_client().get("/readyz").get_json() == {"ok": True}


def test_pause_and_quiet_refuse_what_does_not_exist_with_exit_2(conn):
    code, out = leash("pause", "no-such-queue")
    assert code == 2 and "no queue named 'no-such-queue'" in out
    code, out = leash("quiet", "no-such-worker")
    assert code == 2 and "no worker named 'no-such-worker'" in out
    code, out = leash("quiet")
    assert code == 2 and "--all" in out


@pytest.mark.parametrize(("how", "hold"), [("leash quiet", 8.0), ("SIGTSTP", 8.0), ("leash quiet", 30.0)],
                         ids=["leash-quiet-8s", "SIGTSTP-8s", "leash-quiet-30s"])
def test_a_quiet_worker_finishes_its_job_and_takes_no_new_one(conn, workers, how, hold):
    proc = workers.start("--no-scheduler")
    (worker,) = registered(conn, 1)
    first, _ = enqueue(conn, "count", {"items": [f"i{n}" for n in range(8)], "delay": 0.25})
    wait_for(lambda: states.status(conn, first)["state"] == "running", 30, message="the first job to start")
    if how == "SIGTSTP":
        proc.send_signal(signal.SIGTSTP)
    else:
        assert leash("quiet", worker.name) == (0, f"{worker.name}: quiet\n")
    second, _ = enqueue(conn, "count", {"items": ["x"], "delay": 0.01})

    final = wait_for(lambda: (s := states.status(conn, first))["state"] == "succeeded" and s, 60,
                     message="the running job to finish")
    assert final["attempts"] == 1 and final["done"] == 8
    state = wait_for(lambda: next((w for w in json.loads(leash("workers", "--json")[1])["workers"]
                                   if w["name"] == worker.name and w["state"] == "quiet"), None), 30,
                     message="the worker to show as quiet")
    assert state["quiet_since"] is not None and state["pid"] == proc.pid and state["job_id"] is None
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        assert states.status(conn, second)["state"] == "queued", "a quiet worker took a new job"
        time.sleep(0.25)
    assert proc.poll() is None, "a quiet worker stays up"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert states.status(conn, second)["state"] == "queued" and states.status(conn, second)["attempts"] == 0
