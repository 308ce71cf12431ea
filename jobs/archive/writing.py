"""Writing one ended job to the archive: read whole from Redis, written to SQL in one
transaction (its row and its items replace any earlier ending of the same job: a replay's),
then marked in Redis (``archived_v1``) so its heavy keys leave after LEASH_REDIS_KEEP.

A crash between the SQL commit and the mark is harmless: the job is still due, and writing the
same ending again replaces it with the same rows. An ending already marked is not written again,
so a job whose items have left Redis can never overwrite its archived rows with less."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from redis import Redis
from sqlalchemy import Engine, delete, insert

from jobs import keys
from jobs.archive import USAGE_DAYS_KEPT, tables, webhook_log
from jobs.config import stores
from jobs.core import outcome, payload_copy
from jobs.core.details import is_canceled
from jobs.core.text import decoded
from jobs.lifecycle import transitions
from jobs.usage.prices import usd

#: Rows per INSERT statement of a job's items (psycopg and sqlite3 send them as one batch).
ITEM_BATCH = 2000


def _when(value: str | None) -> datetime | None:
    return datetime.fromtimestamp(float(value), UTC) if value not in (None, "") else None


def _int(value) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def read_ended(connection: Redis, job_id: str) -> tuple[dict, list[dict], str] | None:
    """The job's row, its items' rows and the ending they are (its ``ended_at``), read from Redis
    in one round trip; None when it has not ended, is gone, or this ending is already archived."""
    with connection.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.job(job_id))
        pipe.lrange(keys.errors(job_id), 0, -1)
        pipe.lrange(keys.history(job_id), 0, -1)
        pipe.hgetall(keys.items(job_id))
        pipe.hgetall(keys.usage(job_id))
        pipe.get(keys.estimate(job_id))
        pipe.get(keys.payload(job_id))
        raw, errors, history, items_raw, usage_raw, estimate, payload_raw = pipe.execute()
    h = {decoded(k): decoded(v) for k, v in raw.items()}
    ended = h.get("ended_at") or ""
    if h.get("state") not in ("succeeded", "failed") or not ended or h.get("archived_end") == ended:
        return None
    payload: dict[str, Any] = {}
    if payload_raw is not None:
        try:
            payload = payload_copy.decode(payload_raw)
        except ValueError:
            payload = {}
    inputs = payload.get("items") if isinstance(payload.get("items"), list) else []
    usage = {decoded(k): decoded(v) for k, v in usage_raw.items()}
    results = {int(decoded(k)): decoded(v) for k, v in items_raw.items()}
    total = max(_int(h.get("total")), len(inputs), max(results, default=-1) + 1)
    rows, item_errors = [], 0
    for index in range(total):
        result = results.get(index)
        error = None
        if result is not None:
            value = json.loads(result)
            if outcome.is_item_error(value):  # the same rule as the count the job ended with
                error, item_errors = str(value["error"]), item_errors + 1
        item = inputs[index] if index < len(inputs) else None
        rows.append({"job_id": job_id, "idx": index, "item": None if item is None else json.dumps(item),
                     "result": result, "error": error, "usage": usage.get(f"i{index}")})
    error = h.get("error") or None
    state = h["state"]
    if state == "failed" and is_canceled(error):
        state = "canceled"
    ended_at = _when(ended)
    job = {
        "job_id": job_id, "kind": h.get("kind") or "", "owner": h.get("owner") or "", "name": h.get("name"),
        "queue": h.get("queue"), "state": state, "error": None if state == "succeeded" else error,
        "done": _int(h.get("done")), "total": _int(h.get("total")), "item_errors": item_errors,
        "attempts": _int(h.get("attempts")), "max_attempts": _int(h.get("max_attempts")),
        "created_at": _when(h.get("created_at")), "ended_at": ended_at,
        "ended_month": ended_at.strftime("%Y-%m"), "ended_day": ended_at.strftime("%Y-%m-%d"),
        "archived_at": datetime.now(UTC),
        "calls": _int(h.get("usage_calls")), "input_tokens": _int(h.get("usage_input_tokens")),
        "output_tokens": _int(h.get("usage_output_tokens")),
        "cost_usd": None if _int(h.get("usage_unpriced_calls")) else usd(_int(h.get("usage_cost_nusd"))),
        "record": json.dumps(h), "errors": json.dumps([decoded(e) for e in errors]),
        "history": json.dumps([decoded(e) for e in history]),
        "usage": json.dumps({k: v for k, v in usage.items() if not k.startswith("i")}),
        "estimate": decoded(estimate),
        "payload": json.dumps({k: v for k, v in payload.items() if k != "items"}) if payload else None,
    }
    return job, rows, ended


def write(engine: Engine, job: dict, rows: list[dict]) -> None:
    """One transaction: the job's earlier rows (an earlier ending) out, this ending's in."""
    with engine.begin() as connection:
        connection.execute(delete(tables.items).where(tables.items.c.job_id == job["job_id"]))
        connection.execute(delete(tables.jobs).where(tables.jobs.c.job_id == job["job_id"]))
        connection.execute(insert(tables.jobs), [job])
        for start in range(0, len(rows), ITEM_BATCH):
            connection.execute(insert(tables.items), rows[start:start + ITEM_BATCH])
        # The webhook attempts its record holds (a later attempt writes its own: webhook_log.record).
        webhook_log.write(connection, webhook_log.rows_of(job["job_id"], json.loads(job["record"])))


def archive_one(connection: Redis, engine: Engine, job_id: str, now: float | None = None) -> bool:
    """Archive the job if it has ended and this ending is not archived yet; True when written."""
    found = read_ended(connection, job_id)
    if found is None:
        return False
    job, rows, ended = found
    write(engine, job, rows)
    transitions.archived(connection, job_id, [stores.archive().redis_keep, time.time() if now is None else now, ended])
    shorten_owner_days(connection, job["owner"], job["created_at"] or job["ended_at"], job["ended_at"])
    return True


def shorten_owner_days(connection: Redis, owner: str, first: datetime, last: datetime) -> None:
    """The owner's usage of the days the job ran leaves Redis USAGE_DAYS_KEPT days after each day
    (the usage ledger gives them 400): the archive now holds the job's usage and cost. A day a
    later write gives its 400 days again is shortened when that write's job is archived; a
    shorter expiry already set stays."""
    days = [(first + timedelta(days=n)).date() for n in range(min((last.date() - first.date()).days, 400) + 1)]
    names = [keys.usage_owner_day(owner, day.isoformat()) for day in days]
    with connection.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.ttl(name)
        left = pipe.execute()
    with connection.pipeline(transaction=False) as pipe:
        for day, name, ttl in zip(days, names, left, strict=True):
            until = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=USAGE_DAYS_KEPT + 1)
            if ttl == -1 or ttl > (until - datetime.now(UTC)).total_seconds():
                pipe.expireat(name, max(int(until.timestamp()), int(time.time()) + 1))
        pipe.execute()
