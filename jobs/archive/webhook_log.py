"""A job's completion webhook deliveries in the archive (``leash_webhook_deliveries``): every
attempt, where the job's Redis record keeps the last few (jobs/webhooks/delivery.py's LOG_KEPT)
and only for as long as the record lives.

Written when the job is archived (the attempts its record holds, in the same transaction as its
rows) and by each attempt after that (deliveries retry for hours, archived or not): one row per
delivery id and attempt, written again the same if it was already there. Read by the job's page
and its status when the record counts more attempts than its log keeps. Rows leave with the
archive's jobs, LEASH_RESULT_TTL after their attempt."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, delete, insert, or_, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from jobs.archive import tables

log = logging.getLogger("leash.archive")


def rows_of(job_id: str, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the attempts a job's record holds (its hash, decoded)."""
    delivery_id = record.get("webhook_id")
    if not delivery_id:
        return []
    try:
        entries = json.loads(record.get("webhook_log") or "[]")
    except ValueError:
        return []
    return [row for entry in entries if (row := row_of(job_id, delivery_id, entry)) is not None]


def row_of(job_id: str, delivery_id: str, entry: dict[str, Any]) -> dict[str, Any] | None:
    """One attempt as a row (None for an entry without its attempt number or time)."""
    try:
        at = datetime.fromisoformat(str(entry["at"]).replace("Z", "+00:00"))
        attempt = int(entry["attempt"])
    except (KeyError, TypeError, ValueError):
        return None
    status = entry.get("status")
    return {"delivery_id": delivery_id, "attempt": attempt, "job_id": job_id, "at": at,
            "seconds": entry.get("seconds"), "status": int(status) if isinstance(status, int) else None,
            "error": entry.get("error")}


def write(connection: Connection, rows: list[dict[str, Any]]) -> None:
    """The rows, in the caller's transaction: each replaces the one of its delivery and attempt."""
    if not rows:
        return
    c = tables.webhook_deliveries.c
    connection.execute(delete(tables.webhook_deliveries).where(or_(
        *(and_(c.delivery_id == row["delivery_id"], c.attempt == row["attempt"]) for row in rows))))
    connection.execute(insert(tables.webhook_deliveries), rows)


def record(engine: Engine | None, job_id: str, delivery_id: str, entry: dict[str, Any]) -> bool:
    """One attempt, written now to the archive (``jobs.archive.reading.engine_for``; None: there
    is none) in its own transaction. The delivery stands whatever the archive says: an archive
    that does not answer is logged, the job's record still holds the attempt, and archiving the
    job writes it. Returns whether it was written."""
    row = row_of(job_id, delivery_id, entry)
    if row is None or engine is None:
        return False
    try:
        with engine.begin() as connection:
            write(connection, [row])
    except SQLAlchemyError as exc:
        log.warning("webhook %s of job %s: attempt %s not written to the archive: %s", delivery_id, job_id,
                    row["attempt"], str(exc).splitlines()[0])
        return False
    return True


def read(engine: Engine | None, job_id: str, delivery_id: str) -> list[dict[str, Any]]:
    """The attempts of one delivery the archive holds, first first, as the record's log shows
    them ([] without an archive)."""
    if engine is None:
        return []
    c = tables.webhook_deliveries.c
    query = (select(c.attempt, c.status, c.at, c.seconds, c.error)
             .where(c.job_id == job_id).where(c.delivery_id == delivery_id).order_by(c.attempt))
    with engine.connect() as connection:
        return [{"attempt": attempt, "status": status, "at": _iso(at), "seconds": seconds, "error": error}
                for attempt, status, at, seconds, error in connection.execute(query)]


def _iso(at: datetime) -> str:
    """As the record's log writes it (jobs.core.clock.iso: UTC, milliseconds, a Z); SQLite
    gives the time back without its zone."""
    at = (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S") + f".{at.microsecond // 1000:03d}Z"
