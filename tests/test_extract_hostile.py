"""Hostile ``extract`` schemas against a leash worker in the test's process and the loopback
OpenAI-compatible server: a pattern that backtracks exponentially in Python's ``re``, a chain of
31 ``$ref``s each naming the next twice, ``"$ref": "#"`` and a ``$ref`` to a loopback URL. The
door refuses what it can see (a 422 naming the ``$ref``); a schema that got past an older door
costs a worker at most a few seconds, ending as the item's error by name in one attempt, and
never makes the worker send a request to the URL it names (a real listener counts them)."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from jobs import keys
from jobs.enqueue import enqueue
from jobs.models import schema_guard
from tests.test_items_workers import ended, stored
from tests.test_schema_guard import REDOS, ref_chain, with_property

pytestmark = pytest.mark.slow

ITEM = "a" * 40 + "!"  # the fake server answers each string property with the item's last word
#: At most this many seconds of worker time per hostile job (the work-horse's whole run).
WORKER_SECONDS = 5.0


@pytest.fixture
def listener():
    """A loopback HTTP server counting the requests it gets."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            hits.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server.server_address[1], hits
    server.shutdown()
    server.server_close()
    thread.join(5)


def strict(schema: dict) -> dict:
    return {**schema, "required": ["x"], "additionalProperties": False}


def run_hostile(conn, burst, schema: dict) -> tuple[dict, float]:
    """The job's end and its worker time: from its claim to its end, as its hash records them
    (the burst around it, forking included, is printed beside)."""
    job_id, _ = enqueue(conn, "extract", {"items": [ITEM], "schema": schema})
    started = time.monotonic()
    burst()
    wall = time.monotonic() - started
    final = ended(conn, job_id)
    claimed, finished = conn.hmget(keys.job(job_id), "started_at", "ended_at")
    spent = float(finished) - float(claimed)
    print(f"\nhostile schema: worker {spent:.2f} s (burst {wall:.2f} s), {final['state']}: {final['error']}")
    return {**final, "items": stored(conn, job_id)}, spent


def test_a_backtracking_pattern_costs_the_worker_seconds_and_fails_the_item_by_name(conn, burst, model_server):
    final, spent = run_hostile(conn, burst, REDOS)  # the door takes it: RE2 cannot backtrack
    assert spent < WORKER_SECONDS
    assert final["state"] == "failed" and "does not match '^(a+)+$'" in final["items"][0]["error"]
    assert "does not match '^(a+)+$'" in final["error"]
    assert final["attempts"] == 1 and "lease" not in final["error"]
    assert len(model_server.requests) == 3  # the answer and its 2 repairs, each checked at once


def test_hostile_references_are_refused_at_the_door_and_cost_a_worker_seconds_past_it(
        conn, burst, model_server, listener, monkeypatch):
    port, hits = listener
    hostile = {
        "31-level $ref chain": (strict(ref_chain()), "LEASH_MAX_SCHEMA_EXPANSION",
                                "took more than 2 s (LEASH_SCHEMA_CHECK_SECONDS)"),
        '"$ref": "#"': (strict({"$ref": "#", "type": "object", "properties": {"x": {"type": "string"}}}),
                        "$ref '#' refers back to itself", "refers to itself without end"),
        "$ref to a loopback URL": (with_property(**{"$ref": f"http://127.0.0.1:{port}/probe.json"}),
                                   f"$ref 'http://127.0.0.1:{port}/probe.json'", "cannot be checked against the schema"),
    }
    for schema, door_says, _ in hostile.values():
        with pytest.raises(Exception, match=door_says.replace("$", r"\$").replace("(", r"\(").replace(")", r"\)")):
            enqueue(conn, "extract", {"items": [ITEM], "schema": schema})
    # As if an older door had taken them: the worker's own bounds hold.
    monkeypatch.setattr(schema_guard, "door_problem", lambda schema, limit: None)
    for name, (schema, _, item_says) in hostile.items():
        final, spent = run_hostile(conn, burst, schema)
        print(f"{name}: {spent:.2f} s of worker time")
        assert spent < WORKER_SECONDS, name
        assert final["state"] == "failed" and final["attempts"] == 1, (name, final)
        assert item_says in final["items"][0]["error"] and item_says in final["error"], (name, final)
    assert hits == []
