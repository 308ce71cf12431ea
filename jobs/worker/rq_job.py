"""RQ's ``Job`` as leash's workers use it: a succeeded leash job keeps no RQ result stream.

RQ 3.0 records every successful return value in a stream of its own (``rq:results:<id>``),
and a one-entry stream costs Redis ~4.7 KB however small the value: more than the rest of a
finished job together. leash already keeps the job's result summary in its job hash and its
items in their own hash, so for leash jobs RQ's bookkeeping of a success runs without that
copy: the job is ``finished`` in RQ, in its finished registry for the result TTL, and
``job.return_value()`` is None. rq-dashboard's job page and ``rq`` show the job finished,
with leash's progress in its meta; its results are read with ``leash results <id>`` or
``GET /jobs/<id>/results``. Failures keep RQ's stream: it holds the traceback rq-dashboard
shows. Plain RQ jobs on a leash queue are untouched.
"""

from __future__ import annotations

from rq.job import Job, JobStatus

from jobs.core.rq_side import EXECUTE


def _optional_fields(job: Job) -> dict:
    return {"success_callback_name": job._success_callback_name, "failure_callback_name": job._failure_callback_name,
            "stopped_callback_name": job._stopped_callback_name, "group_id": job.group_id}


class NoResultStreamJob(Job):
    def _handle_success(self, result_ttl, pipeline, worker_name="", execution_id=None,
                        execution_started_at=None, execution_ended_at=None):
        if self.func_name != EXECUTE:
            return super()._handle_success(result_ttl, pipeline, worker_name, execution_id,
                                           execution_started_at, execution_ended_at)
        # RQ's own steps (rq.job.Job._handle_success) but Result.create: the result is leash's.
        self.set_status(JobStatus.FINISHED, pipeline=pipeline)
        self.save(pipeline=pipeline, include_meta=False, include_result=False)
        # Fields RQ keeps empty (no callbacks, no group) for the whole result TTL: ~75 B each
        # in a hash this size; RQ reads a missing one as the empty one.
        empty = [name for name, value in _optional_fields(self).items() if not value]
        if empty:
            pipeline.hdel(self.key, *empty)
        if result_ttl != 0:
            self.finished_job_registry.add(self, result_ttl, pipeline)
        return None
