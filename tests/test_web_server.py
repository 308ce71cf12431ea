"""The web process as the Procfile starts it (``leash web``: waitress, one process, many
threads): its request counters count every request, a browser's session stays valid across
requests under ``leash dev`` without a configured secret, its settings reach the server, and
without SECRET_KEY (outside ``leash dev``) it does not start at all."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.devserver import free_port
from tests.conftest import ROOT
from tests.web_support import create_app_with
from web import serve
from web.app import SecretKeyMissing

pytestmark = pytest.mark.slow


def _get(server, path, headers=None, method="GET", body=None):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)  # a new connection each time
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read(), response
    finally:
        connection.close()


def test_request_counters_count_every_request_answered_on_many_threads_at_once(web_server):
    server = web_server()
    before = _healthz_count(server)
    with ThreadPoolExecutor(max_workers=10) as pool:
        statuses = list(pool.map(lambda _: _get(server, "/healthz")[0], range(30)))
    assert statuses == [200] * 30
    assert _healthz_count(server) - before == 30


def _healthz_count(server) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "leash_http_requests_total" and sample.labels.get("route") == "/healthz")


def test_under_leash_dev_a_browser_session_stays_valid_without_a_configured_secret(web_server):
    # With API tokens configured, GET /jobs without a signed-in session is a 401: every 200
    # below is a request that accepted the cookie signed with the key made for this run (the
    # sign-in itself too: its form and its POST).
    token = "ci-token-0123456789abcdef"
    server = web_server(secret_key=None, extra_env={"LEASH_API_TOKENS": f"ci={token}", "LEASH_DEV": "1"})
    status, body, response = _get(server, "/signin", headers={"Accept": "text/html"})
    assert status == 200
    cookie = re.search(r"leash_session=[^;]+", response.getheader("Set-Cookie")).group(0)
    csrf = re.search(rb'name="csrf_token" type="hidden" value="([^"]+)"', body).group(1).decode()
    status, _, response = _get(server, "/signin", method="POST", body=urlencode({"token": token, "csrf_token": csrf}),
                               headers={"Accept": "text/html", "Cookie": cookie,
                                        "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303
    cookie = re.search(r"leash_session=[^;]+", response.getheader("Set-Cookie")).group(0)
    for _ in range(20):
        status, body, _ = _get(server, "/jobs", headers={"Accept": "application/json", "Cookie": cookie})
        assert status == 200


def test_the_server_gets_the_limits_it_enforces_before_the_app(env, monkeypatch):
    monkeypatch.setenv("LEASH_WEB_THREADS", "5")
    monkeypatch.setenv("LEASH_WEB_CONNECTIONS", "300")
    monkeypatch.setenv("LEASH_MAX_BODY_BYTES", "4096")
    options = serve.waitress_options("127.0.0.1", 5000)
    assert (options["threads"], options["connection_limit"], options["max_request_body_size"]) == (5, 300, 4096)
    monkeypatch.setenv("LEASH_WEB_CONNECTIONS", "0")  # the default: sized to the open-file limit
    assert serve.waitress_options("127.0.0.1", 5000)["connection_limit"] >= 10
    assert options["asyncore_use_poll"] and options["clear_untrusted_proxy_headers"]


def test_outside_leash_dev_the_web_server_refuses_to_start_without_a_secret_key_in_one_line(conn):
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "LEASH_SECRET_KEY", "LEASH_DEV")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "cli", "web", "--host", "127.0.0.1", "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "SECRET_KEY is not set" in lines[0] and "heroku config:set SECRET_KEY=" in lines[0]


def test_create_app_outside_leash_dev_refuses_without_a_secret_key(conn):
    with pytest.raises(SecretKeyMissing, match="SECRET_KEY is not set"):
        create_app_with(SECRET_KEY=None)
    assert create_app_with(SECRET_KEY=None, LEASH_DEV=True).config["SECRET_KEY"]


@pytest.mark.parametrize("setting,value,named", [
    ("REDIS_URL", "redis://:pw-secret@[::1/0", "REDIS_URL is not a Redis URL"),
    ("LEASH_API_TOKENS", "garbage", "LEASH_API_TOKENS entry 'garbage'"),
    ("LEASH_LOG_FORMAT", "xml", "LEASH_LOG_FORMAT must be one of"),
    ("SENTRY_DSN", "not-a-dsn", "SENTRY_DSN is not a Sentry DSN"),
    ("LEASH_WEB_CONNECTIONS", "many", "LEASH_WEB_CONNECTIONS must be an integer"),
])
def test_a_malformed_setting_stops_the_web_server_with_one_line_and_exit_2(conn, setting, value, named):
    env = {**os.environ, "SECRET_KEY": "s", "PYTHONPATH": str(ROOT), setting: value}
    result = subprocess.run([sys.executable, "-m", "cli", "web", "--host", "127.0.0.1", "--port", str(free_port())],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if "LEASH_API_TOKENS is not set" not in line]
    assert len(lines) == 1 and named in lines[0], result.stderr
    assert "Traceback" not in result.stderr and "pw-secret" not in result.stderr
