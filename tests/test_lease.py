"""The lease and its fencing, against a real Redis, with death simulated by writing state:
an expired lease is just a clock moved forward (``now=``)."""

from __future__ import annotations

import json
import time

import pytest
from rq.intermediate_queue import IntermediateQueue

from jobs import keys
from jobs.core import lease, states
from jobs.core.upkeep.reaper import Reaper
from jobs.enqueue import enqueue
from jobs.errors import LeaseLost

ITEMS = {"items": ["a", "b", "c"], "labels": ["x", "y"]}


def claimed(conn, now=1000.0, **kw):
    job_id, _ = enqueue(conn, "classify", ITEMS, now=now - 1, **kw)
    attempt = lease.claim(conn, job_id, "leash", "w1", now=now)
    assert attempt is not None
    conn.hset(keys.rq_job(job_id), "status", "started")  # what RQ's worker records as it starts the job
    return job_id, attempt


def test_claim_hands_out_increasing_tokens_and_counts_attempts(conn):
    job_id, first = claimed(conn)
    assert (first.number, first.kind) == (1, "classify")
    assert lease.claim(conn, job_id, "leash", "w2", now=1000.5) is None, "a running job must not be claimed twice"
    lease.reclaim(conn, job_id, "leash", "lease expired", now=2000.0)
    second = lease.claim(conn, job_id, "leash", "w2", now=2000.0)
    assert second.number == 2 and int(second.token) > int(first.token)


def test_a_claim_lost_in_a_failover_never_hands_its_token_to_the_next_claim(conn):
    """A failover with asynchronous replication can lose a claim the old primary acknowledged:
    the job is queued again on the new primary while the lost claim's worker runs on. The
    next claim must not get the same token, or both would pass the fence."""
    job_id, _ = enqueue(conn, "classify", ITEMS, now=999.0)
    before = conn.dump(keys.job(job_id))
    lost = lease.claim(conn, job_id, "leash", "w1", now=1000.0)
    for second in range(100):
        now = 1000.0 + second  # and every other time in the same microsecond as the lost claim
        conn.restore(keys.job(job_id), 0, before, replace=True)  # the new primary never saw it
        again = lease.claim(conn, job_id, "leash", "w2", now=1000.0 if second % 2 else now)
        assert again.token != lost.token
    with pytest.raises(LeaseLost):
        lost.heartbeat(done=1, now=1001.0)


def test_heartbeat_renews_lease_records_progress_and_mirrors_into_rq_meta(conn):
    job_id, attempt = claimed(conn)
    conn.hset(keys.rq_job(job_id), "meta", json.dumps({"leash_owner": "default", "note": "kept"}))
    attempt.heartbeat(item=(0, json.dumps("x")), now=1001.0)
    fields = states.status(conn, job_id, now=1001.0)
    assert fields["done"] == 1
    assert conn.zscore(keys.LEASES, job_id) == pytest.approx(1001.0 + attempt.lease_seconds)
    meta = json.loads(conn.hget(keys.rq_job(job_id), "meta"))
    assert meta["leash_done"] == 1 and meta["leash_total"] == 3
    assert meta["note"] == "kept", "other meta keys must survive the progress mirror"


def test_a_heartbeat_after_rq_deleted_the_running_job_does_not_recreate_rq_record(conn):
    """rq-dashboard's Delete removes a running job's RQ record while the job runs on: its next
    writes record progress in leash only. Mirrored into a record RQ no longer has, they would
    leave a hash of a meta field alone, without an expiry, for good if the worker then died."""
    job_id, attempt = claimed(conn)
    conn.delete(keys.rq_job(job_id))
    attempt.heartbeat(item=(0, json.dumps("x")), now=1001.0)
    attempt.store_items([(1, '"y"', "0,0,0")], None, now=1002.0)
    assert not conn.exists(keys.rq_job(job_id)), conn.hgetall(keys.rq_job(job_id))
    assert states.status(conn, job_id, now=1002.0)["done"] == 2
    assert conn.zscore(keys.LEASES, job_id) == pytest.approx(1002.0 + attempt.lease_seconds)


def test_a_superseded_attempt_cannot_heartbeat_checkpoint_finish_or_fail(conn):
    job_id, zombie = claimed(conn)
    lease.reclaim(conn, job_id, "leash", "lease expired", now=2000.0)
    live = lease.claim(conn, job_id, "leash", "w2", now=2000.0)
    with pytest.raises(LeaseLost):
        zombie.heartbeat(item=(0, json.dumps("zombie")), now=2001.0)
    with pytest.raises(LeaseLost):
        zombie.finish({"by": "zombie"}, now=2001.0)
    assert zombie.fail("late error", permanent=True, now=2001.0) == "superseded"
    assert not zombie.release(now=2001.0)
    assert conn.hget(keys.items(job_id), "0") is None
    assert int(conn.get(keys.REJECTED_WRITES)) == 4
    live.finish({"by": "live"}, now=2002.0)
    fields = states.status(conn, job_id)
    assert fields["state"] == "succeeded" and fields["result"]["summary"] == {"by": "live"}


def test_expired_lease_is_reported_stale_then_reclaimed_to_queued_with_the_error(conn):
    job_id, attempt = claimed(conn, now=1000.0)
    expiry = 1000.0 + attempt.lease_seconds
    assert states.status(conn, job_id, now=expiry - 0.1)["stale"] is False
    stale = states.status(conn, job_id, now=expiry + 0.1)
    assert stale["state"] == "running" and stale["stale"] is True

    reaper = Reaper(conn, "test-reaper", interval=1)
    assert reaper.reap(now=expiry - 0.1) == 0, "a live lease must not be reclaimed"
    assert reaper.reap(now=expiry + 0.1) == 1
    fields = states.status(conn, job_id, now=expiry + 0.2)
    assert fields["state"] == "queued" and fields["attempts"] == 1
    assert fields["error"].startswith("lease expired")
    assert conn.lindex(keys.rq_queue("leash"), 0) == job_id.encode(), "reclaimed jobs go to the queue front"
    assert conn.hget(keys.rq_job(job_id), "status") == b"queued"
    history = [json.loads(e) for e in conn.lrange(keys.errors(job_id), 0, -1)]
    assert history[0]["attempt"] == 1 and history[0]["error"].startswith("lease expired")
    assert reaper.reap(now=expiry + 0.3) == 0, "a job is reclaimed once"


def test_reclaim_at_max_attempts_fails_the_job_with_lease_expired(conn):
    job_id, _ = claimed(conn, now=1000.0, max_attempts=1)
    assert lease.reclaim(conn, job_id, "leash", "lease expired 1.0s ago", now=5000.0) == "failed"
    fields = states.status(conn, job_id, now=5000.0)
    assert fields["state"] == "failed" and fields["error"] == "lease expired 1.0s ago"
    assert conn.zscore(keys.FAILED_INDEX, job_id) == 5000.0
    assert conn.zscore(keys.rq_failed("leash", conn), job_id) is not None
    assert conn.ttl(keys.job(job_id)) > 0, "ended jobs keep their record for LEASH_RESULT_TTL"


def test_failure_requeues_while_attempts_remain_and_always_stores_text(conn):
    job_id, attempt = claimed(conn, max_attempts=2)
    assert attempt.fail("ValueError: first", permanent=False, now=1001.0) == "queued"
    second = lease.claim(conn, job_id, "leash", "w1", now=1002.0)
    assert second.fail("ValueError: second", permanent=False, now=1003.0) == "failed"
    fields = states.status(conn, job_id)
    assert (fields["state"], fields["attempts"], fields["error"]) == ("failed", 2, "ValueError: second")
    assert conn.llen(keys.errors(job_id)) == 2


def test_hand_off_gives_back_the_attempt_and_goes_to_the_queue_front(conn):
    job_id, attempt = claimed(conn)
    assert attempt.release(now=1001.0) == 1
    fields = states.status(conn, job_id)
    assert (fields["state"], fields["attempts"]) == ("queued", 0)
    assert conn.lindex(keys.rq_queue("leash"), 0) == job_id.encode()
    assert conn.zscore(keys.LEASES, job_id) is None


def test_orphaned_horse_stops_renewing_but_keeps_its_checkpoints(conn, monkeypatch):
    job_id, attempt = claimed(conn, now=1000.0)
    attempt.worker_pid = -1  # as if the worker that claimed had died
    attempt.heartbeat(item=(0, json.dumps("x")), now=1001.0)
    assert conn.zscore(keys.LEASES, job_id) == 1000.0 + attempt.lease_seconds, "lease not extended"
    assert conn.hget(keys.items(job_id), "0") == b'"x"'


def test_status_is_one_round_trip_and_never_reads_items(conn):
    job_id, attempt = claimed(conn)
    for i in range(3):
        attempt.heartbeat(item=(i, json.dumps("y" * 50_000)), now=1001.0)
    attempt.finish({"items": 3}, now=1002.0)
    round_trips, commands = [], []
    original_execute = conn.execute_command
    conn.execute_command = lambda *a, **kw: (round_trips.append(a[0]), original_execute(*a, **kw))[1]
    original_pipeline = conn.pipeline

    def recording_pipeline(*args, **kwargs):
        pipe = original_pipeline(*args, **kwargs)
        execute = pipe.execute

        def recorded_execute(*a, **kw):
            round_trips.append("pipeline")
            commands.extend((c[0][0], c[0][1]) for c in pipe.command_stack)
            return execute(*a, **kw)

        pipe.execute = recorded_execute
        return pipe

    conn.pipeline = recording_pipeline
    fields = states.status(conn, job_id)
    assert round_trips == ["pipeline"], "one status read is one round trip"
    # The job hash, RQ's status and the two short history lists (errors, attempts): never the items.
    assert commands == [("HGETALL", keys.job(job_id)), ("HGET", keys.rq_job(job_id)),
                        ("LRANGE", keys.errors(job_id)), ("LRANGE", keys.history(job_id))]
    assert fields["result"] == {"summary": {"items": 3}, "url": f"/jobs/{job_id}/result"}
    assert conn.memory_usage(keys.job(job_id)) < 2048, "the job hash stays small however large the results"
    assert conn.memory_usage(keys.items(job_id)) > 150_000


@pytest.mark.parametrize("leash_state, rq_status, expected", [
    ("queued", "queued", "queued"),
    ("queued", "scheduled", "queued"),
    ("queued", "deferred", "queued"),
    ("queued", "rate_limited", "queued"),
    ("queued", "created", "queued"),
    ("queued", "canceled", "failed"),
    ("queued", "stopped", "failed"),
    ("running", "started", "running"),
    ("running", "queued", "running"),
    ("succeeded", "started", "succeeded"),
    ("succeeded", "finished", "succeeded"),
    ("failed", "failed", "failed"),
    ("failed", "stopped", "failed"),
])
def test_state_adapter_maps_rq_statuses_and_leash_state(leash_state, rq_status, expected):
    state, stale, _ = states.decide(leash_state, rq_status, lease_expires_at=100.0, now=50.0)
    assert state.value == expected and stale is False


def test_stale_is_running_with_an_expired_lease():
    assert states.decide("running", "started", lease_expires_at=100.0, now=100.5)[1] is True
    assert states.decide("queued", "queued", lease_expires_at=100.0, now=100.5)[1] is False


def test_a_write_whose_reply_was_lost_in_a_redis_blip_is_not_mistaken_for_a_zombie(conn, monkeypatch):
    import redis

    from jobs.lifecycle import scripts

    job_id, attempt = claimed(conn)
    real_run, calls = scripts.run, []

    def lossy_run(connection, name, keys, args, pipeline=None):
        reply = real_run(connection, name, keys, args, pipeline)
        calls.append(name)
        if calls.count("finish_v3") == 1 and name == "finish_v3":
            raise redis.exceptions.ConnectionError("connection reset after the script ran")
        return reply

    monkeypatch.setattr(scripts, "run", lossy_run)
    attempt.finish({"items": 3}, now=1001.0)  # must not raise LeaseLost
    assert calls == ["reservations_settle_v1", "finish_v3", "finish_v3"]  # abandoned calls settled first
    assert attempt.outcome == "succeeded"
    assert states.status(conn, job_id)["state"] == "succeeded"


def test_a_job_swallowed_by_a_dead_workers_dequeue_goes_back_to_the_queue(conn):
    swallowed, _ = enqueue(conn, "classify", ITEMS)
    claimed_id, _ = enqueue(conn, "classify", ITEMS)
    intermediate = IntermediateQueue.get_intermediate_queue_key(keys.rq_queue("leash"))
    for _ in range(2):  # as RQ's BLMOVE does, for a worker that then died / one that claims
        conn.lmove(keys.rq_queue("leash"), intermediate, "LEFT", "RIGHT")
    assert lease.claim(conn, claimed_id, "leash", "w-alive") is not None
    reaper = Reaper(conn, "test-reaper", interval=1, queue_names=("leash",))
    assert reaper.requeue_swallowed(now=time.time()) == 0, "first seen now: a live worker may be about to claim it"
    assert reaper.requeue_swallowed(now=time.time() + 6) == 1
    assert conn.lrange(keys.rq_queue("leash"), 0, -1) == [swallowed.encode()]
    assert conn.lrange(intermediate, 0, -1) == [claimed_id.encode()], "a claimed job is its worker's business"
    assert states.status(conn, swallowed)["attempts"] == 0


def test_a_waiting_batch_jobs_look_swallowed_by_a_dead_workers_dequeue_goes_back_to_the_queue(conn):
    from rq.scheduler import RQScheduler
    from rq.serializers import JSONSerializer

    from tests.test_lost_looks import parked

    swallowed, claimed = parked(conn, owner="o1"), parked(conn, owner="o2")
    scheduler = RQScheduler(["leash"], connection=conn, serializer=JSONSerializer)
    scheduler.prepare_registries(["leash"])
    scheduler.enqueue_scheduled_jobs()  # both looks are due: RQ's scheduler queues them
    intermediate = keys.rq_intermediate("leash", conn)
    for _ in range(2):  # as RQ's BLMOVE does, for a worker that then died / one that claims
        conn.lmove(keys.rq_queue("leash"), intermediate, "LEFT", "RIGHT")
    assert lease.claim(conn, claimed, "leash", "w-alive") is not None  # a look, handed out
    # An entry left by a look RQ holds again (its job was looked at through another entry).
    stale = parked(conn, owner="o3")
    conn.rpush(intermediate, stale)
    reaper = Reaper(conn, "test-reaper", interval=1, queue_names=("leash",))
    assert reaper.requeue_swallowed(now=time.time()) == 0, "first seen now: a live worker may be about to claim it"
    assert reaper.requeue_swallowed(now=time.time() + 6) == 1
    assert conn.lrange(keys.rq_queue("leash"), 0, -1) == [swallowed.encode()]
    assert conn.lrange(intermediate, 0, -1) == [claimed.encode()], "a claimed look is its worker's business"
    assert conn.zscore(keys.rq_scheduled("leash", conn), stale) is not None, "its look still comes through RQ"
    look = lease.claim(conn, swallowed, "leash", "w")
    assert look is not None and conn.hget(keys.job(swallowed), "phase") == b"looking"
    assert states.status(conn, swallowed)["attempts"] == 1, "a look is not an attempt"


def test_rqs_stuck_job_cleanup_requeues_a_leash_job_instead_of_failing_it(conn):
    from rq.job import Job

    from jobs.enqueue import rq_queue
    from jobs.worker.leash_worker import LeashWorker

    job_id, _ = enqueue(conn, "classify", ITEMS)
    intermediate = IntermediateQueue.get_intermediate_queue_key(keys.rq_queue("leash"))
    conn.lmove(keys.rq_queue("leash"), intermediate, "LEFT", "RIGHT")
    worker = LeashWorker(["leash"], connection=conn)
    job = Job.fetch(job_id, connection=conn, serializer=rq_queue(conn).serializer)
    # what RQ's IntermediateQueue.cleanup does a minute after a dead worker swallowed the job
    worker.handle_job_failure(job, rq_queue(conn), exc_string="Job was stuck in intermediate queue.")
    assert conn.lrange(keys.rq_queue("leash"), 0, -1) == [job_id.encode()]
    assert conn.llen(intermediate) == 0
    assert conn.hget(keys.rq_job(job_id), "status") == b"queued"
    assert states.status(conn, job_id)["state"] == "queued"


def test_a_stop_between_the_claim_and_the_fork_gives_the_claim_back(conn, monkeypatch):
    from rq.exceptions import StopRequested
    from rq.job import Job
    from rq.worker import Worker

    from jobs.enqueue import rq_queue
    from jobs.worker.leash_worker import LeashWorker

    job_id, _ = enqueue(conn, "classify", ITEMS)
    job = Job.fetch(job_id, connection=conn, serializer=rq_queue(conn).serializer)

    def stopped_before_forking(self, job, queue):
        assert states.status(conn, job_id)["state"] == "running"  # claimed
        raise StopRequested()  # what RQ's SIGTERM handler raises while the worker is not yet busy

    monkeypatch.setattr(Worker, "execute_job", stopped_before_forking)
    with pytest.raises(StopRequested):
        LeashWorker(["leash"], connection=conn).execute_job(job, rq_queue(conn))
    fields = states.status(conn, job_id)
    assert (fields["state"], fields["attempts"]) == ("queued", 0)
    assert conn.lindex(keys.rq_queue("leash"), 0) == job_id.encode()


def test_a_first_seen_marker_older_than_the_jobs_last_claim_is_an_earlier_pass_not_a_swallowed_job(conn):
    job_id, _ = enqueue(conn, "classify", ITEMS)
    intermediate = keys.rq_intermediate("leash", conn)
    conn.lmove(keys.rq_queue("leash"), intermediate, "LEFT", "RIGHT")
    # A marker from an earlier pass (left by a worker that did not clear it on claim), then the
    # job's last claim (its previous attempt), then this pass: the job is back in the list now.
    marker = IntermediateQueue(keys.rq_queue("leash"), conn).get_first_seen_key(job_id)
    conn.set(marker, time.time() - 600)
    conn.hset(keys.job(job_id), "started_at", time.time() - 60)
    reaper = Reaper(conn, "test-reaper", interval=1, queue_names=("leash",))
    assert reaper.requeue_swallowed(now=time.time()) == 0
    assert float(conn.get(marker)) > time.time() - 5, "timed afresh"
    assert reaper.requeue_swallowed(now=time.time() + 6) == 1, "still unclaimed 5 s after: swallowed"
    assert not conn.exists(marker)
