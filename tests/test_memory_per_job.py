"""What a job keeps in Redis: no second copy of its result, a compressed payload copy that
still reads the plain form earlier releases wrote, and owner indexes that leave with their jobs."""

from __future__ import annotations

import json

from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.core import payload_copy, state_index
from jobs.enqueue import enqueue
from jobs.read.results import submitted_items
from tests.conftest import wait_for
from tests.web_support import finish_job

ITEMS = [f"review number {n}: the delivery was late again and the box arrived damaged" for n in range(100)]


def test_a_succeeded_job_keeps_its_result_in_leash_only_and_rq_still_calls_it_finished(conn, workers):
    job_id, _ = enqueue(conn, "count", {"items": ["a", "b"], "delay": 0}, owner="alice")
    proc = workers.start("--burst")
    wait_for(lambda: proc.poll() is not None, 60, message="the burst worker to finish")
    assert conn.hget(keys.job(job_id), "state") == b"succeeded"
    assert json.loads(conn.hget(keys.job(job_id), "result")) == {"items": 2}
    rq_job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert rq_job.get_status() == JobStatus.FINISHED
    assert job_id in FinishedJobRegistry("leash", connection=conn, serializer=JSONSerializer).get_job_ids()
    assert not conn.exists(Result.get_key(job_id))  # RQ's one-entry stream: ~4.7 KB per job
    assert rq_job.return_value() is None
    assert conn.ttl(rq_job.key) > 0  # RQ's record still expires with the result TTL


def test_the_payload_copy_is_compressed_and_a_plain_one_from_an_earlier_release_still_reads(conn):
    job_id, _ = enqueue(conn, "classify", {"items": ITEMS, "labels": ["a", "b"]}, owner="alice")
    stored = conn.get(keys.payload(job_id))
    plain = json.dumps({"items": ITEMS, "labels": ["a", "b"]}, separators=(",", ":")).encode()
    assert stored[:1] == b"x" and len(stored) < len(plain) / 2
    assert submitted_items(conn, job_id) == ITEMS

    conn.set(keys.payload(job_id), plain)  # as the previous release wrote it
    assert submitted_items(conn, job_id) == ITEMS

    small = {"items": ["hi"], "labels": ["a", "b"]}
    assert payload_copy.encode(small) == json.dumps(small, separators=(",", ":")).encode()  # smaller plain
    assert payload_copy.decode(payload_copy.encode(small)) == small


def test_the_owners_job_index_expires_with_its_last_ended_job_and_never_while_a_job_is_queued(conn):
    ended, _ = enqueue(conn, "classify", {"items": ["one"], "labels": ["a", "b"]}, owner="alice")
    state_index.backfill_step(conn)  # every job indexed: the marker the script waits for
    finish_job(conn, ended, ["a"])
    state_index.trim_expired(conn, "alice")
    ttl = conn.ttl(keys.owner_jobs("alice"))
    assert 0 < ttl and abs(ttl - conn.ttl(keys.owner_expiries("alice"))) <= 2

    queued, _ = enqueue(conn, "classify", {"items": ["two"], "labels": ["a", "b"]}, owner="alice")
    assert conn.ttl(keys.owner_jobs("alice")) == -1  # lists a queued job: no TTL
    state_index.trim_expired(conn, "alice")
    assert conn.ttl(keys.owner_jobs("alice")) == -1

    # Every record of the ended job has expired (deleted, as its expiry would): its entries go.
    conn.delete(keys.job(ended), keys.items(ended), keys.payload(ended))
    due = float(conn.zscore(keys.owner_expiries("alice"), ended)) + 1
    assert state_index.trim_expired(conn, "alice", now=due) == 1
    assert conn.zrange(keys.owner_jobs("alice"), 0, -1) == [queued.encode()]
    assert conn.zscore(keys.owner_state("alice", "succeeded"), ended) is None
