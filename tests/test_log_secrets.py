"""Credentials in a URL never reach a log line, and the HTTP clients' line per call is off."""

from __future__ import annotations

import http.server
import io
import json
import logging
import threading

import httpx2
import pytest

from jobs.observability import logs

SECRET = "s3cr3t-pa55"


@pytest.fixture
def captured(monkeypatch):
    """Logging set up as ``leash worker`` does, into a buffer; the root logger restored after."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in ("httpx", "httpx2", "httpcore", "openai", "anthropic", "urllib3")})
    stream = io.StringIO()

    def configure(fmt="text", **env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(logs.sys, "stderr", stream)
        logs.configure("INFO", fmt)
        return stream

    yield configure
    root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    for name, level in saved[2].items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_line_masks_the_credentials_of_any_url(captured, fmt):
    stream = captured(fmt)
    log = logging.getLogger("leash.test")
    log.info("calling %s", f"http://user:{SECRET}@models.example/v1")
    log.warning(f"redis at rediss://:{SECRET}@cache.example:6380/0 did not answer")
    log.info("token in a URL: https://%s@git.example/x and https://h.example/v1?api_key=%s&n=1", SECRET, SECRET)
    try:
        raise ConnectionError(f"cannot reach redis://default:{SECRET}@10.0.0.1:6379")
    except ConnectionError:
        log.exception("the worker stopped")
    log.info("done", extra={"url": f"http://u:{SECRET}@x.example"})
    text = stream.getvalue()
    assert SECRET not in text, text
    assert "http://user:***@models.example/v1" in text and "rediss://:***@cache.example" in text
    assert "https://***@git.example" in text and "api_key=***&n=1" in text
    if fmt == "json":
        assert all(json.loads(line) for line in text.splitlines() if line.startswith("{"))


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://user:{SECRET}@127.0.0.1:{server.server_address[1]}/v1/chat"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_the_http_clients_line_per_call_is_off_by_default(captured, http_server):
    stream = captured()
    with httpx2.Client() as client:
        assert client.get(http_server).status_code == 200
    assert "HTTP Request" not in stream.getvalue()


def test_turned_on_the_line_per_call_has_its_password_masked(captured, http_server):
    stream = captured(LEASH_LOG_HTTP_CALLS="1")
    with httpx2.Client() as client:
        assert client.get(http_server).status_code == 200
    text = stream.getvalue()
    assert "HTTP Request: GET" in text and SECRET not in text


def test_a_worker_calling_a_model_url_with_a_password_never_logs_it(conn, workers, model_server, tmp_path):
    from jobs.enqueue import enqueue
    from tests.conftest import wait_for

    url = model_server.url.replace("http://", f"http://user:{SECRET}@")
    job_id, _ = enqueue(conn, "prompt", {"items": ["cats", "dogs"], "template": "say {item}"})
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log_file:
        proc = workers.start("--burst", "--log-level", "INFO", extra_env={"LEASH_MODEL_URL": url},
                             stderr=log_file, stdout=log_file)
        wait_for(lambda: proc.poll() is not None, 60, message="the burst worker to finish")
    text = log_path.read_text()
    assert job_id in text  # the worker did log its work at INFO
    assert SECRET not in text, [line for line in text.splitlines() if SECRET in line]
    assert "HTTP Request" not in text
