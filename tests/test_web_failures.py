"""The failures page: ``leash failures``' groups in the browser with counts, the failure rate and
each group's jobs; a group or the ticked jobs replayed after a confirm step (CSRF-checked);
owners see and replay their own, the dashboard's operator everyone's; links from the overview
and from a failed job's page."""

from __future__ import annotations

import re

import pytest

from jobs import deadletter, keys
from jobs.core import lease, states
from jobs.deadletter import failures
from jobs.read import failure_groups
from tests.web_support import CLASSIFY, HTML, TOKENS, basic, bearer, create_app_with, csrf_from, sign_in


@pytest.fixture
def browser(app):
    browser = app.test_client()
    browser.token = csrf_from(browser.get("/", headers=HTML).data)
    return browser


def failed_job(client, conn, error: str, headers=None, name: str | None = None) -> str:
    headers = headers or {"X-CSRFToken": client.token}
    body = dict(CLASSIFY, max_attempts=3) | ({"name": name} if name else {})
    job_id = client.post("/jobs", json=body, headers=headers).get_json()["job_id"]
    attempt = lease.claim(conn, job_id, "leash", "w")
    attempt.heartbeat(item=(0, '"positive"'))
    assert attempt.fail(error + "\nTraceback ...", permanent=True) == "failed"
    return job_id


def test_the_page_groups_like_the_cli_with_counts_rate_and_each_groups_jobs(browser, conn):
    server_down = [failed_job(browser, conn, f"ModelUnavailable: the model server at http://m:{n}/v1 failed "
                              f"(HTTP 503): down", name=f"batch {n}") for n in range(3)]
    too_long = failed_job(browser, conn, "PermanentError: the prompt is longer than 8192 tokens")
    html = browser.get("/failures", headers=HTML).data.decode()
    cli = failures.report(conn)
    assert [g["count"] for g in cli["groups"]] == [3, 1]
    assert '<strong id="failed-count">4</strong> failed jobs in 2 groups' in html
    assert '<strong id="failure-rate">100.0 %</strong>' in html and "4 of 4 ended jobs failed" in html
    first = failure_groups.group_key("classify", cli["groups"][0]["error"])
    section = html[html.index(f'id="group-{first}"'):html.index(f'id="group-{failure_groups.group_key("classify", cli["groups"][1]["error"])}"')]
    assert '<span class="count">3</span>' in section and "(HTTP 503)" in section and "(HTTP &lt;n&gt;)" not in section
    for job_id in server_down:
        assert f'value="{job_id}"' in section and f'href="/jobs/{job_id}"' in section
    assert "batch 2" in section and too_long not in section
    assert f'name="group" value="{first}"' in section and "Replay the group (3)" in section


def test_replaying_a_group_asks_first_then_requeues_all_its_jobs_and_audits(browser, conn):
    ids = [failed_job(browser, conn, f"ValueError: bad item {n}") for n in range(2)]
    other = failed_job(browser, conn, "KeyError: 'label'")
    key = failure_groups.group_key("classify", failures.normalise("ValueError: bad item 0"))
    asked = browser.post("/failures/replay", data={"csrf_token": browser.token, "group": key, "since": "24h"},
                         headers=HTML)
    page = asked.data.decode()
    assert asked.status_code == 200 and "Replay 2 failed jobs?" in page and 'name="confirm" value="yes"' in page
    assert all(states.status(conn, i)["state"] == "failed" for i in ids), "nothing replayed before the confirm"
    done = browser.post("/failures/replay", data={"csrf_token": browser.token, "group": key, "since": "24h",
                                                  "confirm": "yes"}, headers=HTML)
    assert done.status_code == 303 and "replayed=2" in done.headers["Location"]
    assert [states.status(conn, i)["state"] for i in ids] == ["queued", "queued"]
    assert states.status(conn, other)["state"] == "failed"
    [entry] = deadletter.audit_log(conn, 1)
    assert (entry["actor"], sorted(entry["ids"])) == ("web:shared", sorted(ids))
    after = browser.get(done.headers["Location"], headers=HTML).data.decode()
    assert "Replayed 2 jobs" in after and '<strong id="failed-count">1</strong>' in after


def test_replaying_ticked_jobs_takes_only_those_and_needs_the_csrf_token(browser, conn):
    ids = [failed_job(browser, conn, f"ValueError: bad item {n}") for n in range(3)]
    refused = browser.post("/failures/replay", data={"job_id": ids[:1], "confirm": "yes"})
    assert refused.status_code == 403 and conn.xlen(keys.REPLAY_AUDIT) == 0
    done = browser.post("/failures/replay", data={"csrf_token": browser.token, "job_id": ids[:2], "confirm": "yes"},
                        headers=HTML)
    assert done.status_code == 303
    assert [states.status(conn, i)["state"] for i in ids] == ["queued", "queued", "failed"]
    nothing = browser.post("/failures/replay", data={"csrf_token": browser.token, "confirm": "yes"}, headers=HTML)
    assert nothing.status_code == 409


def test_owners_see_and_replay_their_own_and_the_dashboard_operator_everyones(conn):
    app = create_app_with(LEASH_API_TOKENS=",".join(f"{o}={t}" for o, t in TOKENS.items()), LEASH_DASHBOARD_USER="ops",
                          LEASH_DASHBOARD_PASSWORD="pw-ops-long-enough")
    client = app.test_client()
    alice = bearer("alice")
    mine = failed_job(client, conn, "ValueError: alice's broken item", headers=alice)
    theirs = failed_job(client, conn, "ValueError: bob's broken item", headers=bearer("bob"))
    seen = client.get("/failures", headers=alice).get_json()
    assert [g["job_ids"] for g in seen["groups"]] == [[mine]] and seen["owner"] == "alice"
    stolen = client.post("/failures/replay", data={"job_id": [theirs]}, headers=alice)
    assert stolen.status_code == 409 and states.status(conn, theirs)["state"] == "failed"
    browser = app.test_client()
    sign_in(browser, "alice", "/failures")
    page = browser.get("/failures", headers=HTML).data.decode()
    assert mine in page and theirs not in page
    operator = app.test_client()
    everyone = operator.get("/failures", headers=HTML | basic("ops", "pw-ops-long-enough")).data.decode()
    assert mine in everyone and theirs in everyone and "every owner" in everyone
    wrong = operator.get("/failures", headers=HTML | basic("ops", "guess"))
    assert wrong.status_code in (303, 401) and theirs not in wrong.data.decode()
    # The operator's browser sends basic auth by itself: its replay needs the page's CSRF token.
    forged = operator.post("/failures/replay", data={"job_id": [theirs], "confirm": "yes"},
                           headers=basic("ops", "pw-ops-long-enough"))
    assert forged.status_code in (400, 403) and states.status(conn, theirs)["state"] == "failed"
    token = csrf_from(everyone.encode())
    done = operator.post("/failures/replay", data={"job_id": [theirs], "confirm": "yes", "csrf_token": token},
                         headers=HTML | basic("ops", "pw-ops-long-enough"))
    assert done.status_code == 303 and states.status(conn, theirs)["state"] == "queued"
    assert deadletter.audit_log(conn, 1)[0]["actor"] == "dashboard:ops"


def test_links_from_the_overview_and_from_a_failed_jobs_page_to_its_group(browser, conn):
    job_id = failed_job(browser, conn, "ModelUnavailable: the model server failed (HTTP 502): bad gateway")
    overview = browser.get("/overview", headers=HTML).data.decode()
    assert 'id="failures-link" href="/failures"' in overview
    page = browser.get(f"/jobs/{job_id}", headers=HTML).data.decode()
    link = re.search(r'id="failure-group-link" href="([^"]+)"', page).group(1).replace("&amp;", "&")
    path, anchor = link.split("#")
    assert anchor.startswith("group-")
    assert f'id="{anchor}"' in browser.get(path, headers=HTML).data.decode()


def test_a_canceled_job_is_no_failure_here_and_bad_windows_fall_back(browser, conn):
    job_id = browser.post("/jobs", json=CLASSIFY, headers={"X-CSRFToken": browser.token}).get_json()["job_id"]
    assert browser.post(f"/jobs/{job_id}/cancel", headers={"X-CSRFToken": browser.token}).status_code in (200, 202)
    html = browser.get("/failures?since=nonsense", headers=HTML).data.decode()
    assert 'id="no-failures"' in html and "failure-group-link" not in browser.get(
        f"/jobs/{job_id}", headers=HTML).data.decode()
