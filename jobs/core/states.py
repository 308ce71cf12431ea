"""The one function that says what state a job is in.

    queued ──claim──▶ running ──success──────────────▶ succeeded  (terminal)
      ▲                 │
      │                 ├─ retryable failure, attempts < max ─┐
      │                 ├─ permanent failure ─▶ failed (terminal, error stored)
      │                 ├─ retryable failure, attempts = max ─▶ failed
      │                 └─ lease expired (worker died/hung) ──┤
      └───────────────────────────────────────────────────────┘

Two sources are combined. leash's job hash is written only by fenced Lua transitions and is
the authority for running and for the terminal states. RQ's status says where a job that
leash calls queued is waiting (queue, scheduled retry, rate limit) and whether RQ itself
ended it (canceled or stopped from rq-dashboard); those RQ endings count as failed.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from redis import Redis

from jobs import keys
from jobs.core import clock
from jobs.core.details import details, look_is_late
from jobs.core.details import whole_error as whole_error_of
from jobs.core.rq_side import ENDED_BY_RQ, REMOVED, requeued_by_rq
from jobs.core.text import decoded
from jobs.errors import NoSuchJob
from jobs.usage.report import budget_wait, job_usage


class State(StrEnum):
    QUEUED = "queued"  #: waiting: in a queue, scheduled for a retry, or held by the owner's limit
    RUNNING = "running"  #: an attempt holds a lease (``stale`` when that lease has expired)
    SUCCEEDED = "succeeded"  #: terminal; the result has its own address
    FAILED = "failed"  #: terminal; ``error`` always holds the reason as text


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED})

# RQ statuses of a job that leash has not ended, when RQ's own tools ended it: the same texts
# the sweep (jobs/core/upkeep/consistency.py) records in leash within one reaper tick.
_RQ_ENDED = {**ENDED_BY_RQ, None: REMOVED}

FIELDS = ("job_id", "kind", "state", "done", "total", "result", "error", "stale", "attempts",
          "max_attempts", "created_at", "updated_at", "lease_expires_at",
          # What a person watching the job wants to know (see ``details``).
          "canceled",
          # How it ended, one word, and how many items ended in an error (jobs/core/outcome.py).
          "stopped", "item_errors", "outcome",
          "error_summary", "started_at", "finished_at", "elapsed_seconds", "items_per_second",
          "eta_seconds", "submitted", "labels", "template", "results_url", "waiting", "next_retry_at", "history",
          # What its model calls used and cost, and the budget it runs under (jobs/usage).
          "usage", "cost_usd", "budget", "budget_wait",
          # What people call it (``leash submit --name``).
          "name",
          # Direct calls or the provider's batch API, and where a batch job's batch is.
          "mode", "batch",
          # Where its completion webhook goes and how its deliveries went (jobs/webhooks/).
          "webhook",
          # The jobs it waits for and what it does if one does not succeed (jobs.core.parents).
          "after",
          # The pipeline it is a stage of (jobs/intake/pipelines.py), or None.
          "pipeline",
          # Where this answer was read: Redis, or the SQL archive once Redis no longer holds the
          # job's record (jobs/read/job_status.py; the same fields, from the record it archived).
          "source")

#: ``source`` of a status read from Redis, and of one read from the archive.
FROM_REDIS, FROM_ARCHIVE = "redis", "archive"


def _float(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


def decide(leash_state: str, rq_status: str | None, lease_expires_at: float | None,
           now: float, ended_at: float | None = None) -> tuple[State, bool, str | None]:
    """(state, stale, error override) from leash's state and RQ's status (None: RQ has no
    record of the job: deleted or emptied behind leash's back)."""
    if requeued_by_rq(leash_state, rq_status, ended_at, now):
        return State.QUEUED, False, None  # RQ's tools requeued it: a replay under way
    if leash_state in (State.SUCCEEDED, State.FAILED):
        return State(leash_state), False, None
    if leash_state == State.RUNNING:
        stale = lease_expires_at is not None and lease_expires_at <= now
        return State.RUNNING, stale, None
    if rq_status in _RQ_ENDED:
        return State.FAILED, False, _RQ_ENDED[rq_status]
    return State.QUEUED, False, None


def read(connection: Redis, job_id: str) -> tuple[dict, str | None]:
    """What the adapter needs, in one round trip: leash's job hash and RQ's status. Never
    reads the item results. The hash is empty for an unknown (or expired) job."""
    raw, rq_status, _, _ = read_with_history(connection, job_id)
    return raw, rq_status


def read_with_history(connection: Redis, job_id: str) -> tuple[dict, str | None, list, list]:
    """``read`` plus the job's error and attempt history lists, still one round trip."""
    with connection.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.job(job_id))
        pipe.hget(keys.rq_job(job_id), "status")
        pipe.lrange(keys.errors(job_id), 0, -1)
        pipe.lrange(keys.history(job_id), 0, -1)
        raw, rq_status, errors, history = pipe.execute()
    return raw, decoded(rq_status), errors, history


def status(connection: Redis, job_id: str, now: float | None = None, whole_error: bool = False) -> dict[str, Any]:
    """The status fields of one job: one round trip (two for a job waiting for a retry, to
    read when RQ's scheduler will bring it back). ``whole_error``: ``error`` as the error
    history keeps it, not cut to the job hash's size (``leash status --full``)."""
    raw, rq_status, errors, history = read_with_history(connection, job_id)
    if not raw:
        raise NoSuchJob(f"no such job: {job_id}")
    now = clock.wall() if now is None else now
    h = {"phase": decoded(raw.get(b"phase")), "lease_expires_at": decoded(raw.get(b"lease_expires_at"))}
    late = raw.get(b"state") == b"running" and rq_status != "rate_limited" and look_is_late(h, now)
    fields = from_raw(job_id, raw, rq_status, now=now, errors=errors, history=history,
                      retry_at=retry_time(connection, job_id, raw, rq_status),
                      workers_alive=workers_alive(connection) if late else None)
    if whole_error:
        fields["error"] = whole_error_of(errors, fields["error"])
    return fields


def workers_alive(connection: Redis) -> bool:
    """Whether any RQ worker is registered and still beating (its own key expires when it stops)."""
    registered = list(connection.smembers(keys.rq_workers()))
    return bool(registered) and bool(connection.exists(*registered))


def retry_time(connection: Redis, job_id: str, raw: dict, rq_status: str | None) -> float | None:
    """When RQ's scheduler brings back a job waiting for its retry (None for any other job)."""
    if rq_status != "scheduled":
        return None
    queue = decoded(raw.get(b"queue") or raw.get("queue"))
    return connection.zscore(keys.rq_scheduled(queue, connection), job_id) if queue else None


def from_raw(job_id: str, raw: dict, rq_status: str | None, now: float | None = None,
             errors: list | None = None, history: list | None = None,
             retry_at: float | None = None, workers_alive: bool | None = None) -> dict[str, Any]:
    now = clock.wall() if now is None else now
    h = {decoded(k): decoded(v) for k, v in raw.items()}
    lease_expires_at = _float(h.get("lease_expires_at"))
    state, stale, error_override = decide(h.get("state") or "queued", rq_status, lease_expires_at, now,
                                          ended_at=_float(h.get("ended_at")))
    if stale and h.get("phase") == "waiting" and rq_status == "rate_limited":
        stale = False  # its look waits for a place among the owner's running jobs, as the limit says
    result = None
    if state == State.SUCCEEDED and h.get("result"):
        result = {"summary": json.loads(h["result"]), "url": f"/jobs/{job_id}/result"}
    # While queued or running again, ``error`` says why the last attempt did not finish;
    # once succeeded it is cleared (the history stays in the errors list).
    error = None if state == State.SUCCEEDED else (h.get("error") or None)
    if error_override:
        error = error_override
    elif state == State.FAILED and not error:
        error = "failed"
    return {
        "job_id": job_id,
        "kind": h.get("kind"),
        "state": state.value,
        "done": int(h.get("done") or 0),
        "total": int(h.get("total") or 0),
        "result": result,
        "error": error,
        "stale": stale,
        "attempts": int(h.get("attempts") or 0),
        "max_attempts": int(h.get("max_attempts") or 0),
        "created_at": clock.iso(_float(h.get("created_at"))),
        "updated_at": clock.iso(_float(h.get("updated_at"))),
        "lease_expires_at": clock.iso(lease_expires_at) if state == State.RUNNING else None,
    } | details(job_id, h, state.value, error, rq_status, now, errors or [], history or [], retry_at, workers_alive) \
      | job_usage(h) | budget_wait(h, state == State.RUNNING or (state == State.QUEUED and retry_at is not None)) \
      | {"name": h.get("name")} | batch_status(h, state.value) | {"webhook": webhook_status(h, state)} \
      | {"after": {"jobs": h["after"].split(","), "policy": h.get("after_policy")} if h.get("after") else None} \
      | {"pipeline": h.get("pipeline"), "source": FROM_REDIS}


def batch_status(h: dict, state: str) -> dict[str, Any]:
    """``mode``, and for a batch job ``batch``: its phase (``waiting`` at the provider with no
    worker held, ``canceling`` the same once its batch was canceled past the longest wait and
    leash waits for what it answered, ``looking`` while a worker reads it), the provider's
    requests done / failed / total as of the last look, the next look, the looks in a row the
    provider did not answer, and the items asked directly (counted apart)."""
    if h.get("mode") != "batch":
        return {"mode": "direct", "batch": None}
    phase = h.get("phase") if state == State.RUNNING else None
    if phase == "waiting" and h.get("batch_stage") == "canceling":
        phase = "canceling"
    look_at = _float(h.get("look_at"))
    done, failed, total = (int(h.get(name) or 0) for name in ("batch_done", "batch_failed", "batch_total"))
    direct = int(h.get("batch_direct") or 0)
    if state in TERMINAL:
        # The last look's figures stop where the batch's answers were stored: once the job has
        # ended, the requests the provider answered are its stored items minus those asked
        # directly (what the job page says, jobs.read.job_view.batch_details).
        done = max(done, int(h.get("done") or 0) - direct)
        total = max(total, done + failed)
    return {"mode": "batch", "batch": {
        "phase": phase or ("sending" if state == State.RUNNING else None),
        "done": done, "failed": failed, "total": total, "batches": int(h.get("batches") or 0),
        "next_look_at": clock.iso(look_at) if phase in ("waiting", "canceling") else None,
        "failed_looks": int(h.get("batch_failed_looks") or 0),
        "direct": direct}}


def webhook_status(h: dict, state: State) -> dict[str, Any] | None:
    """A job's completion webhook (None without one): its URL, and once the job has ended, its
    delivery id, its state (``to send`` until the sweep queues it, then ``pending``, ``delivered``
    or ``given up``), how many attempts were made and the last few (attempt, HTTP status, when,
    seconds, error). While the job is queued or running (a replay too) it is ``waiting``."""
    if not h.get("webhook_url"):
        return None
    begun = state in TERMINAL and bool(h.get("ended_at")) and h.get("webhook_ending") == h.get("ended_at")
    if not begun:
        return {"url": h["webhook_url"], "id": None, "state": "to send" if state in TERMINAL else "waiting",
                "attempts": 0, "deliveries": []}
    return {"url": h["webhook_url"], "id": h.get("webhook_id"), "state": h.get("webhook_state") or "pending",
            "attempts": int(h.get("webhook_attempts") or 0), "deliveries": json.loads(h.get("webhook_log") or "[]")}
