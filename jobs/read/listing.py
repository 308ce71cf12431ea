"""An owner's jobs, newest first, filtered (the jobs page, ``GET /jobs``, ``leash jobs``).
Reads the owner's indexes, never scans Redis: a state filter reads the owner's index of that
state (jobs/core/state_index.py), exact and as fast at any number of jobs.

A listing filters by *view*, not by state: queued, running, then the outcomes of an ended job
(jobs/core/outcome.py): a canceled job (state ``failed``, ``canceled: true``) is in the view
``canceled`` and not in ``failed``, one RQ's stop command ended in ``stopped``, one that
succeeded with item errors in ``succeeded_with_item_errors`` and not in ``succeeded`` — people
look for "what broke", "what I stopped" and "what needs a second look" separately. The failed
index holds the first three; they are told apart by the stored error, whose length alone rules
out almost every failure (one O(1) read each), so only would-be cancels and stops have their
text read. The succeeded index holds both succeeded views, told apart by the item-error count.

Filters by kind, by a text found in the id, name or kind (any case) and by creation date read
the owner's newest MAX_SCAN jobs. The state indexes follow leash's own state: a job that RQ's
tools ended or requeued behind leash's back reads in its new state at once (``states.decide``)
and moves index at the next consistency sweep (one reaper tick); meanwhile a filtered page
leaves it out rather than show it under the wrong state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from redis import Redis

from jobs import keys
from jobs.core import clock, outcome, state_index, states
from jobs.core.rq_side import ENDED_BY_RQ
from jobs.core.text import decoded
from jobs.errors import CANCELED as CANCELED_ERROR

#: Filters other than the state, and the index before older jobs are indexed, read at most
#: this many of the owner's newest jobs.
MAX_SCAN = 10_000
_CHUNK = 500
CANCELED = outcome.CANCELED_OUTCOME
STOPPED = outcome.STOPPED
WITH_ITEM_ERRORS = outcome.WITH_ITEM_ERRORS
#: What a listing can be filtered by: queued, running and every outcome.
VIEWS = (states.State.QUEUED.value, states.State.RUNNING.value, *outcome.ENDED)
_FAILED = states.State.FAILED.value
_SUCCEEDED = states.State.SUCCEEDED.value
#: The views the failed index holds, and those the succeeded index holds.
_FAILED_VIEWS = (_FAILED, CANCELED, STOPPED)
_SUCCEEDED_VIEWS = (_SUCCEEDED, WITH_ITEM_ERRORS)


def view_of(fields: dict) -> str:
    """The view a job's status fields put it in."""
    return fields.get("outcome") or fields["state"]


def _index_of(view: str) -> str:
    """The state index that holds a view's jobs."""
    return _FAILED if view in _FAILED_VIEWS else _SUCCEEDED if view in _SUCCEEDED_VIEWS else view


@dataclass
class Filters:
    view: str | None = None
    kind: str | None = None
    search: str | None = None  #: any part of the id, the name or the kind, any case
    since: float | None = None  #: created at or after (unix seconds)
    until: float | None = None  #: created before

    def beyond_view(self) -> bool:
        return any(v is not None for v in (self.kind, self.search, self.since, self.until))

    def matches(self, job_id: str, kind: str | None, name: str | None, created: float | None) -> bool:
        if self.kind is not None and kind != self.kind:
            return False
        if self.search:
            needle = self.search.lower()
            if not any(needle in (text or "").lower() for text in (job_id, name, kind)):
                return False
        if self.since is not None and (created is None or created < self.since):
            return False
        return not (self.until is not None and (created is None or created >= self.until))


class Row(NamedTuple):
    job_id: str
    view: str
    created: float | None
    ended: float | None


@dataclass
class Found:
    total: int
    jobs: list[dict[str, Any]]
    #: jobs per view (and "all") under the other filters, when asked for
    counts: dict[str, int] = field(default_factory=dict)


def _canceled_among(connection: Redis, ids: list[str]) -> dict[str, str]:
    """Which of these failed jobs were canceled or stopped by RQ (job id -> view). Their stored
    error is one of three short texts: HSTRLEN (a number) rules out every other failure without
    reading its traceback."""
    lengths = {len(CANCELED_ERROR.encode()), len(ENDED_BY_RQ["canceled"].encode()), len(outcome.STOPPED_BY_RQ.encode())}
    canceled: dict[str, str] = {}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        with connection.pipeline(transaction=False) as pipe:
            for job_id in chunk:
                pipe.hstrlen(keys.job(job_id), "error")
            sizes = pipe.execute()
        maybe = [job_id for job_id, size in zip(chunk, sizes, strict=True) if size in lengths]
        if not maybe:
            continue
        with connection.pipeline(transaction=False) as pipe:
            for job_id in maybe:
                pipe.hget(keys.job(job_id), "error")
            for job_id, error in zip(maybe, pipe.execute(), strict=True):
                view = outcome.of(_FAILED, decoded(error), 0)
                if view != _FAILED:
                    canceled[job_id] = view
    return canceled


def _with_item_errors(connection: Redis, ids: list[str]) -> set[str]:
    """Which of these succeeded jobs ended with item errors."""
    found: set[str] = set()
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        with connection.pipeline(transaction=False) as pipe:
            for job_id in chunk:
                pipe.hget(keys.job(job_id), outcome.FIELD)
            found.update(j for j, n in zip(chunk, pipe.execute(), strict=True) if int(n or 0))
    return found


def scan(connection: Redis, owner: str, filters: Filters, now: float) -> list[Row]:
    """The owner's newest MAX_SCAN jobs that pass every filter but the view, newest first."""
    ids = [decoded(i) for i in connection.zrevrange(keys.owner_jobs(owner), 0, MAX_SCAN - 1)]
    found: list[Row] = []
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start:start + _CHUNK]
        with connection.pipeline(transaction=False) as pipe:
            for job_id in chunk:
                pipe.hmget(keys.job(job_id), "state", "lease_expires_at", "ended_at", "kind", "name", "created_at")
                pipe.hget(keys.rq_job(job_id), "status")
            replies = pipe.execute()
        failed: list[int] = []
        succeeded: list[int] = []
        for n, job_id in enumerate(chunk):
            (leash_state, lease, ended, kind, name, created), rq_status = replies[2 * n], replies[2 * n + 1]
            if leash_state is None:
                continue
            created = float(created) if created else None
            if not filters.matches(job_id, decoded(kind), decoded(name), created):
                continue
            decided, _, override = states.decide(decoded(leash_state), decoded(rq_status),
                                                 float(lease) if lease else None, now,
                                                 ended_at=float(ended) if ended else None)
            if decided == states.State.FAILED and override is None:
                failed.append(len(found))  # canceled or not: its error says (read below)
            if decided == states.State.SUCCEEDED:
                succeeded.append(len(found))  # with item errors or not: read below
            view = outcome.of(decided.value, override, 0) or decided.value
            found.append(Row(job_id, view, created, float(ended) if ended else None))
        if failed:
            canceled = _canceled_among(connection, [found[n].job_id for n in failed])
            for n in failed:
                if found[n].job_id in canceled:
                    found[n] = found[n]._replace(view=canceled[found[n].job_id])
        if succeeded:
            with_errors = _with_item_errors(connection, [found[n].job_id for n in succeeded])
            for n in succeeded:
                if found[n].job_id in with_errors:
                    found[n] = found[n]._replace(view=WITH_ITEM_ERRORS)
    return found


def _index_ready(connection: Redis, owner: str, now: float) -> bool:
    """Whether the owner's state indexes can be read (a step of the one-time indexing of older
    jobs runs here first, so a small store is ready at once); expired entries dropped."""
    if not state_index.ready(connection) and not state_index.backfill_step(connection, now=now):
        return False
    state_index.trim_expired(connection, owner, now)
    return True


def _split(connection: Redis, owner: str, state: str) -> tuple[list[str], dict[str, str]]:
    """The owner's index of an ended state, newest first, and the view of each of its jobs
    that is not the state's own (canceled, stopped; with item errors)."""
    ids = [decoded(i) for i in connection.zrevrange(keys.owner_state(owner, state), 0, -1)]
    if state == _FAILED:
        return ids, _canceled_among(connection, ids)
    return ids, dict.fromkeys(_with_item_errors(connection, ids), WITH_ITEM_ERRORS)


def _view_counts(connection: Redis, owner: str, splits: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, int]:
    with connection.pipeline(transaction=False) as pipe:
        for state in states.State:
            pipe.zcard(keys.owner_state(owner, state.value))
        pipe.zcard(keys.owner_jobs(owner))
        *sizes, everything = pipe.execute()
    per_view = {state.value: size for state, size in zip(states.State, sizes, strict=True)}
    per_view |= {view: 0 for view in VIEWS if view not in per_view}
    for state, (_, others) in splits.items():
        for view in others.values():
            per_view[view] += 1
            per_view[state] -= 1
    return per_view | {"all": everything}


def _view_page(connection: Redis, owner: str, view: str, offset: int, limit: int,
               split: tuple[list[str], dict[str, str]] | None) -> tuple[int, list[str]]:
    if split is not None:  # an ended view: its state's index, told apart
        ids, others = split
        matching = [i for i in ids if others.get(i, _index_of(view)) == view]
        return len(matching), matching[offset:offset + limit]
    index = keys.owner_state(owner, view)
    with connection.pipeline(transaction=False) as pipe:
        pipe.zcard(index)
        pipe.zrevrange(index, offset, offset + limit - 1)
        total, raw_ids = pipe.execute()
    return total, [decoded(i) for i in raw_ids]


def find(connection: Redis, owner: str, offset: int, limit: int, filters: Filters | None = None,
         counts: bool = False, now: float | None = None) -> Found:
    """One page of the owner's jobs that pass ``filters``, newest first, with how many pass
    and, if ``counts``, how many are in each view."""
    now = clock.wall() if now is None else now
    filters = filters or Filters()
    index = keys.owner_jobs(owner)
    per_view: dict[str, int] = {}
    needs_index = filters.view is not None or counts
    if filters.beyond_view() or (needs_index and not _index_ready(connection, owner, now)):
        scanned = scan(connection, owner, filters, now)
        if counts:
            per_view = {view: 0 for view in VIEWS} | {"all": len(scanned)}
            for row in scanned:
                per_view[row.view] += 1
        matching = [row.job_id for row in scanned if filters.view in (None, row.view)]
        total, ids = len(matching), matching[offset:offset + limit]
    else:
        wanted = [_FAILED, _SUCCEEDED] if counts else [_index_of(filters.view)] if filters.view else []
        splits = {state: _split(connection, owner, state) for state in wanted if state in (_FAILED, _SUCCEEDED)}
        if filters.view is None:
            with connection.pipeline(transaction=False) as pipe:
                pipe.zcard(index)
                pipe.zrevrange(index, offset, offset + limit - 1)
                total, raw_ids = pipe.execute()
            ids = [decoded(i) for i in raw_ids]
        else:
            total, ids = _view_page(connection, owner, filters.view, offset, limit,
                                    splits.get(_index_of(filters.view)))
        if counts:
            per_view = _view_counts(connection, owner, splits)
    return Found(total, _read(connection, owner, ids, filters.view, now), per_view)


def _read(connection: Redis, owner: str, ids: list[str], view: str | None, now: float) -> list[dict[str, Any]]:
    if not ids:
        return []
    with connection.pipeline(transaction=False) as pipe:
        for job_id in ids:
            pipe.hgetall(keys.job(job_id))
            pipe.hget(keys.rq_job(job_id), "status")
        replies = pipe.execute()
    listing, misplaced = [], []
    for n, job_id in enumerate(ids):
        raw, rq_status = replies[2 * n], replies[2 * n + 1]
        if not raw:  # the job's record expired (LEASH_RESULT_TTL after it ended): trim the index as met
            connection.zrem(keys.owner_jobs(owner), job_id)
            if view is not None:
                state_index.repair(connection, [job_id], [owner], now)
            continue
        fields = states.from_raw(job_id, raw, decoded(rq_status), now=now)
        if view is not None and view_of(fields) != view:
            if decoded(raw.get(b"state")) != _index_of(view):
                misplaced.append(job_id)  # moved by an older release's script: repaired as met
            continue
        listing.append(fields)
    if misplaced:
        state_index.repair(connection, misplaced, [owner] * len(misplaced), now)
    return listing


def list_jobs(connection: Redis, owner: str, offset: int, limit: int, state: str | None = None,
              now: float | None = None) -> tuple[int, list[dict[str, Any]]]:
    """(how many jobs match, the status fields of one page of them, newest first); ``state``
    is a view (one of VIEWS)."""
    found = find(connection, owner, offset, limit, Filters(view=state), now=now)
    return found.total, found.jobs
