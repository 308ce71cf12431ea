"""``leash usage``: what an owner's jobs used and cost, per UTC day, model and kind (Redis keeps
the days: LEASH_USAGE_DAYS_KEPT of them, 400 unless set, 40 with an archive), or in one month by
kind (``--month``: the archive's ended jobs, kept as long as LEASH_RESULT_TTL)."""

from __future__ import annotations

import json
import math
import re

import click
from sqlalchemy.exc import SQLAlchemyError

from jobs.archive import reading
from jobs.read.money import money
from jobs.usage.meter import days_kept
from jobs.usage.prices import why_no_price
from jobs.usage.report import owner_usage, unpriced_models

from .acting import acting_owner, owner_option
from .exit_codes import BadInput, Unreachable
from .failure_commands import DURATION
from .redis_target import connect_checked, dev_archive_url

MONTH = re.compile(r"\d{4}-(0[1-9]|1[0-2])")


def _line(label: str, figures: dict) -> str:
    usage = figures["usage"]
    approx = "~" if usage["estimated"] else ""
    cost = "cost unknown" if figures["cost_usd"] is None else (money(figures["cost_usd"]) if usage["calls"] else "$0")
    return (f"{label:<32} {usage['calls']:>8,} {approx}{usage['input_tokens']:>13,} "
            f"{approx}{usage['output_tokens']:>13,} {usage['cache_hits']:>12,}  {cost}")


@click.command("usage")
@owner_option
@click.option("--since", default="30d", show_default=True, type=DURATION,
              help="How far back, in whole UTC days with today counted: 1d, 7d, 2w (at most "
                   "LEASH_USAGE_DAYS_KEPT, 400 days unless set; 40 with an archive).")
@click.option("--days", type=click.IntRange(1), hidden=True, deprecated="use --since 30d")
@click.option("--month", metavar="YYYY-MM",
              help="One UTC month from the archive: the owner's jobs that ended in it, by kind, and their cost.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: the days, each split by model and kind, and the total.")
def usage_command(owner, token, since, days, month, as_json):
    """Tokens and cost of an owner's jobs per UTC day, split by model and kind
    ("~": the server reported no usage, so the figure is an estimate; "cache (free)": requests
    the request cache answered, no call, no cost), or with --month a month's ended jobs by kind,
    from the archive."""
    # LEASH_USAGE_DAYS_KEPT, or 40 with an archive (configured, or `leash dev`'s own): it keeps the months
    kept = reading.usage_days_kept(archive_url=dev_archive_url())
    if days is None:
        days = max(1, math.ceil(since / 86400)) if since != float("inf") else kept
    if days > kept:
        raise BadInput(f"--since reaches {days} days back; usage per day is kept {kept} days"
                       + (" (older months: --month YYYY-MM reads the archive)" if kept < days_kept()
                          else " (LEASH_USAGE_DAYS_KEPT)"))
    owner = acting_owner(owner, token)
    if month is not None:
        _month(owner, month, as_json)
        return
    report = owner_usage(connect_checked(), owner, days=days)
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(f"{'day / model / kind':<32} {'calls':>8} {'input tokens':>13} {'output tokens':>13} "
               f"{'cache (free)':>12}  cost")
    for day in report["days"]:
        click.echo(_line(day["day"], day))
        for part in day["by"]:
            click.echo(_line(f"  {part['model'][:20]} / {part['kind'][:8]}", part))
    click.echo(_line(f"total, last {days} day(s)", report["total"]))
    for model in unpriced_models(report):  # what "cost unknown" means, once per model
        click.echo(f"cost unknown: {why_no_price(model)}")
    if not report["days"]:
        click.echo(f"owner {owner} made no model calls in the last {days} day(s)", err=True)


def _month(owner: str, month: str, as_json: bool) -> None:
    if not MONTH.fullmatch(month):
        raise BadInput(f"--month takes a month as YYYY-MM (such as 2026-12), got {month!r}")
    conn = connect_checked()
    try:
        if reading.engine_for(conn) is None:
            raise BadInput("no archive: set DATABASE_URL or LEASH_ARCHIVE_URL (docs/ARCHIVE.md); "
                           "without one, leash usage --since reads what Redis keeps")
        kinds = reading.month_by_kind(owner, month, conn)
    except SQLAlchemyError as exc:
        raise Unreachable(f"the archive did not answer: {str(exc).splitlines()[0]}") from None
    priced = all(k["cost_usd"] is not None for k in kinds)
    total = {name: sum(k[name] for k in kinds) for name in ("jobs", "calls", "input_tokens", "output_tokens")}
    total["cost_usd"] = round(sum(k["cost_usd"] for k in kinds), 6) if priced else None
    if as_json:
        click.echo(json.dumps({"owner": owner, "month": month, "by_kind": kinds, "total": total}))
        return
    click.echo(f"{'jobs ended in ' + month + ' / kind':<32} {'jobs':>6} {'calls':>8} {'input tokens':>13} "
               f"{'output tokens':>13}  cost")
    for row in [*kinds, {"kind": "total", **total}]:
        cost = "cost unknown" if row["cost_usd"] is None else money(row["cost_usd"]) if row["calls"] else "$0"
        click.echo(f"{row['kind'][:32]:<32} {row['jobs']:>6,} {row['calls']:>8,} {row['input_tokens']:>13,} "
                   f"{row['output_tokens']:>13,}  {cost}")
    if not kinds:
        click.echo(f"owner {owner} has no archived job that ended in {month}", err=True)
