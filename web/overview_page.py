"""GET /overview: how the queue is doing — now: the workers (busy or idle, since when, on which
of the caller's jobs), the caller's running jobs and the items a minute they get through; as
charts: queue depth, the caller's jobs and failures per hour over the last day, and the tokens
the caller's jobs used per UTC day over the last two weeks, with a table of what each day cost.
The page reloads itself every REFRESH_SECONDS (a meta refresh: no JavaScript needed).

Charts are a list: each is drawn here from data Redis already holds (usage: the owner's daily
totals that every item write adds to, jobs/usage/report.py).
"""

from __future__ import annotations

from datetime import UTC, datetime

from flask import Blueprint, make_response, render_template

from jobs.core import clock, deferrals, switches
from jobs.read import fleet, humane, money, overview
from jobs.usage.report import cost_text, days_back, owner_usage, unpriced_models

from . import charts
from .auth import Need, browser_owner
from .operator_api import is_operator
from .reads import redis_conn

bp = Blueprint("overview", __name__)


def _hour(start: float) -> str:
    begin = datetime.fromtimestamp(start, UTC)
    return f"{begin:%H}:00–{(begin.hour + 1) % 24:02d}:00 UTC"


def overview_charts(connection, owner: str) -> list[charts.Chart]:
    depths = overview.queue_depths(connection)
    hourly = overview.hourly(connection, owner)
    hours = [_hour(start) for start in hourly.starts]
    names = ([f"{d.queue}: waiting" for d in depths] + [f"{d.queue}: retrying" for d in depths]
             + [f"{d.queue}: at provider" for d in depths])
    values = [d.waiting for d in depths] + [d.retrying for d in depths] + [d.at_provider for d in depths]
    return [
        charts.Chart("queue-depth", "Queue depth now", charts.bars("Jobs waiting per queue", names, values, "depth"),
                     "All owners' jobs: waiting for a worker, waiting for a retry, and batch jobs waiting at "
                     "their provider (no worker held)."),
        charts.Chart("jobs-per-hour", "Your jobs per hour",
                     charts.bars("Jobs submitted per hour, last 24 hours", hours, hourly.submitted, "jobs",
                                 tick_every=6),
                     f"{sum(hourly.submitted)} submitted in the last 24 hours (UTC hours)."),
        charts.Chart("failures-per-hour", "Your failures per hour",
                     charts.bars("Jobs failed per hour, last 24 hours", hours, hourly.failed, "failures",
                                 tick_every=6),
                     f"{sum(hourly.failed)} failed in the last 24 hours; canceled jobs are not failures."),
        charts.Chart("item-errors-per-hour", "Your jobs with item errors per hour",
                     charts.bars("Jobs that succeeded with item errors per hour, last 24 hours", hours,
                                 hourly.item_errors, "jobs", tick_every=6),
                     f"{sum(hourly.item_errors)} succeeded with item errors in the last 24 hours: some items hold "
                     "an error instead of an answer."),
        _tokens_per_day(connection, owner),
    ]


#: Days of usage the overview draws.
USAGE_DAYS = 14


def _tokens_per_day(connection, owner: str) -> charts.Chart:
    report = owner_usage(connection, owner, days=USAGE_DAYS)
    by_day = {day["day"]: day for day in report["days"]}
    days = list(reversed(days_back(USAGE_DAYS)))
    tokens = [by_day[d]["usage"]["input_tokens"] + by_day[d]["usage"]["output_tokens"] if d in by_day else 0
              for d in days]
    total = report["total"]
    calls = total["usage"]["calls"]
    cost = cost_text(total["cost_usd"], calls, unpriced_models(report))
    return charts.Chart(
        "tokens-per-day", "Your tokens per day",
        charts.bars(f"Tokens used per UTC day, last {USAGE_DAYS} days", [d[5:] for d in days], tokens, "tokens",
                    tick_every=2, unit="tokens"),
        f"{sum(tokens):,} tokens in {calls:,} model calls over the last {USAGE_DAYS} days, "
        f"{cost}" + ("; ~ some figures are estimates" if total["usage"]["estimated"] else "")
        + " (per model and kind: GET /usage, leash usage).")


#: How often the overview reloads itself.
REFRESH_SECONDS = 10


def cost_per_day(connection, owner: str) -> list[dict]:
    """The days of the last USAGE_DAYS with model calls, newest first: calls, tokens, cost."""
    report = owner_usage(connection, owner, days=USAGE_DAYS)
    return [{"day": day["day"], "calls": day["usage"]["calls"],
             "tokens": day["usage"]["input_tokens"] + day["usage"]["output_tokens"],
             "estimated": day["usage"]["estimated"], "cost": money.money(day["cost_usd"])} for day in report["days"]]


def _provider_wait(connection) -> dict | None:
    count, since = deferrals.oldest(connection, "provider")
    return {"count": count, "since": clock.iso(since)} if count and since else None


@bp.get("/overview")
def overview_page():
    owner = browser_owner(Need.LIST)
    connection = redis_conn()
    operator = is_operator()  # the dashboard's operator: the queues' and workers' buttons
    response = make_response(render_template(
        "overview.html", charts=overview_charts(connection, owner), workers=overview.workers(connection, owner),
        running=overview.running(connection, owner), days=cost_per_day(connection, owner),
        paused={queue: clock.iso(since) for queue, since in switches.paused(connection).items()},
        provider_wait=_provider_wait(connection),
        operator=operator, queues=fleet.queues(connection) if operator else [],
        quiet=switches.quiet_workers(connection),
        refresh=REFRESH_SECONDS, ago=humane.relative, money_cell=money.cost_cell, utc=humane.utc,
        now=humane.utc(clock.iso(clock.wall()))))
    response.headers["Cache-Control"] = "no-cache, private"
    response.vary.update(("Cookie",))
    return response
