"""The web app under a real gunicorn with two worker processes, as the Procfile runs it:
metrics add up across processes, a browser's session is valid in every process, the server
keeps gunicorn's control socket to itself, and without SECRET_KEY (outside ``leash dev``) it does
not start at all."""

from __future__ import annotations

import http.client
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from urllib.parse import urlencode
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli.devserver import free_port
from tests.conftest import ROOT, wait_for
from tests.web_support import make_app
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


def test_under_leash_dev_a_browser_session_is_valid_in_every_worker_without_a_configured_secret(web_server):
    # With API tokens configured, GET /jobs without a signed-in session is a 401: every 200
    # below is a worker that accepted the cookie another worker signed with the key made for
    # this run (the sign-in itself crosses workers too: its form and its POST).
    token = "ci-token-0123456789abcdef"
    server = web_server(workers=2, secret_key=None, extra_env={"LEASH_API_TOKENS": f"ci={token}", "LEASH_DEV": "1"})
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
def test_outside_leash_dev_the_web_server_refuses_to_start_without_a_secret_key_in_one_line(conn):
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "LEASH_SECRET_KEY", "LEASH_DEV")}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{free_port()}", "web.app:create_app()"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "SECRET_KEY is not set" in lines[0] and "heroku config:set SECRET_KEY=" in lines[0]


def test_create_app_outside_leash_dev_refuses_without_a_secret_key(conn):
    with pytest.raises(SecretKeyMissing, match="SECRET_KEY is not set"):
        make_app(SECRET_KEY=None)
    assert make_app(SECRET_KEY=None, LEASH_DEV=True).config["SECRET_KEY"]
