"""No false alarms from the swallowed-job check: a job that passes through RQ's intermediate
list again and again (a batch job's looks) is never taken for one a dead worker swallowed.

The reaper gives back a job that sat in the intermediate list, unclaimed, for SWALLOWED_AFTER
seconds, timing it from RQ's "first seen" marker. The marker must leave when the job is
claimed, or the job's next pass (its next look) reads as swallowed at once: a WARNING about a
worker that never died, and the entry put back on the queue while its worker claims it (a
second dequeue, an extra look at the provider)."""

from __future__ import annotations

import logging

import pytest
from rq.intermediate_queue import IntermediateQueue

from jobs import keys
from jobs.core import lease, states
from jobs.core.upkeep.reaper import SWALLOWED_AFTER
from jobs.worker.leash_worker import LeashWorker
from tests.test_batch_jobs import submit_batch

pytestmark = pytest.mark.slow

#: (jobs, seconds between looks): the short run, and the issue's 20 jobs with 5-s looks (a look
#: SWALLOWED_AFTER after the last: the previous pass's marker is just old enough to alarm).
RUNS = [pytest.param(10, SWALLOWED_AFTER + 1, id="10-jobs"), pytest.param(20, 5.0, id="20-jobs-5s-looks")]


@pytest.mark.parametrize(("jobs", "poll"), RUNS)
def test_batch_jobs_through_many_looks_raise_no_swallowed_alarm_and_are_dequeued_once_a_look(
        conn, burst, batch_env, env, monkeypatch, caplog, jobs, poll):
    server = batch_env
    server.batches.auto = True  # each look moves the batch one step: three looks a job
    # Looks at least SWALLOWED_AFTER apart: the previous pass's marker is old enough to alarm.
    assert poll >= SWALLOWED_AFTER
    env.setenv("LEASH_BATCH_POLL_SECONDS", f"{poll:g}")
    taken: list[str] = []
    claims: list[tuple[str, bool]] = []
    dequeue, claim = LeashWorker.dequeue_job_and_maintain_ttl, lease.claim

    def dequeue_then_reap(self, *args, **kwargs):
        # A reaper round lands in every dequeue's window (the job taken, not yet claimed), as on
        # a busy deploy where some worker's round always falls between another's dequeue and claim.
        result = dequeue(self, *args, **kwargs)
        if result is not None:
            taken.append(result[0].id)
            self.reaper.requeue_swallowed()
        return result

    def recorded_claim(connection, job_id, *args, **kwargs):
        attempt = claim(connection, job_id, *args, **kwargs)
        claims.append((job_id, attempt is not None))
        return attempt

    monkeypatch.setattr(LeashWorker, "dequeue_job_and_maintain_ttl", dequeue_then_reap)
    monkeypatch.setattr(lease, "claim", recorded_claim)
    job_ids = [submit_batch(conn, f"s{n}-", 2)[0] for n in range(jobs)]

    with caplog.at_level(logging.INFO):
        burst(follow=240)

    alarms = [r.getMessage() for r in caplog.records if "before claiming" in r.getMessage()
              or "not claimable" in r.getMessage() or "stale entry" in r.getMessage()]
    assert alarms == []
    assert all(ok for _, ok in claims), [job_id for job_id, ok in claims if not ok]
    assert len(taken) == len(claims)
    for job_id in job_ids:
        status = states.status(conn, job_id)
        assert status["state"] == "succeeded" and status["attempts"] == 1, status
        assert taken.count(job_id) >= 3  # created its batch, then looked at least twice
    # The provider read once a pass (the create's own read, then a look each): nothing extra.
    assert sum(batch.polls for batch in server.batches.batches.values()) == len(taken)
    assert not conn.keys(IntermediateQueue(keys.rq_queue("*"), conn).get_first_seen_key("*"))
