"""The web app under a real gunicorn with two worker processes, as the Procfile runs it:
metrics add up across processes, a browser's session is valid in every process, and the server
keeps gunicorn's control socket to itself."""

from __future__ import annotations

import http.client
import re
import shutil
import tempfile
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_for


pytestmark = pytest.mark.slow


def _get(server, path, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)  # a new connection each time
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read(), response
    finally:
        connection.close()


def test_request_counters_add_up_across_gunicorn_workers(web_server):
    server = web_server(workers=2)
    before = _healthz_count(server)
    for _ in range(30):
        assert _get(server, "/healthz")[0] == 200
    assert _healthz_count(server) - before == 30


def _healthz_count(server) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "leash_http_requests_total" and sample.labels.get("route") == "/healthz")


def test_a_browser_session_is_valid_in_every_worker_even_without_a_configured_secret(web_server):
    # With API tokens configured, GET /jobs without a valid session is a 401: every 200 below
    # is a worker that accepted the cookie another worker signed.
    server = web_server(workers=2, secret_key=None, extra_env={"LEASH_API_TOKENS": "ci=ci-token-0123456789abcdef"})
    status, body, response = _get(server, "/", headers={"Accept": "text/html"})
    assert status == 200
    cookie = re.search(r"leash_session=[^;]+", response.getheader("Set-Cookie")).group(0)
    for _ in range(20):
        status, body, _ = _get(server, "/jobs", headers={"Accept": "application/json", "Cookie": cookie})
        assert status == 200


def test_gunicorn_shares_no_control_socket_and_opens_its_own_only_when_asked(web_server):
    # gunicorn's default would be $XDG_RUNTIME_DIR/gunicorn.ctl, else ~/.gunicorn/gunicorn.ctl:
    # one socket for every gunicorn of the user. Short paths: a unix socket's is at most 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="lw"))
    try:
        home, runtime = base / "home", base / "run"
        home.mkdir()
        runtime.mkdir()
        isolated = {"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
        web_server(workers=1, extra_env=isolated)
        assert not (runtime / "gunicorn.ctl").exists() and not (home / ".gunicorn").exists()

        own = base / "web.ctl"
        web_server(workers=1, extra_env={**isolated, "LEASH_GUNICORN_CONTROL_SOCKET": str(own)})
        wait_for(lambda: own.is_socket(), 10, message="the control socket at the configured path")
        assert own.stat().st_mode & 0o077 == 0  # the owner's alone
        assert not (runtime / "gunicorn.ctl").exists() and not (home / ".gunicorn").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)
