"""What a job keeps in Redis: no second copy of its result or its payload once it succeeded, a
compressed payload copy that still reads the plain form earlier releases wrote, and owner indexes
that leave with their jobs."""

from __future__ import annotations

import html
import json

from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry
from rq.results import Result
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.core import payload_copy, state_index
from jobs.core.rq_side import finished_data
from jobs.enqueue import enqueue
from jobs.lifecycle import scripts
from jobs.read.results import item_inputs, submitted_items
from tests.web_support import basic, create_app_with, finish_job

#: MEMORY USAGE of a finished 2-item job's own keys (RQ's job hash, leash's job hash, items,
#: history and payload copy): ~2,130 bytes for the `count` job below, ~3,200 while RQ's hash
#: kept the payload as a hash table. benchmarks/bench_memory.py measures every key of a job,
#: against plain RQ (docs/BENCHMARKS.md).
JOB_KEYS_BOUND = 2_400

ITEMS = [f"review number {n}: the delivery was late again and the box arrived damaged" for n in range(100)]


def test_a_succeeded_job_keeps_its_result_in_leash_only_and_rq_still_calls_it_finished(conn, burst):
    job_id, _ = enqueue(conn, "count", {"items": ["a", "b"], "delay": 0}, owner="alice")
    burst()
    assert conn.hget(keys.job(job_id), "state") == b"succeeded"
    assert json.loads(conn.hget(keys.job(job_id), "result")) == {"items": 2}
    rq_job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert rq_job.get_status() == JobStatus.FINISHED
    assert job_id in FinishedJobRegistry("leash", connection=conn, serializer=JSONSerializer).get_job_ids()
    assert not conn.exists(Result.get_key(job_id))  # RQ's one-entry stream: ~4.7 KB per job
    assert rq_job.return_value() is None
    assert conn.ttl(rq_job.key) > 0  # RQ's record still expires with the result TTL


def test_a_succeeded_job_keeps_one_copy_of_its_payload_and_rq_still_reads_its_record(conn, burst):
    payload = {"items": ITEMS[:2], "delay": 0}
    job_id, _ = enqueue(conn, "count", payload, owner="alice")
    failing, _ = enqueue(conn, "permanent", {"items": ITEMS[:2]}, owner="alice")
    burst()
    assert [conn.hget(keys.job(i), "state") for i in (job_id, failing)] == [b"succeeded", b"failed"]

    rq_job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    assert rq_job.get_status() == JobStatus.FINISHED
    assert (rq_job.func_name, rq_job.args, rq_job.kwargs) == ("jobs.runner.execute", ["count", {}], {})
    assert rq_job.description == "count (2 items) for alice"
    assert rq_job.get_meta() == {"leash_done": 2, "leash_total": 2}
    assert conn.object("encoding", rq_job.key) == b"listpack"  # every value within 64 bytes: no hash table
    assert conn.ttl(rq_job.key) > 0
    assert payload_copy.decode(conn.get(keys.payload(job_id))) == payload  # leash's copy, read by leash
    assert submitted_items(conn, job_id) == ITEMS[:2]
    assert item_inputs(conn, job_id, 1, 5) == ITEMS[1:2]  # the job page's inputs column
    own_keys = [rq_job.key, keys.job(job_id), keys.items(job_id), keys.history(job_id), keys.payload(job_id)]
    assert sum(conn.memory_usage(k, samples=0) for k in own_keys) <= JOB_KEYS_BOUND

    # rq-dashboard lists the job under Finished and shows its page, description and progress.
    auth = basic("operator", "pw")
    client = create_app_with(LEASH_DASHBOARD_USER="operator", LEASH_DASHBOARD_PASSWORD="pw").test_client()
    listed = client.get("/rq/0/data/jobs/leash/finished/100/asc/1.json", headers=auth).get_json()["jobs"]
    assert {"id": job_id, "description": "count (2 items) for alice"}.items() <= \
        next(j for j in listed if j["id"] == job_id).items()
    shown = client.get(f"/rq/0/data/job/{job_id}.json", headers=auth).get_json()
    # (the dashboard's data is HTML-escaped: it prints it unescaped)
    assert shown["status"] == "finished" and json.loads(html.unescape(shown["metadata"])) == {"leash_done": 2,
                                                                                              "leash_total": 2}
    assert client.get(f"/rq/0/view/job/{job_id}", headers=auth).status_code == 200

    failed = Job.fetch(failing, connection=conn, serializer=JSONSerializer)
    assert failed.get_status() == JobStatus.FAILED
    assert failed.args == ["permanent", {"items": ITEMS[:2]}]  # a requeue runs it again: RQ's record stays whole


def test_rq_keeps_the_payload_of_a_job_that_has_no_other_copy(conn):
    """A job a release without payload copies queued (the schema's migration gives such jobs
    a copy; one submitted by such a release's web process meanwhile has none)."""
    payload = {"items": ITEMS[:2], "labels": ["a", "b"]}
    job_id, _ = enqueue(conn, "classify", payload, owner="alice")
    conn.delete(keys.payload(job_id))
    rq_key = keys.rq_job(job_id)
    assert scripts.run(conn, "compact_finished_rq_job_v1", keys={"rq_job": rq_key, "payload": keys.payload(job_id)},
                       args=[finished_data("classify")]) == 0
    assert Job.fetch(job_id, connection=conn, serializer=JSONSerializer).args == ["classify", payload]
    assert submitted_items(conn, job_id) == ITEMS[:2]

    conn.set(keys.payload(job_id), payload_copy.encode(payload))
    assert scripts.run(conn, "compact_finished_rq_job_v1", keys={"rq_job": rq_key, "payload": keys.payload(job_id)},
                       args=[finished_data("classify")]) == 1
    assert Job.fetch(job_id, connection=conn, serializer=JSONSerializer).args == ["classify", {}]
    assert scripts.run(conn, "compact_finished_rq_job_v1",
                       keys={"rq_job": keys.rq_job("missing"), "payload": keys.payload("missing")},
                       args=[finished_data("classify")]) == -1 and not conn.exists(keys.rq_job("missing"))


def test_a_job_finished_by_the_previous_release_keeps_its_full_record_and_reads_the_same(conn):
    job_id, _ = enqueue(conn, "classify", {"items": ITEMS, "labels": ["a", "b"]}, owner="alice")
    finish_job(conn, job_id, ["a"] * len(ITEMS))  # RQ's record as it was: the whole payload in `data`
    assert item_inputs(conn, job_id, 98, 5) == ITEMS[98:]
    conn.delete(keys.payload(job_id))  # and from before leash kept a copy
    assert item_inputs(conn, job_id, 98, 5) == ITEMS[98:]
    assert submitted_items(conn, job_id) == ITEMS


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
