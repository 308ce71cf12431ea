"""The operator's API: pause and resume a queue, quiet a worker or all, the workers' and the
queues' views (the same JSON as ``leash workers --json`` and ``leash queue --json``), for the
dashboard's operator only, CSRF-checked when a browser sends it, every change audited."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from rq.serializers import JSONSerializer
from rq.worker import Worker

from cli import main
from jobs import keys
from jobs.core import switches
from tests.web_support import HTML, TOKENS, basic, bearer, create_app_with, csrf_from, sign_in

USER, PASSWORD, METRICS = "ops", "a-long-dashboard-password", "metrics-token-0123456789"
OPERATOR = basic(USER, PASSWORD)
JSON_BODY = {"Content-Type": "application/json"}


@pytest.fixture
def op_app(conn):
    return create_app_with(LEASH_API_TOKENS=",".join(f"{o}={t}" for o, t in TOKENS.items()),
                           LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD, LEASH_METRICS_TOKEN=METRICS)


@pytest.fixture
def registered(conn):
    """Two workers in RQ's registry (not running: the API reads and writes Redis only)."""
    made = []
    for name in ("w-one", "w-two"):
        worker = Worker(["leash"], connection=conn, serializer=JSONSerializer, name=name)
        worker.register_birth()
        made.append(worker)
    yield [w.name for w in made]
    for worker in made:
        worker.register_death()


def cli_json(*args: str) -> dict:
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_views_answer_what_the_cli_answers(op_app, conn, registered):
    client = op_app.test_client()
    switches.pause(conn, "leash")
    workers = client.get("/operator/workers", headers=OPERATOR)
    assert workers.status_code == 200
    assert sorted(w["name"] for w in workers.get_json()["workers"]) == ["w-one", "w-two"]
    assert workers.get_json() == cli_json("workers")
    queues = client.get("/operator/queues", headers=OPERATOR)
    assert queues.status_code == 200
    (row,) = [q for q in queues.get_json()["queues"] if q["queue"] == "leash"]
    assert row["paused_since"] is not None
    assert queues.get_json() == cli_json("queue")
    # The metrics token reads them too (a monitor's view), and changes nothing.
    metrics = {"Authorization": f"Bearer {METRICS}"}
    assert client.get("/operator/queues", headers=metrics).status_code == 200
    refused = client.post("/operator/queues/leash/resume", headers={**metrics, **JSON_BODY}, json={})
    assert refused.status_code == 403 and "metrics token" in refused.get_json()["error"]


def test_pause_resume_and_quiet_act_and_are_audited(op_app, conn, registered):
    client = op_app.test_client()
    paused = client.post("/operator/queues/leash/pause", headers=OPERATOR, json={})
    assert paused.status_code == 200 and paused.get_json()["paused"] is True and paused.get_json()["changed"]
    assert "leash" in switches.paused(conn)
    again = client.post("/operator/queues/leash/pause", headers=OPERATOR, json={})
    assert again.get_json()["changed"] is False
    assert op_app.test_client().get("/readyz").get_json()["paused"].keys() == {"leash"}
    resumed = client.post("/operator/queues/leash/resume", headers=OPERATOR, json={})
    assert resumed.status_code == 200 and resumed.get_json() == {"queue": "leash", "paused": False, "changed": True}
    assert switches.paused(conn) == {}

    quiet = client.post("/operator/workers/w-one/quiet", headers=OPERATOR, json={})
    assert quiet.status_code == 200 and quiet.get_json() == {"quiet": ["w-one"], "newly": ["w-one"]}
    every = client.post("/operator/workers/quiet", headers=OPERATOR, json={"all": True})
    assert every.status_code == 200 and sorted(every.get_json()["quiet"]) == ["w-one", "w-two"]
    assert every.get_json()["newly"] == ["w-two"]
    assert set(switches.quiet_workers(conn)) == {"w-one", "w-two"}

    entries = client.get("/operator/audit", headers=OPERATOR).get_json()["entries"]
    assert [(e["action"], e["actor"], e["changed"]) for e in entries] == [
        ("quiet", "dashboard:ops", True), ("quiet", "dashboard:ops", True), ("resume", "dashboard:ops", True),
        ("pause", "dashboard:ops", False), ("pause", "dashboard:ops", True)]
    assert sorted(entries[0]["targets"]) == ["w-one", "w-two"]
    # The CLI's switches are audited in the same stream, and `leash operator-log` reads it.
    assert CliRunner().invoke(main, ["pause", "leash"]).exit_code == 0
    newest = cli_json("operator-log")["entries"][0]
    assert newest["action"] == "pause" and newest["actor"].startswith("cli:")


def test_owners_and_strangers_are_refused_with_json(op_app, conn, registered):
    client = op_app.test_client()
    for method, path in (("get", "/operator/workers"), ("get", "/operator/queues"),
                         ("post", "/operator/queues/leash/pause"), ("post", "/operator/workers/w-one/quiet")):
        anonymous = getattr(client, method)(path, json={} if method == "post" else None)
        assert anonymous.status_code == 401, (path, anonymous.status_code)
        assert anonymous.get_json()["error"] and anonymous.headers["WWW-Authenticate"].startswith("Basic")
        owner = getattr(client, method)(path, headers=bearer("alice"), json={} if method == "post" else None)
        assert owner.status_code == 403 and "dashboard" in owner.get_json()["error"], (path, owner.status_code)
        wrong = getattr(client, method)(path, headers=basic(USER, "not-it"), json={} if method == "post" else None)
        assert wrong.status_code == 401, (path, wrong.status_code)
    # An owner signed in from a browser is not the operator either.
    browser = op_app.test_client()
    sign_in(browser, "alice", "/overview")
    assert browser.get("/operator/queues").status_code == 403
    assert switches.paused(conn) == {} and switches.quiet_workers(conn) == {}
    assert conn.xlen(keys.OPERATOR_AUDIT) == 0


@pytest.mark.parametrize("path", ["/operator/queues/no-such-queue/pause", "/operator/queues/no-such-queue/resume",
                                  "/operator/workers/no-such-worker/quiet", "/operator/queues/%00%ff/pause",
                                  "/operator/workers/" + "w" * 5000 + "/quiet"])
def test_bad_names_are_a_404_with_json_never_a_500(op_app, conn, registered, path):
    answer = op_app.test_client().post(path, headers=OPERATOR, json={})
    assert answer.status_code == 404, answer.status_code
    assert "no " in answer.get_json()["error"]
    assert switches.paused(conn) == {}


@pytest.mark.parametrize("body", [None, {}, {"all": False}, [], "all", {"all": "maybe"}])
def test_quiet_of_every_worker_needs_all_true(op_app, conn, registered, body):
    answer = op_app.test_client().post("/operator/workers/quiet", headers={**OPERATOR, **JSON_BODY},
                                       data=json.dumps(body) if body is not None else "not json")
    assert answer.status_code == 400 and "all" in answer.get_json()["error"]
    assert switches.quiet_workers(conn) == {}


def test_a_browser_change_needs_the_csrf_token(op_app, conn, registered):
    # Basic auth that a browser would send by itself, with a form body: forged from elsewhere.
    forged = op_app.test_client().post("/operator/queues/leash/pause", headers=OPERATOR, data={"x": "1"})
    assert forged.status_code == 403 and switches.paused(conn) == {}

    browser = op_app.test_client()
    sign_in(browser, "alice", "/overview")
    assert 'id="operator-queues"' not in browser.get("/overview", headers=HTML).get_data(as_text=True)
    signed = browser.get("/operator/signin", headers={**HTML, **OPERATOR})
    assert signed.status_code == 303 and signed.headers["Location"].endswith("/overview")
    page = browser.get("/overview", headers=HTML)
    html = page.get_data(as_text=True)
    assert 'id="operator-queues"' in html and 'id="pause-leash"' in html and "quiet-button" in html
    assert browser.post("/operator/queues/leash/pause", headers=HTML, data={}).status_code == 403
    assert switches.paused(conn) == {}
    done = browser.post("/operator/queues/leash/pause", headers=HTML, data={"csrf_token": csrf_from(page.data)})
    assert done.status_code == 303 and "leash" in switches.paused(conn)
    html = browser.get("/overview", headers=HTML).get_data(as_text=True)
    assert 'id="resume-leash"' in html and 'id="paused-leash"' in html
    # Quiet asks first: the confirm page, then the change.
    token = csrf_from(page.data)
    confirm = browser.post("/operator/workers/w-one/quiet", headers=HTML, data={"csrf_token": token})
    assert confirm.status_code == 200 and 'id="confirm-button"' in confirm.get_data(as_text=True)
    assert switches.quiet_workers(conn) == {}
    quieted = browser.post("/operator/workers/w-one/quiet", headers=HTML, data={"csrf_token": token, "confirm": "yes"})
    assert quieted.status_code == 303 and set(switches.quiet_workers(conn)) == {"w-one"}
    assert re.search(r"worker-quiet", browser.get("/overview", headers=HTML).get_data(as_text=True))
    entries = switches.audit_log(conn)
    assert [(e["action"], e["actor"]) for e in entries] == [("quiet", "dashboard:ops (browser)"),
                                                            ("pause", "dashboard:ops (browser)")]
    # Quiet every worker: the overview's button, the confirm page, then all of them.
    page = browser.get("/overview", headers=HTML)
    assert 'id="quiet-all"' in page.get_data(as_text=True)
    asked = browser.post("/operator/workers/quiet", headers=HTML, data={"csrf_token": token, "all": "true"})
    assert asked.status_code == 200 and 'name="all" value="true"' in asked.get_data(as_text=True)
    assert set(switches.quiet_workers(conn)) == {"w-one"}
    every = browser.post("/operator/workers/quiet", headers=HTML,
                         data={"csrf_token": token, "all": "true", "confirm": "yes"})
    assert every.status_code == 303 and set(switches.quiet_workers(conn)) == {"w-one", "w-two"}
    assert 'id="quiet-all"' not in browser.get("/overview", headers=HTML).get_data(as_text=True)
    # Other credentials: the browser's operator session ends with them.
    other = create_app_with(LEASH_API_TOKENS=",".join(f"{o}={t}" for o, t in TOKENS.items()),
                            LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD="a-new-password-now")
    cookie = browser.get_cookie("leash_session")
    moved = other.test_client()
    moved.set_cookie("leash_session", cookie.value)
    assert moved.get("/operator/queues").status_code == 403


def test_without_dashboard_credentials_nobody_is_the_operator_but_under_leash_dev(conn):
    plain = create_app_with(LEASH_API_TOKENS=",".join(f"{o}={t}" for o, t in TOKENS.items())).test_client()
    assert plain.get("/operator/signin").status_code == 403
    assert plain.post("/operator/queues/leash/pause", headers=bearer("alice"), json={}).status_code == 403
    dev = create_app_with(LEASH_DEV=True).test_client()
    assert dev.post("/operator/queues/leash/pause", json={}).status_code == 200
    assert 'id="operator-queues"' in dev.get("/overview", headers=HTML).get_data(as_text=True)


def test_guessing_the_metrics_token_here_is_slowed_as_at_metrics(op_app, conn):
    client = op_app.test_client()
    answers = [client.get("/operator/queues", headers={"Authorization": f"Bearer guess-{n}"}).status_code
               for n in range(12)]
    assert answers[:10] == [403] * 10 and answers[-1] == 429, answers


def test_an_owners_token_is_not_counted_as_a_guess(op_app, conn):
    client = op_app.test_client()
    assert [client.get("/operator/queues", headers=bearer("bob")).status_code for _ in range(12)] == [403] * 12
