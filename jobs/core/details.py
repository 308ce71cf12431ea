"""The status fields a person watching a job wants beside the state: timing, speed, what was
submitted, why it waits, and each attempt's story. Computed from what the status read already
holds (the job hash, RQ's status, the error and attempt history lists); no extra reads.

    canceled         a failed job that was canceled (the state machine still says failed)
    stopped          a failed job that RQ's stop command ended
    item_errors      how many items ended in an error (known once the job has ended)
    outcome          how it ended, one word (jobs/core/outcome.py); None until then
    error_summary    the first line of ``error``; the traceback stays in ``error``
    started_at       when the first attempt started; finished_at: when the job ended
    elapsed_seconds  from the first start to the end (or to the last update)
    items_per_second over the current attempt up to its last update (the whole run once ended)
    eta_seconds      at that rate, for the items left (running jobs only)
    submitted        the kind's declared fields as submitted (labels/template also alone)
    results_url      the per-item results, readable while the job runs
    waiting          why a queued job is not running: the owner's limit, a retry, the queue;
                     for a batch job waiting at its provider: its progress there, the next look
    next_retry_at    when a job waiting for a retry comes back
    history          one entry per attempt: when, worker, how it ended
"""

from __future__ import annotations

import json
from typing import Any

from jobs.config import settings
from jobs.core import clock, outcome
from jobs.core.outcome import CANCELED_IN_RQ, is_canceled  # noqa: F401 - read from here by other modules

#: A first line is a summary: the whole text stays in ``error``.
SUMMARY_CHARS = 300


def first_line(text: str | None) -> str | None:
    if not text or not text.strip():
        return text or None
    line = text.strip().splitlines()[0]
    return line if len(line) <= SUMMARY_CHARS else line[:SUMMARY_CHARS] + "…"


#: Where a stored error was cut (jobs.core.lease.truncate): its head is before it.
CUT_MARKER = "\n... [truncated] ...\n"


def _json_cost(char: str) -> int:
    """Bytes one character takes in a JSON answer (``\n`` 2, ``é`` 6, an emoji 12)."""
    return 1 if " " <= char <= "~" and char not in '"\\' else len(json.dumps(char)) - 2


def truncate(text: str, limit: int | None = None) -> str:
    """At most ``limit`` (LEASH_ERROR_MAX_CHARS) bytes as JSON, so a failed job's hash and
    status answer stay small whatever the error says."""
    limit = limit or settings().error_max_chars
    costs = [_json_cost(char) for char in text]
    if sum(costs) <= limit:
        return text
    # Keep the head (what failed) and the tail (where): the middle of a traceback is noise.
    marker = CUT_MARKER
    budget = limit - sum(_json_cost(char) for char in marker)
    head = _fit(costs, budget // 3)
    tail = _fit(costs[::-1], budget - sum(costs[:head]))
    return text[:head] + marker + (text[-tail:] if tail else "")


def _fit(costs: list[int], budget: int) -> int:
    """How many leading characters fit in ``budget``."""
    used = count = 0
    for cost in costs:
        if used + cost > budget:
            break
        used, count = used + cost, count + 1
    return count


def whole_error(errors: list, error: str | None) -> str | None:
    """``error`` as the latest history entry that begins with its head keeps it: the whole text
    up to lease.FULL_ERROR_BYTES where the job hash holds a LEASH_ERROR_MAX_CHARS cut."""
    if not error:
        return error
    head = error.split(CUT_MARKER, 1)[0]
    for entry in reversed(_entries(errors)):
        text = str(entry.get("error") or "")
        if text.startswith(head) and len(text) > len(error):
            return text
    return error


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _entries(raw: list) -> list[dict]:
    out = []
    for item in raw:
        try:
            entry = json.loads(item)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def history(errors: list, starts: list, state: str, error: str | None,
            ended_at: float | None = None, h: dict | None = None) -> list[dict[str, Any]]:
    """One entry per attempt, oldest first: {attempt, started_at, worker, ended_at, ended}.
    ``ended`` is "running", "succeeded", "canceled", "handed off", "deferred", "lease
    expired", or the first line of the attempt's error.

    Attempts the previous release ran left no start entry (it kept only the error list and,
    in the job hash ``h``, the latest attempt's number, start and worker): they are told from
    their errors, and the latest from the hash, with what is not known left None."""
    starts_ = _entries(starts)
    first_start = next((_float(e.get("at")) for e in starts_ if "ended" not in e), None)
    # Errors older than the first recorded start belong to attempts no start entry tells of
    # (a replay numbers attempts from 1 again, so the number alone cannot say which).
    earlier = [e for e in _entries(errors) if first_start is None or (_float(e.get("at")) or 0) < first_start]
    errors_left = [e for e in _entries(errors) if e not in earlier]
    attempts: list[dict[str, Any]] = [
        {"attempt": e.get("attempt"), "started_at": None, "worker": None,
         "ended_at": clock.iso(_float(e.get("at"))), "ended": _ended_by(truncate(str(e.get("error") or "")))}
        for e in earlier]
    for entry in starts_:
        if "ended" in entry:  # a give-back (hand-off or deferral) of the latest attempt
            if attempts and attempts[-1]["ended"] is None:
                attempts[-1].update(ended=entry["ended"], ended_at=clock.iso(_float(entry.get("at"))))
            continue
        attempts.append({"attempt": entry.get("attempt"), "started_at": clock.iso(_float(entry.get("at"))),
                         "worker": entry.get("worker"), "ended_at": None, "ended": None})
    for attempt in attempts:
        if attempt["ended"] is not None:
            continue
        match = next((e for e in errors_left if e.get("attempt") == attempt["attempt"]), None)
        if match is not None:
            errors_left.remove(match)
            attempt["ended"] = _ended_by(truncate(str(match.get("error") or "")))
            attempt["ended_at"] = clock.iso(_float(match.get("at")))
    _add_unrecorded_latest(attempts, state, h or {})
    if attempts and attempts[-1]["ended"] is None:
        last = attempts[-1]
        last["ended_at"] = clock.iso(ended_at)
        if state == "running":
            last["ended"] = "running"
        elif state == "succeeded":
            last["ended"] = "succeeded"
        elif state == "failed":
            last["ended"] = "canceled" if is_canceled(error) else first_line(error)
    # A cancel of a queued job ends no attempt: the errors left say so.
    return attempts


def _ended_by(error_text: str) -> str | None:
    return "lease expired" if error_text.startswith("lease expired") else first_line(error_text)


def _add_unrecorded_latest(attempts: list[dict[str, Any]], state: str, h: dict) -> None:
    """The attempt running or ended without a start entry (claimed by the previous release),
    from the job hash: its number, start and worker."""
    number = int(h.get("attempts") or 0)
    if state == "queued" or number < 1 or (attempts and attempts[-1]["ended"] is None):
        return
    if attempts and attempts[-1]["attempt"] == number and not _after(h.get("started_at"), attempts[-1]):
        return
    attempts.append({"attempt": number, "started_at": clock.iso(_float(h.get("started_at"))),
                     "worker": h.get("worker"), "ended_at": None, "ended": None})


def _after(started_at: str | None, entry: dict[str, Any]) -> bool:
    """Whether the hash's latest start is later than ``entry`` ended (a new attempt since)."""
    start = _float(started_at)
    ended = entry.get("ended_at")
    return start is not None and ended is not None and clock.iso(start) > ended


def waiting(state: str, rq_status: str | None, retry_at: float | None, h: dict | None = None,
            now: float | None = None, workers_alive: bool | None = None) -> str | None:
    h = h or {}
    if state == "running" and h.get("phase") == "waiting":
        return at_provider(h, rq_status, clock.wall() if now is None else now, workers_alive)
    if state != "queued":
        return None
    if rq_status == "rate_limited":
        limit = settings().owner_concurrency
        return (f"owner limit reached: {limit} of {limit} jobs queued or running (LEASH_OWNER_CONCURRENCY); "
                "it starts when one of them ends")
    if rq_status == "deferred":  # RQ holds it until the jobs it waits for end (jobs.core.parents)
        parents = (h.get("after") or "").split(",")
        return f"waiting for job{'s' if len(parents) > 1 else ''} {', '.join(parents)} to end (after)"
    if h.get("waiting_for") == "provider" and h.get("provider_down_since"):
        since = clock.iso(_float(h.get("provider_down_since")))[:19].replace("T", " ")
        later = f"; next try at {clock.iso(retry_at)[11:19]} UTC" if retry_at else ""
        return (f"waiting for the model provider since {since} UTC: it failed every call (connection errors, "
                f"5xx, 529){later}; no attempt is counted")
    if rq_status == "scheduled":
        when = clock.iso(retry_at) if retry_at else None
        return f"waiting to retry at {when[:19].replace('T', ' ')} UTC" if when else "waiting to retry"
    return "in the queue, waiting for a worker"


def at_provider(h: dict, rq_status: str | None, now: float, workers_alive: bool | None) -> str:
    """A batch job waiting at its provider: its progress there, and when leash looks next or,
    when that look is late, why (``workers_alive`` None: not known)."""
    look_at = _float(h.get("look_at"))
    when = clock.iso(look_at)[11:19] + " UTC" if look_at else "soon"
    failed_looks = int(h.get("batch_failed_looks") or 0)
    progress = (("canceled at the provider after LEASH_BATCH_MAX_WAIT, leash reads what it answered once it "
                 "ends: " if h.get("batch_stage") == "canceling" else "at the provider: ")
                + f"{int(h.get('batch_done') or 0)} of {int(h.get('batch_total') or 0)} requests "
                f"done, {int(h.get('batch_failed') or 0)} failed"
                + (f"; the last {failed_looks} look(s) failed at the provider" if failed_looks else ""))
    held_back = int(h.get("total") or 0) - int(h.get("batch_total") or 0)
    if held_back > 0 and h.get("batch_stage") != "canceling":  # a budget's room takes them later (jobs.batch.room)
        progress += f"; {held_back} more item(s) go as answers free room in a budget"
    if rq_status == "rate_limited":
        limit = settings().owner_concurrency
        return (f"{progress}; its look is waiting for a free place among the owner's {limit} running jobs "
                "(LEASH_OWNER_CONCURRENCY; no worker held)")
    if not look_is_late(h, now):
        return f"{progress}; leash looks next at {when} (no worker held)"
    if workers_alive is False:
        return f"{progress}; its look was due at {when} and no `leash worker` is running: start one"
    return (f"{progress}; its look was due at {when} and is late: the workers are busy, or RQ lost the "
            "look (the consistency sweep puts it back)")


def look_is_late(h: dict, now: float) -> bool:
    """A waiting batch job whose look is overdue by more than its grace (park_v1)."""
    expires = _float(h.get("lease_expires_at"))
    return h.get("phase") == "waiting" and expires is not None and expires <= now


def details(job_id: str, h: dict, state: str, error: str | None, rq_status: str | None, now: float,
            errors: list, starts: list, retry_at: float | None, workers_alive: bool | None = None) -> dict[str, Any]:
    done, total = int(h.get("done") or 0), int(h.get("total") or 0)
    first_start = _float(h.get("first_started_at")) or _float(h.get("started_at"))
    updated = _float(h.get("updated_at"))
    ended_at = None
    if state in ("succeeded", "failed"):
        ended_at = _float(h.get("ended_at")) or updated
    # Measured up to the last update, not to now: a poll of an unchanged job gets the same
    # answer (ETag, 304), and a watcher that wants a ticking clock counts from started_at.
    until = ended_at or updated or now
    elapsed = max(0.0, until - first_start) if first_start is not None else None
    rate = None
    if state == "running":
        # Over this attempt only: items an earlier attempt checkpointed did not take its time.
        attempt_start = _float(h.get("started_at"))
        progressed = done - int(h.get("done_at_start") or 0)
        if attempt_start is not None and progressed > 0:
            rate = progressed / max(until - attempt_start, 1e-3)
    elif state == "succeeded" and elapsed:
        rate = done / elapsed
    eta = (total - done) / rate if state == "running" and rate and total >= done else None
    try:
        params = json.loads(h.get("params") or "{}")
    except ValueError:
        params = {}
    item_errors = int(h.get(outcome.FIELD) or 0) if state in ("succeeded", "failed") else 0
    return {
        "canceled": state == "failed" and is_canceled(error),
        "stopped": state == "failed" and outcome.is_stopped(error),
        "item_errors": item_errors,
        "outcome": outcome.of(state, error, item_errors),
        "error_summary": first_line(error),
        "started_at": clock.iso(first_start),
        "finished_at": clock.iso(ended_at),
        "elapsed_seconds": round(elapsed, 1) if elapsed is not None else None,
        "items_per_second": round(rate, 3) if rate is not None else None,
        "eta_seconds": round(eta, 1) if eta is not None else None,
        # The kind's declared fields as submitted (jobs.kinds), cut to fit the job's hash.
        "submitted": params,
        # The built-in kinds' fields under their own names, as clients of 0.2 read them.
        "labels": params.get("labels"),
        "template": params.get("template"),
        "results_url": f"/jobs/{job_id}/result",
        "waiting": waiting(state, rq_status, retry_at, h, now, workers_alive),
        "next_retry_at": clock.iso(retry_at) if state == "queued" and retry_at else None,
        "history": history(errors, starts, state, error, ended_at, h),
    }
