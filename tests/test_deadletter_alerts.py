"""Alerts look at the failure rate in a recent window, from the per-minute outcome counters."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from click.testing import CliRunner

from cli import main
from jobs import keys
from jobs.deadletter import alerts
from jobs.deadletter.stats import window_counts
from jobs.enqueue import enqueue
from tests.conftest import wait_for

NOW = 1_800_000_000.0  # a minute boundary


def record(conn, outcome, kind, at, count=1):
    """What the Lua transitions write when ``count`` jobs of ``kind`` end at ``at``."""
    minute = int(at // 60)
    for label in (kind, "_all"):
        conn.incrby(keys.stats_minute(outcome, label, minute), count)


def test_only_the_minutes_inside_the_window_count(conn):
    record(conn, "failed", "classify", NOW - 30, 4)  # the minute before NOW
    record(conn, "failed", "classify", NOW - 50 * 60, 3)
    record(conn, "failed", "classify", NOW - 61 * 60, 100)  # outside 1h
    record(conn, "succeeded", "classify", NOW - 10 * 60, 13)

    check = alerts.check(conn, 3600, now=NOW)

    assert (check.failed, check.succeeded) == (7, 13)
    assert check.ratio == pytest.approx(7 / 20)
    assert alerts.check(conn, 2 * 3600, now=NOW).failed == 107
    assert alerts.check(conn, 15 * 60, now=NOW).failed == 4


def test_moving_the_clock_moves_the_window(conn):
    record(conn, "failed", "classify", NOW, 5)
    assert alerts.check(conn, 3600, now=NOW + 59 * 60).failed == 5
    assert alerts.check(conn, 3600, now=NOW + 60 * 60).failed == 0


def test_thresholds_decide_the_alert(conn):
    record(conn, "failed", "classify", NOW, 6)
    record(conn, "succeeded", "classify", NOW, 4)
    record(conn, "succeeded", "summarize", NOW, 90)

    assert not alerts.check(conn, 3600, max_failures=6, now=NOW).alerting
    over = alerts.check(conn, 3600, max_failures=5, now=NOW)
    assert over.alerting and over.breaches == ["6 failures > --max-failures 5"]
    assert not alerts.check(conn, 3600, max_ratio=0.1, now=NOW).alerting  # 6 / 100 overall
    by_kind = alerts.check(conn, 3600, max_ratio=0.5, kind="classify", now=NOW)  # 6 / 10
    assert by_kind.alerting
    assert by_kind.line == ("ALERT leash failures, kind classify, last 1h: 6 failed, 4 succeeded, "
                            "failure ratio 0.600 (ratio 0.600 > --max-ratio 0.5)")


def test_no_jobs_ended_is_ratio_zero_and_ok(conn):
    check = alerts.check(conn, 3600, max_failures=0, max_ratio=0, now=NOW)
    assert (check.failed, check.ratio, check.alerting) == (0, 0.0, False)


@pytest.mark.parametrize("kwargs", [{"window": 3 * 86400}, {"window": 0}, {"max_failures": -1},
                                    {"max_ratio": 1.5}, {"max_ratio": -0.1}])
def test_check_rejects_out_of_range_input(conn, kwargs):
    with pytest.raises(ValueError):
        alerts.check(conn, **{"window": 3600, **kwargs})


def test_a_real_failure_counts_in_the_window(conn, burst):
    job_id, _ = enqueue(conn, "permanent", {}, max_attempts=1)
    burst()
    wait_for(lambda: conn.hget(keys.job(job_id), "state") == b"failed", 20)

    assert window_counts(conn, 60, kind="permanent")["failed"] == 1
    result = CliRunner().invoke(main, ["alert", "--since", "15m", "--max-failures", "0", "--kind", "permanent"])
    assert result.exit_code == 1
    assert result.output.startswith("ALERT leash failures, kind permanent, last 15m: 1 failed, 0 succeeded")


def test_cli_exit_status_and_json(conn):
    record(conn, "failed", "classify", alerts.clock.wall(), 2)
    runner = CliRunner()
    ok = runner.invoke(main, ["alert", "--max-failures", "2"])
    assert ok.exit_code == 0 and ok.output.startswith("OK leash failures, all kinds, last 1h: 2 failed")
    over = runner.invoke(main, ["alert", "--max-failures", "1", "--json"])
    assert over.exit_code == 1
    body = json.loads(over.output)
    assert body["alert"] is True and body["failed"] == 2 and body["text"].startswith("ALERT")


@pytest.mark.parametrize("args, message", [
    (["--since", "3d"], "longer than 2d"),
    (["--since", "3x"], "is not a duration"),
    (["--max-failures", "-1"], "--max-failures"),
    (["--max-ratio", "1.5"], "--max-ratio"),
    (["--max-ratio", "-0.5"], "--max-ratio"),
    (["--webhook", "ftp://example.com"], "--webhook must be an http(s) URL"),
])
def test_cli_bad_input_exits_2(conn, args, message):
    result = CliRunner().invoke(main, ["alert", *args])
    assert result.exit_code == 2
    assert message in result.output


class _Hook:
    """A loopback HTTP server that answers 503 ``fail_first`` times, then 200."""

    def __init__(self, fail_first=0):
        self.bodies: list[dict] = []
        self.fail_first = fail_first
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                hook.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(503 if len(hook.bodies) <= hook.fail_first else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_webhook_gets_the_line_when_alerting(conn):
    record(conn, "failed", "classify", alerts.clock.wall(), 3)
    with _Hook() as hook:
        result = CliRunner().invoke(main, ["alert", "--max-failures", "1", "--webhook", hook.url])
    assert result.exit_code == 1
    assert len(hook.bodies) == 1
    assert hook.bodies[0]["text"] == result.output.strip()
    assert hook.bodies[0]["failed"] == 3


def test_webhook_is_not_called_when_ok(conn):
    with _Hook() as hook:
        result = CliRunner().invoke(main, ["alert", "--max-failures", "1", "--webhook", hook.url])
    assert result.exit_code == 0 and hook.bodies == []


def test_webhook_is_retried_twice_then_gives_up():
    naps = []
    with _Hook(fail_first=2) as hook:
        alerts.post_webhook(hook.url, {"text": "x"}, sleep=naps.append)
    assert len(hook.bodies) == 3 and naps == [1, 2]

    with _Hook(fail_first=5) as hook:
        with pytest.raises(alerts.WebhookFailed, match="HTTP 503"):
            alerts.post_webhook(hook.url, {"text": "x"}, sleep=naps.append)
    assert len(hook.bodies) == 3


def test_alert_without_a_threshold_says_it_checks_nothing_and_exits_2(conn, env):
    result = CliRunner().invoke(main, ["alert"])
    assert result.exit_code == 2
    assert result.stdout.strip().endswith("nothing checked: no threshold given (--max-failures N or --max-ratio R)")
    assert not result.stdout.startswith("OK")
    as_json = CliRunner().invoke(main, ["alert", "--json"])
    assert as_json.exit_code == 2 and json.loads(as_json.stdout)["checked"] is False
