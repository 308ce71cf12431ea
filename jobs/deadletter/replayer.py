"""Replay: failed jobs back to ``queued`` with one command, written before the outage.

    failed ──replay──▶ queued (attempts 0, checkpoints and error history kept)

Selection reads the failed index (or takes ids), replay runs ``lua/replay_v4.lua`` once per
batch: per job it checks the job is still failed and its owner below the queued cap
(``LEASH_MAX_QUEUED_PER_OWNER``, counted as a submission's: jobs/intake/door.py), flips it
to queued, removes the expiry the failure set, and puts RQ's side right (out of the failed
registry, retries restored, waiting for a slot of the owner's ``RateLimit``). RQ's own acquire
step then promotes waiting jobs onto the queue as slots allow, exactly as for a fresh
rate-limited enqueue. Every replay leaves an audit entry (who, when, selector, ids) in a capped stream.

A job that failed by its item errors (every item, or more than its ``max_item_errors``) is
replayed by asking those items again, its answered ones kept: replayed as it was, its stored
errors would count over the limit again and it would fail at once, having asked nothing
(jobs.deadletter.item_errors). ``ReplayOutcome.errored_items_asked`` says which jobs, how many.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from redis import Redis
from rq.utils import now as rq_now
from rq.utils import utcformat

from jobs import keys
from jobs.config import settings
from jobs.config.front import command_line
from jobs.core import clock, state_index
from jobs.core.rq_side import rq_jobs_from_copy
from jobs.core.text import decoded, summary_of_ids
from jobs.deadletter.failures import HEAD_CHARS, failed_ids, heads
from jobs.deadletter.item_errors import errored_items, failed_by_them
from jobs.errors import NoSuchJob
from jobs.intake import door
from jobs.lifecycle import transitions
from jobs.usage.budget import Budget

log = logging.getLogger("leash.replay")

BATCH = 500


class UnknownJobs(NoSuchJob):
    """No such job."""

    def __init__(self, job_ids: list[str]):
        shown = ", ".join(job_ids[:5]) + (f" and {len(job_ids) - 5} more" if len(job_ids) > 5 else "")
        super().__init__(f"no such job{'s' if len(job_ids) > 1 else ''}: {shown}")
        self.job_ids = job_ids


@dataclass
class Candidate:
    job_id: str
    kind: str
    failed_at: float | None
    error: str  # first line

    def as_dict(self) -> dict:
        return {"job_id": self.job_id, "kind": self.kind, "failed_at": clock.iso(self.failed_at),
                "error": self.error}


@dataclass
class Selection:
    matched: list[Candidate] = field(default_factory=list)
    #: (job id, reason) for ids given explicitly that cannot be replayed
    skipped: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class ReplayOutcome:
    replayed: list[Candidate]
    skipped: list[tuple[str, str]]
    audit_id: str | None
    #: (job id, reason) of jobs left failed because their owner is at the queued cap
    #: (LEASH_MAX_QUEUED_PER_OWNER): the same replay succeeds once some have started
    left_failed: list[tuple[str, str]] = field(default_factory=list)
    #: job id -> how many errored items were asked again, for the replayed jobs that failed by
    #: their item errors (and every job of ``leash replay --errored-items``)
    errored_items_asked: dict[str, int] = field(default_factory=dict)


def select(connection: Redis, job_ids: Iterable[str] | None = None, kind: str | None = None,
           error_contains: str | None = None, since: float | None = None,
           now: float | None = None, archived: dict[str, dict] | None = None) -> Selection:
    """The failed jobs a replay would take. Explicit ids that do not exist raise
    ``UnknownJobs`` (nothing is replayed then); ids that exist but are not failed, or do not
    match the other selectors, are returned as skipped with the reason. ``archived``: the
    records of jobs given by id that Redis no longer holds, read from the archive (a dry run's:
    jobs.archive.restore.records_to_restore; a replay puts them back first), taken as Redis'."""
    now = clock.wall() if now is None else now
    selection = Selection()
    archived = archived or {}
    if job_ids:
        ids = _explicit(connection, list(dict.fromkeys(job_ids)), selection, archived)
    else:
        ids = failed_ids(connection, since, now=now)
    held = {h.job_id: Candidate(h.job_id, h.kind, h.failed_at, h.first_line)
            for h in heads(connection, [i for i in ids if i not in archived]) if h is not None}
    candidates = [held[i] if i in held else _archived_candidate(i, archived[i])
                  for i in ids if i in held or i in archived]
    if error_contains:
        full = _errors(connection, [c.job_id for c in candidates], archived)
    for n, candidate in enumerate(candidates):
        reason = None
        if kind is not None and candidate.kind != kind:
            reason = f"kind is {candidate.kind}, not {kind}"
        elif error_contains and error_contains not in full[n]:
            reason = "error does not contain the text"
        elif since is not None and (candidate.failed_at or 0) < now - since:
            reason = "failed before --since"
        if reason is None:
            selection.matched.append(candidate)
        elif job_ids:
            selection.skipped.append((candidate.job_id, reason))
    return selection


def _archived_candidate(job_id: str, record: dict) -> Candidate:
    """A failed job as its archived record has it, as the failed index and its error's head would
    once the record is put back (failed at its end: restore_record_v1)."""
    ended_at = record.get("ended_at")
    return Candidate(job_id, record.get("kind") or "", float(ended_at) if ended_at else None,
                     (record.get("error") or "").split("\n", 1)[0][:HEAD_CHARS])


def _explicit(connection: Redis, job_ids: list[str], selection: Selection, archived: dict[str, dict]) -> list[str]:
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hget(keys.job(job_id), "state")
        states = [decoded(s) if s is not None else (archived.get(job_id) or {}).get("state")
                  for job_id, s in zip(job_ids, pipe.execute(), strict=True)]
    unknown = [job_id for job_id, state in zip(job_ids, states, strict=True) if state is None]
    if unknown:
        raise UnknownJobs(unknown)
    failed = []
    for job_id, state in zip(job_ids, states, strict=True):
        if state != "failed":
            selection.skipped.append((job_id, f"{state}: only failed jobs can be replayed"))
        else:
            failed.append(job_id)
    return failed


def _errors(connection: Redis, job_ids: list[str], archived: dict[str, dict]) -> list[str]:
    out: list[str] = []
    for start in range(0, len(job_ids), BATCH):
        with connection.pipeline(transaction=False) as pipe:
            for job_id in job_ids[start:start + BATCH]:
                pipe.hget(keys.job(job_id), "error")
            out.extend((decoded(v) or (archived.get(job_id) or {}).get("error") or "")
                       for job_id, v in zip(job_ids[start:start + BATCH], pipe.execute(), strict=True))
    return out


_REASONS = {
    "missing": "the job no longer exists",
    "rq-missing": "its payload has expired, there is nothing left to run",
    "archive-unreachable": "its items are in the archive, which did not answer: replay it again once it is back",
}
#: ``restore`` of ``replay``: puts an archived job's payload copy, results and usage back in Redis
#: (jobs.archive.restore.restore, passed in by the commands and pages: the replay sits below the
#: archive); answers {job id: "restored" or why not} for the jobs it had to bring back.
Restore = Callable[[Redis, list[str]], dict[str, str]]


def replay(connection: Redis, candidates: list[Candidate], actor: str, selector: dict,
           skipped: list[tuple[str, str]] | None = None, now: float | None = None,
           batch: int = BATCH, budget: Budget | None = None, capped: bool = True,
           restore: Restore | None = None, reopen: dict[str, list[int]] | None = None) -> ReplayOutcome:
    """Replay the selected jobs and record the audit entry. A job that stopped being failed
    since it was selected is skipped with the state it is in now. With ``budget``, each job
    runs on under that budget (a job that stopped at ``budget reached`` resumes from its
    checkpoint: no stored item is asked again). A replayed job takes a place of its owner's
    queued cap like a submission: one whose owner is at the cap is left failed, with the reason
    (``left_failed``; ``capped=False`` for jobs already put back on a queue by RQ's tools). An
    archived job whose copy left Redis is brought back from the archive by ``restore`` first.
    ``reopen``: per job, its errored items, dropped in the same step as the flip (a job that
    succeeded with item errors is taken too; jobs.deadletter.errored). A job that failed by its
    item errors is given its errored items whether or not ``reopen`` names it."""
    now = clock.wall() if now is None else now
    replayed: list[Candidate] = []
    asked: dict[str, int] = {}
    skipped = list(skipped or [])
    left_failed: list[tuple[str, str]] = []
    cap = door.cap() if capped else None
    if budget is not None:
        selector = selector | {"budget": budget.as_dict()}
    for start in range(0, len(candidates), batch):
        chunk = candidates[start:start + batch]
        results, owners, reopened = _replay_batch(connection, [c.job_id for c in chunk], now, position=start,
                                                  budget=budget, cap=cap, restore=restore, reopen=reopen or {})
        for candidate, result, owner in zip(chunk, results, owners, strict=True):
            if result == "replayed":
                replayed.append(candidate)
                if reopened.get(candidate.job_id):
                    asked[candidate.job_id] = len(reopened[candidate.job_id])
            elif result.startswith("over-cap:") and cap is not None:
                taken = int(result.partition(":")[2])
                left_failed.append((candidate.job_id, "left failed: " + door.too_many_queued(owner, taken, cap)))
            else:
                reason = _REASONS.get(result) or f"{result}: only failed jobs can be replayed"
                skipped.append((candidate.job_id, reason))
    if asked and not selector.get("errored_items"):
        selector = selector | {"errored_items_asked": sum(asked.values())}  # jobs that failed by them
    audit_id = _audit(connection, actor, selector, [c.job_id for c in replayed], skipped + left_failed, now)
    return ReplayOutcome(replayed, skipped, audit_id, left_failed, asked)


def _read_rq_sides(connection: Redis, job_ids: list[str]) -> list:
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.rq_job(job_id), "origin", "rate_limit_key", "rate_limit_concurrency")
            pipe.hmget(keys.job(job_id), "queue", "owner")
        return pipe.execute()


def _replay_batch(connection: Redis, job_ids: list[str], now: float, position: int,
                  budget: Budget | None = None, cap: int | None = None, restore: Restore | None = None,
                  reopen: dict[str, list[int]] | None = None
                  ) -> tuple[list[str], list[str], dict[str, list[int]]]:
    """Each job's outcome (replay_v4's answer), its owner, and the errored items given to each."""
    # An archived job whose heavy keys have left Redis (LEASH_REDIS_KEEP): its payload copy,
    # results and usage come back from the archive first, so it replays like any failed job.
    unreachable = {job_id for job_id, how in (restore(connection, job_ids) if restore else {}).items()
                   if how != "restored"}
    reopen = dict(reopen or {})
    for job_id in failed_by_them(connection, [j for j in job_ids if j not in reopen]):
        reopen[job_id] = errored_items(connection, job_id)  # read once its items are back in Redis
    rows = _read_rq_sides(connection, job_ids)
    # RQ's record deleted behind leash's back (rq-dashboard Delete, `rq empty`): rebuild it
    # from leash's copy of the payload, then replay it like any failed job.
    deleted = [job_id for n, job_id in enumerate(job_ids) if rows[2 * n][0] is None]
    if deleted and rebuild_rq_jobs(connection, deleted):
        rows = _read_rq_sides(connection, job_ids)
    per_job: list[str] = []
    # The budget is written by the script onto the jobs it replays, in the same step: so no
    # worker starts one under the old budget, and a job it skips keeps its own.
    args: list = [now, utcformat(rq_now()), position,
                  json.dumps({k: str(v) for k, v in budget.hash_fields().items()}) if budget else "",
                  "" if cap is None else cap]
    limits: dict[str, int] = {}
    origins: set[str] = set()
    for n, job_id in enumerate(job_ids):
        origin, limit_key, concurrency = (decoded(v) for v in rows[2 * n])
        queue, owner = (decoded(v) for v in rows[2 * n + 1])
        origin = origin or queue or "leash"
        origins.add(origin)
        per_job += [keys.job(job_id), keys.items(job_id), keys.errors(job_id), keys.payload(job_id),
                        keys.rq_job(job_id), _failed_registry(connection, origin)]
        if limit_key and concurrency:
            registry = keys.rq_rate_limit(limit_key, connection)
            per_job += [registry.rate_limited_key, *keys.owner_state_indexes(owner or ""),
                            keys.owner_door_holds(owner or ""), registry.allowed_key]
            args += [job_id, "limited", _reopen_arg(reopen, job_id)]
            limits[limit_key] = int(concurrency)
        else:
            per_job += [keys.rq_queue(origin), *keys.owner_state_indexes(owner or ""),
                            keys.owner_door_holds(owner or "")]
            args += [job_id, "list", _reopen_arg(reopen, job_id)]
    results = [decoded(r) for r in transitions.replay(connection, per_job, args)]
    results = ["archive-unreachable" if job_id in unreachable and result == "rq-missing" else result
               for job_id, result in zip(job_ids, results, strict=True)]
    # What RQ's enqueue does for a rate-limited job after saving it as waiting: register the
    # limit, then fill free slots (oldest waiting first) onto the queue.
    with connection.pipeline(transaction=False) as pipe:
        for origin in origins:
            pipe.sadd(keys.rq_queues_set(), keys.rq_queue(origin))
        for owner in {decoded(rows[2 * n + 1][1]) or "" for n in range(len(job_ids))}:
            state_index.trim_expired(connection, owner, now, pipeline=pipe)  # queued again: no TTL
        for limit_key, concurrency in limits.items():
            registry = keys.rq_rate_limit(limit_key, connection)
            registry.register(concurrency, pipe)
            registry.acquire_and_enqueue(concurrency, pipeline=pipe)
        # The script made the payload copy persistent with the job; it keeps an expiry instead,
        # as enqueue gives it: a worker of the previous release ends a job without knowing the
        # copy, and would leave it forever (this release's end scripts give it the record's).
        ttl = settings().result_ttl
        for job_id, result in zip(job_ids, results, strict=True):
            if result == "replayed":
                pipe.expire(keys.payload(job_id), ttl)
        pipe.execute()
    return results, [decoded(rows[2 * n + 1][1]) or "" for n in range(len(job_ids))], reopen


_failed_registries: dict[tuple[int, str], str] = {}


def _failed_registry(connection: Redis, origin: str) -> str:
    key = (id(connection), origin)
    if key not in _failed_registries:
        _failed_registries[key] = keys.rq_failed(origin, connection)
    return _failed_registries[key]


def default_actor() -> str:
    operator = command_line()
    return operator.actor or operator.user


def _audit(connection: Redis, actor: str, selector: dict, replayed: list[str],
           skipped: list[tuple[str, str]], now: float) -> str:
    entry = {
        "actor": actor, "at": repr(now), "selector": json.dumps(selector, sort_keys=True),
        "count": len(replayed), "ids": json.dumps(replayed),
        "skipped": json.dumps([{"job_id": i, "reason": r} for i, r in skipped]),
    }
    entry_id = connection.xadd(keys.REPLAY_AUDIT, entry, maxlen=keys.REPLAY_AUDIT_MAXLEN, approximate=True)
    return decoded(entry_id)


def audit_log(connection: Redis, count: int = 20) -> list[dict]:
    """The latest replay audit entries, newest first."""
    out = []
    for entry_id, fields in connection.xrevrange(keys.REPLAY_AUDIT, count=count):
        f = {decoded(k): decoded(v) for k, v in fields.items()}
        out.append({"id": decoded(entry_id), "actor": f["actor"], "at": clock.iso(float(f["at"])),
                    "selector": json.loads(f["selector"]), "count": int(f["count"]),
                    "ids": json.loads(f["ids"]), "skipped": json.loads(f["skipped"])})
    return out


def _reopen_arg(reopen: dict[str, list[int]] | None, job_id: str) -> str:
    indexes = (reopen or {}).get(job_id)
    return json.dumps(indexes) if indexes else ""


def rebuild_rq_jobs(connection: Redis, job_ids: list[str], status: str = "failed") -> set[str]:
    """Recreate RQ's record (as ``status``) of leash jobs whose RQ job was deleted (or kept
    only in part, as RQ keeps a finished job), from leash's own copy of the payload, so a replay
    can run them again. Returns the ids rebuilt."""
    built = rq_jobs_from_copy(connection, job_ids)
    with connection.pipeline(transaction=False) as pipe:
        for _, job in built.values():
            job.set_status(status, pipeline=pipe)
            job.save(pipeline=pipe)
        pipe.execute()
    return set(built)


def adopt_requeues(connection: Redis, job_ids: list[str], source: str) -> list[str]:
    """Replay failed leash jobs that RQ's tools put back on a queue, as ``leash replay`` would
    (through the owner's concurrency limit); returns the ids replayed."""
    selection = select(connection, job_ids=job_ids)
    if not selection.matched:
        return []
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:  # RQ's requeue pushed it on its queue; the replay promotes it again
            pipe.hget(keys.job(job_id), "queue")
        queues = [decoded(q) or settings().queue for q in pipe.execute()]
        for job_id, queue in zip(job_ids, queues, strict=True):
            pipe.lrem(keys.rq_queue(queue), 0, job_id)
        pipe.execute()
    # Not capped: RQ's tool already put them on a queue; leaving them failed would leave RQ's
    # side saying queued for a job that never runs.
    outcome = replay(connection, selection.matched, actor="rq", selector={"source": source}, capped=False)
    ids = [c.job_id for c in outcome.replayed]
    if ids:
        log.warning("%d job(s) requeued with RQ's tools were replayed (attempts reset): %s", len(ids),
                    summary_of_ids(ids))
    return ids
