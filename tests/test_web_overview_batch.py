"""The overview names a batch job waiting at its provider as such (not "running 0/2, 0 items a
minute", and not a retry in the queue-depth chart); chart axes keep their labels inside the
chart, in short figures; rq-dashboard's pages carry a way back to leash."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from rq.job import Job
from rq.serializers import JSONSerializer

from jobs import keys
from jobs.core import lease
from jobs.core.rq_side import rq_queue
from jobs.enqueue import enqueue
from jobs.read import overview
from tests.web_support import HTML, create_app_with, csrf_from
from web import charts


def waiting_at_provider(conn, owner: str = "shared") -> str:
    """A job parked as a batch job is while its provider works: its next look an hour away, its
    RQ job scheduled for that look."""
    job_id, _ = enqueue(conn, "count", {"items": ["a", "b"]}, owner=owner)
    conn.hset(keys.job(job_id), "mode", "batch")
    look_at = time.time() + 3600
    assert lease.claim(conn, job_id, "leash", "w").park(look_at, (0, 0, 2, 1)) == 1
    conn.lrem(keys.rq_queue("leash"), 0, job_id)
    job = Job.fetch(job_id, connection=conn, serializer=JSONSerializer)
    rq_queue(conn, "leash").schedule_job(job, datetime.fromtimestamp(look_at, UTC))
    return job_id


def test_a_batch_job_at_its_provider_is_named_so_and_is_no_retry(client, conn):
    job_id = waiting_at_provider(conn)
    [depth] = overview.queue_depths(conn)
    assert (depth.retrying, depth.at_provider) == (0, 1)
    running = overview.running(conn, "shared")
    assert (running.total, running.at_provider) == (1, 1)
    html = client.get("/overview", headers=HTML).data.decode()
    assert '<strong id="running-count">0</strong> of your jobs running on a worker' in html
    assert '<strong id="at-provider-count">1</strong> batch job waiting at the provider' in html
    row = re.search(rf'<tr>\s*<td data-label="Job"><a href="/jobs/{job_id}">.*?</tr>', html, re.S).group(0)
    assert "waiting at the provider" in row and "0/2" not in row and "<progress" not in row
    assert "leash: at provider" in html and "leash: retrying: 0 jobs" in html


def test_axis_labels_are_short_figures_kept_inside_the_chart():
    assert [charts.short(v) for v in (0, 50, 2500, 200_000, 1_500_000)] == ["0", "50", "2.5k", "200k", "1.5M"]
    svg = str(charts.bars("tokens", [f"12-{d:02d}" for d in range(1, 15)], [0] * 13 + [180_000], "tokens",
                          tick_every=2, unit="tokens"))
    for x, anchor, text in re.findall(r'<text class="axis" x="([\d.]+)" y="[\d.]+" text-anchor="(\w+)">([^<]*)<',
                                      svg):
        width = charts.CHAR_WIDTH * len(text)
        left = {"end": float(x) - width, "middle": float(x) - width / 2, "start": float(x)}[anchor]
        assert 0 <= left and left + width <= charts.WIDTH, (text, x, anchor)
    assert ">200k<" in svg and ">100k<" in svg


def test_rq_dashboard_pages_lead_back_to_leash(conn):
    client = create_app_with(LEASH_DEV=True).test_client()
    page = client.get("/rq/").data.decode()
    assert '<a href="/overview">&larr; Back to leash</a>' in page and '<a href="/failures">Failures</a>' in page
    assert page.index('class="leash-back"') < page.index('id="navbar-dashboard"')


def test_after_look_now_the_page_says_now_once_and_no_later_time(app, conn):
    browser = app.test_client()
    token = csrf_from(browser.get("/", headers=HTML).data)
    job_id = waiting_at_provider(conn)
    before = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    assert "leash looks next at" in before and 'id="look-now"' in before
    asked = browser.post(f"/jobs/{job_id}/look", data={"csrf_token": token}, headers=HTML)
    assert asked.status_code == 303
    after = browser.get(asked.headers["Location"], headers=HTML).data.decode()
    assert "now: a worker looks within seconds" in after
    assert "leash looks next at" not in after and "a worker looks within seconds (no worker held)" in after
