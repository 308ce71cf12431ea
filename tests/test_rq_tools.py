"""RQ's own tools on a leash deployment: the real `rq` command, rq-dashboard's HTTP actions and a
plain `rq worker` act on RQ's keys only; leash's state follows, and no owner slot leaks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli import main
from jobs import deadletter, keys
from jobs.core import states
from jobs.core.upkeep import consistency
from jobs.deadletter import failures
from jobs.enqueue import enqueue
from tests.conftest import REDIS_URL, ROOT, wait_for
from tests.kinds_for_tests import item_calls
from tests.web_support import basic, create_app_with

pytestmark = pytest.mark.slow

RQ = str(Path(sys.executable).with_name("rq"))
JSON = "rq.serializers.JSONSerializer"
USER, PASSWORD = "operator", "correct horse battery staple"


def rq(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([RQ, *args, "-u", REDIS_URL], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def state(conn, job_id):
    return states.status(conn, job_id)


def slots(conn, owner="default"):
    registry = keys.rq_rate_limit(keys.owner_rate_limit_key(owner), conn)
    return registry.get_allowed_job_ids(), registry.get_rate_limited_job_ids()


def fail_on_a_model_error(conn, burst, flag="model", owner="default"):
    """A job that fails (item 2 of 4, after checkpointing 0 and 1) while the model is broken."""
    conn.set(f"test:broken:{flag}", 1)
    job_id, _ = enqueue(conn, "breaks_at", {"items": ["a", "b", "c", "d"], "break_at": 2, "flag": flag},
                        owner=owner, max_attempts=1)
    burst()
    wait_for(lambda: state(conn, job_id)["state"] == "failed", 20, message="the job to fail")
    wait_for(lambda: slots(conn, owner) == ([], []), 10, message="RQ's bookkeeping to free the slot")
    return job_id


def settle(conn, *job_ids):
    """Age the failures past the moment a leash cancel and RQ's cancel can disagree."""
    for job_id in job_ids:
        conn.hset(keys.job(job_id), "ended_at", float(conn.hget(keys.job(job_id), "ended_at")) - 60)


def test_rq_requeue_all_is_a_replay_and_the_job_succeeds_from_its_checkpoint(conn, burst):
    job_id = fail_on_a_model_error(conn, burst)
    settle(conn, job_id)
    conn.delete("test:broken:model")  # the model is fixed

    rq("requeue", "--all", "--queue", "leash", "--serializer", JSON)
    burst()

    done = wait_for(lambda: (s := state(conn, job_id))["state"] == "succeeded" and s, 20, message="success")
    assert done["attempts"] == 1, "a requeue resets attempts like a replay"
    assert item_calls(conn, job_id) == {0: 1, 1: 1, 2: 1, 3: 1}, "checkpointed items are not redone"
    assert len(conn.lrange(keys.errors(job_id), 0, -1)) == 1, "the error history is kept"
    audit = deadletter.audit_log(conn)[0]
    assert (audit["actor"], audit["ids"], audit["selector"]) == ("rq", [job_id], {"source": "rq requeue"})
    wait_for(lambda: slots(conn) == ([], []), 10, message="the owner's slot to be free")


def test_requeue_with_no_worker_running_is_seen_by_the_sweep_and_keeps_the_owner_limit(conn):
    from rq.registry import FailedJobRegistry

    from jobs.deadletter.synthetic import FailedJob, write_failed_jobs

    ids = write_failed_jobs(conn, [FailedJob(kind="count", error="ValueError: x", payload={"items": ["a"]},
                                             failed_at=1000.0) for _ in range(3)])
    registry = FailedJobRegistry("leash", connection=conn)
    for job_id in ids:
        registry.requeue(job_id)  # what `rq requeue` and rq-dashboard do
    assert [state(conn, j)["state"] for j in ids] == ["queued"] * 3  # a status read tells the truth at once

    counts = consistency.sweep(conn, adopt_requeues=deadletter.adopt_requeues)  # as a worker's reaper does

    assert counts["requeued"] == 3
    assert [conn.hget(keys.job(j), "state") for j in ids] == [b"queued"] * 3
    assert [conn.hget(keys.job(j), "attempts") for j in ids] == [b"0"] * 3
    allowed, waiting = slots(conn)
    assert len(allowed) == 2 and len(waiting) == 1, "the owner's limit (2) still holds"
    assert sorted(conn.lrange(keys.rq_queue("leash"), 0, -1)) == sorted(j.encode() for j in allowed)
    assert conn.zcard(keys.FAILED_INDEX) == 0


def test_rq_dashboard_requeue_buttons_are_replays(conn, burst):
    first = fail_on_a_model_error(conn, burst, flag="one")
    second = fail_on_a_model_error(conn, burst, flag="two")
    settle(conn, first, second)
    conn.delete("test:broken:one", "test:broken:two")
    client = create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD).test_client()
    auth = basic(USER, PASSWORD)
    client.get("/rq/", headers=auth)
    csrf = {**auth, "X-CSRFToken": client.get_cookie("_csrf_token", path="/rq").value}

    assert client.post(f"/rq/job/{first}/requeue", headers=csrf).status_code == 200
    burst()
    wait_for(lambda: state(conn, first)["state"] == "succeeded", 20, message="the requeued job to succeed")
    assert client.post("/rq/requeue/leash", headers=csrf).get_json()["count"] == 1
    burst()
    wait_for(lambda: state(conn, second)["state"] == "succeeded", 20, message="requeue-all's job to succeed")
    assert [e["actor"] for e in deadletter.audit_log(conn)] == ["rq", "rq"]
    wait_for(lambda: slots(conn) == ([], []), 10, message="no slot held")


def test_rq_empty_fails_the_jobs_frees_the_slots_and_replay_brings_them_back(conn, burst):
    ids = [enqueue(conn, "count", {"items": ["a", "b"], "delay": 0})[0] for _ in range(3)]
    emptied, held_back = ids[:2], ids[2]  # the owner's limit (2) keeps the third waiting, off the queue
    allowed, waiting = slots(conn)
    assert (sorted(allowed), waiting) == (sorted(emptied), [held_back])

    rq("empty", "leash")

    for job_id in emptied:  # at once, in any status read
        s = state(conn, job_id)
        assert (s["state"], s["error"]) == ("failed", consistency.REMOVED)
    assert consistency.sweep(conn)["removed"] == 2  # what every worker's reaper tick runs
    assert {conn.hget(keys.job(j), "state") for j in emptied} == {b"failed"}
    assert slots(conn) == ([held_back], []), "the emptied jobs' slots went to the waiting job"
    groups = failures.report(conn)["groups"]
    assert [g["count"] for g in groups] == [2] and consistency.REMOVED.startswith(groups[0]["error"])

    result = CliRunner().invoke(main, ["replay", "--yes", "--", *emptied])
    assert result.exit_code == 0, result.output
    burst()
    for job_id in ids:
        wait_for(lambda j=job_id: state(conn, j)["state"] == "succeeded", 20, message=f"{job_id} to succeed")
    # RQ frees a job's slot in its worker's success handling, just after leash's finish.
    wait_for(lambda: slots(conn) == ([], []), 10, message="no slot held")


def test_rq_dashboard_delete_of_a_queued_job_fails_it_and_frees_its_slot(conn):
    held, waiting = (enqueue(conn, "count", {"items": ["a"]})[0] for _ in range(2))
    enqueue(conn, "count", {"items": ["a"]})
    client = create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD).test_client()
    auth = basic(USER, PASSWORD)
    client.get("/rq/", headers=auth)
    csrf = {**auth, "X-CSRFToken": client.get_cookie("_csrf_token", path="/rq").value}

    assert client.post(f"/rq/job/{held}/delete", headers=csrf).get_json() == {"status": "OK"}
    consistency.sweep(conn)

    s = state(conn, held)
    assert (s["state"], s["error"]) == ("failed", consistency.REMOVED)
    allowed, _ = slots(conn)
    assert held.encode() not in [a.encode() for a in allowed] and len(allowed) == 2, "the next job got the slot"
    assert conn.zscore(keys.FAILED_INDEX, held) is not None


def test_rq_dashboard_delete_of_a_job_waiting_for_its_retry_fails_it_and_replay_runs_it(conn, burst, env):
    env.setenv("LEASH_RETRY_BACKOFF", "600")  # the retry waits in RQ's scheduled registry
    conn.set("test:broken:retry", 1)
    job_id, _ = enqueue(conn, "breaks_at", {"items": ["a", "b", "c"], "break_at": 1, "flag": "retry"},
                        max_attempts=3)
    burst()
    wait_for(lambda: conn.zscore(keys.rq_scheduled("leash", conn), job_id) is not None, 20, message="the retry scheduled")
    assert state(conn, job_id)["state"] == "queued"
    client = create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD).test_client()
    auth = basic(USER, PASSWORD)
    client.get("/rq/", headers=auth)
    csrf = {**auth, "X-CSRFToken": client.get_cookie("_csrf_token", path="/rq").value}
    assert client.post(f"/rq/job/{job_id}/delete", headers=csrf).get_json() == {"status": "OK"}

    s = state(conn, job_id)
    assert (s["state"], s["error"]) == ("failed", consistency.REMOVED), "at once, in a status read"
    assert consistency.sweep(conn)["removed"] == 1
    assert slots(conn) == ([], [])
    conn.delete("test:broken:retry")  # the model is fixed
    assert CliRunner().invoke(main, ["replay", "--yes", "--", job_id]).exit_code == 0
    burst()
    final = wait_for(lambda: (s := state(conn, job_id))["state"] == "succeeded" and s, 20, message="the replay")
    assert final["done"] == 3 and item_calls(conn, job_id)[0] == 1, "the checkpointed item was not run again"


def test_rq_dashboard_delete_of_a_running_job_lets_it_finish_and_records_it_truly(conn, workers):
    # RQ's Delete does not stop a running job (RQ's own workers run it on too); leash's state
    # must still end true, RQ's record must not be left behind without an expiry, the owner's
    # slot must come back and the worker must go on.
    job_id, _ = enqueue(conn, "count", {"items": [f"i{n}" for n in range(8)], "delay": 0.4})
    worker = workers.start("--no-scheduler", extra_env={"LEASH_ITEM_CONCURRENCY": "1"})
    wait_for(lambda: state(conn, job_id)["done"] >= 2, 20, message="two items stored")
    client = create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD).test_client()
    auth = basic(USER, PASSWORD)
    client.get("/rq/", headers=auth)
    csrf = {**auth, "X-CSRFToken": client.get_cookie("_csrf_token", path="/rq").value}
    assert client.post(f"/rq/job/{job_id}/delete", headers=csrf).get_json() == {"status": "OK"}
    assert state(conn, job_id)["state"] == "running", "a status read right after the delete"

    final = wait_for(lambda: (s := state(conn, job_id))["state"] in ("succeeded", "failed") and s, 30,
                     message="the job to end")
    assert (final["state"], final["done"], final["attempts"]) == ("succeeded", 8, 1)
    # leash's finish comes first; RQ's bookkeeping of the success follows in the work-horse, one
    # transaction that writes its record afresh with an expiry and deletes its execution keys.
    wait_for(lambda: conn.hget(keys.rq_job(job_id), "status") == b"finished", 10,
             message="RQ's bookkeeping of the success")
    ttls = {key: conn.ttl(key) for key in conn.scan_iter(f"*{job_id}*") if not key.startswith(b"test:")}
    assert not [key for key, ttl in ttls.items() if ttl == -1], f"kept without an expiry: {ttls}"
    follow_up, _ = enqueue(conn, "count", {"items": ["a"]})
    wait_for(lambda: state(conn, follow_up)["state"] == "succeeded", 20, message="the worker's next job")
    wait_for(lambda: slots(conn) == ([], []), 10, message="the owner's slots free")
    assert worker.poll() is None


@pytest.mark.parametrize("serializer", [JSON, None], ids=["json-serializer", "default-serializer"])
def test_a_plain_rq_worker_cannot_silently_burn_a_job(conn, burst, serializer):
    job_id, _ = enqueue(conn, "count", {"items": ["a", "b"], "delay": 0}, max_attempts=3)
    extra = ["--serializer", serializer] if serializer else []
    rq("worker", "leash", "--burst", *extra)
    consistency.sweep(conn)

    s = state(conn, job_id)
    assert s["state"] == "failed"
    if serializer:  # it reached leash's code, which refused to run without a lease
        assert s["error"] == consistency.PLAIN_WORKER
        assert s["attempts"] == 0
    else:  # RQ could not even read the job: RQ's own error text is kept
        assert s["error"].startswith(consistency.ENDED_BY_RQ["failed"])
        assert "Traceback" in s["error"]
    assert item_calls(conn, job_id) == {}
    groups = failures.report(conn)["groups"]
    assert [g["count"] for g in groups] == [1]
    assert slots(conn) == ([], [])

    assert CliRunner().invoke(main, ["replay", "--yes", "--", job_id]).exit_code == 0
    burst()
    wait_for(lambda: state(conn, job_id)["state"] == "succeeded", 20, message="the replayed job to succeed")


def test_rq_info_and_suspend_resume_leave_leash_state_alone(conn, burst):
    job_id, _ = enqueue(conn, "count", {"items": ["a"], "delay": 0})
    rq("suspend")
    burst()  # a suspended worker takes nothing
    rq("info")
    assert state(conn, job_id)["state"] == "queued"
    rq("resume")
    burst()
    wait_for(lambda: state(conn, job_id)["state"] == "succeeded", 20, message="the job to run after resume")


def test_a_canceled_queued_job_is_never_mistaken_for_a_requeue(conn):
    from jobs.core import control

    job_id, _ = enqueue(conn, "count", {"items": ["a"]})
    assert control.cancel(conn, job_id) == "queued"
    assert conn.hget(keys.rq_job(job_id), "status") == b"canceled"
    later = float(conn.hget(keys.job(job_id), "ended_at")) + 3600
    assert consistency.sweep(conn, now=later, adopt_requeues=deadletter.adopt_requeues)["requeued"] == 0
    s = states.status(conn, job_id, now=later)
    assert (s["state"], s["error"]) == ("failed", "canceled")
    assert slots(conn) == ([], [])


def test_a_bulk_removal_behind_leashs_back_is_one_log_line_not_one_per_job(conn, caplog):
    import logging

    ids = [enqueue(conn, "classify", {"items": ["x"], "labels": ["a"]}, owner=f"o{n}")[0] for n in range(30)]
    for job_id in ids:
        conn.delete(keys.rq_job(job_id))  # what `rq empty` does to each
    with caplog.at_level(logging.INFO, logger="leash"):
        assert consistency.sweep(conn)["removed"] == 30
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"30 job(s) {consistency.REMOVED}") and "and 20 more" in warnings[0]
