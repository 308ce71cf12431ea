"""Errors where operators look: with SENTRY_DSN set, web errors and failed attempts reach
Sentry, tagged with the job id, kind, owner and attempt. The DSN points at a stand-in Sentry:
a loopback HTTP server of this test that stores the envelopes sentry-sdk posts."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jobs import cancel, enqueue
from jobs.core import states
from tests.conftest import REDIS_URL, ROOT, wait_for

pytestmark = pytest.mark.slow


class StandInSentry:
    """Accepts sentry-sdk's envelope POSTs on 127.0.0.1 and keeps the events they carry."""

    def __init__(self):
        self.events: list[dict] = []
        self.lock = threading.Lock()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                with stand_in.lock:
                    stand_in.events.extend(events_in_envelope(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.dsn = f"http://publickey@127.0.0.1:{self.server.server_address[1]}/1"

    def matching(self, **tags) -> list[dict]:
        with self.lock:
            return [e for e in self.events if all(e.get("tags", {}).get(k) == v for k, v in tags.items())]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def events_in_envelope(body: bytes) -> list[dict]:
    """An envelope: a header line, then items, each a header line and a payload (of the
    header's ``length`` in bytes, else up to the next newline)."""
    events = []
    _, _, rest = body.partition(b"\n")
    while rest.strip():
        header_line, _, rest = rest.partition(b"\n")
        header = json.loads(header_line)
        if "length" in header:
            payload, rest = rest[: header["length"]], rest[header["length"]:].lstrip(b"\n")
        else:
            payload, _, rest = rest.partition(b"\n")
        if header.get("type") == "event":
            events.append(json.loads(payload))
    return events


@pytest.fixture
def sentry():
    stand_in = StandInSentry()
    yield stand_in
    stand_in.close()


def test_failed_attempts_reach_sentry_tagged_with_job_kind_owner_and_attempt(conn, workers, env, sentry):
    workers.start(extra_env={"SENTRY_DSN": sentry.dsn})
    job_id, _ = enqueue(conn, "boom", {"items": ["x"]}, owner="alice", max_attempts=2)
    wait_for(lambda: states.status(conn, job_id)["state"] == "failed", 60, message="the job to fail twice")

    wait_for(lambda: len(sentry.matching(job_id=job_id)) >= 2, 30, message="both failed attempts to reach Sentry")
    # One worker takes jobs in order: once the next job has run, the last one's events are all in.
    later, _ = enqueue(conn, "count", {"items": ["a"], "delay": 0}, owner="alice")
    wait_for(lambda: states.status(conn, later)["state"] == "succeeded", 30, message="the next job to run")
    events = sentry.matching(job_id=job_id)
    assert sorted(e["tags"]["attempt"] for e in events) == ["1", "2"]  # one event per failed attempt
    for event in events:
        assert event["tags"]["kind"] == "boom" and event["tags"]["owner"] == "alice"
        assert event["tags"]["component"] == "worker"
        exception = event["exception"]["values"][-1]
        assert exception["type"] == "ValueError"
        assert exception["value"] == f"boom on attempt {event['tags']['attempt']}"


def test_a_permanent_failure_is_one_event_and_a_success_none(conn, workers, env, sentry):
    workers.start(extra_env={"SENTRY_DSN": sentry.dsn})
    failing, _ = enqueue(conn, "permanent", {"items": ["x"]}, owner="bob", max_attempts=3)
    fine, _ = enqueue(conn, "count", {"items": ["a"], "delay": 0}, owner="bob")
    wait_for(lambda: states.status(conn, failing)["state"] == "failed"
             and states.status(conn, fine)["state"] == "succeeded", 60, message="both jobs to end")
    events = wait_for(lambda: sentry.matching(job_id=failing), 30, message="the failure to reach Sentry")
    assert len(events) == 1 and events[0]["tags"]["attempt"] == "1" and events[0]["tags"]["owner"] == "bob"
    assert events[0]["exception"]["values"][-1]["type"] == "PermanentError"
    assert sentry.matching(job_id=fine) == []


def test_a_cancel_and_a_deploy_hand_off_are_not_reported(conn, workers, env, sentry):
    worker = workers.start(extra_env={"SENTRY_DSN": sentry.dsn})
    canceled, _ = enqueue(conn, "count", {"items": [f"i{n}" for n in range(100)], "delay": 0.1}, owner="gus")
    wait_for(lambda: states.status(conn, canceled)["done"] >= 1, 30, message="the first job to be running")
    cancel(conn, canceled)
    wait_for(lambda: states.status(conn, canceled)["state"] == "failed", 30, message="the cancel to land")

    handed_off, _ = enqueue(conn, "count", {"items": [f"i{n}" for n in range(100)], "delay": 0.1}, owner="gus")
    wait_for(lambda: states.status(conn, handed_off)["done"] >= 1, 30, message="the second job to be running")
    worker.send_signal(signal.SIGTERM)  # a deploy: the job goes back to the queue
    worker.wait(timeout=30)
    assert states.status(conn, handed_off)["state"] == "queued"

    # The worker flushed its events before it exited; a failure in the same run does reach Sentry.
    workers.start(extra_env={"SENTRY_DSN": sentry.dsn})
    failing, _ = enqueue(conn, "permanent", {"items": ["x"]}, owner="gus")
    wait_for(lambda: sentry.matching(job_id=failing), 60, message="the later failure to reach Sentry")
    assert sentry.matching(job_id=canceled) == [] and sentry.matching(job_id=handed_off) == []


WEB_SCRIPT = """
import sys
from web.app import create_app
app = create_app({"SECRET_KEY": "s", "REDIS_URL": sys.argv[1], "LEASH_API_TOKENS": "carol=carol-token-0123456789"})

@app.get("/jobs/<job_id>/explode")
def explode(job_id):
    from web import auth
    auth.request_owner()
    raise RuntimeError("the web app broke while serving " + job_id)

response = app.test_client().get("/jobs/job-123/explode", headers={"Authorization": "Bearer carol-token-0123456789"})
assert response.status_code == 500, response.status_code
import sentry_sdk
sentry_sdk.flush(timeout=10)
"""


def test_a_web_error_reaches_sentry_tagged_with_the_job_and_owner(conn, env, sentry):
    env.setenv("SENTRY_DSN", sentry.dsn)
    env.setenv("PYTHONPATH", str(ROOT))
    subprocess.run([sys.executable, "-c", WEB_SCRIPT, REDIS_URL], cwd=ROOT, check=True, timeout=60)
    events = wait_for(lambda: sentry.matching(job_id="job-123"), 10, message="the web error to reach Sentry")
    assert len(events) == 1
    event = events[0]
    assert event["tags"]["owner"] == "carol" and event["tags"]["component"] == "web"
    assert event["exception"]["values"][-1]["value"] == "the web app broke while serving job-123"
    assert event["request"]["url"].endswith("/jobs/job-123/explode")
