"""Reading the archive: a job's items a page at a time (or streamed, a page per query), its
submitted items and payload, its row (whole, or as Redis held it: ``ended_job``), and what owners
spent by month (and by kind in a month)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from jobs.archive import USAGE_DAYS_KEPT, database, tables
from jobs.errors import ArchiveUnreachable
from jobs.usage.meter import days_kept


def engine_for(connection) -> Any:
    """The archive a reader of ``connection``'s jobs uses: the configured one, else the one of the
    ``leash dev`` whose Redis it is (the command line marks its connection so)."""
    return database.engine_for(connection)


def usage_days_kept(connection=None, archive_url: str | None = None) -> int:
    """Days back an owner's daily usage can be read from Redis: 40 where an archive keeps the
    months (``month_by_kind``), else the LEASH_USAGE_DAYS_KEPT (400) the usage ledger gives them.
    The archive: the configured one, else ``archive_url`` or the one ``connection`` is marked with
    (a ``leash dev``'s own, whose workers archive with it)."""
    archived = database.configured_url() or archive_url or getattr(connection, "leash_archive_url", None)
    return min(USAGE_DAYS_KEPT, days_kept()) if archived else days_kept()


def could_hold(job_id: str) -> bool:
    """Whether the archive could hold a job of this id: PostgreSQL's text cannot hold a NUL
    character, and refuses a query naming one, which would read as the archive not answering
    (a 503 to retry) where the answer is the 404 an unknown id gets."""
    return "\x00" not in job_id


def page(job_id: str, offset: int, limit: int, connection=None) -> list[tuple[int, Any, str | None, str | None]]:
    """(index, input item, raw result JSON or None, raw usage or None) of ``[offset, offset+limit)``."""
    engine = engine_for(connection)
    if engine is None or not could_hold(job_id):
        return []
    c = tables.items.c
    query = (select(c.idx, c.item, c.result, c.usage).where(c.job_id == job_id)
             .where(c.idx >= offset).where(c.idx < offset + limit).order_by(c.idx))
    with engine.connect() as connection:
        return [(idx, None if item is None else json.loads(item), result, usage)
                for idx, item, result, usage in connection.execute(query)]


def job(job_id: str, connection=None) -> dict | None:
    """The job's archived row (None when the archive does not hold it)."""
    engine = engine_for(connection)
    if engine is None or not could_hold(job_id):
        return None
    with engine.connect() as connection:
        row = connection.execute(select(tables.jobs).where(tables.jobs.c.job_id == job_id)).mappings().first()
    return dict(row) if row else None


@dataclass
class EndedJob:
    """An ended job as its archived row keeps what Redis held of it: its record (the job hash,
    text to text), its error and attempt history (the lists' raw entries), its estimate (JSON
    text) and its payload without the items."""

    job_id: str
    owner: str
    record: dict[str, str]
    errors: list[str]
    history: list[str]
    estimate: str | None
    payload: dict | None
    archived_at: float  # when it was archived (unix seconds)


def ended_job(job_id: str, connection=None) -> EndedJob | None:
    """The job as Redis held it when it was archived, in one query (None: no archive, or it does
    not hold the job). For reads once Redis no longer holds the job's record; ``ArchiveUnreachable``
    while the archive does not answer (the job may be there: "no such job" would be a guess)."""
    try:
        row = job(job_id, connection)
    except SQLAlchemyError:  # its words (addresses, the engine's) are the operator's: `leash archive status`
        raise ArchiveUnreachable(f"Redis no longer holds job {job_id} and the archive did not answer; "
                                 "try again once it is back") from None
    if row is None:
        return None
    return EndedJob(job_id=job_id, owner=row["owner"], record=json.loads(row["record"]),
                    errors=json.loads(row["errors"] or "[]"), history=json.loads(row["history"] or "[]"),
                    estimate=row["estimate"], payload=json.loads(row["payload"]) if row["payload"] else None,
                    # SQLite gives the time back without its zone: UTC, as it was written
                    archived_at=(at if (at := row["archived_at"]).tzinfo else at.replace(tzinfo=UTC)).timestamp())


def payload(job_id: str, connection=None, with_items: bool = True) -> dict | None:
    """The payload as submitted, its items too unless ``with_items`` is False (None when the
    archive does not hold the job)."""
    row = job(job_id, connection)
    if row is None:
        return None
    found = json.loads(row["payload"]) if row["payload"] else {}
    if with_items:
        found["items"] = [item for _, item, _, _ in page(job_id, 0, 1 << 30, connection)]
    return found


def months(owner: str | None = None, month: str | None = None, connection=None) -> list[dict]:
    """Jobs, calls, tokens and cost by owner and month of their end, newest month first."""
    engine = engine_for(connection)
    if engine is None:
        return []
    c = tables.jobs.c
    query = (select(c.owner, c.ended_month, func.count(), func.sum(c.calls), func.sum(c.input_tokens),
                    func.sum(c.output_tokens), func.sum(c.cost_usd), func.count(c.cost_usd))
             .group_by(c.owner, c.ended_month).order_by(c.ended_month.desc(), c.owner))
    if owner is not None:
        query = query.where(c.owner == owner)
    if month is not None:
        query = query.where(c.ended_month == month)
    with engine.connect() as connection:
        return [{"owner": o, "month": m, "jobs": n, "calls": int(calls or 0), "input_tokens": int(i or 0),
                 "output_tokens": int(out or 0),
                 # Unknown when any job's cost is: a partial sum shown as the cost would be a guess.
                 "cost_usd": round(cost or 0.0, 6) if priced == n else None}
                for o, m, n, calls, i, out, cost, priced in connection.execute(query)]


def month_by_kind(owner: str, month: str, connection=None) -> list[dict]:
    """An owner's jobs that ended in ``month`` (YYYY-MM), by kind: jobs, calls, tokens and cost
    (the cost None when any of those jobs' is unknown)."""
    engine = engine_for(connection)
    if engine is None:
        return []
    c = tables.jobs.c
    query = (select(c.kind, func.count(), func.sum(c.calls), func.sum(c.input_tokens), func.sum(c.output_tokens),
                    func.sum(c.cost_usd), func.count(c.cost_usd))
             .where(c.owner == owner).where(c.ended_month == month).group_by(c.kind).order_by(c.kind))
    with engine.connect() as connection:
        return [{"kind": kind, "jobs": n, "calls": int(calls or 0), "input_tokens": int(i or 0),
                 "output_tokens": int(out or 0), "cost_usd": round(cost or 0.0, 6) if priced == n else None}
                for kind, n, calls, i, out, cost, priced in connection.execute(query)]
