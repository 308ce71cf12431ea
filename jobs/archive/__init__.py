"""The archive: every ended job, whole, in SQL — SQLite for ``leash dev`` (a file beside its Redis
data), PostgreSQL in a deploy (LEASH_ARCHIVE_URL, else DATABASE_URL) — queryable for as long as
LEASH_RESULT_TTL, while Redis keeps live work.

    a job ends ──▶ noted due (pending.note_ended: the one call at the end, from retention.retain)
                     │
    a worker's tick ─▶ sweep.tick ─▶ writing.archive_one: its row and items in one transaction,
                     │               then archived_v1 in Redis: the heavy keys (items, answers,
                     │               usage, payload, RQ's record) leave after LEASH_REDIS_KEEP
                     ▼
    reads ──▶ Redis while it holds the items, else reading.* from the archive

    tables.py   the schema (leash_jobs, leash_items, leash_answers); migrations/ its Alembic versions
    database.py the engine, migrations run by ``leash archive migrate`` and before first use
    restore.py  an archived failed job's payload, results and usage back in Redis for a replay
    answers.py  the request cache's answers unused in Redis for the keep time, served from SQL
Without an archive nothing changes: results stay in Redis for LEASH_RESULT_TTL.
"""

#: Days an owner's daily usage stays in Redis once the jobs of those days are archived (writing.py
#: shortens the LEASH_USAGE_DAYS_KEPT days jobs.usage.meter gives them): the archive keeps the months.
USAGE_DAYS_KEPT = 40
