"""The queued cap (LEASH_MAX_QUEUED_PER_OWNER) is checked and taken in one step: submitters racing
each other, through the API or through jobs.enqueue, never pass it, and replays count against it
(the API's and the button's 429, `leash replay`'s jobs left failed and its exit status)."""

from __future__ import annotations

import threading

import redis
from click.testing import CliRunner

from cli import main
from jobs import deadletter, keys
from jobs.core import states
from jobs.deadletter.synthetic import FailedJob, traceback_text, write_failed_jobs
from jobs.enqueue import enqueue
from jobs.errors import QueueFull
from jobs.intake import door
from tests.conftest import REDIS_URL
from tests.web_support import CLASSIFY, bearer

ITEMS = {"items": ["a"], "labels": ["x", "y"]}
SUBMITTERS = 64
CAP = 20


def at_once(n: int, submit) -> list:
    """Run ``submit(i)`` on n threads released together; each one's answer (or exception)."""
    barrier = threading.Barrier(n)
    answers: list = [None] * n

    def one(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            answers[i] = submit(i)
        except Exception as exc:  # the answer under test: QueueFull or anything unexpected
            answers[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return answers


def queued(conn, owner: str) -> int:
    return conn.zcard(keys.owner_state(owner, "queued"))


def test_64_concurrent_submitters_through_jobs_enqueue_queue_exactly_the_cap(conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", str(CAP))
    clients = [redis.Redis.from_url(REDIS_URL) for _ in range(8)]  # 8 pools, as from several processes
    answers = at_once(SUBMITTERS, lambda i: enqueue(clients[i % 8], "classify", dict(ITEMS), owner="alice"))
    created = [a for a in answers if isinstance(a, tuple)]
    refused = [a for a in answers if isinstance(a, QueueFull)]
    assert len(created) == CAP and len(refused) == SUBMITTERS - CAP, [a for a in answers if isinstance(a, Exception)
                                                                    and not isinstance(a, QueueFull)]
    assert "(at most 20, LEASH_MAX_QUEUED_PER_OWNER)" in str(refused[0]) and refused[0].retry_after == 60
    assert queued(conn, "alice") == CAP and len(conn.keys(keys.job("*"))) == CAP
    assert conn.zcard(keys.owner_door_holds("alice")) == 0, "every place taken was written or given back"
    for client in clients:
        client.close()


def test_64_concurrent_submitters_through_the_api_are_answered_20_times_202_and_44_times_429(token_app, conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", str(CAP))

    def post(i: int):
        response = token_app.test_client().post("/jobs", json=CLASSIFY, headers=bearer("alice"))
        return response.status_code, response.headers.get("Retry-After"), response.get_json()

    answers = at_once(SUBMITTERS, post)
    statuses = sorted(a[0] for a in answers)
    assert statuses == [202] * CAP + [429] * (SUBMITTERS - CAP)
    refusal = next(a for a in answers if a[0] == 429)
    assert refusal[1] == "60" and "(at most 20, LEASH_MAX_QUEUED_PER_OWNER)" in refusal[2]["error"]
    assert queued(conn, "alice") == CAP and len(conn.keys(keys.job("*"))) == CAP
    # Another owner has a cap of its own.
    assert token_app.test_client().post("/jobs", json=CLASSIFY, headers=bearer("bob")).status_code == 202


def test_a_place_held_by_a_submission_being_written_counts_and_a_dead_writers_hold_lapses(conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "2")
    enqueue(conn, "classify", dict(ITEMS), owner="alice")
    door.take(conn, "alice", "being-written")  # a submission between its take and its write
    try:
        enqueue(conn, "classify", dict(ITEMS), owner="alice")
    except QueueFull as exc:
        assert "has 2 queued (at most 2" in str(exc)
    else:
        raise AssertionError("a held place was not counted")
    # A writer that died leaves its hold; once it lapses (Redis time), the place is free again.
    lapsed = float(conn.time()[0]) - 1
    conn.zadd(keys.owner_door_holds("alice"), {"being-written": lapsed})
    assert enqueue(conn, "classify", dict(ITEMS), owner="alice")[1] is True
    assert queued(conn, "alice") == 2 and conn.zcard(keys.owner_door_holds("alice")) == 0


def test_a_repeated_idempotency_key_at_the_cap_gets_its_job_and_leaves_no_hold(conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "1")
    job_id, created = enqueue(conn, "classify", dict(ITEMS), owner="alice", idempotency_key="k")
    assert created and enqueue(conn, "classify", dict(ITEMS), owner="alice", idempotency_key="k") == (job_id, False)
    assert conn.zcard(keys.owner_door_holds("alice")) == 0


def failed_jobs(conn, n: int, owner: str = "alice") -> list[str]:
    return write_failed_jobs(conn, [FailedJob(kind="classify", error=traceback_text("ValueError: bad"), owner=owner)
                                    for _ in range(n)])


def test_replays_count_against_the_cap_and_leave_the_rest_failed_with_the_reason(conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "5")
    ids = failed_jobs(conn, 15)
    other = failed_jobs(conn, 1, owner="bob")
    selection = deadletter.select(conn, ids + other)
    outcome = deadletter.replay(conn, selection.matched, "ops", {"ids_given": 16})
    assert sorted(c.job_id for c in outcome.replayed) == sorted(ids[:5] + other)  # bob has a cap of his own
    assert [job_id for job_id, _ in outcome.left_failed] == ids[5:] and outcome.skipped == []
    assert "left failed: too many jobs waiting: owner 'alice' has 5 queued (at most 5, LEASH_MAX_QUEUED_PER_OWNER)" \
        in outcome.left_failed[0][1]
    assert queued(conn, "alice") == 5
    assert [states.status(conn, job_id)["state"] for job_id in ids[5:]] == ["failed"] * 10
    [entry] = deadletter.audit_log(conn, 1)
    assert entry["count"] == 6 and len(entry["skipped"]) == 10
    # Once some have started, the same replay takes the places freed.
    conn.zrem(keys.owner_state("alice", "queued"), *ids[:2])
    again = deadletter.replay(conn, deadletter.select(conn, ids[5:]).matched, "ops", {})
    assert len(again.replayed) == 2 and len(again.left_failed) == 8


def test_replays_racing_submissions_never_pass_the_cap(conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", str(CAP))
    ids = failed_jobs(conn, 32)

    def one(i: int):
        if i % 2:
            return enqueue(conn, "classify", dict(ITEMS), owner="alice")
        candidates = deadletter.select(conn, ids[i:i + 2]).matched
        return deadletter.replay(conn, candidates, "ops", {})

    answers = at_once(32, one)
    assert not [a for a in answers if isinstance(a, Exception) and not isinstance(a, QueueFull)]
    assert queued(conn, "alice") == CAP


def test_leash_replay_names_the_jobs_it_left_failed_and_why_and_exits_1(conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "5")
    ids = failed_jobs(conn, 15)
    result = CliRunner().invoke(main, ["replay", "--yes", "--", *ids])
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[0] == "replayed 5 jobs"
    for job_id in ids[5:]:
        assert f"  {job_id} left failed: too many jobs waiting: owner 'alice' has 5 queued (at most 5, " \
               "LEASH_MAX_QUEUED_PER_OWNER)" in result.stdout
    assert "10 jobs left failed: their owner is at the queued cap (LEASH_MAX_QUEUED_PER_OWNER)" in result.stderr
    assert queued(conn, "alice") == 5
    as_json = CliRunner().invoke(main, ["replay", "--json", "--", *ids[5:]])
    assert as_json.exit_code == 1 and '"left_failed": [{"job_id": "' + ids[5] + '"' in as_json.stdout


def test_the_apis_replay_and_the_button_answer_429_naming_the_cap(token_app, conn, env):
    env.setenv("LEASH_MAX_QUEUED_PER_OWNER", "1")
    client = token_app.test_client()
    [job_id] = failed_jobs(conn, 1)
    assert client.post("/jobs", json=CLASSIFY, headers=bearer("alice")).status_code == 202
    refused = client.post(f"/jobs/{job_id}/replay", headers=bearer("alice"))
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "60"
    assert refused.get_json()["error"] == ("not replayed: left failed: too many jobs waiting: owner 'alice' has 1 "
                                           "queued (at most 1, LEASH_MAX_QUEUED_PER_OWNER); submit again once some "
                                           "have started, or cancel some")
    assert states.status(conn, job_id)["state"] == "failed"
