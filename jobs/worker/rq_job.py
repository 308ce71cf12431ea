"""RQ's ``Job`` as leash's workers use it: a succeeded leash job keeps no RQ result stream and
no second copy of its payload.

RQ 3.0 records every successful return value in a stream of its own (``rq:results:<id>``),
and a one-entry stream costs Redis ~4.7 KB however small the value: more than the rest of a
finished job together. leash already keeps the job's result summary in its job hash and its
items in their own hash, so for leash jobs RQ's bookkeeping of a success runs without that
copy: the job is ``finished`` in RQ, in its finished registry for the result TTL, and
``job.return_value()`` is None. In the same transaction RQ's job hash is rewritten small
(``compact_finished_rq_job_v1.lua``): its ``data`` becomes ``jobs.runner.execute(kind, {})``,
since leash's copy of the payload (``keys.payload``) is what leash reads and nothing runs a
succeeded job again, and the hash becomes a listpack. rq-dashboard's job page and ``rq`` show
the job finished, its kind and owner in its description, its progress in its meta; its items
and results are read with ``leash results <id>`` or ``GET /jobs/<id>/results``. Failures keep RQ's full record: its
stream holds the traceback rq-dashboard shows, and a requeue runs the payload in ``data``.
Plain RQ jobs on a leash queue are untouched.
"""

from __future__ import annotations

from rq.job import Job, JobStatus

from jobs import keys
from jobs.core.rq_side import EXECUTE, finished_data
from jobs.lifecycle import scripts


class NoResultStreamJob(Job):
    def _handle_success(self, result_ttl, pipeline, worker_name="", execution_id=None,
                        execution_started_at=None, execution_ended_at=None):
        if self.func_name != EXECUTE:
            return super()._handle_success(result_ttl, pipeline, worker_name, execution_id,
                                           execution_started_at, execution_ended_at)
        # RQ's own steps (rq.job.Job._handle_success) but Result.create: the result is leash's.
        self.set_status(JobStatus.FINISHED, pipeline=pipeline)
        self.save(pipeline=pipeline, include_meta=False, include_result=False)
        kind = self.args[0] if self.args else ""
        scripts.run(self.connection, "compact_finished_rq_job_v1",
                    keys={"rq_job": self.key, "payload": keys.payload(self.id)},
                    args=[finished_data(str(kind))], pipeline=pipeline)
        if result_ttl != 0:
            self.finished_job_registry.add(self, result_ttl, pipeline)
        return None
