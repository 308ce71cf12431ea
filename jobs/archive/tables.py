"""The archive's tables: one schema for SQLite and PostgreSQL, every name ``leash_*`` (a deploy's
database is often the app's too). Changed only by a migration in migrations/versions/.

    leash_jobs    one row per ended job: who, what, how it ended (``state``: succeeded, failed or
                  canceled; ``item_errors`` of a succeeded job), its error text, attempts, usage
                  and cost, the month and day it ended (plain text, so the same SQL groups by
                  them on both engines), and what reads need to show it as Redis did (its record,
                  error and attempt history, usage, estimate and payload, as JSON text)
    leash_items   one row per item: its input, its result or item error, its calls and tokens
    leash_answers the request cache's answers that left Redis, by entry (its scope and request
                  digest), with their last use (kept LEASH_CACHE_DAYS from it)
    leash_webhook_deliveries  every attempt of a job's completion webhook, by delivery id and
                  attempt: when, how long, the HTTP status, the error (jobs/archive/webhook_log.py)
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

jobs = Table(
    "leash_jobs", metadata,
    Column("job_id", String(64), primary_key=True),
    Column("kind", String(100), nullable=False),
    Column("owner", String(200), nullable=False),
    Column("name", String(200)),
    Column("queue", String(100)),
    Column("state", String(20), nullable=False),
    Column("error", Text),
    Column("done", Integer, nullable=False),
    Column("total", Integer, nullable=False),
    Column("item_errors", Integer, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True)),
    Column("ended_at", DateTime(timezone=True), nullable=False),
    Column("ended_month", String(7), nullable=False),
    Column("ended_day", String(10), nullable=False),
    Column("archived_at", DateTime(timezone=True), nullable=False),
    Column("calls", BigInteger, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cost_usd", Float),
    Column("record", Text, nullable=False),
    Column("errors", Text, nullable=False),
    Column("history", Text, nullable=False),
    Column("usage", Text, nullable=False),
    Column("estimate", Text),
    Column("payload", Text),
    Index("leash_jobs_owner_ended", "owner", "ended_at"),
    Index("leash_jobs_state_kind", "state", "kind"),
    Index("leash_jobs_ended", "ended_at"),
)

items = Table(
    "leash_items", metadata,
    Column("job_id", String(64), primary_key=True),
    Column("idx", Integer, primary_key=True, autoincrement=False),
    Column("item", Text),
    Column("result", Text),
    Column("error", Text),
    Column("usage", String(100)),
)

answers = Table(
    "leash_answers", metadata,
    Column("entry", String(300), primary_key=True),
    Column("answer", Text, nullable=False),
    Column("used_at", DateTime(timezone=True), nullable=False),
    Index("leash_answers_used", "used_at"),
)

webhook_deliveries = Table(
    "leash_webhook_deliveries", metadata,
    Column("delivery_id", String(200), primary_key=True),
    Column("attempt", Integer, primary_key=True, autoincrement=False),
    Column("job_id", String(64), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("seconds", Float),
    Column("status", Integer),
    Column("error", Text),
    Index("leash_webhook_deliveries_job", "job_id"),
    Index("leash_webhook_deliveries_at", "at"),
)
