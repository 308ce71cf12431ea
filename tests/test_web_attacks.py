"""Attacks anyone who can reach the app can make, without logging in, each of which once took
it down or answered 500: slow clients, a costly CSV upload, made-up HTTP methods filling
/metrics, lone surrogates, rq-dashboard probes, oversized chunked bodies and malformed URLs.
Each test sends the attack and checks that ordinary service goes on and the answer is a 4xx.

The server tests run the web process as the Procfile starts it, on loopback only, and close
every socket they open; run with ``-s`` to see the figures (docs/BENCHMARKS.md)."""

from __future__ import annotations

import http.client
import io
import json
import re
import socket
import threading
import time

import pytest

from jobs import keys
from jobs.core import payload_copy
from jobs.enqueue import enqueue
from tests.conftest import wait_for
from tests.web_support import CLASSIFY, HTML, basic, create_app_with, csrf_from, finish_job

pytestmark = pytest.mark.slow

SLOW_BODIES = 16    # each holds a POST open by sending its body a byte a second
SLOW_HEADERS = 200  # each holds a connection open by sending its headers a byte a second
TRICKLE_SECONDS = 12  # how long the trickle lasts at most (the probes run inside it)


def _request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
             timeout: float = 10) -> tuple[int, bytes, http.client.HTTPResponse, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        return response.status, data, response, time.monotonic() - started
    finally:
        connection.close()


class Trickle:
    """Slow clients: sockets that send their request a byte a second, from one thread, for at
    most ``TRICKLE_SECONDS``; ``close()`` closes every one of them."""

    def __init__(self, port: int):
        self.port = port
        self.sockets: list[tuple[socket.socket, bytes]] = []
        self.rounds = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def open(self, count: int, head: bytes, tail: bytes) -> None:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            sock.sendall(head)
            self.sockets.append((sock, tail))

    def _run(self) -> None:
        deadline = time.monotonic() + TRICKLE_SECONDS
        position = 0
        while not self.stopped.is_set() and time.monotonic() < deadline:
            for sock, tail in self.sockets:
                try:
                    sock.send(tail[position % len(tail):position % len(tail) + 1])
                except OSError:
                    pass  # the server closed it: that is allowed
            position += 1
            self.rounds += 1
            self.stopped.wait(1.0)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        for sock, _ in self.sockets:
            sock.close()


def test_ordinary_requests_are_answered_within_2_s_while_216_slow_clients_trickle(web_server):
    # Slow clients from many addresses (all loopback here): no per-address cap, as behind a proxy.
    server = web_server(extra_env={"LEASH_WEB_CONNECTIONS_PER_ADDRESS": "0"})
    status, body, _, _ = _request(server.port, "POST", "/jobs", json.dumps(CLASSIFY).encode(),
                                  {"Content-Type": "application/json"})
    assert status == 202
    job_path = json.loads(body)["url"]
    trickle = Trickle(server.port)
    try:
        trickle.open(SLOW_BODIES, b"POST /jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: 100000\r\n\r\n", b" ")
        trickle.open(SLOW_HEADERS, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n", b"X-Slow: aaaaaaaaaaaaaaaa\r\n")
        trickle.thread.start()
        wait_for(lambda: trickle.rounds >= 3, 10, message="three rounds of trickling")
        took = []
        for _ in range(5):
            for method, path, data in (("GET", "/healthz", None), ("GET", job_path, None),
                                       ("POST", "/jobs", json.dumps(CLASSIFY).encode())):
                status, _, _, seconds = _request(server.port, method, path, data,
                                                 {"Content-Type": "application/json"}, timeout=5)
                assert status in (200, 202), (method, path, status)
                took.append(seconds)
        assert not trickle.stopped.is_set() and trickle.thread.is_alive()  # all of it while they trickled
    finally:
        trickle.close()
    print(f"\n{SLOW_BODIES + SLOW_HEADERS} slow clients: {len(took)} ordinary requests, slowest {max(took):.3f} s")
    assert max(took) < 2.0


def _form_post(port: int, filename: str, content: bytes) -> tuple[int, bytes, float]:
    status, page, response, _ = _request(port, "GET", "/", headers=HTML)
    assert status == 200
    cookie = re.search(r"leash_session=[^;]+", response.getheader("Set-Cookie")).group(0)
    boundary = "leashboundary7MA4YWxkTrZu0gW"
    fields = {"csrf_token": csrf_from(page), "kind": "classify", "labels": "a,b", "submission": "wide-csv-upload-1"}
    body = io.BytesIO()
    for name, value in fields.items():
        body.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    body.write(f'--{boundary}\r\nContent-Disposition: form-data; name="items_file"; filename="{filename}"\r\n'
               f"Content-Type: text/csv\r\n\r\n".encode() + content + f"\r\n--{boundary}--\r\n".encode())
    status, answer, _, took = _request(port, "POST", "/", body.getvalue(), {
        **HTML, "Cookie": cookie, "Content-Type": f"multipart/form-data; boundary={boundary}"}, timeout=5)
    return status, answer, took


def test_a_1_mib_csv_of_empty_columns_is_refused_within_5_s_naming_the_limit(web_server):
    server = web_server()
    # Rows of one short cell around one row of 480,001 columns: the old column picker looked at
    # every column of every row (hours of CPU for this one request).
    wide = b"a\n" * 100_000 + b"b" + b"," * 480_000 + b"\n" + b"a\n" * 170_000
    assert 1_000_000 < len(wide) < 1_040_000
    status, answer, took = _form_post(server.port, "wide.csv", wide)
    print(f"\n1 MiB wide CSV: {status} in {took:.3f} s")
    assert status == 422 and took < 5.0
    assert b"LEASH_MAX_CSV_COLUMNS" in answer and b"480001 columns" in answer
    # Still answering, at once.
    assert _request(server.port, "GET", "/healthz", timeout=2)[0] == 200


def test_a_csv_that_defeats_the_dialect_sniffer_is_answered_within_5_s(web_server):
    server = web_server()
    # csv.Sniffer's quote regexes took 102 s over the 64 KB they were given of this.
    status, answer, took = _form_post(server.port, "quotes.csv", b',"' * 500_000)
    print(f"\n1 MiB of ',\"': {status} in {took:.3f} s")
    assert 400 <= status < 500 and took < 5.0


def _series(client) -> set[str]:
    text = client.get("/metrics").get_data(as_text=True)
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith("leash_http_requests_total{")}


def test_made_up_http_methods_add_at_most_a_few_metrics_series(conn):
    client = create_app_with().test_client()
    client.get("/healthz")
    before = _series(client)
    statuses = {client.open("/healthz", method=f"FOO{n}").status_code for n in range(300)}
    added = _series(client) - before
    assert statuses <= {405}
    assert len(added) <= 5, sorted(added)[:10]
    assert any('method="other"' in series for series in added)


LONE = "bad \udfff text"


@pytest.mark.parametrize("field,payload", [
    ("items", {"kind": "classify", "items": ["fine", LONE], "labels": ["a", "b"]}),
    ("labels", {"kind": "classify", "items": ["fine"], "labels": ["a", "b\ud800"]}),
    ("template", {"kind": "prompt", "items": ["fine"], "template": "Say {item} \udc80"}),
])
def test_a_lone_surrogate_is_a_422_naming_the_field(conn, field, payload):
    client = create_app_with().test_client()
    # json.dumps escapes it as \\udfff: valid JSON, which Python's parser turns back into a lone surrogate.
    response = client.post("/jobs", data=json.dumps(payload), headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.data
    error = response.get_json()["error"]
    assert f"'{field}'" in error and "surrogate" in error
    assert conn.zcard(keys.FAILED_INDEX) == 0 and not conn.keys(keys.job("*"))


def test_text_already_stored_with_a_lone_surrogate_is_shown_not_a_500(conn, tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REDIS_URL, ROOT

    job_id, _ = enqueue(conn, "classify", {"items": ["first", "second"], "labels": ["a", "b"]}, owner="shared")
    # As a job accepted before the check, or a model answer, could have stored it.
    payload = payload_copy.decode(conn.get(keys.payload(job_id)))
    payload["items"][1] = LONE
    conn.set(keys.payload(job_id), json.dumps(payload))
    finish_job(conn, job_id, ["a", {"label": "b \ud83d", "note": LONE}])
    client = create_app_with().test_client()
    for path, headers, shows in ((f"/jobs/{job_id}/result.csv", {}, "bad \ufffd text"),
                                 (f"/jobs/{job_id}/result.jsonl", {}, "bad \ufffd text"),
                                 (f"/jobs/{job_id}", HTML, "b \ufffd"), (f"/jobs/{job_id}/result", {}, "\\udfff"),
                                 (f"/jobs/{job_id}", {}, "succeeded"), ("/jobs", HTML, job_id)):
        response = client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.status_code)
        text = response.get_data().decode("utf-8")  # valid UTF-8 throughout
        assert shows in text, path
    lines = client.get(f"/jobs/{job_id}/result.jsonl").get_data().decode().splitlines()
    assert json.loads(lines[1])["item"] == "bad \ufffd text"
    environment = {**os.environ, "REDIS_URL": REDIS_URL, "PYTHONPATH": str(ROOT), "XDG_STATE_HOME": str(tmp_path)}
    for fmt in ("csv", "jsonl"):
        result = subprocess.run([sys.executable, "-m", "cli", "results", job_id, "--format", fmt], cwd=ROOT,
                                env=environment, capture_output=True, timeout=60)
        assert result.returncode == 0 and b"Traceback" not in result.stderr, result.stderr
        assert "bad \ufffd text" in result.stdout.decode("utf-8")
    shown = subprocess.run([sys.executable, "-m", "cli", "status", job_id], cwd=ROOT, env=environment,
                           capture_output=True, timeout=60)
    assert shown.returncode == 0 and b"Traceback" not in shown.stderr, shown.stderr


USER, PASSWORD = "operator", "correct horse battery staple"


@pytest.mark.parametrize("path,expected", [
    ("/rq/0/view/job/no-such-job", 404),
    ("/rq/0/data/job/no-such-job.json", 404),
    ("/rq/0/data/jobs/leash/queued/x/asc/1.json", 400),
    ("/rq/0/data/jobs/leash/queued/0/asc/1.json", 400),
    ("/rq/0/data/jobs/leash/queued/8/asc/y.json", 400),
    ("/rq/0/data/jobs/leash/nonsense/8/asc/1.json", 400),
    ("/rq/0/data/jobs/leash/queued/100000000/asc/1.json", 400),
    ("/rq/7/data/queues.json", 404),
    ("/rq/7/view/workers", 404),
])
def test_rq_dashboard_probes_are_4xx_with_a_json_error(conn, path, expected):
    client = create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD).test_client()
    response = client.get(path, headers={**basic(USER, PASSWORD), "Accept": "application/json"})
    assert response.status_code == expected, (path, response.status_code)
    assert response.get_json()["error"]


def test_rq_dashboard_actions_on_an_unknown_job_are_404(conn):
    client = create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD).test_client()
    auth = basic(USER, PASSWORD)
    client.get("/rq/", headers=auth)
    token = client.get_cookie("_csrf_token", path="/rq").value
    response = client.post("/rq/job/no-such-job/requeue", headers={**auth, "X-CSRFToken": token})
    assert response.status_code == 404 and response.get_json()["error"]


@pytest.mark.parametrize("header", ["Basic é", "Basic ÿÿÿÿ", "Basic \u0100abc", "Basic " + "=" * 10, "Basic",
                                    "Basic /w==", "Basic " + "A" * 9])
def test_a_basic_auth_header_that_is_not_base64_is_a_401(conn, header):
    client = create_app_with(LEASH_DASHBOARD_USER=USER, LEASH_DASHBOARD_PASSWORD=PASSWORD).test_client()
    response = client.get("/rq/", headers={"Authorization": header})
    assert response.status_code == 401 and response.get_json()["error"]


def _raw(port: int, data: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                break
        return b"".join(chunks)


def _complete(response: bytes) -> bool:
    head, _, body = response.partition(b"\r\n\r\n")
    match = re.search(rb"(?i)content-length: *(\d+)", head)
    return match is not None and len(body) >= int(match.group(1))


def _chunked(payload: bytes, size: int = 65536) -> bytes:
    out = io.BytesIO()
    for start in range(0, len(payload), size):
        piece = payload[start:start + size]
        out.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
    out.write(b"0\r\n\r\n")
    return out.getvalue()


@pytest.mark.parametrize("tail", [b" ", b"x"])
def test_a_chunked_body_over_the_limit_is_a_413(web_server, tail):
    server = web_server()
    # A valid submission padded past 1 MiB: with spaces it would still parse if cut at the limit.
    body = json.dumps(CLASSIFY).encode() + tail * (1_100_000)
    answer = _raw(server.port, b"POST /jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                               b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + _chunked(body))
    assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"413", answer[:300]
    small = json.dumps(CLASSIFY).encode()
    answer = _raw(server.port, b"POST /jobs HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                               b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + _chunked(small, 7))
    assert answer.split(b"\r\n", 1)[0].split(b" ")[1] == b"202", answer[:300]


@pytest.mark.parametrize("target", [b"/static//x", b"//evil.example/", b"/jobs//x", b"///evil.example/x",
                                    b"/static/..%2f..%2fetc/passwd", b"/jobs/%ff%fe", b"/jobs/%00",
                                    b"/%2e%2e/", b"/jobs?offset=%ff", b"/" + b"a" * 6000])
def test_malformed_urls_are_4xx_and_never_redirect_to_the_host_header(web_server, target):
    server = web_server()
    answer = _raw(server.port, b"GET " + target + b" HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
    status_line, _, rest = answer.partition(b"\r\n")
    status = int(status_line.split(b" ")[1])
    head = rest.partition(b"\r\n\r\n")[0].lower()
    assert 400 <= status < 500, answer[:300]
    assert b"evil.example" not in head, answer[:300]
