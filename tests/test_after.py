"""A job that waits for others (``after``) on RQ's dependencies: queued with "waiting for ..."
while RQ defers it, on its way once they end, and what ``after_policy`` does when one of them
fails or is canceled."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rq.registry import DeferredJobRegistry
from rq.serializers import JSONSerializer

from jobs import deadletter, keys
from jobs.core import control, states
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob
from jobs.webhooks import outbox
from tests.conftest import REDIS_URL, ROOT
from tests.web_support import CLASSIFY


def rq_status(conn, job_id):
    return conn.hget(keys.rq_job(job_id), "status").decode()


def work(conn, burst):
    """Work the queues, let the sweep of ended jobs move waiting children on, work again."""
    for _ in range(3):
        burst()
        outbox.sweep(conn)
    burst()


def test_a_child_waits_queued_and_runs_once_its_parent_succeeded(conn, burst):
    parent, _ = enqueue(conn, "noop", {})
    child, _ = enqueue(conn, "noop", {}, after=[parent])
    status = states.status(conn, child)
    assert status["state"] == "queued" and rq_status(conn, child) == "deferred"
    assert status["waiting"] == f"waiting for job {parent} to end (after)"
    assert status["after"] == {"jobs": [parent], "policy": "cancel"}
    assert child in DeferredJobRegistry("leash", connection=conn, serializer=JSONSerializer).get_job_ids()
    burst()  # RQ moves the child on as the parent's worker ends it: no sweep needed
    assert states.status(conn, parent)["state"] == "succeeded"
    assert states.status(conn, child)["state"] == "succeeded"


def test_a_child_of_ended_parents_does_not_wait(conn, burst):
    parent, _ = enqueue(conn, "noop", {})
    burst()
    child, _ = enqueue(conn, "noop", {}, after=parent)
    assert rq_status(conn, child) != "deferred"
    burst()
    assert states.status(conn, child)["state"] == "succeeded"


def test_a_child_waits_for_every_parent(conn, burst):
    first, _ = enqueue(conn, "noop", {})
    slow, _ = enqueue(conn, "noop", {}, after=[first])
    child, _ = enqueue(conn, "noop", {}, after=[first, slow])
    assert states.status(conn, child)["waiting"] == f"waiting for jobs {first}, {slow} to end (after)"
    burst()
    ended = [conn.hget(keys.job(j), "ended_at") for j in (first, slow, child)]
    assert all(ended) and float(ended[2]) >= float(ended[1]) >= float(ended[0])


def test_cancel_policy_a_failed_parent_cancels_the_child_saying_why(conn, burst):
    parent, _ = enqueue(conn, "boom", {}, max_attempts=1)
    child, _ = enqueue(conn, "noop", {}, after=[parent])
    work(conn, burst)
    status = states.status(conn, child)
    assert status["state"] == "failed" and status["canceled"] and status["error"] == "canceled"
    assert status["history"][-1]["ended"] == f"canceled: job {parent} it waited for failed (after_policy cancel)"
    assert conn.hget(keys.job(child), "done") in (None, b"0")


def test_cancel_policy_a_parent_canceled_while_queued_cancels_the_child(conn, burst):
    parent, _ = enqueue(conn, "noop", {})
    child, _ = enqueue(conn, "noop", {}, after=[parent])
    control.cancel(conn, parent)
    outbox.sweep(conn)
    status = states.status(conn, child)
    assert status["canceled"], status
    assert status["history"][-1]["ended"] == f"canceled: job {parent} it waited for was canceled (after_policy cancel)"
    burst()  # nothing left to run


@pytest.mark.parametrize("how", ["failed", "canceled"])
def test_run_policy_the_child_runs_anyway(conn, burst, how):
    parent, _ = enqueue(conn, "boom" if how == "failed" else "noop", {}, max_attempts=1)
    child, _ = enqueue(conn, "noop", {}, after=[parent], after_policy="run")
    if how == "canceled":
        control.cancel(conn, parent)
    work(conn, burst)
    assert states.status(conn, parent)["state"] == "failed"
    assert states.status(conn, child)["state"] == "succeeded"


def test_wait_policy_replaying_the_failed_parent_lets_the_child_go_on(conn, burst):
    conn.set("test:broken:p", 1)
    parent, _ = enqueue(conn, "breaks_at", {"items": ["a", "b"], "break_at": 1, "flag": "p"}, max_attempts=1)
    child, _ = enqueue(conn, "noop", {}, after=[parent], after_policy="wait")
    work(conn, burst)
    assert states.status(conn, parent)["state"] == "failed"
    status = states.status(conn, child)
    assert status["state"] == "queued" and "waiting for job" in status["waiting"]
    conn.delete("test:broken:p")  # the bug fixed
    deadletter.replay(conn, deadletter.select(conn, [parent]).matched, "tester", {})
    work(conn, burst)
    assert states.status(conn, parent)["state"] == "succeeded"
    assert states.status(conn, child)["state"] == "succeeded"


def test_a_waiting_child_can_be_canceled(conn, burst):
    parent, _ = enqueue(conn, "noop", {})
    child, _ = enqueue(conn, "noop", {}, after=[parent])
    control.cancel(conn, child)
    work(conn, burst)
    assert states.status(conn, child)["canceled"] and states.status(conn, parent)["state"] == "succeeded"


def test_after_is_checked_at_the_door(client, conn, env):
    parent = client.post("/jobs", json=CLASSIFY).get_json()["job_id"]
    for body, message in [({"after": ["nope"]}, "no such job: nope"), ({"after": 7}, "job id or a list"),
                          ({"after": [parent], "after_policy": "maybe"}, "'after_policy' must be one of"),
                          ({"after": [f"j{i}" for i in range(21)]}, "at most 20")]:
        response = client.post("/jobs", json={**CLASSIFY, **body})
        assert response.status_code == 422 and message in response.get_json()["error"], (body, response.get_json())
    taken = client.post("/jobs", json={**CLASSIFY, "after": [parent], "after_policy": "run"})
    assert taken.status_code == 202
    assert client.get(taken.get_json()["url"]).get_json()["after"] == {"jobs": [parent], "policy": "run"}
    for body in ({"after_policy": "run"}, {"after": [], "after_policy": "wait"}):
        refused = client.post("/jobs", json={**CLASSIFY, **body})
        assert refused.status_code == 422, refused.get_json()
        assert refused.get_json()["error"].startswith("'after_policy' needs 'after'"), refused.get_json()
    with pytest.raises(InvalidJob, match="'after_policy' needs 'after'"):
        enqueue(conn, "noop", {}, after_policy="cancel")  # InvalidJob is a ValueError
    with pytest.raises(ValueError, match="waits for none"):
        enqueue(conn, "noop", {}, after=[], after_policy="run")
    # items_from waits for the job it reads: its after_policy is about that job.
    fed, _ = enqueue(conn, "count", {"items_from": parent}, owner=conn.hget(keys.job(parent), "owner").decode(),
                     after_policy="run")
    assert states.status(conn, fed)["after"] == {"jobs": [parent], "policy": "run"}
    other, _ = enqueue(conn, "noop", {}, owner="someone-else")
    with pytest.raises(InvalidJob, match=f"no such job: {other}"):
        enqueue(conn, "noop", {}, after=[other])  # another owner's job is not there for you


def test_the_cli_takes_after(conn, env, tmp_path):
    items = tmp_path / "items.txt"
    items.write_text("one\n")
    parent, _ = enqueue(conn, "noop", {})
    run_env = {"PATH": "/usr/bin:/bin", "REDIS_URL": REDIS_URL, "LEASH_IMPORTS": "tests.kinds_for_tests",
               "PYTHONPATH": str(ROOT), "LEASH_OWNER": "default"}
    command = [sys.executable, "-m", "cli", "submit", "--kind", "noop", str(items)]
    taken = subprocess.run([*command, "--after", parent, "--after-policy", "wait"], env=run_env, cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert taken.returncode == 0, taken.stderr
    assert states.status(conn, taken.stdout.strip())["after"] == {"jobs": [parent], "policy": "wait"}
    refused = subprocess.run([*command, "--after", "nope"], env=run_env, cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "--after: no such job: nope" in refused.stderr
    alone = subprocess.run([*command, "--after-policy", "run"], env=run_env, cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    print(alone.stderr)
    assert alone.returncode == 2 and "--after-policy needs --after" in alone.stderr, alone.stderr
    assert alone.stdout == ""
