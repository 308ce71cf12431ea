"""The overview page: queue depth now, the caller's jobs and failures per hour, drawn as SVG
on the server (no script), from what Redis holds, and the tokens the owner's jobs used per day."""

from __future__ import annotations

import re

from jobs.core import clock, control, lease
from jobs.enqueue import enqueue
from jobs.read import overview
from tests.web_support import HTML

CLASSIFY = {"items": ["x"], "labels": ["a", "b"]}


def bar_values(html: str, chart_id: str) -> list[int]:
    section = re.search(rf'<section class="chart-card" id="{chart_id}">(.*?)</section>', html, re.S)
    assert section, chart_id
    return [int(v) for v in re.findall(r'<rect class="bar"[^>]* data-value="(\d+)"', section.group(1))]


def test_the_overview_counts_jobs_and_failures_per_hour_and_the_queue_depth(client, conn):
    now = clock.wall()
    two_hours_ago = now - 2 * 3600
    old, _ = enqueue(conn, "classify", CLASSIFY, owner="shared", now=two_hours_ago)
    failing, _ = enqueue(conn, "classify", CLASSIFY, owner="shared")
    canceled, _ = enqueue(conn, "classify", CLASSIFY, owner="shared")
    enqueue(conn, "classify", CLASSIFY, owner="someone-else")
    lease.claim(conn, failing, "leash", "w").fail("RuntimeError: boom", permanent=True)
    control.cancel(conn, canceled)

    hourly = overview.hourly(conn, "shared", now=now)
    assert len(hourly.submitted) == 24 and hourly.submitted[-1] == 2 and hourly.submitted[-3] == 1
    assert sum(hourly.failed) == 1 and hourly.failed[-1] == 1, "a cancel is not a failure"

    response = client.get("/overview", headers=HTML)
    assert response.status_code == 200
    html = response.data.decode()
    assert bar_values(html, "jobs-per-hour") == hourly.submitted
    assert bar_values(html, "failures-per-hour") == hourly.failed
    # Queue depth is RQ's list, every owner's: the canceled job left it; the failing one was
    # claimed here without a worker's dequeue, so RQ still lists it.
    [depth] = overview.queue_depths(conn)
    assert bar_values(html, "queue-depth") == [depth.waiting, depth.retrying, depth.at_provider] == [3, 0, 0]
    assert "<script" not in html.split("<main")[1], "charts need no JavaScript"
    assert 'role="img" aria-label="Jobs submitted per hour, last 24 hours"' in html
    assert bar_values(html, "tokens-per-day") == [0] * 14, "no model calls: zero tokens, not a made-up figure"


def test_the_overview_is_per_owner(client, conn):
    enqueue(conn, "classify", CLASSIFY, owner="someone-else")
    html = client.get("/overview", headers=HTML).data.decode()
    assert sum(bar_values(html, "jobs-per-hour")) == 0


def test_the_overview_draws_the_owners_tokens_per_day_and_what_they_cost(client, conn, env):
    from jobs.usage.meter import Pending

    env.setenv("LEASH_MODEL_PRICES", '{"m": {"input": 1, "output": 2}}')
    job_id, _ = enqueue(conn, "classify", CLASSIFY, owner="shared")
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, '"a"'), usage=Pending("m", "classify", calls=3, input=1000, output=234,
                                                   nusd=1_468_000))
    other, _ = enqueue(conn, "classify", CLASSIFY, owner="someone-else")
    lease.claim(conn, other, "leash", "w").heartbeat(item=(0, '"a"'), usage=Pending("m", "classify", calls=1,
                                                                                   input=99, output=1))
    html = client.get("/overview", headers=HTML).data.decode()
    assert bar_values(html, "tokens-per-day") == [0] * 13 + [1234]
    assert "1,234 tokens in 3 model calls over the last 14 days, $0.001468" in html
