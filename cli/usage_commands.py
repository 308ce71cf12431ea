"""``leash usage``: what an owner's jobs used and cost, per UTC day, model and kind."""

from __future__ import annotations

import json
import math

import click

from jobs.read.money import money
from jobs.usage.meter import DAYS_KEPT
from jobs.usage.prices import why_no_price
from jobs.usage.report import owner_usage, unpriced_models

from .exit_codes import BadInput
from .failure_commands import DURATION
from .job_commands import acting_owner, owner_option
from .redis_target import connect_checked


def _line(label: str, figures: dict) -> str:
    usage = figures["usage"]
    approx = "~" if usage["estimated"] else ""
    cost = "cost unknown" if figures["cost_usd"] is None else (money(figures["cost_usd"]) if usage["calls"] else "$0")
    return (f"{label:<32} {usage['calls']:>8,} {approx}{usage['input_tokens']:>13,} "
            f"{approx}{usage['output_tokens']:>13,}  {cost}")


@click.command("usage")
@owner_option
@click.option("--since", default="30d", show_default=True, type=DURATION,
              help=f"How far back, in whole UTC days with today counted: 1d, 7d, 2w (at most {DAYS_KEPT}d).")
@click.option("--days", type=click.IntRange(1, DAYS_KEPT), hidden=True, deprecated="use --since 30d")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: the days, each split by model and kind, and the total.")
def usage_command(owner, token, since, days, as_json):
    """Tokens and cost of an owner's jobs per UTC day, split by model and kind
    ("~": the server reported no usage, so the figure is an estimate)."""
    if days is None:
        days = max(1, math.ceil(since / 86400)) if since != float("inf") else DAYS_KEPT
        if days > DAYS_KEPT:
            raise BadInput(f"--since reaches {days} days back; usage is kept {DAYS_KEPT} days")
    owner = acting_owner(owner, token)
    report = owner_usage(connect_checked(), owner, days=days)
    if as_json:
        click.echo(json.dumps(report))
        return
    click.echo(f"{'day / model / kind':<32} {'calls':>8} {'input tokens':>13} {'output tokens':>13}  cost")
    for day in report["days"]:
        click.echo(_line(day["day"], day))
        for part in day["by"]:
            click.echo(_line(f"  {part['model'][:20]} / {part['kind'][:8]}", part))
    click.echo(_line(f"total, last {days} day(s)", report["total"]))
    for model in unpriced_models(report):  # what "cost unknown" means, once per model
        click.echo(f"cost unknown: {why_no_price(model)}")
    if not report["days"]:
        click.echo(f"owner {owner} made no model calls in the last {days} day(s)", err=True)
