"""``leash archive``: the SQL archive of ended jobs (docs/ARCHIVE.md) — its tables migrated, the
jobs already in Redis archived, how far behind it is, what owners spent by month."""

from __future__ import annotations

import json
import sys

import click

from jobs.read.money import money

from . import exit_codes
from .exit_codes import BadInput
from .redis_target import connect_checked


def _engine(connection):
    from jobs.archive import reading

    engine = reading.engine_for(connection)
    if engine is None:
        raise BadInput("no archive: set LEASH_ARCHIVE_URL (or DATABASE_URL); "
                               "`leash dev` archives into a SQLite file of its own")
    return engine


@click.group("archive")
def archive():
    """The SQL archive of ended jobs (LEASH_ARCHIVE_URL, else DATABASE_URL; SQLite under `leash dev`)."""


@archive.command("migrate")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the version applied.")
def migrate(as_json):
    """Create or upgrade the archive's tables (also done by every worker and web process at start)."""
    from sqlalchemy.exc import SQLAlchemyError

    from jobs.archive import database

    url = database.configured_url()
    if url is None:
        raise BadInput("no archive to migrate: set LEASH_ARCHIVE_URL (or DATABASE_URL)")
    try:
        engine = database.engine(url, migrate_first=False)
        version = database.migrate(engine)
    except SQLAlchemyError as exc:
        raise exit_codes.Unreachable(f"cannot migrate the archive: {str(exc).splitlines()[0]}") from None
    click.echo(json.dumps({"version": version}) if as_json else f"archive at version {version}")


@archive.command("backfill")
@click.option("--limit", default=0, type=click.IntRange(0), help="Archive at most this many jobs now (0: all).")
@click.option("--json", "as_json", is_flag=True, help='One JSON object: {"in_redis": ..., "archived": ...}.')
def backfill(limit, as_json):
    """Archive every ended job Redis holds (after an upgrade). Resumable: stop it and run it again;
    a job is archived once."""
    from sqlalchemy.exc import SQLAlchemyError

    from jobs import keys
    from jobs.archive import sweep

    connection = connect_checked()
    _engine(connection)
    noted = sweep.backfill(connection)
    written = 0
    try:
        while connection.zcard(keys.ARCHIVE_DUE) and not (limit and written >= limit):
            written += sweep.sweep(connection, limit=200, budget=30.0)
    except SQLAlchemyError as exc:
        raise exit_codes.Unreachable(f"archive unreachable after {written} job(s): {str(exc).splitlines()[0]}; "
                                     "run it again") from None
    click.echo(json.dumps({"in_redis": noted, "archived": written}) if as_json
               else f"{noted} ended job(s) in Redis, {written} archived now")


@archive.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def status(as_json):
    """How far behind the archive is: ended jobs waiting, the oldest's wait, the last error."""
    from jobs.archive import pending

    connection = connect_checked()
    behind = pending.behind(connection)
    if as_json:
        click.echo(json.dumps(behind))
    else:
        click.echo(f"{behind['waiting']} ended job(s) waiting, the oldest for {behind['oldest_seconds']:.0f} s"
                   + (f"; last error: {behind['error']}" if behind["error"] else ""))
    sys.exit(exit_codes.FAILED if behind["error"] else exit_codes.OK)


@archive.command("months")
@click.option("--owner", default=None, help="One owner only.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array: owner, month, jobs, calls, tokens, cost.")
def months(owner, as_json):
    """Jobs, calls, tokens and cost per owner and month their jobs ended, from the archive."""
    from jobs.archive import reading

    connection = connect_checked()
    _engine(connection)
    found = reading.months(owner, connection=connection)
    if as_json:
        click.echo(json.dumps(found))
        return
    click.echo(f"{'month':<8} {'owner':<24} {'jobs':>6} {'calls':>8} {'input tokens':>13} {'output tokens':>13}  cost")
    for row in found:
        cost = money(row["cost_usd"])
        click.echo(f"{row['month']:<8} {row['owner'][:24]:<24} {row['jobs']:>6} {row['calls']:>8,} "
                   f"{row['input_tokens']:>13,} {row['output_tokens']:>13,}  {cost}")
