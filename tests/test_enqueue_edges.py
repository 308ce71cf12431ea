"""Submissions at the edges: the same idempotency key at once or after a stall, owners and keys
that could run together, backoff as written, explicit queues, first in first out per owner."""

from __future__ import annotations

import json
import signal
import tempfile
import threading
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from rq.job import Job
from rq.serializers import JSONSerializer

from cli import main
from cli.devserver import start_redis, stop
from jobs import keys
from jobs.core import states
from jobs.core.rq_side import retry_intervals
from jobs.enqueue import enqueue
from jobs.errors import InvalidJob
from tests.conftest import wait_for
from tests.web_support import CLASSIFY, create_app_with

ITEMS = {"items": ["a"], "labels": ["x", "y"]}


def test_eight_clients_with_one_key_at_once_all_get_the_same_existing_job(conn):
    app = create_app_with()
    answers: list[tuple[int, str | None]] = []
    lock = threading.Lock()

    def post(key: str, barrier: threading.Barrier):
        client = app.test_client()
        barrier.wait()
        response = client.post("/jobs", json=CLASSIFY, headers={"Idempotency-Key": key})
        job_id = (response.get_json() or {}).get("job_id")
        status = client.get(f"/jobs/{job_id}").status_code if job_id else None
        with lock:
            answers.append((response.status_code, job_id, status))

    for round_ in range(30):
        barrier = threading.Barrier(8)
        threads = [threading.Thread(target=post, args=(f"round-{round_}", barrier)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(answers) == 240
    assert {code for code, _, _ in answers} <= {200, 202}
    assert sum(code == 202 for code, _, _ in answers) == 30, "exactly one job per key"
    assert {status for _, _, status in answers} == {200}, "the job exists whenever its key is visible"
    assert conn.zcard(keys.owner_jobs("shared")) == 30


def test_owner_and_key_cannot_run_together_into_one_key(conn):
    first, _ = enqueue(conn, "classify", ITEMS, owner="team", idempotency_key="ops:k1")
    second, created = enqueue(conn, "classify", ITEMS, owner="team:ops", idempotency_key="k1")
    assert created and second != first


def test_a_submission_cut_short_by_a_stalled_redis_leaves_nothing_and_the_retry_creates_the_job(env):
    workdir = Path(tempfile.mkdtemp(prefix="leash-stall-"))
    proc, url = start_redis(workdir)
    try:
        app = create_app_with(REDIS_URL=url, LEASH_REDIS_TIMEOUT=0.3)
        client = app.test_client()
        assert client.get("/jobs").status_code == 200  # connected before the stall
        proc.send_signal(signal.SIGSTOP)
        try:
            stalled = client.post("/jobs", json=CLASSIFY, headers={"Idempotency-Key": "retry-me"})
            assert stalled.status_code == 503 and "Retry-After" in stalled.headers
        finally:
            proc.send_signal(signal.SIGCONT)
        # The client retries with the same key, as the 503 told it to, until Redis answers again.
        retried = wait_for(lambda: (r := client.post("/jobs", json=CLASSIFY, headers={"Idempotency-Key": "retry-me"}))
                           .status_code != 503 and r, 10, interval=0.2, message="Redis to answer again")
        assert retried.status_code in (200, 202), retried.get_json()
        job_id = retried.get_json()["job_id"]
        assert client.get(f"/jobs/{job_id}").status_code == 200
        again = client.post("/jobs", json=CLASSIFY, headers={"Idempotency-Key": "retry-me"})
        assert (again.status_code, again.get_json()["job_id"]) == (200, job_id)
    finally:
        stop([proc], grace=5)


@pytest.mark.parametrize(("max_attempts", "backoff", "expected"), [
    (3, [10, 60, 300], [10, 60]),
    (2, [10, 60, 300], [10]),
    (5, [10, 60], [10, 60, 60, 60]),
    (1, [10], []),
])
def test_backoff_values_are_used_in_the_order_written(conn, max_attempts, backoff, expected):
    intervals = retry_intervals(max_attempts, backoff)
    assert intervals == expected
    # What RQ 3.0 picks for each retry (it counts retries_left down from max_attempts - 1).
    job = Job(id="x", connection=conn)
    job.retry_intervals = intervals
    picked = []
    for retries_left in range(max_attempts - 1, 0, -1):
        job.retries_left = retries_left
        picked.append(job.get_retry_interval())
    assert picked == expected


@pytest.mark.slow
def test_measured_gaps_between_attempts_follow_the_backoff(conn, env, workers):
    env.setenv("LEASH_RETRY_BACKOFF", "1,4,30")  # read when the job is enqueued
    job_id, _ = enqueue(conn, "boom", {}, max_attempts=3)
    workers.start()
    wait_for(lambda: states.status(conn, job_id)["state"] == "failed", 30, message="all three attempts")
    at = [json.loads(e)["at"] for e in conn.lrange(keys.errors(job_id), 0, -1)]
    gaps = [b - a for a, b in zip(at, at[1:], strict=False)]
    assert len(gaps) == 2
    # RQ schedules to the whole second and its scheduler looks every second; the wrong order
    # (RQ 3.0 counting from the end of the list) would give 4 s then 30 s.
    assert 0.5 <= gaps[0] < 3, gaps
    assert 3.5 <= gaps[1] < 7, gaps


def test_jobs_go_to_the_first_queue_unless_another_served_one_is_named(conn, env):
    env.setenv("LEASH_QUEUE", "high,low")
    default, _ = enqueue(conn, "classify", ITEMS)
    low, _ = enqueue(conn, "classify", ITEMS, queue="low")
    assert conn.hget(keys.job(default), "queue") == b"high"
    assert Job.fetch(low, connection=conn, serializer=JSONSerializer).origin == "low"
    assert not any(b"high,low" in k for k in conn.keys("*"))
    with pytest.raises(InvalidJob, match="high, low"):
        enqueue(conn, "classify", ITEMS, queue="nope")

    client = create_app_with().test_client()
    refused = client.post("/jobs", json={**CLASSIFY, "queue": "nope"})
    assert refused.status_code == 422 and "LEASH_QUEUE" in refused.get_json()["error"]
    accepted = client.post("/jobs", json={**CLASSIFY, "queue": "low"})
    assert accepted.status_code == 202
    assert conn.hget(keys.job(accepted.get_json()["job_id"]), "queue") == b"low"

    result = CliRunner().invoke(main, ["submit", "--labels", "a,b", "--queue", "nope", "-"], input="x\n")
    assert result.exit_code == 2 and "LEASH_QUEUE" in result.output
    result = CliRunner().invoke(main, ["submit", "--labels", "a,b", "--queue", "low", "--json", "-"], input="x\n")
    assert conn.hget(keys.job(json.loads(result.output)["job_id"]), "queue") == b"low"


@pytest.mark.slow
def test_an_owners_jobs_start_in_the_order_they_were_submitted(conn, burst):
    submitted = [enqueue(conn, "count", {"items": ["a"], "delay": 0}, owner="fifo")[0] for _ in range(30)]
    burst()
    wait_for(lambda: all(conn.hget(keys.job(j), "state") == b"succeeded" for j in submitted), 60,
             message="all 30 jobs to succeed")
    started = sorted(submitted, key=lambda j: float(conn.hget(keys.job(j), "started_at")))
    assert started == submitted


def test_a_job_may_ask_for_fewer_items_at_once_through_the_api(conn):
    client = create_app_with().test_client()
    assert client.post("/jobs", json={**CLASSIFY, "item_concurrency": 2}).status_code == 202
    refused = client.post("/jobs", json={**CLASSIFY, "item_concurrency": 0})
    assert refused.status_code == 422 and "item_concurrency" in refused.get_json()["error"]


def test_an_idempotency_key_written_by_the_previous_release_still_finds_its_job(conn, env):
    """Releases before the owner's length was in the key wrote ``leash:idem:<owner>:<key>``: a
    client retrying across the upgrade gets its job back instead of paying for it twice, and
    the old form's ambiguity never hands one owner another owner's job."""
    first, _ = enqueue(conn, "classify", ITEMS, owner="team")
    conn.set(keys.legacy_idempotency("team", "ops:k1"), first)  # as the previous release left it
    again, created = enqueue(conn, "classify", ITEMS, owner="team", idempotency_key="ops:k1")
    assert (again, created) == (first, False)
    # "team:ops" + "k1" reads the same old key, but the job is not theirs: a new job.
    other, created = enqueue(conn, "classify", ITEMS, owner="team:ops", idempotency_key="k1")
    assert created and other != first


def test_a_repeated_submission_gets_its_job_even_when_todays_limits_refuse_the_payload(conn, env):
    """Limits apply to new jobs: a client repeating a submission an earlier release (or a looser
    setting) accepted gets the job it made, not a 422."""
    many_labels = {"items": ["a"], "labels": [f"label-{n}" for n in range(25)]}  # LEASH_MAX_LABELS: 20
    env.setenv("LEASH_MAX_LABELS", "30")
    first, _ = enqueue(conn, "classify", many_labels, owner="team", idempotency_key="k")
    env.delenv("LEASH_MAX_LABELS")
    assert enqueue(conn, "classify", many_labels, owner="team", idempotency_key="k") == (first, False)
    conn.set(keys.legacy_idempotency("team", "k0"), first)  # the previous release's form too
    assert enqueue(conn, "classify", many_labels, owner="team", idempotency_key="k0") == (first, False)
    with pytest.raises(InvalidJob, match="LEASH_MAX_LABELS"):
        enqueue(conn, "classify", many_labels, owner="team", idempotency_key="k2")


def test_a_payload_left_without_expiry_by_a_previous_release_worker_gets_its_jobs_expiry(conn, env):
    """Workers of the release before the payload copy end jobs with scripts that do not know
    it: the sweep gives the copy the record's remaining time when it sees the job ended."""
    from jobs.core.upkeep import consistency

    job_id, _ = enqueue(conn, "classify", ITEMS)
    conn.hset(keys.job(job_id), mapping={"state": "succeeded", "ended_at": 1.0})
    conn.expire(keys.job(job_id), 3600)  # what the old finish script did; the copy kept no expiry
    conn.persist(keys.payload(job_id))  # (this release's enqueue gives it one; builds before did not)
    consistency.sweep(conn)
    assert 3500 < conn.ttl(keys.payload(job_id)) <= 3600
    assert conn.zscore(keys.ACTIVE, job_id) is None


def test_a_full_redis_is_a_503_with_a_reason_on_the_web_and_one_line_exit_1_from_the_cli(env):
    """Redis at maxmemory with noeviction refuses writes: the submitter is told the store is
    full (not "internal error", not a raw pipeline error) and nothing half-written is left."""
    from click.testing import CliRunner

    from cli import main

    workdir = Path(tempfile.mkdtemp(prefix="leash-full-"))
    proc, url = start_redis(workdir)
    try:
        full = redis.Redis.from_url(url)
        full.config_set("maxmemory-policy", "noeviction")
        full.config_set("maxmemory", max(1, int(full.info("memory")["used_memory"]) - 1024))
        client = create_app_with(REDIS_URL=url).test_client()
        refused = client.post("/jobs", json=CLASSIFY)
        assert refused.status_code == 503 and "Retry-After" in refused.headers
        assert refused.get_json()["error"].startswith("the job store (Redis) is full")
        env.setenv("REDIS_URL", url)
        result = CliRunner().invoke(main, ["submit", "--labels", "a,b", "-"], input="one\n")
        assert result.exit_code == 3 and result.output.count("\n") == 1 and "is full" in result.output
        full.config_set("maxmemory", 0)
        assert client.post("/jobs", json=CLASSIFY).status_code == 202  # memory freed: it works again
        full.close()
    finally:
        stop([proc], grace=5)


def test_an_enqueue_is_one_round_trip_and_still_promotes_after_redis_lost_its_scripts(conn):
    owner_limit = keys.rq_rate_limit(keys.owner_rate_limit_key("default"), conn)
    enqueue(conn, "count", {"items": ["a"]})  # the promotion script is loaded by now
    before = conn.info("commandstats").get("cmdstat_script|exists", {}).get("calls", 0)
    second, _ = enqueue(conn, "count", {"items": ["a"]})
    assert conn.info("commandstats").get("cmdstat_script|exists", {}).get("calls", 0) == before, \
        "no SCRIPT EXISTS round trip before the transaction"
    assert second in owner_limit.get_allowed_job_ids()

    conn.script_flush()  # what a Redis restart does to the script cache
    conn.delete(keys.rq_queue("leash"))
    for job_id in owner_limit.get_allowed_job_ids():
        owner_limit.release_and_enqueue(job_id)
    third, _ = enqueue(conn, "count", {"items": ["a"]})

    assert third in owner_limit.get_allowed_job_ids(), "promoted at once, by the script loaded again"
    assert conn.lrange(keys.rq_queue("leash"), 0, -1) == [third.encode()]
    assert states.status(conn, third)["state"] == "queued"


def test_a_submission_writes_its_idempotency_key_in_the_previous_releases_form_too(conn, env):
    """During the compatibility window a repeat may reach the previous release (a deploy's
    overlap, a rollback), which reads only ``leash:idem:<owner>:<key>``: both forms point at the
    job, with the same expiry. An owner with a colon gets only this release's form (the old one
    is ambiguous), and an old key of another owner is never overwritten."""
    env.setenv("LEASH_RESULT_TTL", "600")
    job_id, _ = enqueue(conn, "classify", ITEMS, owner="alice", idempotency_key="K")
    for key in (keys.idempotency("alice", "K"), keys.legacy_idempotency("alice", "K")):
        assert conn.get(key) == job_id.encode(), key
        assert 0 < conn.ttl(key) <= 600, key
    colon, _ = enqueue(conn, "classify", ITEMS, owner="team:ops", idempotency_key="k1")
    assert conn.get(keys.idempotency("team:ops", "k1")) == colon.encode()
    assert not conn.exists(keys.legacy_idempotency("team:ops", "k1"))
    theirs, _ = enqueue(conn, "classify", ITEMS, owner="bob", idempotency_key="x")
    conn.set(keys.legacy_idempotency("carol", "x"), theirs)  # another owner's job under carol's old form
    mine, created = enqueue(conn, "classify", ITEMS, owner="carol", idempotency_key="x")
    assert created and mine != theirs
    assert conn.get(keys.legacy_idempotency("carol", "x")) == theirs.encode()
