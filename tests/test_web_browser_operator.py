"""The operator's buttons on the overview in a real browser (headless Chromium, Playwright,
against a real web server) at 1280 and 390 px: Pause shows the paused banner with its Resume
button, Resume takes it away; Quiet asks first; no text overlaps other text and nothing
scrolls sideways. The chromium fixture skips or fails as tests/test_web_browser.py explains."""

from __future__ import annotations

import pytest
from rq.serializers import JSONSerializer
from rq.worker import Worker

from jobs.core import switches

pytestmark = pytest.mark.slow

WIDTHS = (1280, 390)

#: Pairs of visible text boxes of the page's main part that overlap (leaf elements with text).
OVERLAPPING_TEXT = """
() => {
  const leaves = [...document.querySelectorAll("main *")].filter(e =>
    e.children.length === 0 && e.textContent.trim() && e.getClientRects().length && !e.closest("svg"));
  // One box per line an element's text takes (an inline link that wraps is two boxes, not their union).
  const boxes = leaves.flatMap(e => [...e.getClientRects()].map(r => [e, r]));
  const found = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const [a, r] = boxes[i], [b, s] = boxes[j];
    if (a === b || a.contains(b) || b.contains(a)) continue;
    const w = Math.min(r.right, s.right) - Math.max(r.left, s.left);
    const h = Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top);
    if (w > 1 && h > 1) found.push(a.textContent.trim().slice(0, 30) + " / " + b.textContent.trim().slice(0, 30));
  }
  return found;
}
"""


@pytest.fixture
def a_worker(conn):
    """A worker in RQ's registry (the buttons act on Redis; no process is needed)."""
    worker = Worker(["leash"], connection=conn, serializer=JSONSerializer, name="worker-with-a-long-name-0123456789")
    worker.register_birth()
    yield worker.name
    worker.register_death()


def check_layout(page, width: int, when: str) -> None:
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), \
        f"the overview scrolls sideways at {width} px ({when})"
    assert page.evaluate(OVERLAPPING_TEXT) == [], f"text overlaps at {width} px ({when})"


@pytest.mark.parametrize("width", WIDTHS)
def test_pause_shows_the_banner_resume_takes_it_away_and_quiet_asks_first(conn, env, web_server, chromium,
                                                                         a_worker, width):
    server = web_server(extra_env={"LEASH_DEV": "1"})  # leash dev: the dashboard, and its operator, open
    context = chromium.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{server.url}/overview")
        page.wait_for_selector("#operator-queues")
        assert page.locator("#paused-leash").count() == 0
        check_layout(page, width, "before")

        page.click("#pause-leash")
        page.wait_for_selector("#paused-leash")
        assert "is paused since" in page.inner_text("#paused-leash")
        assert "leash" in switches.paused(conn)
        check_layout(page, width, "paused")

        page.click("#resume-leash")  # the banner's own button
        page.wait_for_selector("#pause-leash")
        assert page.locator("#paused-leash").count() == 0 and switches.paused(conn) == {}

        page.click(".quiet-button")
        page.wait_for_selector("#confirm-button")
        assert switches.quiet_workers(conn) == {}, "quiet asks first"
        check_layout(page, width, "quiet's confirm")
        page.click("#confirm-button")
        page.wait_for_selector(".worker-quiet")
        assert set(switches.quiet_workers(conn)) == {a_worker}
        check_layout(page, width, "a quiet worker")
        assert [e["action"] for e in switches.audit_log(conn)] == ["quiet", "resume", "pause"]
    finally:
        context.close()
