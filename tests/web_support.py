"""Fixtures and helpers for the web tests: the app on the test database, clients that act as
an API caller or as a browser, a counter of Redis round trips, and one headless Chromium shared
by the browser tests."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import redis

from cli.devserver import free_port
from jobs import keys
from jobs.core import state_index
from tests.conftest import REDIS_URL, ROOT, wait_for
from web.app import create_app

TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789ab"}
CHROMIUM = os.environ.get("LEASH_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
HTML = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
CLASSIFY = {"kind": "classify", "items": ["good film", "bad film"], "labels": ["positive", "negative"]}


def bearer(owner: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[owner]}"}


def basic(user: str, password: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


#: What every test app is made with unless a test says otherwise (the environment may set the rest).
TEST_SETTINGS = {"SECRET_KEY": "test-secret", "LEASH_SECRET_KEY": None, "REDIS_URL": REDIS_URL,
                 "LEASH_DASHBOARD_USER": None, "LEASH_DASHBOARD_PASSWORD": None, "LEASH_DEV": False}


def create_app_with(**settings):
    """The app under test, its declared settings (``LEASH_API_TOKENS="..."``, None: unset) read
    in place of the environment's, as the app reads them: the one way a test sets one."""
    app = create_app({**TEST_SETTINGS, **settings})
    app.config["TESTING"] = True  # Flask's own
    return app


@pytest.fixture
def app(conn):
    return create_app_with()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def token_app(conn):
    return create_app_with(LEASH_API_TOKENS=",".join(f"{o}={t}" for o, t in TOKENS.items()))


def csrf_from(html: bytes) -> str:
    match = re.search(rb'name="csrf_token" type="hidden" value="([^"]+)"', html) or \
        re.search(rb'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1).decode()


def sign_in(client, owner: str, next_path: str = "/"):
    """Sign a browser in at /signin with the owner's token; returns the answer (a 303 to next)."""
    page = client.get(f"/signin?next={next_path}", headers=HTML)
    assert page.status_code == 200, page.status_code
    return client.post("/signin", data={"token": TOKENS[owner], "next": next_path, "csrf_token": csrf_from(page.data)},
                       headers=HTML)


def finish_job(connection: redis.Redis, job_id: str, results: list, summary: dict | None = None) -> None:
    """Write a succeeded job's end state as the finish transition would (for page tests that
    do not need a worker)."""
    now = time.time()
    connection.hset(keys.items(job_id), mapping={str(i): json.dumps(r) for i, r in enumerate(results)})
    connection.hset(keys.job(job_id), mapping={
        "state": "succeeded", "done": len(results), "total": len(results), "attempts": 1,
        "updated_at": now, "ended_at": now, "result": json.dumps(summary or {"items": len(results)}),
    })
    state_index.repair(connection, [job_id], [connection.hget(keys.job(job_id), "owner").decode()])


class RoundTrips:
    """Counts network round trips on one Redis client: each direct command is one, each
    pipeline execute is one (however many commands it carries)."""

    def __init__(self, connection: redis.Redis, monkeypatch):
        self.count = 0
        self.commands: list[str] = []
        original_command = connection.execute_command
        original_pipeline = connection.pipeline

        def execute_command(*args, **kwargs):
            self.count += 1
            self.commands.append(str(args[0]))
            return original_command(*args, **kwargs)

        def pipeline(*args, **kwargs):
            pipe = original_pipeline(*args, **kwargs)
            original_execute = pipe.execute

            def execute(*a, **k):
                self.count += 1
                self.commands.append("PIPELINE[" + ",".join(str(c[0][0]) for c in pipe.command_stack) + "]")
                return original_execute(*a, **k)

            pipe.execute = execute
            return pipe

        monkeypatch.setattr(connection, "execute_command", execute_command)
        monkeypatch.setattr(connection, "pipeline", pipeline)

    def reset(self) -> None:
        self.count = 0
        self.commands.clear()


class WebServer:
    """The web process as the Procfile starts it (``leash web``: waitress) on a free loopback
    port; stopped by pid."""

    def __init__(self, extra_env: dict | None = None, secret_key: str | None = "test-secret"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, **(extra_env or {}))
        env.pop("SECRET_KEY", None)
        env.pop("LEASH_SECRET_KEY", None)
        if secret_key:
            env["SECRET_KEY"] = secret_key
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "web", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT, env=env, start_new_session=True,
        )

    def wait_ready(self, timeout: float = 20) -> None:
        def healthy():
            if self.proc.poll() is not None:
                raise AssertionError(f"the web server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(healthy, timeout, interval=0.1, message="the web server to answer /healthz")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def web_server(conn):
    servers: list[WebServer] = []

    def start(**kwargs) -> WebServer:
        server = WebServer(**kwargs)
        servers.append(server)
        server.wait_ready()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def shared_chromium():
    """One headless Chromium for the whole run: launching it costs more than most browser tests."""
    if not os.path.exists(CHROMIUM):
        message = (f"headless Chromium was not found ({CHROMIUM}); install it with `apt-get install -y chromium` "
                   "or point LEASH_CHROMIUM at a Chromium binary")
        if os.environ.get("CI", "").lower() in ("1", "true", "yes") or os.environ.get("LEASH_REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message + " (browser tests not run; they are required in CI)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser test needs Playwright for Python: pip install -e '.[test]'")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def chromium(shared_chromium):
    """The shared browser; every context a test opened (its cookies, storage and pages) is closed
    after it, so no test sees another's."""
    yield shared_chromium
    for context in list(shared_chromium.contexts):
        context.close()
