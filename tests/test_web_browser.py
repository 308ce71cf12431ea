"""In a real browser (headless Chromium driven by Playwright) against the real web server and real
``leash worker`` processes: submit the form with 20 items, watch the progress bar move, kill
the worker mid-job and see the stale badge, then see the job finish after another worker
reclaims it — in a page with JavaScript and in one without.

Chromium comes from Debian (``apt-get install -y chromium``) or ``LEASH_CHROMIUM``. In CI
(``CI`` set, as ``.ci/run`` runs) or with ``LEASH_REQUIRE_BROWSER=1`` a missing browser FAILS
the run; on a developer's machine without one these tests are reported as skipped, with the
reason, so the README's test command still works on a machine that has only Python. One
browser serves every browser test of the run (the ``chromium`` fixture in tests/web_support.py);
each test opens its own contexts, closed after it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.error
import urllib.request

import pytest

from jobs import keys
from jobs.core import states
from tests.conftest import ROOT, wait_for
from tests.web_support import CLASSIFY

pytestmark = pytest.mark.slow

SCREENSHOT = ROOT / "docs" / "screenshot-job.png"
#: The screenshot in docs/WEB.md is rewritten only on request, so a test run leaves the tree clean.
UPDATE_SCREENSHOT = os.environ.get("LEASH_UPDATE_SCREENSHOT") == "1"
ITEMS = [
    "Great service, thanks for the quick reply", "The app crashes every time I open settings",
    "Terrible experience, I want a refund", "Love the new dashboard design",
    "How do I export my data?", "Delivery was slow and the box was broken",
    "Excellent support from Maria", "Why was I charged twice this month?",
    "Perfect, works exactly as described", "Awful update, everything is slower now",
    "Nice touch with the dark mode", "The invoice page shows the wrong total",
    "Happy with the purchase", "Worst onboarding I have seen",
    "Where can I change my password?", "Fast shipping, great packaging",
    "Login fails with an unknown error", "Thanks, the fix worked",
    "Poor quality, returned it", "Awesome team, keep it up",
]
ITEM_DELAY_MS = "400"  # 20 items take about 8 s on one worker


def _progress(page) -> tuple[int, int]:
    return tuple(int(v) for v in page.eval_on_selector("#progress", "el => [el.value, el.max]"))


def test_the_job_page_follows_a_job_through_a_worker_kill_to_its_results(conn, workers, web_server, chromium):
    # One item at a time: the job lasts long enough to watch its bar move and kill its worker.
    env = {"LEASH_LOCAL_DELAY_MS": ITEM_DELAY_MS, "LEASH_ITEM_CONCURRENCY": "1"}
    server = web_server(extra_env=env)
    first = workers.start("--no-scheduler", extra_env=env)

    context = chromium.new_context(viewport={"width": 1100, "height": 900})
    page = context.new_page()
    poll_requests = []
    # The status polls (JSON); the page's HTML fetched after a change is not a poll. Their times
    # are read from the browser's own record at the end: the moment this process hears of a
    # request depends on when Playwright's sync API delivers events, not on when it was sent.
    page.on("request", lambda r: poll_requests.append(r)
            if r.resource_type == "fetch" and re.search(r"/jobs/[\w-]+$", r.url)
            and r.headers.get("accept") == "application/json" else None)

    page.goto(server.url + "/")
    page.select_option("#kind", "classify")
    page.fill("#labels", "positive, negative, question, bug")
    page.fill("#items", "\n".join(ITEMS))
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/jobs/[\w-]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    assert "of 20 items" in page.inner_text("#progress-text") or _progress(page)[1] == 20

    # The same job in a browser without JavaScript (same session cookie): it refreshes itself.
    no_js = chromium.new_context(java_script_enabled=False)
    no_js.add_cookies(context.cookies())
    static_page = no_js.new_page()
    static_page.goto(server.url + f"/jobs/{job_id}")
    assert static_page.locator('noscript').count() == 1

    # The bar moves: several distinct values between 0 and 20, each read from the page.
    seen: set[int] = set()

    def moved():
        done, total = _progress(page)
        assert total == 20
        if 0 < done < 20:
            seen.add(done)
        return len(seen) >= 2

    wait_for(moved, 20, interval=0.1, message="the progress bar to move")
    horse = workers.horse(first)
    os.kill(first.pid, signal.SIGKILL)
    os.kill(horse, signal.SIGKILL)
    killed = states.status(conn, job_id)
    assert killed["state"] == "running" and killed["done"] < 20, "the job ended before the kill; slow it down"

    # The lease (2 s in tests) runs out with nobody renewing it: the page says so.
    wait_for(lambda: page.is_visible("#stale"), 20, interval=0.1, message="the stale badge")
    assert page.inner_text("#stale") == "stale — the worker stopped reporting, the job will be retried"
    assert page.inner_text("#state") == "running"
    assert _progress(page)[0] == killed["done"]  # the progress stays where the dead worker left it

    # Another worker reclaims the job, resumes from the checkpoint and finishes it.
    workers.start("--no-scheduler", extra_env=env)
    wait_for(lambda: page.inner_text("#state") == "succeeded", 60, interval=0.2, message="the job to succeed")
    assert not page.is_visible("#stale")
    assert page.inner_text("#attempts") == "2 of 3"
    assert _progress(page) == (20, 20)
    rows = page.locator("#results tbody tr")
    assert rows.count() == 20
    assert rows.nth(0).locator("td").nth(1).inner_text() == ITEMS[0]
    assert rows.nth(0).locator("td").nth(2).inner_text() == "positive"
    assert rows.nth(2).locator("td").nth(2).inner_text() == "negative"
    # The attempts' story: the first ended with its lease, the second succeeded on another worker.
    history = page.locator("#history tbody tr")
    assert history.count() == 2
    assert history.nth(0).locator("td.ended").inner_text() == "lease expired"
    assert history.nth(1).locator("td.ended").inner_text() == "succeeded"
    assert page.is_visible("#download-csv") and page.is_visible("#download-jsonl")
    assert int(conn.get(keys.RECLAIMS) or 0) >= 1
    shot = page.screenshot(full_page=True)
    assert shot.startswith(b"\x89PNG")
    if UPDATE_SCREENSHOT:
        SCREENSHOT.write_bytes(shot)

    # The page without JavaScript got there through its meta refresh.
    wait_for(lambda: static_page.inner_text("#state") == "succeeded", 15, interval=0.2,
             message="the no-JavaScript page to refresh to the end state")
    assert static_page.locator("#results tbody tr").count() == 20

    # The page polled on the backoff schedule: 1 s apart at first, 5 s apart after 10 s.
    polls = sorted(r.timing["startTime"] / 1000 for r in poll_requests)
    gaps = [(later - polls[0], later - earlier) for earlier, later in zip(polls, polls[1:], strict=False)]
    assert gaps, "the page never polled"
    assert all(gap >= 0.9 for _, gap in gaps), gaps
    assert all(gap >= 4.5 for since_first, gap in gaps if since_first - gap >= 10.5), gaps
    context.close()
    no_js.close()


def test_the_dashboard_works_in_a_browser_and_refuses_a_cross_site_post(conn, web_server, chromium):
    user, password = "operator", "a long dashboard password"
    server = web_server(extra_env={"LEASH_DASHBOARD_USER": user, "LEASH_DASHBOARD_PASSWORD": password})
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(server.url + "/rq/", timeout=10)
    assert anonymous.value.code == 401
    context = chromium.new_context(http_credentials={"username": user, "password": password})
    page = context.new_page()
    assert page.goto(server.url + "/rq/0/view/jobs/leash/failed/8/asc/1").status == 200
    # rq-dashboard's own jQuery POST (what its "Requeue all" button sends) carries the CSRF header.
    status = page.evaluate("""() => new Promise(resolve =>
        $.post('/rq/requeue/leash').always((_, __, xhr) => resolve((xhr && xhr.status) || _.status)))""")
    assert status == 200
    # A form on another site posting to the same action, in the same logged-in browser.
    page.set_content(f'<form method="post" action="{server.url}/rq/requeue/leash"><button>go</button></form>')
    with page.expect_navigation() as navigation:
        page.click("button")
    assert navigation.value.status == 403
    assert "CSRF token is missing" in page.content()

    # A failed job whose error echoes markup: its page shows the text, runs none of it, and the
    # dashboard's own scripts (allowed by its policy) filled the page.
    from rq.job import Job
    from rq.results import Result
    from rq.serializers import JSONSerializer

    job_id = urllib.request.urlopen(urllib.request.Request(
        server.url + "/jobs", data=json.dumps(CLASSIFY).encode(), headers={"Content-Type": "application/json"}),
        timeout=10).read()
    job_id = json.loads(job_id)["job_id"]
    markup = '<img src=x onerror="window.injected=1">'
    Result.create_failure(Job.fetch(job_id, connection=conn, serializer=JSONSerializer), ttl=600,
                          exc_string=f"BadRequest: the provider said: {markup}")
    page = context.new_page()
    dialogs: list = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    assert page.goto(server.url + f"/rq/0/view/job/{job_id}").status == 200
    page.wait_for_selector("pre.exc_info", timeout=10_000)
    assert markup in page.inner_text("pre.exc_info")
    assert page.evaluate("() => window.injected") is None and dialogs == []
    context.close()
