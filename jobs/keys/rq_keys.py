"""RQ's keys, taken from RQ's own objects (``Job.key_for``, a registry's ``.key``) so a change in
RQ's naming cannot split the two; and the lists of a job's keys, leash's and RQ's, that leave with it."""

from __future__ import annotations

from rq import registry as rq_registry
from rq.executions import ExecutionRegistry
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.queue import Queue
from rq.rate_limit import RateLimitRegistry
from rq.results import Result
from rq.scheduler import RQScheduler
from rq.worker import Worker

from jobs.keys.job_keys import ended_job_keys, items, payload, provider_batches, received_answers, usage


def rq_job(job_id: str) -> str:
    return Job.key_for(job_id)


def rq_queue(queue_name: str) -> str:
    return Queue.redis_queue_namespace_prefix + queue_name


def rq_started(queue_name: str, connection) -> str:
    return rq_registry.StartedJobRegistry(queue_name, connection=connection).key


def rq_failed(queue_name: str, connection) -> str:
    return rq_registry.FailedJobRegistry(queue_name, connection=connection).key


def rq_finished(queue_name: str, connection) -> str:
    return rq_registry.FinishedJobRegistry(queue_name, connection=connection).key


def rq_scheduled(queue_name: str, connection) -> str:
    return rq_registry.ScheduledJobRegistry(queue_name, connection=connection).key


def rq_canceled(queue_name: str, connection) -> str:
    return rq_registry.CanceledJobRegistry(queue_name, connection=connection).key


def rq_intermediate(queue_name: str, connection) -> str:
    """RQ's list of jobs a worker took off the queue and has not yet started."""
    return IntermediateQueue(rq_queue(queue_name), connection).key


def rq_executions(job_id: str, connection) -> str:
    return ExecutionRegistry(job_id, connection=connection).key


def rq_queues_set() -> str:
    """RQ's set of known queue keys (rq-dashboard and ``rq info`` list queues from it)."""
    return Queue.redis_queues_keys


def rq_workers() -> str:
    """RQ's set of registered workers' keys (a worker's own key expires when it stops beating)."""
    return Worker.redis_workers_keys


def owner_rate_limit_key(owner: str) -> str:
    """The RQ ``RateLimit`` key that holds an owner's concurrency slots."""
    return f"leash-owner:{owner}"


def rq_rate_limit(rate_limit_key: str, connection) -> RateLimitRegistry:
    """RQ's registry for one rate-limit key; its ``allowed_key`` holds the jobs using a slot,
    its ``rate_limited_key`` the jobs waiting for one."""
    return RateLimitRegistry(rate_limit_key, connection=connection)


def rq_scheduler_lock(queue_name: str) -> str:
    """RQ's lock naming the scheduler that moves this queue's due retries."""
    return RQScheduler.get_locking_key(queue_name)


def rq_results(job_id: str) -> str:
    """RQ's stream of a job's results (each attempt's outcome and traceback)."""
    return Result.get_key(job_id)


def retained_with_job(job_id: str, connection) -> list[str]:
    """Every key of one job, leash's and RQ's, that expires no later than its record once it
    has ended (jobs/core/retention.py): RQ's record holds the submitted items."""
    return ended_job_keys(job_id) + [rq_job(job_id), rq_results(job_id), rq_executions(job_id, connection)]


def archived_heavy(job_id: str, connection) -> list[str]:
    """What an archived job lets go after LEASH_REDIS_KEEP: all but its record, errors, history, estimate."""
    return [payload(job_id), items(job_id), usage(job_id), provider_batches(job_id), received_answers(job_id),
            rq_job(job_id), rq_results(job_id), rq_executions(job_id, connection)]
