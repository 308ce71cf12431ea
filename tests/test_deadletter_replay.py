"""Replay puts failed jobs back to queued with one command, and leaves everything else alone."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from cli import main
from jobs import deadletter, keys
from jobs.core import clock, lease, states
from jobs.deadletter.synthetic import FailedJob, traceback_text, write_failed_jobs
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.kinds_for_tests import item_calls


def failed(conn, kind="classify", error="ValueError: bad item 3", n=1, failed_at=None, **kw):
    return write_failed_jobs(conn, [FailedJob(kind=kind, error=traceback_text(error), failed_at=failed_at, **kw)
                                    for _ in range(n)])


_READ = {b"hash": "hgetall", b"list": "lrange", b"zset": "zrange", b"set": "smembers", b"string": "get",
         b"stream": "xrange"}


def snapshot(conn):
    """Every key's value and whether it expires (DUMP is not stable for hashes: rehashing)."""
    out = {}
    for k in sorted(conn.keys("*")):
        kind = conn.type(k)
        read = getattr(conn, _READ[kind])
        value = read(k, 0, -1, withscores=True) if kind == b"zset" else read(k, 0, -1) if kind == b"list" else read(k)
        out[k] = (kind, value, conn.ttl(k) > 0)
    return out


def run(*args, ids=(), input=None):
    """``leash replay ARGS -- IDS`` (job ids may start with "-")."""
    return CliRunner().invoke(main, ["replay", *args, "--", *ids], input=input)


def test_replay_by_id_puts_the_job_back_to_queued_with_attempts_0(conn):
    job_id, other = failed(conn, n=2, done_items={0: "A"}, payload={"items": ["a", "b"]})
    errors_before = conn.lrange(keys.errors(job_id), 0, -1)

    result = run(ids=[job_id])

    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "replayed 1 job"
    s = states.status(conn, job_id)
    assert (s["state"], s["attempts"], s["done"]) == ("queued", 0, 1)
    assert conn.hgetall(keys.items(job_id)) == {b"0": b'"A"'}  # checkpoint kept
    assert conn.lrange(keys.errors(job_id), 0, -1) == errors_before  # history kept
    for key in (keys.job(job_id), keys.items(job_id), keys.errors(job_id), keys.rq_job(job_id)):
        assert conn.ttl(key) == -1, f"{key} still expires"
    assert conn.zscore(keys.FAILED_INDEX, job_id) is None
    assert conn.zscore(keys.FAILED_INDEX, other) is not None
    assert states.status(conn, other)["state"] == "failed"


def test_rq_side_is_consistent_and_respects_the_owner_rate_limit(conn, env):
    env.setenv("LEASH_OWNER_CONCURRENCY", "2")
    now = clock.wall()
    ids = write_failed_jobs(conn, [FailedJob(kind="classify", error="ValueError: x", owner="alice", max_attempts=4,
                                             failed_at=now - 10 + n) for n in range(3)])

    assert run(ids=ids).exit_code == 0

    failed_registry = keys.rq_failed("leash", conn)
    limit = keys.rq_rate_limit("leash-owner:alice", conn)
    jobs = [Job.fetch(i, connection=conn, serializer=JSONSerializer) for i in ids]
    assert [j.get_status() for j in jobs] == [JobStatus.QUEUED, JobStatus.QUEUED, JobStatus.RATE_LIMITED]
    assert all(j.retries_left == 3 for j in jobs)
    assert all(j.ended_at is None and not conn.hexists(j.key, "exc_info") for j in jobs)
    assert conn.zcard(failed_registry) == 0
    assert [x.decode() for x in conn.lrange(keys.rq_queue("leash"), 0, -1)] == ids[:2]
    assert set(limit.get_allowed_job_ids()) == set(ids[:2])
    assert limit.get_rate_limited_job_ids() == ids[2:]


def test_a_job_without_a_rate_limit_goes_straight_onto_its_queue(conn):
    job_id = failed(conn, rate_limited=False)[0]

    assert run(ids=[job_id]).exit_code == 0

    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert job.get_status() == JobStatus.QUEUED and job.enqueued_at is not None
    assert conn.lrange(keys.rq_queue("leash"), 0, -1) == [job_id.encode()]
    assert conn.sismember(keys.rq_queues_set(), keys.rq_queue("leash"))


def test_replay_by_kind_error_text_and_since(conn):
    now = clock.wall()
    old_timeout = failed(conn, error="TimeoutError: model call 1 timed out", failed_at=now - 7200)
    new_timeout = failed(conn, error="TimeoutError: model call 2 timed out", failed_at=now - 60)
    other_kind = failed(conn, kind="summarize", error="TimeoutError: model call 3 timed out", failed_at=now - 60)
    key_error = failed(conn, error="KeyError: 'label'", failed_at=now - 60)

    def replayed(*args):
        out = json.loads(run(*args, "--dry-run", "--json").output)
        return {c["job_id"] for c in out["would_replay"]}

    assert replayed("--kind", "classify") == set(old_timeout + new_timeout + key_error)
    assert replayed("--error-contains", "timed out") == set(old_timeout + new_timeout + other_kind)
    assert replayed("--error-contains", "timed out", "--since", "1h") == set(new_timeout + other_kind)
    assert replayed("--kind", "classify", "--error-contains", "TimeoutError", "--since", "3h") \
        == set(old_timeout + new_timeout)

    result = run("--kind", "classify", "--error-contains", "TimeoutError", "--since", "1h", "--json")
    assert [c["job_id"] for c in json.loads(result.output)["replayed"]] == new_timeout
    assert states.status(conn, new_timeout[0])["state"] == "queued"
    assert states.status(conn, old_timeout[0])["state"] == "failed"


def test_dry_run_changes_nothing(conn):
    ids = failed(conn, n=3)
    before = snapshot(conn)

    result = run("--dry-run", ids=ids)

    assert result.exit_code == 0
    assert result.output.splitlines()[0] == "would replay 3 jobs"
    assert snapshot(conn) == before


def test_running_and_succeeded_jobs_are_skipped_with_a_reason(conn):
    running, _ = enqueue(conn, "noop", {})
    lease.claim(conn, running, "leash", "w1")
    succeeded, _ = enqueue(conn, "noop", {})
    lease.claim(conn, succeeded, "leash", "w1").finish({})
    queued, _ = enqueue(conn, "noop", {})
    failed_id = failed(conn)[0]

    result = run("--json", ids=[running, succeeded, queued, failed_id])

    assert result.exit_code == 0
    out = json.loads(result.output)
    assert [c["job_id"] for c in out["replayed"]] == [failed_id]
    assert {s["job_id"]: s["reason"] for s in out["skipped"]} == {
        running: "running: only failed jobs can be replayed",
        succeeded: "succeeded: only failed jobs can be replayed",
        queued: "queued: only failed jobs can be replayed",
    }
    assert states.status(conn, running)["state"] == "running"
    assert states.status(conn, succeeded)["state"] == "succeeded"


def test_a_job_whose_rq_job_was_deleted_is_rebuilt_from_leashs_payload_and_replayed(conn):
    job_id = failed(conn, payload={"items": ["a", "b"], "labels": ["x", "y"]})[0]
    conn.delete(keys.rq_job(job_id))
    out = json.loads(run("--json", ids=[job_id]).output)
    assert [r["job_id"] for r in out["replayed"]] == [job_id]
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert job.args == ["classify", {"items": ["a", "b"], "labels": ["x", "y"]}]
    assert job.get_status() in (JobStatus.QUEUED, JobStatus.RATE_LIMITED)
    assert states.status(conn, job_id)["state"] == "queued"


def test_a_job_whose_rq_job_and_payload_expired_is_skipped(conn):
    job_id = failed(conn)[0]
    conn.delete(keys.rq_job(job_id), keys.payload(job_id))
    out = json.loads(run("--json", ids=[job_id]).output)
    assert out["replayed"] == []
    assert out["skipped"] == [{"job_id": job_id, "reason": "its payload has expired, there is nothing left to run"}]
    assert conn.hget(keys.job(job_id), "state") == b"failed"


def test_unknown_ids_exit_2_and_change_nothing(conn):
    ids = failed(conn, n=2)
    before = snapshot(conn)

    result = run(ids=[ids[0], "no-such-job", ids[1]])

    assert result.exit_code == 2
    assert result.output.strip() == "Error: no such job: no-such-job; nothing was replayed"
    assert snapshot(conn) == before


@pytest.mark.parametrize("args, message", [
    ([], "say which jobs"),
    (["--since", "3x"], "is not a duration"),
    (["--since", "-1h"], "is not a duration"),
])
def test_bad_selectors_exit_2(conn, args, message):
    failed(conn)
    before = snapshot(conn)
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert snapshot(conn) == before


def test_more_than_10_jobs_asks_first_and_refuses_without_stdin(conn):
    ids = failed(conn, kind="summarize", n=11)
    before = snapshot(conn)

    no_stdin = run("--kind", "summarize")
    assert no_stdin.exit_code == 2
    assert "11 jobs match and there is no answer on stdin; pass --yes" in no_stdin.output
    declined = run("--kind", "summarize", input="n\n")
    assert declined.exit_code == 1
    assert snapshot(conn) == before

    agreed = run("--kind", "summarize", input="y\n")
    assert agreed.exit_code == 0 and "replayed 11 jobs" in agreed.output
    assert all(states.status(conn, i)["state"] == "queued" for i in ids)


def test_yes_skips_the_question_and_the_audit_says_who_when_what(conn, env):
    env.setenv("USER", "ops-on-call")
    ids = failed(conn, kind="summarize", n=12)

    result = run("--kind", "summarize", "--yes", "--json")

    assert result.exit_code == 0
    [entry] = deadletter.audit_log(conn)
    assert entry["actor"] == "ops-on-call"
    assert entry["count"] == 12 and sorted(entry["ids"]) == sorted(ids)
    assert entry["selector"] == {"ids_given": 0, "kind": "summarize", "error_contains": None, "since": None}
    assert entry["at"].endswith("Z")
    assert json.loads(result.output)["audit_id"] == entry["id"]

    run("--actor", "alice", ids=failed(conn))
    assert deadletter.audit_log(conn)[0]["actor"] == "alice"
    log = CliRunner().invoke(main, ["replay-log"]).output.splitlines()
    assert [line.split()[2:4] for line in log] == [["alice", "1"], ["ops-on-call", "12"]]
    assert log[0].endswith("ids_given=1") and log[1].endswith("kind=summarize")


@pytest.mark.slow
def test_replayed_job_succeeds_on_a_worker_and_resumes_from_its_checkpoint(conn, burst):
    items = [f"item-{i}" for i in range(8)]
    conn.set("test:broken:backend", 1)
    job_id, _ = enqueue(conn, "breaks_at", {"items": items, "break_at": 5, "flag": "backend"}, max_attempts=1)
    burst()
    first = wait_for(lambda: (s := states.status(conn, job_id))["state"] == "failed" and s, 20)
    # Items run several at once: 6 and 7 may have started beside the broken one (then they were
    # stored); nothing is launched after it failed.
    assert 5 <= first["done"] <= 7 and 5 not in {int(k) for k in conn.hkeys(keys.items(job_id))}
    assert first["error"].startswith(f"ConnectionError: model backend refused item 5 of job {job_id}")

    conn.delete("test:broken:backend")  # the fix is deployed
    result = run(ids=[job_id])
    assert result.exit_code == 0, result.output
    burst()

    final = wait_for(lambda: (s := states.status(conn, job_id))["state"] == "succeeded" and s, 20)
    assert (final["done"], final["total"], final["attempts"]) == (8, 8, 1)
    assert item_calls(conn, job_id) == {i: 1 for i in range(8)}, "checkpointed items were computed again"
    history = [json.loads(e) for e in conn.lrange(keys.errors(job_id), 0, -1)]
    assert [e["error"].split("\n")[0] for e in history] == [first["error"].split("\n")[0]]
