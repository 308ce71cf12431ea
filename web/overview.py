"""GET /overview: how the queue is doing, as charts — queue depth now, the caller's jobs and
failures per hour over the last day.

Charts are a list: each is drawn here from data Redis already holds. Tokens and cost per day
belong here once usage is recorded per owner and day; until then no chart of them is drawn,
because an empty or made-up usage chart would read as a fact.
"""

from __future__ import annotations

from datetime import UTC, datetime

from flask import Blueprint, make_response, render_template

from jobs import overview

from . import charts
from .auth import Need, browser_owner
from .reads import redis_conn

bp = Blueprint("overview", __name__)


def _hour(start: float) -> str:
    begin = datetime.fromtimestamp(start, UTC)
    return f"{begin:%H}:00–{(begin.hour + 1) % 24:02d}:00 UTC"


def overview_charts(connection, owner: str) -> list[charts.Chart]:
    depths = overview.queue_depths(connection)
    hourly = overview.hourly(connection, owner)
    hours = [_hour(start) for start in hourly.starts]
    names = [f"{d.queue}: waiting" for d in depths] + [f"{d.queue}: retrying" for d in depths]
    values = [d.waiting for d in depths] + [d.retrying for d in depths]
    return [
        charts.Chart("queue-depth", "Queue depth now", charts.bars("Jobs waiting per queue", names, values, "depth"),
                     "All owners' jobs: waiting for a worker, and waiting for a retry."),
        charts.Chart("jobs-per-hour", "Your jobs per hour",
                     charts.bars("Jobs submitted per hour, last 24 hours", hours, hourly.submitted, "jobs",
                                 tick_every=6),
                     f"{sum(hourly.submitted)} submitted in the last 24 hours (UTC hours)."),
        charts.Chart("failures-per-hour", "Your failures per hour",
                     charts.bars("Jobs failed per hour, last 24 hours", hours, hourly.failed, "failures",
                                 tick_every=6),
                     f"{sum(hourly.failed)} failed in the last 24 hours; canceled jobs are not failures."),
        # Tokens and cost per day: append its Chart here, drawn from the recorded usage.
    ]


@bp.get("/overview")
def overview_page():
    owner = browser_owner(Need.LIST)
    response = make_response(render_template("overview.html", charts=overview_charts(redis_conn(), owner)))
    response.headers["Cache-Control"] = "no-cache, private"
    response.vary.update(("Cookie",))
    return response
