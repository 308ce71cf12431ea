"""A job that waits for others (``after``): RQ's ``depends_on``, with leash's policy for a parent
that does not succeed (``after_policy``).

    submitted with after=[A, B] ──▶ queued, RQ's status deferred ("waiting for A, B")
                                        │ every parent ended (RQ moves its dependents on)
                                        ▼
                                    queued, in its queue (through the owner's limit) ──▶ runs
    a parent failed or was canceled:
        "cancel" (default)  the child is canceled, its history saying which parent and why
        "run"               the child runs anyway (RQ's Dependency(allow_failure=True))
        "wait"              the child keeps waiting; replaying the parent lets it go on when the
                            parent succeeds (RQ's Dependency(allow_failure=False))

The four states stay four: a waiting child is ``queued``, its ``waiting`` text names its parents
(jobs/core/details.py).
"cancel" and "run" both let RQ release the child when a parent fails; the runner decides at the
child's start (``blocked``). RQ releases a child on its parent's end in the worker that ended it;
a parent ended elsewhere (canceled while queued, failed by the reaper, ended by RQ's tools) has
its children released by the sweep of ended jobs (``release``).
"""

from __future__ import annotations

from redis import Redis
from rq.job import Dependency, Job, JobStatus
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.errors import CANCELED, InvalidJob

POLICIES = ("cancel", "run", "wait")
#: The refusal of an ``after_policy`` given to a job that waits for none (neither ``after`` nor
#: ``items_from``, which waits for its source; a pipeline's stage: nor an earlier stage it waits for).
POLICY_WITHOUT_AFTER = ("'after_policy' needs 'after': it says what happens when a job this one waits for does "
                        "not succeed, and this one waits for none")


def _decoded(value):
    return value.decode() if isinstance(value, bytes) else value


#: Parents one job may wait for.
MAX_PARENTS = 20
#: RQ statuses of a parent that will not move its dependents on by itself (RQ treats a canceled
#: or stopped parent as never met), or that has no record left.
_NOT_RELEASING = (JobStatus.CANCELED.value, JobStatus.STOPPED.value, None)
#: RQ statuses of a parent that has ended (a child submitted after it need not wait).
_ENDED_IN_RQ = (JobStatus.FINISHED.value, JobStatus.FAILED.value, *_NOT_RELEASING)


def parse(after, policy) -> tuple[list[str], str]:
    """The parent ids (none: an empty list) and the policy, checked for their form."""
    if after is None or after == [] or after == "":
        return [], policy or "cancel"
    if isinstance(after, str):
        after = [after]
    if not isinstance(after, list) or not all(isinstance(a, str) and 0 < len(a) <= 200 for a in after):
        raise InvalidJob("'after' must be a job id or a list of job ids")
    if len(after) > MAX_PARENTS:
        raise InvalidJob(f"'after' names {len(after)} jobs; at most {MAX_PARENTS}")
    policy = policy or "cancel"
    if policy not in POLICIES:
        raise InvalidJob(f"'after_policy' must be one of {', '.join(POLICIES)}, got {str(policy)[:40]!r}")
    return list(dict.fromkeys(after)), policy


def check_owned(connection: Redis, after: list[str], owner: str) -> None:
    """Every parent exists and is the owner's (InvalidJob naming the first that is not)."""
    if not after:
        return
    with connection.pipeline(transaction=False) as pipe:
        for job_id in after:
            pipe.hget(keys.job(job_id), "owner")
        owners = pipe.execute()
    for job_id, found in zip(after, owners, strict=True):
        if _decoded(found) != owner:
            raise InvalidJob(f"'after': no such job: {job_id}")


def still_running(pipe, after: list[str]) -> list[str]:
    """The parents RQ has not ended yet, read on a pipeline that WATCHes their RQ records (a
    parent that ends before the child is written makes the write start again)."""
    if not after:
        return []
    pipe.watch(*[keys.rq_job(job_id) for job_id in after])
    statuses = [_decoded(pipe.hget(keys.rq_job(job_id), "status")) for job_id in after]
    return [job_id for job_id, status in zip(after, statuses, strict=True) if status not in _ENDED_IN_RQ]


def dependency(after: list[str], policy: str) -> Dependency | None:
    return Dependency(jobs=after, allow_failure=policy != "wait") if after else None


def write_waiting(job: Job, pipe) -> None:
    """The child's RQ side saved deferred and registered with its parents (RQ's own
    ``setup_dependencies`` steps, on leash's transaction)."""
    job.set_status(JobStatus.DEFERRED, pipeline=pipe)
    job.register_dependency(pipeline=pipe)
    job.save(pipeline=pipe)
    job.cleanup(ttl=job.ttl, pipeline=pipe)


def blocked(connection: Redis, job_id: str) -> str | None:
    """Why a child whose policy is "cancel" must not run (a parent failed or was canceled), as
    the history entry of its cancel; None when it may run."""
    after, policy = (_decoded(v) for v in connection.hmget(keys.job(job_id), "after", "after_policy"))
    if not after or policy != "cancel":
        return None
    parents = after.split(",")
    with connection.pipeline(transaction=False) as pipe:
        for parent in parents:
            pipe.hmget(keys.job(parent), "state", "error")
        rows = pipe.execute()
    for parent, (state, error) in zip(parents, rows, strict=True):
        if _decoded(state) == "failed":
            how = "was canceled" if _decoded(error) == CANCELED else "failed"
            return f"{CANCELED}: job {parent} it waited for {how} (after_policy cancel)"
    return None


def cancel_reason(exc: Exception) -> str | None:
    """The history entry of a cancel raised by ``blocked``'s reason (None for any other cancel)."""
    return str(exc) if str(exc).startswith(CANCELED + ": ") else None


def release(connection: Redis, parent_id: str, leash_state: str | None, cancel) -> int:
    """Move on the children waiting for a parent that has ended in leash (the sweep of ended
    jobs). A parent RQ ended too (finished, failed) gets RQ's own ``enqueue_dependents``, which
    moves each child once. A failed parent RQ will not release (canceled or stopped in RQ, failed
    by the reaper, its record gone): "cancel" children are canceled (``cancel``: the lifecycle's
    cancel, given the reason), "run" children go to their queue once no other parent holds them,
    "wait" children keep waiting for a replay. Returns how many children moved."""
    dependents = [_decoded(c) for c in connection.smembers(Job.dependents_key_for(parent_id))]
    if not dependents:
        return 0
    status = _decoded(connection.hget(keys.rq_job(parent_id), "status"))
    if status in (JobStatus.FINISHED.value, JobStatus.FAILED.value):
        from rq import Queue

        parent = Job.fetch(parent_id, connection=connection, serializer=JSONSerializer)
        moved = Queue(parent.origin, connection=connection, serializer=JSONSerializer).enqueue_dependents(parent)
        return sum(len(ids) for ids in moved.values())
    if leash_state != "failed":
        return 0  # succeeded in leash a moment before RQ's bookkeeping, which releases them
    moved = 0
    for child in dependents:
        policy = _decoded(connection.hget(keys.job(child), "after_policy"))
        if policy == "cancel":
            how = "was canceled" if status == JobStatus.CANCELED.value else "failed"
            cancel(connection, child, reason=f"{CANCELED}: job {parent_id} it waited for {how} (after_policy cancel)")
        elif policy == "run":
            _run_anyway(connection, child, parent_id)
        else:
            continue  # "wait": the parent's replay lets it go on
        connection.srem(Job.dependents_key_for(parent_id), child)
        moved += 1
    return moved


def _run_anyway(connection: Redis, child_id: str, parent_id: str) -> int:
    """A "run" child stops waiting for this parent; once none holds it, RQ's ready registry puts
    it on its queue (through the owner's limit), as RQ does for a released dependent."""
    from rq.registry import DeferredJobRegistry, ReadyJobRegistry

    try:
        child = Job.fetch(child_id, connection=connection, serializer=JSONSerializer)
    except Exception:  # noqa: BLE001 - RQ's record gone: nothing to move
        return 0
    connection.srem(child.dependencies_key, parent_id)
    left = [_decoded(p) for p in connection.smembers(child.dependencies_key)]
    rows = [_decoded(connection.hget(keys.rq_job(p), "status")) for p in left]
    if child.get_status(refresh=True) != JobStatus.DEFERRED or any(r not in _ENDED_IN_RQ for r in rows):
        return 0
    with connection.pipeline() as pipe:
        DeferredJobRegistry(child.origin, connection=connection, serializer=JSONSerializer).remove(child, pipeline=pipe)
        ready = ReadyJobRegistry(child.origin, connection=connection, serializer=JSONSerializer)
        child.set_status(JobStatus.READY_TO_ENQUEUE, pipeline=pipe)
        ready.add(child, pipeline=pipe)
        pipe.execute()
    ready.enqueue_jobs([child_id])
    return 1
