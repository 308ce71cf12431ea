"""Each owner's jobs by state: every transition moves a job between the indexes in the same
atomic step, ended jobs leave with their records, filters are exact past 10,000 jobs, and an
upgrade (older jobs, older workers still running) ends with exact indexes too."""

from __future__ import annotations

import json

import pytest

from jobs import keys
from jobs.config import settings
from jobs.core import control, lease, state_index
from jobs.core.upkeep import consistency
from jobs.deadletter.replayer import replay, select
from jobs.deadletter.synthetic import FailedJob, write_failed_jobs
from jobs.enqueue import enqueue
from jobs.read import listing
from tests.test_upgrade import previous_script

ITEMS = {"items": ["a", "b"], "labels": ["x", "y"]}
STATES = keys.INDEXED_STATES


def indexed_in(conn, owner: str, job_id: str) -> list[str]:
    """The states whose index of ``owner`` lists the job (exactly one when all is well)."""
    return [s for s in STATES if conn.zscore(keys.owner_state(owner, s), job_id) is not None]


def leash_state(conn, job_id: str) -> str:
    return conn.hget(keys.job(job_id), "state").decode()


def assert_exact(conn, owner: str, job_id: str) -> None:
    assert indexed_in(conn, owner, job_id) == [leash_state(conn, job_id)]


def test_every_transition_moves_the_job_to_exactly_the_index_of_its_state(conn, env):
    env.setenv("LEASH_MAX_ATTEMPTS", "2")
    job_id, _ = enqueue(conn, "classify", ITEMS, owner="ann", now=100.0)
    assert_exact(conn, "ann", job_id)  # queued
    attempt = lease.claim(conn, job_id, "leash", "w1", now=101.0)
    assert_exact(conn, "ann", job_id)  # running
    assert attempt.fail("boom", permanent=False, now=102.0) == "queued"
    assert_exact(conn, "ann", job_id)
    attempt = lease.claim(conn, job_id, "leash", "w1", now=103.0)
    assert attempt.release(now=104.0) == 1  # a deploy's hand-off
    assert_exact(conn, "ann", job_id)
    attempt = lease.claim(conn, job_id, "leash", "w1", now=105.0)
    assert lease.reclaim(conn, job_id, "leash", "lease expired", now=1000.0) == "failed"  # 2nd attempt of 2
    assert_exact(conn, "ann", job_id)
    assert replay(conn, select(conn, job_ids=[job_id]).matched, actor="test", selector={}, now=1001.0).replayed
    assert_exact(conn, "ann", job_id)  # queued again
    attempt = lease.claim(conn, job_id, "leash", "w1", now=1002.0)
    attempt.finish({"items": 2}, now=1003.0)
    assert_exact(conn, "ann", job_id)  # succeeded

    canceled, _ = enqueue(conn, "classify", ITEMS, owner="ann", now=200.0)
    control.cancel(conn, canceled, now=201.0)
    assert_exact(conn, "ann", canceled)  # failed (canceled while queued)
    removed, _ = enqueue(conn, "classify", ITEMS, owner="ann", now=300.0)
    assert consistency.end_outside(conn, removed, consistency.REMOVED, now=301.0)
    assert_exact(conn, "ann", removed)
    # Scored by creation: a filtered listing is newest first, like the unfiltered one.
    assert conn.zscore(keys.owner_state("ann", "failed"), removed) == 300.0
    total, page = listing.list_jobs(conn, "ann", 0, 10, state="failed", now=302.0)
    assert (total, [j["job_id"] for j in page]) == (1, [removed])
    # Canceled jobs share the failed index and are listed as their own view.
    total, page = listing.list_jobs(conn, "ann", 0, 10, state="canceled", now=302.0)
    assert (total, [j["job_id"] for j in page]) == (1, [canceled])


def test_an_ended_job_leaves_the_index_with_its_record_and_no_index_key_lives_forever(conn):
    ttl = settings().result_ttl
    job_id, _ = enqueue(conn, "classify", ITEMS, owner="ann", now=100.0)
    lease.claim(conn, job_id, "leash", "w1", now=101.0).finish({"items": 2}, now=102.0)
    assert conn.zscore(keys.owner_expiries("ann"), job_id) == 102.0 + ttl
    for key in (keys.owner_state("ann", "succeeded"), keys.owner_expiries("ann")):
        assert 0 < conn.ttl(key) <= ttl, key
    assert not conn.exists(keys.owner_state("ann", "queued"), keys.owner_state("ann", "running"))
    assert listing.list_jobs(conn, "ann", 0, 10, state="succeeded", now=103.0)[0] == 1
    # Its record expires ttl after it ended: from then on no listing counts it.
    total, page = listing.list_jobs(conn, "ann", 0, 10, state="succeeded", now=102.0 + ttl + 1)
    assert (total, page) == (0, [])
    assert not conn.exists(keys.owner_expiries("ann"), keys.owner_state("ann", "succeeded"))


def _write_queued(conn, owner: str, count: int, start: float) -> None:
    """Queued jobs written as enqueue writes them, pipelined (enqueue one by one takes minutes)."""
    from jobs.core.rq_side import rq_queue
    from jobs.enqueue import _write_job

    q, s = rq_queue(conn), settings()
    for first in range(0, count, 1000):
        with conn.pipeline() as pipe:
            for n in range(first, min(count, first + 1000)):
                job_id = f"q{n:06d}"
                _write_job(pipe, q, job_id, "classify", ITEMS, owner, 3, 2, start + n, s)
            pipe.execute()


@pytest.mark.timeout(120)
def test_a_state_filter_is_exact_past_the_newest_10000_jobs(conn):
    assert state_index.backfill_step(conn)  # a new store is indexed at once: nothing older to read
    failed = write_failed_jobs(conn, [FailedJob("classify", "boom", failed_at=1000.0 + n, owner="ann")
                                      for n in range(10)], now=2000.0)
    _write_queued(conn, "ann", 10_050, start=5000.0)  # all newer than the failed ones
    total, page = listing.list_jobs(conn, "ann", 0, 20, state="failed", now=20_000.0)
    assert total == 10 and sorted(j["job_id"] for j in page) == sorted(failed)
    assert listing.list_jobs(conn, "ann", 10_040, 20, state="queued", now=20_000.0)[0] == 10_050
    assert state_index.count(conn, "ann", "queued") == 10_050


def _old_release_enqueue(conn, owner: str, now: float) -> str:
    """A job as the previous release wrote it: no state index entry."""
    job_id, _ = enqueue(conn, "classify", ITEMS, owner=owner, now=now)
    conn.zrem(keys.owner_state(owner, "queued"), job_id)
    return job_id


def _old_release_claim_and_finish(conn, job_id: str, now: float) -> None:
    """An old worker's claim and finish: the claim through the previous release's own claim_v1
    (its text from its commit, as its workers send it); the finish written as an older release's
    finish script wrote it (the job ended, its records expiring, its outcome counted), leaving
    every state index as it was."""
    claimed = conn.register_script(previous_script("claim_v1"))(keys=[keys.job(job_id), keys.LEASES],
                                                                args=[job_id, now, 60, "old-worker"])
    assert claimed[0] == 1
    ended = now + 1
    kind_minute, all_minute, totals = keys.outcome_keys("succeeded", "classify", ended)
    pipe = conn.pipeline(transaction=True)
    pipe.hset(keys.job(job_id), mapping={"state": "succeeded", "result": json.dumps({"items": 2}),
                                         "done": conn.hlen(keys.items(job_id)) or conn.hget(keys.job(job_id), "total"),
                                         "updated_at": ended, "ended_at": ended, "lease_expires_at": ""})
    pipe.hdel(keys.job(job_id), "error")
    pipe.zrem(keys.LEASES, job_id)
    for key in (keys.job(job_id), keys.items(job_id), keys.errors(job_id), keys.payload(job_id)):
        pipe.expire(key, 3600)
    for key in (kind_minute, all_minute):
        pipe.incr(key)
        pipe.expire(key, 60)
    pipe.hincrby(totals, "succeeded:classify", 1)
    pipe.execute()


def test_an_upgrade_indexes_older_jobs_once_and_reads_them_meanwhile(conn):
    ended = _old_release_enqueue(conn, "ann", now=100.0)
    _old_release_claim_and_finish(conn, ended, now=101.0)
    waiting = _old_release_enqueue(conn, "ann", now=102.0)
    conn.delete(keys.STATE_INDEX_READY)  # a store from before the indexes
    assert indexed_in(conn, "ann", ended) == []
    total, page = listing.list_jobs(conn, "ann", 0, 10, state="succeeded", now=110.0)
    assert (total, [j["job_id"] for j in page]) == (1, [ended])
    assert state_index.ready(conn)  # the listing finished the small store's indexing itself
    assert indexed_in(conn, "ann", ended) == ["succeeded"] and indexed_in(conn, "ann", waiting) == ["queued"]
    assert conn.zscore(keys.owner_expiries("ann"), ended) is not None, "an indexed ended job leaves with its record"


def test_a_backfill_step_is_bounded_and_resumes_where_it_stopped(conn):
    ids = [_old_release_enqueue(conn, "ann", now=100.0 + n) for n in range(30)]
    conn.delete(keys.STATE_INDEX_READY)
    steps = 0
    while not state_index.backfill_step(conn, budget=1, now=200.0):
        steps += 1
        assert steps < 1000
    assert state_index.ready(conn) and not conn.exists(keys.STATE_INDEX_CURSOR)
    assert all(indexed_in(conn, "ann", job_id) == ["queued"] for job_id in ids)


def test_jobs_moved_by_an_older_release_during_a_deploy_are_repaired_by_the_sweep(conn):
    assert state_index.backfill_step(conn)  # the new release is in place...
    job_id = _old_release_enqueue(conn, "ann", now=100.0)  # ...while an old web process still writes
    other, _ = enqueue(conn, "classify", ITEMS, owner="ann", now=101.0)
    _old_release_claim_and_finish(conn, other, now=102.0)  # and an old worker still runs jobs
    assert indexed_in(conn, "ann", job_id) == [] and indexed_in(conn, "ann", other) == ["queued"]
    consistency.sweep(conn, now=103.0)
    assert_exact(conn, "ann", job_id)
    assert_exact(conn, "ann", other)
    assert listing.list_jobs(conn, "ann", 0, 10, state="queued", now=104.0)[0] == 1


def test_a_listing_repairs_a_misplaced_entry_it_meets_and_never_shows_it_under_the_wrong_state(conn):
    assert state_index.backfill_step(conn)
    job_id, _ = enqueue(conn, "classify", ITEMS, owner="ann", now=100.0)
    _old_release_claim_and_finish(conn, job_id, now=101.0)
    assert listing.list_jobs(conn, "ann", 0, 10, state="queued", now=102.0)[1] == []
    assert_exact(conn, "ann", job_id)
    assert [j["job_id"] for j in listing.list_jobs(conn, "ann", 0, 10, state="succeeded", now=102.0)[1]] == [job_id]


def test_the_previous_release_s_claim_runs_on_this_release_s_jobs(conn):
    """Old workers keep calling the scripts they sent when they started during a deploy: the
    text comes with the call (its SHA), so no file of this tree has to stay for them."""
    job_id, _ = enqueue(conn, "classify", ITEMS, owner="ann", now=100.0)
    _old_release_claim_and_finish(conn, job_id, now=101.0)
    assert leash_state(conn, job_id) == "succeeded"
