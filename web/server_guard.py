"""waitress, hardened against clients that hold connections or make requests costly to read.

waitress reads each request whole in its one I/O thread before an app thread sees it (see
web/serve.py). These subclasses bound what one client can make that thread, and the
connection table, do:

- **connections per address** (``LEASH_WEB_CONNECTIONS_PER_ADDRESS``): one address holding
  thousands of sockets cannot fill ``connection_limit`` for everyone else. A connection over
  the cap gets a JSON 429 and is closed at once. Behind a trusted proxy
  (``LEASH_TRUSTED_PROXIES``) every connection comes from the proxy, so the cap is off; the
  proxy (or platform router) is then what bounds a client's connections.
- **a deadline for a whole request** (``LEASH_WEB_REQUEST_DEADLINE``): from its first byte to
  its last, headers and body. A client trickling a byte every few seconds resets waitress's
  idle timeout forever; it cannot outlive this.
- **the cost of reading one request**: at most ``MAX_CHUNKS`` chunks in a chunked body (1 MiB
  sent as one-byte chunks cost 229 ms of the I/O thread), header lines of at most
  ``MAX_HEADER_LINE`` bytes and at most ``MAX_HEADER_FIELDS`` of them (a 63 KB Accept header
  cost 31 ms to parse in the app).
- **every refusal the server makes itself is JSON** (``{"error": ...}``, as the app's), and the
  connection **lingers** after it: the answer is sent, the write side shut, and what the client
  is still sending is read and dropped (at most ``LINGER_SECONDS`` and ``LINGER_BYTES``) before
  the socket closes. Closed at once, a client still sending its body (Python's urllib, 10 of
  10) saw a reset connection instead of the 413.
"""

from __future__ import annotations

import html
import json
import socket
import time
from collections import Counter

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.receiver import ChunkedReceiver
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher
from waitress.utilities import BadRequest, Error, RequestEntityTooLarge, RequestHeaderFieldsTooLarge

#: Chunks in one chunked body (a client streaming 1 MiB in 8 KiB writes sends 128).
MAX_CHUNKS = 4096
#: One header line, and how many there may be (gunicorn's defaults are 8190 and 100).
MAX_HEADER_LINE = 8192
MAX_HEADER_FIELDS = 100
#: After the server's own refusal, how long and how much of what the client still sends is read.
LINGER_SECONDS = 5.0
LINGER_BYTES = 4 * 1024 * 1024
#: How often the deadlines are checked (seconds).
CHECK_INTERVAL = 1


class TooManyChunks(RequestEntityTooLarge):
    pass


class _CountingChunkedReceiver(ChunkedReceiver):
    """waitress's chunked-body reader, counting chunks as they begin."""

    chunks = 0
    _remainder = 0

    @property
    def chunk_remainder(self) -> int:
        return self._remainder

    @chunk_remainder.setter
    def chunk_remainder(self, value: int) -> None:
        if value > 0 and self._remainder == 0:
            self.chunks += 1
        self._remainder = value


class LeashParser(HTTPRequestParser):
    def parse_header(self, header_plus: bytes) -> None:
        lines = header_plus.split(b"\n")
        if len(lines) > MAX_HEADER_FIELDS + 1 or any(len(line) > MAX_HEADER_LINE for line in lines):
            super().parse_header(b"GET / HTTP/1.0\r\n")
            self.error = RequestHeaderFieldsTooLarge(
                f"at most {MAX_HEADER_FIELDS} header lines of at most {MAX_HEADER_LINE} bytes each")
            return
        super().parse_header(header_plus)
        if self.chunked and isinstance(self.body_rcv, ChunkedReceiver):
            self.body_rcv = _CountingChunkedReceiver(self.body_rcv.buf)

    def received(self, data: bytes) -> int:
        consumed = super().received(data)
        body = self.body_rcv
        if isinstance(body, _CountingChunkedReceiver) and body.chunks > MAX_CHUNKS and not self.error:
            self.error = TooManyChunks(f"more than {MAX_CHUNKS} chunks")
            self.completed = True
        return consumed


def _message(error: Error, adj: Adjustments) -> str:
    if isinstance(error, TooManyChunks):
        return (f"the chunked request body has more than {MAX_CHUNKS} chunks; send it in fewer, larger chunks "
                "(or whole, with a Content-Length)")
    if isinstance(error, RequestEntityTooLarge):
        return (f"the request body is over the limit of {adj.max_request_body_size} bytes (LEASH_MAX_BODY_BYTES): "
                "send fewer or shorter items, or split the batch into several jobs")
    if isinstance(error, RequestHeaderFieldsTooLarge):
        return (f"the request's headers are too large: at most {adj.max_request_header_size} bytes in all, "
                f"{MAX_HEADER_FIELDS} lines of at most {MAX_HEADER_LINE} bytes each")
    if isinstance(error, BadRequest):
        return f"the request is not valid HTTP: {error.body}"
    return f"{error.reason}: {error.body}"


#: A browser's form over the body limit: the server refused it before reading a field, so it is
#: said on a page whose Back button returns to the form as it was typed (static/form.js says it on
#: the form itself, before sending, where JavaScript runs).
TOO_LARGE_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Too large - leash</title></head><body><main>
<h1>The form was too large to send</h1><p id="too-large">{message}</p>
<p>Go back with your browser's Back button: the form keeps what you typed.</p></main></body></html>"""


def _wants_html(headers: dict) -> bool:
    """A browser navigating (its Accept names text/html before JSON), as the app tells them."""
    accept = headers.get("ACCEPT", "")
    return "text/html" in accept and "application/json" not in accept


class JsonErrorTask(ErrorTask):
    """The server's own refusals as the app's errors are: ``{"error": "..."}``; a browser's form
    over the body limit gets a page saying its size and the limit."""

    def execute(self) -> None:
        error = self.request.error
        message = _message(error, self.channel.adj)
        size = self.request.content_length
        if isinstance(error, RequestEntityTooLarge) and not isinstance(error, TooManyChunks) and size:
            message = message.replace("the request body is over", f"the request body is {size:,} bytes, over", 1)
        self.status = f"{error.code} {error.reason}"
        if isinstance(error, RequestEntityTooLarge) and _wants_html(self.request.headers):
            body = TOO_LARGE_PAGE.format(message=html.escape(message[:1].upper() + message[1:])).encode()
            self.response_headers.append(("Content-Type", "text/html; charset=utf-8"))
        else:
            body = json.dumps({"error": message}).encode()
            self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class LeashChannel(HTTPChannel):
    parser_class = LeashParser
    error_task_class = JsonErrorTask

    #: Monotonic time the request being read began (None: none being read).
    request_started: float | None = None
    #: Non-zero: the answer is sent and the write side shut; reading (and dropping) until then.
    lingering_until = 0.0
    lingered = 0
    _closing_after_answer = False
    _counted = False

    def __init__(self, server, sock, addr, adj, map=None):
        super().__init__(server, sock, addr, adj, map)
        self.address = addr[0] if isinstance(addr, tuple) else str(addr)
        server.connections_by_address[self.address] += 1
        self._counted = True

    def received(self, data: bytes) -> bool:
        if self.request is None and data:
            self.request_started = time.monotonic()
        result = super().received(data)
        if self.request is None:
            self.request_started = None
        return result

    def readable(self) -> bool:
        return True if self.lingering_until else super().readable()

    def writable(self) -> bool:
        return self.will_close if self.lingering_until else super().writable()

    def handle_read(self) -> None:
        if not self.lingering_until:
            return super().handle_read()
        try:
            data = self.socket.recv(65536)
        except OSError:
            data = b""
        self.lingered += len(data)
        if not data or self.lingered > LINGER_BYTES or time.monotonic() > self.lingering_until:
            self._close_now()

    def handle_write(self) -> None:
        if self.lingering_until:
            return self._close_now()
        self._closing_after_answer = bool(self.close_when_flushed)
        return super().handle_write()

    def handle_close(self) -> None:
        if self._closing_after_answer and self.connected and not self.lingering_until:
            try:
                self.socket.shutdown(socket.SHUT_WR)  # the client reads the answer to its end
            except OSError:
                return self._close_now()
            self.lingering_until = time.monotonic() + LINGER_SECONDS
            self.will_close = False
            return None
        return self._close_now()

    def _close_now(self) -> None:
        self.lingering_until = 0.0
        self._closing_after_answer = False
        HTTPChannel.handle_close(self)

    def del_channel(self, map=None) -> None:
        if self._counted:
            self._counted = False
            counts = self.server.connections_by_address
            counts[self.address] -= 1
            if counts[self.address] <= 0:
                del counts[self.address]
        super().del_channel(map)


#: What a connection over the per-address cap gets before it is closed.
_TOO_MANY = json.dumps({"error": "too many connections from this address (LEASH_WEB_CONNECTIONS_PER_ADDRESS); "
                                 "close some and try again"}).encode()
TOO_MANY_CONNECTIONS = (b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 5\r\n"
                        b"Connection: close\r\nContent-Length: " + str(len(_TOO_MANY)).encode() + b"\r\n\r\n"
                        + _TOO_MANY)


class LeashServer(TcpWSGIServer):
    channel_class = LeashChannel
    per_address_cap = 0  # 0: no cap (behind a trusted proxy)
    request_deadline = 60.0

    def __init__(self, *args, **kwargs):
        self.connections_by_address: Counter = Counter()
        super().__init__(*args, **kwargs)

    def handle_accept(self) -> None:
        try:
            accepted = self.accept()
        except OSError:
            return
        if accepted is None:
            return
        conn, addr = accepted
        address = addr[0] if isinstance(addr, tuple) else str(addr)
        if self.per_address_cap and self.connections_by_address[address] >= self.per_address_cap:
            try:
                conn.setblocking(False)
                conn.send(TOO_MANY_CONNECTIONS)
            except OSError:
                pass
            conn.close()
            return
        try:
            self.set_socket_options(conn)
        except OSError:
            conn.close()
            return
        self.channel_class(self, conn, self.fix_addr(addr), self.adj, map=self._map)

    def maintenance(self, now: float) -> None:
        super().maintenance(now)
        clock = time.monotonic()
        cutoff = clock - self.request_deadline
        for channel in list(self.active_channels.values()):
            started = getattr(channel, "request_started", None)
            if started is not None and started < cutoff and not channel.lingering_until:
                channel.will_close = True  # still arriving after the deadline: closed
            elif channel.lingering_until and clock > channel.lingering_until:
                channel.will_close = True


def create_server(app, options: dict, per_address_cap: int, request_deadline: float) -> LeashServer:
    """waitress's create_server for one TCP address, with the classes above."""
    adj = Adjustments(**options, cleanup_interval=CHECK_INTERVAL)
    dispatcher = ThreadedTaskDispatcher()
    dispatcher.set_thread_count(adj.threads)
    server_class = type("ConfiguredLeashServer", (LeashServer,),
                        {"per_address_cap": per_address_cap, "request_deadline": request_deadline})
    return server_class(app, {}, dispatcher=dispatcher, adj=adj, sockinfo=adj.listen[0])
