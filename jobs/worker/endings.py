"""How an attempt ends in RQ's terms, decided in the worker's main process: a work-horse that
died without recording how (killed: OOM, SIGKILL, RQ's stop command), and the text RQ (and so
rq-dashboard) records as the error of a job canceled through leash."""

from __future__ import annotations

from rq.job import Job, JobStatus

from jobs import keys
from jobs.core import lease
from jobs.core.lease import Outcome
from jobs.core.outcome import STOPPED_BY_RQ
from jobs.core.upkeep.reaper import release_rate_limit_slot
from jobs.errors import CANCELED
from jobs.worker.log import REDIS_DOWN, log_not_a_failure

#: What RQ (and so rq-dashboard) records as the "error" of a job canceled through leash.
CANCELED_IN_RQ_VIEW = ("canceled through leash (`leash cancel` or the job page), not an error; "
                       "Requeue runs it again as `leash replay` does, attempts from 0")


def settle_dead_horse(connection, attempt: lease.Attempt, job: Job, exc_string: str, *, stopped: bool,
                      handing_off: bool) -> None:
    """The work-horse ended without recording how (killed). ``stopped``: by RQ's stop command
    (leash's own cancel sends it past its grace); ``handing_off``: the worker is shutting down."""
    if stopped:
        asked = connection.hget(keys.job(job.id), "cancel_requested") == b"1"
        attempt.fail(CANCELED if asked else STOPPED_BY_RQ, permanent=True)
    elif handing_off:
        attempt.release()
        log_not_a_failure(attempt, None, how="after the grace period")
    else:
        message = f"worker process died: {exc_string.strip() or 'no exit status'}"
        new_state = attempt.abandon(message)
        attempt.settle(Outcome.RECLAIMED if new_state else Outcome.SUPERSEDED)
        if new_state == "failed":
            release_rate_limit_slot(connection, job.id)
        elif new_state is None:
            # The horse may have recorded its failure and died before RQ's bookkeeping:
            # finish that bookkeeping here so the job does not wait for RQ's sweep.
            landed = attempt.landed("queued", "failed")
            if landed and job.get_status(refresh=True) == JobStatus.STARTED:
                attempt.settle(Outcome.RETRY if landed[0] == "queued" else Outcome.FAILED)
                attempt.extra["attempts_left"] = landed[2] - landed[1]


def failed_text(connection, job_id: str, exc_string: str) -> str:
    """What RQ records as a failed leash job's error: a cancel is not an error, so rq-dashboard
    shows this line, not the traceback of the exception that stopped the job, and its Requeue is a
    replay (jobs/core/upkeep/consistency.py)."""
    try:
        if connection.hget(keys.job(job_id), "error") == CANCELED.encode():
            return CANCELED_IN_RQ_VIEW
    except REDIS_DOWN:
        pass  # RQ's own handling that follows meets the same outage; the text is a nicety
    return exc_string
