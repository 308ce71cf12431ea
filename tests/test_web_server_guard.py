"""The web process (waitress with web/server_guard.py) against clients that hold connections
or make requests costly: every refusal is JSON a still-sending client receives; chunks, header
lines and form fields are bounded; one address cannot hold the server; a trickled request ends."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

from tests.conftest import wait_for
from tests.web_support import create_app_with

MIB = 1 << 20


def _refusal(server, body: bytes, headers: dict) -> tuple[int, dict]:
    request = urllib.request.Request(server.url + "/jobs", data=body, headers=headers)
    try:
        urllib.request.urlopen(request, timeout=20)
    except urllib.error.HTTPError as refused:
        assert refused.headers["Content-Type"] == "application/json"
        return refused.code, json.loads(refused.read())
    raise AssertionError("the request was not refused")


def _raw(server, data: bytes, source: str = "127.0.0.1") -> bytes:
    """Send ``data`` on one connection, shut the write side, return all of the answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=(source, 0)) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # refused while still sending: the answer must be there to read anyway
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_a_too_large_body_is_a_json_413_that_a_client_still_sending_receives(web_server):
    server = web_server(extra_env={"LEASH_MAX_BODY_BYTES": str(MIB)})
    for _ in range(10):  # urllib sends the whole 3 MiB before it reads: it saw a reset before
        status, error = _refusal(server, b"x" * (3 * MIB), {"Content-Type": "application/json"})
        assert status == 413 and "LEASH_MAX_BODY_BYTES" in error["error"]
    chunked = (b"POST /jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n%s\r\n" % (64 * 1024, b"y" * 64 * 1024) * 40 + b"0\r\n\r\n")
    answer = _raw(server, chunked)
    assert answer.startswith(b"HTTP/1.1 413") and b'"error"' in answer and b"LEASH_MAX_BODY_BYTES" in answer


def test_the_cost_of_reading_one_request_is_bounded(web_server):
    server = web_server()
    one_byte_chunks = (b"POST /jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                       b"Content-Type: application/json\r\n\r\n" + b"1\r\nx\r\n" * 100_000 + b"0\r\n\r\n")
    answer = _raw(server, one_byte_chunks)
    assert answer.startswith(b"HTTP/1.1 413") and b"chunks" in answer
    big_header = b"GET /healthz HTTP/1.1\r\nHost: x\r\nAccept: " + b"a" * 60_000 + b"\r\n\r\n"
    answer = _raw(server, big_header)
    assert b" 431 " in answer.split(b"\r\n")[0] and b'"error"' in answer
    many = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: 1\r\n" % n for n in range(300)) + b"\r\n"
    assert b" 431 " in _raw(server, many).split(b"\r\n")[0]
    # Ordinary requests still pass: a few headers, a body in a few chunks.
    ok = (b"POST /jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
          b"2\r\n{}\r\n0\r\n\r\n")
    assert _raw(server, ok).startswith(b"HTTP/1.1 400")  # read whole, refused by the API's validation


def test_a_form_of_too_many_fields_is_a_413_before_it_is_parsed(conn):
    client = create_app_with().test_client()
    response = client.post("/", data=b"&".join(b"f%d=1" % n for n in range(5000)),
                           content_type="application/x-www-form-urlencoded")
    assert response.status_code == 413 and "5000 fields" in response.get_json()["error"]


def test_one_address_holding_connections_cannot_stop_others_and_a_trickled_request_ends(web_server):
    server = web_server(extra_env={"LEASH_WEB_CONNECTIONS_PER_ADDRESS": "20", "LEASH_WEB_REQUEST_DEADLINE": "2"})
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(60)]
    try:
        for sock in held:  # each sends a request line and stops there
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        refused = 0
        for sock in held:
            sock.settimeout(0.5)
            try:
                refused += sock.recv(200).startswith(b"HTTP/1.1 429")
            except OSError:
                pass
        assert refused >= 40 - 2  # the cap of 20 (a refused one may be read before its answer)
        answer = _raw(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", source="127.0.0.2")
        assert answer.startswith(b"HTTP/1.1 200")
        # A request trickled a byte at a time is closed at the deadline, whatever it sends.
        trickler = socket.create_connection(("127.0.0.1", server.port), timeout=5, source_address=("127.0.0.3", 0))
        trickler.sendall(b"GET /healthz HTTP/1.1\r\n")
        trickler.settimeout(0.2)
        started = time.monotonic()

        def closed() -> bool:
            try:
                trickler.send(b"X")
                return trickler.recv(10) == b""
            except TimeoutError:
                return False
            except OSError:
                return True

        wait_for(closed, 15, interval=0.2, message="the trickled request to be closed at its deadline")
        assert time.monotonic() - started >= 1.5
        trickler.close()
    finally:
        for sock in held:
            sock.close()
